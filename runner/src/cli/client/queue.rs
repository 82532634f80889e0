//! Client commands on tasks: `enqueue`, `task show|cancel|cancel-all`, `stats`,
//! `dead list|requeue`.

use anyhow::Context;
use reqwest::Method;
use serde_json::{json, Value};

use sweep::queue::TaskState;

use super::{print, tenant_query, Api, ClientArgs};

#[derive(Debug, clap::Args)]
pub struct EnqueueArgs {
    pub task_type: String,
    /// The payload, a JSON object (`-` reads it from stdin). Default `{}`.
    pub payload: Option<String>,
    /// Higher runs first; negative is deferred work.
    #[arg(long, allow_hyphen_values = true)]
    pub priority: Option<i32>,
    /// Run no sooner than this many milliseconds from now.
    #[arg(long, conflicts_with = "run_at")]
    pub delay_ms: Option<u64>,
    /// Run no sooner than this RFC 3339 time.
    #[arg(long)]
    pub run_at: Option<String>,
    /// Attempts before the task dies (default: the module's, else 5).
    #[arg(long)]
    pub max_attempts: Option<i32>,
    /// While a task with this key is live, enqueueing the key again returns that task.
    #[arg(long)]
    pub dedup_key: Option<String>,
    /// Wait for these tasks (ids, comma-separated) to end first; the task is `blocked` until
    /// then and gets their results in its payload's `$parents`.
    #[arg(long, value_delimiter = ',')]
    pub after: Vec<i64>,
    /// When a task it waits for ends dead or cancelled: `cancel` (default) or `run` anyway.
    #[arg(long, value_parser = ["cancel", "run"])]
    pub on_parent_failure: Option<String>,
    /// (Operator) enqueue for this tenant instead of `default`.
    #[arg(long)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn enqueue(args: EnqueueArgs) -> anyhow::Result<()> {
    let payload: Value = match args.payload.as_deref() {
        None => json!({}),
        Some("-") => serde_json::from_reader(std::io::stdin().lock())
            .context("reading the payload from stdin")?,
        Some(text) => serde_json::from_str(text).context("the payload is not valid JSON")?,
    };
    let mut body = json!({ "task_type": args.task_type, "payload": payload });
    for (key, value) in [
        ("priority", args.priority.map(Value::from)),
        ("delay_ms", args.delay_ms.map(Value::from)),
        ("run_at", args.run_at.map(Value::from)),
        ("max_attempts", args.max_attempts.map(Value::from)),
        ("dedup_key", args.dedup_key.map(Value::from)),
        ("after", (!args.after.is_empty()).then(|| Value::from(args.after.clone()))),
        ("on_parent_failure", args.on_parent_failure.map(Value::from)),
    ] {
        if let Some(v) = value {
            body[key] = v;
        }
    }
    let api = Api::new(args.client)?;
    let request =
        api.request(Method::POST, "/v1/tasks").query(&tenant_query(&args.tenant)).json(&body);
    let a = api.send(request).await?;
    if !api.printed_json(&a) {
        if a["created"] == true {
            println!("enqueued task {}", a["id"]);
        } else {
            println!("task {} already holds this dedup key; nothing new was enqueued", a["id"]);
        }
    }
    Ok(())
}

