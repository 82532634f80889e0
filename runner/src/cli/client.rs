//! Client commands: `module`, `enqueue`, `task`, `schedule`, `stats`, `dead`, `queue`,
//! `secret`, `usage` talk to the admin API over
//! HTTP (`--url`/`SWEEP_URL`, `--token`/`SWEEP_TOKEN`) and print tables, or the API's JSON
//! with `--json`. `admin` and `tenant` (in `operator`) work on the database directly.
//!
//! Invariant: the client adds nothing the API does not check itself; an API error is printed
//! as the API worded it, with its code.

mod capabilities;
mod flow;
mod operator;
mod print;
mod queue;
mod schedule;
mod workflow;

use std::path::PathBuf;

use anyhow::{bail, Context};
use reqwest::{Method, RequestBuilder};
use serde_json::{json, Value};

// `AdminServerArgs` is for `sweep run` too, which serves the API next to its runner.
pub use capabilities::{secret, usage, SecretCommand, UsageArgs};
pub use flow::{queue, QueueCommand};
pub use operator::{admin, tenant, AdminArgs, AdminServerArgs, TenantCommand};
pub use queue::{dead, enqueue, stats, task, DeadCommand, EnqueueArgs, StatsArgs, TaskCommand};
pub use schedule::{schedule, ScheduleCommand};
pub use workflow::{workflow, WorkflowCommand};

/// Where and as whom to call the admin API.
#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// Base URL of the admin API.
    #[arg(long, env = "SWEEP_URL", default_value = "http://127.0.0.1:7070")]
    pub url: String,
    /// API token: a tenant's, or the operator's.
    #[arg(long, env = "SWEEP_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
    json: bool,
}

impl Api {
    fn new(args: ClientArgs) -> anyhow::Result<Api> {
        let Some(token) = args.token.filter(|t| !t.is_empty()) else {
            bail!("no API token: pass --token or set SWEEP_TOKEN (tenant tokens come from `sweep tenant create`)");
        };
        Ok(Api {
            http: reqwest::Client::new(),
            url: args.url.trim_end_matches('/').to_owned(),
            token,
            json: args.json,
        })
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.url)).bearer_auth(&self.token)
    }

    /// Sends `request` and returns the JSON answer, or the API's error as the error.
    async fn send(&self, request: RequestBuilder) -> anyhow::Result<Value> {
        let response = request.send().await.with_context(|| {
            format!(
                "cannot reach the admin API at {} (is `sweep run` or `sweep admin` running?)",
                self.url
            )
        })?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        match (body["error"]["message"].as_str(), body["error"]["code"].as_str()) {
            (Some(message), Some(code)) => bail!("{message} ({status}, {code})"),
            _ => bail!("the admin API answered {status}"),
        }
    }

    /// Prints `value` as JSON when `--json` was given; true if it did.
    fn printed_json(&self, value: &Value) -> bool {
        if self.json {
            println!("{}", print::pretty(value));
        }
        self.json
    }
}

/// `?tenant=` for operators acting on a tenant.
fn tenant_query(tenant: &Option<String>) -> Vec<(&'static str, String)> {
    tenant.iter().map(|t| ("tenant", t.clone())).collect()
}