#[derive(Debug, clap::Subcommand)]
pub enum TaskCommand {
    /// Show a task: state, attempts, error history, result.
    Show {
        id: i64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel a task: a pending or retrying one at once; a running one is stopped by its
    /// runner and ends cancelled.
    Cancel {
        id: i64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel every live task of a task type (waiting ones at once, running ones stopped).
    CancelAll {
        task_type: String,
        /// Only tasks in this state: pending, retrying or running.
        #[arg(long)]
        state: Option<String>,
        /// (Operator) the tenant whose tasks to cancel (default: `default`).
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn task(command: TaskCommand) -> anyhow::Result<()> {
    let (id, client, path) = match command {
        TaskCommand::Show { id, client } => (id, client, format!("/v1/tasks/{id}")),
        TaskCommand::Cancel { id, client } => (id, client, format!("/v1/tasks/{id}/cancel")),
        TaskCommand::CancelAll { task_type, state, tenant, client } => {
            return cancel_all(task_type, state, tenant, client).await
        }
    };
    let api = Api::new(client)?;
    let method = if path.ends_with("/cancel") { Method::POST } else { Method::GET };
    let t = api.send(api.request(method.clone(), &path)).await?;
    if !api.printed_json(&t) {
        if method == Method::POST && !t["cancel_requested_at"].is_null() {
            println!(
                "cancel requested: task {id} is running (attempt {}); its runner is stopping it \
                 and it will end cancelled",
                print::cell(&t["attempts"])
            );
        }
        print_task(id, &t);
    }
    Ok(())
}

async fn cancel_all(
    task_type: String,
    state: Option<String>,
    tenant: Option<String>,
    client: ClientArgs,
) -> anyhow::Result<()> {
    let mut body = json!({ "task_type": task_type });
    if let Some(state) = state {
        body["state"] = Value::from(state);
    }
    let api = Api::new(client)?;
    let request =
        api.request(Method::POST, "/v1/tasks/cancel").query(&tenant_query(&tenant)).json(&body);
    let a = api.send(request).await?;
    if !api.printed_json(&a) {
        println!(
            "cancelled {} waiting tasks; asked {} running tasks to stop (each ends cancelled)",
            print::cell(&a["cancelled"]),
            print::cell(&a["cancel_requested"])
        );
    }
    Ok(())
}

fn print_task(id: i64, t: &Value) {
    println!("task {id}: {}", print::cell(&t["state"]));
    for key in [
        "tenant",
        "task_type",
        "priority",
        "attempts",
        "max_attempts",
        "run_at",
        "started_at",
        "finished_at",
        "cancel_requested_at",
        "blocked_on",
        "dedup_key",
        "module_sha256",
        "created_at",
    ] {
        if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
            println!("  {key:<14}{}", print::cell(v));
        }
    }
    println!("  payload       {}", t["payload"]);
    let empty = Vec::new();
    let errors = t["errors"].as_array().unwrap_or(&empty);
    if !errors.is_empty() {
        println!("errors:");
        for e in errors {
            println!(
                "  attempt {} {}: {}",
                print::cell(&e["attempt"]),
                print::cell(&e["kind"]),
                print::short(&print::cell(&e["message"]), 200)
            );
        }
    }
    if !t["result"].is_null() {
        println!("result:\n{}", print::pretty(&t["result"]));
    }
}

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// (Operator) only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn stats(args: StatsArgs) -> anyhow::Result<()> {
    let api = Api::new(args.client)?;
    let s =
        api.send(api.request(Method::GET, "/v1/stats").query(&tenant_query(&args.tenant))).await?;
    if api.printed_json(&s) {
        return Ok(());
    }
    let empty = Vec::new();
    let rows: Vec<Vec<String>> = s["types"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|t| {
            let mut row: Vec<String> = ["tenant", "task_type"]
                .into_iter()
                .chain(TaskState::ALL.into_iter().map(TaskState::as_str))
                .map(|k| print::cell(&t[k]))
                .collect();
            row.push(print::millis(t["oldest_due_ms"].as_i64().unwrap_or(0)));
            row.push(print::cell(&t["failures_last_hour"]));
            row.push(print::cell(&t["completed_last_minute"]));
            row
        })
        .collect();
    print::table(
        &[
            "TENANT",
            "TASK_TYPE",
            "PENDING",
            "RUNNING",
            "RETRYING",
            "SUCCEEDED",
            "CANCELLED",
            "DEAD",
            "OLDEST_DUE",
            "FAILED/1H",
            "DONE/1M",
        ],
        &rows,
    );
    let runners: Vec<Vec<String>> = s["runners"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|r| {
            vec![
                print::cell(&r["id"]),
                print::cell(r.get("host").unwrap_or(&Value::Null)),
                print::cell(r.get("pid").unwrap_or(&Value::Null)),
                print::time(&r["started_at"]),
                print::millis(r["heartbeat_age_ms"].as_i64().unwrap_or(0)),
            ]
        })
        .collect();
    println!();
    print::table(&["RUNNER", "HOST", "PID", "STARTED", "HEARTBEAT_AGE"], &runners);
    if s["schedules"].as_array().is_some_and(|a| !a.is_empty()) {
        println!();
        super::schedule::print_schedules(&s);
    }
    super::flow::print_controls(&s);
    Ok(())
}

#[derive(Debug, clap::Subcommand)]
pub enum DeadCommand {
    /// List dead tasks in id order, a page at a time.
    List {
        /// Only this task type.
        #[arg(long)]
        task_type: Option<String>,
        /// Start after this task id (the previous page's `next`).
        #[arg(long)]
        after: Option<u64>,
        /// Page size (at most 1000).
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// (Operator) only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Put a dead task back in the queue (attempts reset, history kept).
    Requeue {
        id: i64,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn dead(command: DeadCommand) -> anyhow::Result<()> {
    match command {
        DeadCommand::List { task_type, after, limit, tenant, client } => {
            let api = Api::new(client)?;
            let mut query = tenant_query(&tenant);
            query.push(("limit", limit.to_string()));
            if let Some(t) = task_type {
                query.push(("task_type", t));
            }
            if let Some(a) = after {
                query.push(("after", a.to_string()));
            }
            let page = api.send(api.request(Method::GET, "/v1/dead").query(&query)).await?;
            if api.printed_json(&page) {
                return Ok(());
            }
            let empty = Vec::new();
            let rows: Vec<Vec<String>> = page["tasks"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .map(|t| {
                    vec![
                        print::cell(&t["id"]),
                        print::cell(&t["tenant"]),
                        print::cell(&t["task_type"]),
                        print::cell(&t["attempts"]),
                        print::cell(&t["reason"]),
                        print::time(&t["died_at"]),
                        print::short(&print::cell(&t["last_error"]), 60),
                    ]
                })
                .collect();
            print::table(
                &["ID", "TENANT", "TASK_TYPE", "ATTEMPTS", "REASON", "DIED", "LAST_ERROR"],
                &rows,
            );
            if !page["next_after"].is_null() {
                println!("more: --after {}", page["next_after"]);
            }
            Ok(())
        }
        DeadCommand::Requeue { id, client } => {
            let api = Api::new(client)?;
            let t = api.send(api.request(Method::POST, &format!("/v1/dead/{id}/requeue"))).await?;
            if !api.printed_json(&t) {
                println!("task {id} requeued: {}", print::cell(&t["state"]));
            }
            Ok(())
        }
    }
}