#[derive(Debug, clap::Subcommand)]
pub enum ModuleCommand {
    /// Upload a compiled handler (.wasm) as the new active version of a task type.
    Upload(UploadArgs),
    /// List active modules, or every version of one task type.
    List {
        /// Show this task type's versions.
        task_type: Option<String>,
        /// Every version of every task type, not just the active ones.
        #[arg(long)]
        all: bool,
        /// (Operator) only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Make an uploaded version the active one (rollback or roll forward).
    Activate {
        task_type: String,
        version: i32,
        /// (Operator) the tenant whose module this is.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, clap::Args)]
pub struct UploadArgs {
    /// Task type the module handles.
    pub task_type: String,
    /// The handler: a module built for wasm32-wasip1 or a component built for wasm32-wasip2.
    pub file: PathBuf,
    /// Fuel per task (default: the runner's).
    #[arg(long)]
    pub fuel: Option<u64>,
    /// Wall-clock limit per task, in milliseconds.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Memory limit per task, in MiB.
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Attempts before a task dies (for tasks that do not set their own).
    #[arg(long)]
    pub max_attempts: Option<u64>,
    /// First retry delay in milliseconds (doubles per attempt).
    #[arg(long)]
    pub backoff_base_ms: Option<u64>,
    /// Longest retry delay in milliseconds.
    #[arg(long)]
    pub backoff_cap_ms: Option<u64>,
    /// Most tasks of this type running at once across all runners.
    #[arg(long)]
    pub max_running: Option<u64>,
    /// Tenant secrets the handler receives as environment variables (comma-separated or
    /// repeated; each must exist: `sweep secret set NAME` first).
    #[arg(long, value_delimiter = ',')]
    pub secrets: Vec<String>,
    /// Keep a component's instance after a task that returned cleanly and run up to this
    /// many tasks on it (tasks then share the guest's memory; docs/guests.md). Default for a
    /// component: 1000; 1 gives every task a fresh instance. Not for preview-1 modules.
    #[arg(long)]
    pub reuse: Option<u64>,
    /// (Operator) upload for this tenant instead of `default`.
    #[arg(long)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn module(command: ModuleCommand) -> anyhow::Result<()> {
    match command {
        ModuleCommand::Upload(args) => upload(args).await,
        ModuleCommand::List { task_type, all, tenant, client } => {
            let api = Api::new(client)?;
            let mut query = tenant_query(&tenant);
            let path = match &task_type {
                Some(t) => format!("/v1/modules/{t}"),
                None => {
                    if all {
                        query.push(("all", "true".into()));
                    }
                    "/v1/modules".to_owned()
                }
            };
            let answer = api.send(api.request(Method::GET, &path).query(&query)).await?;
            if !api.printed_json(&answer) {
                print_modules(&answer);
            }
            Ok(())
        }
        ModuleCommand::Activate { task_type, version, tenant, client } => {
            let api = Api::new(client)?;
            let request = api
                .request(Method::POST, &format!("/v1/modules/{task_type}/activate"))
                .query(&tenant_query(&tenant))
                .json(&json!({ "version": version }));
            let answer = api.send(request).await?;
            if !api.printed_json(&answer) {
                println!(
                    "{task_type}: version {} is active (sha256 {})",
                    answer["version"],
                    print::cell(&answer["sha256"])
                );
            }
            Ok(())
        }
    }
}

async fn upload(args: UploadArgs) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let api = Api::new(args.client)?;
    let mut query = tenant_query(&args.tenant);
    for (name, value) in [
        ("fuel", args.fuel),
        ("timeout_ms", args.timeout_ms),
        ("memory_mb", args.memory_mb),
        ("max_attempts", args.max_attempts),
        ("backoff_base_ms", args.backoff_base_ms),
        ("backoff_cap_ms", args.backoff_cap_ms),
        ("max_running", args.max_running),
        ("reuse", args.reuse),
    ] {
        if let Some(v) = value {
            query.push((name, v.to_string()));
        }
    }
    if !args.secrets.is_empty() {
        query.push(("secrets", args.secrets.join(",")));
    }
    let request = api
        .request(Method::PUT, &format!("/v1/modules/{}", args.task_type))
        .query(&query)
        .header(reqwest::header::CONTENT_TYPE, "application/wasm")
        .body(bytes);
    let a = api.send(request).await?;
    if api.printed_json(&a) {
        return Ok(());
    }
    let compiling = a["compile_state"] == "compiling";
    let verb = match (a["created"] == true, compiling) {
        (true, false) => "uploaded",
        (false, false) => "unchanged, re-activated",
        (true, true) => "uploaded, compiling",
        (false, true) => "unchanged, compiling again",
    };
    println!(
        "{verb}: {}/{} version {} ({}, sha256 {})",
        print::cell(&a["tenant"]),
        print::cell(&a["task_type"]),
        a["version"],
        print::bytes(a["size"].as_u64().unwrap_or(0)),
        print::short(&print::cell(&a["sha256"]), 16),
    );
    let l = &a["limits"];
    println!(
        "limits: fuel {}, timeout {}, memory {}, output {}, max_attempts {}",
        l["fuel"],
        print::millis(l["timeout_ms"].as_i64().unwrap_or(0)),
        print::bytes(l["memory_bytes"].as_u64().unwrap_or(0)),
        print::bytes(l["output_bytes"].as_u64().unwrap_or(0)),
        l["max_attempts"],
    );
    if let Some(names) = a["secrets"].as_array().filter(|n| !n.is_empty()) {
        let names: Vec<String> = names.iter().map(print::cell).collect();
        println!("secrets (as environment variables): {}", names.join(", "));
    }
    match a["reuse"].as_i64() {
        Some(1) => println!("instances: a fresh one for every task"),
        Some(tasks) => println!("instances kept: up to {tasks} tasks each"),
        None => {}
    }
    if compiling {
        println!(
            "its compile outlasted the request and goes on: the version becomes active once it \
             is ready (`sweep module list {}` shows its state); until then the previous version \
             runs, and tasks of a type with none wait",
            print::cell(&a["task_type"])
        );
    }
    Ok(())
}

fn print_modules(answer: &Value) {
    let empty = Vec::new();
    let rows: Vec<Vec<String>> = answer["modules"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|m| {
            vec![
                print::cell(&m["tenant"]),
                print::cell(&m["task_type"]),
                print::cell(&m["version"]),
                if m["active"] == true { "*".into() } else { String::new() },
                print::bytes(m["size"].as_u64().unwrap_or(0)),
                print::short(&print::cell(&m["sha256"]), 13),
                print::time(&m["created_at"]),
                secret_names(&m["secrets"]),
                m["reuse"].as_i64().map_or_else(|| "-".to_owned(), |n| n.to_string()),
                compile_state(m),
            ]
        })
        .collect();
    let headers = [
        "TENANT",
        "TASK_TYPE",
        "VERSION",
        "ACTIVE",
        "SIZE",
        "SHA256",
        "CREATED",
        "SECRETS",
        "REUSE",
        "STATE",
    ];
    print::table(&headers, &rows);
}

/// `ready`, `compiling`, or `rejected: <why>`.
fn compile_state(m: &Value) -> String {
    match m["compile_error"].as_str() {
        Some(why) => format!("{}: {why}", print::cell(&m["compile_state"])),
        None => print::cell(&m["compile_state"]),
    }
}

fn secret_names(v: &Value) -> String {
    let names: Vec<String> = v.as_array().into_iter().flatten().map(print::cell).collect();
    if names.is_empty() {
        "-".to_owned()
    } else {
        names.join(",")
    }
}
