//! Capability commands, through the admin API: `sweep secret set|list|delete`, `sweep usage`
//! and the operator's `sweep tenant egress`.
//!
//! Invariants: as every client command, nothing is checked here that the API does not check;
//! a secret's value is read from a file or stdin, never from an argument (it would be in the
//! shell's history and in `ps`), and never printed.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use reqwest::Method;
use serde_json::{json, Value};

use super::{print, tenant_query, Api, ClientArgs};

#[derive(Debug, clap::Subcommand)]
pub enum SecretCommand {
    /// Set a secret (new or replaced). The value is read from --from-file, else from stdin
    /// (one trailing newline removed); it is stored encrypted and never shown again.
    Set {
        /// The environment variable name the handler sees (MAIL_API_KEY).
        name: String,
        /// Read the value from this file (as is) instead of stdin.
        #[arg(long)]
        from_file: Option<PathBuf>,
        /// (Operator) the tenant whose secret this is (default: `default`).
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List secrets: names and when they were set, never values.
    List {
        /// (Operator) only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete a secret. Modules that name it then fail as `secrets_unavailable` until it is
    /// set again.
    Delete {
        name: String,
        /// (Operator) the tenant whose secret this is (default: `default`).
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn secret(command: SecretCommand) -> anyhow::Result<()> {
    match command {
        SecretCommand::Set { name, from_file, tenant, client } => {
            let value = match from_file {
                Some(path) => std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?,
                None => {
                    let mut value = String::new();
                    std::io::stdin().read_to_string(&mut value).context("reading stdin")?;
                    if value.ends_with('\n') {
                        value.pop();
                        if value.ends_with('\r') {
                            value.pop();
                        }
                    }
                    value
                }
            };
            let api = Api::new(client)?;
            let request = api
                .request(Method::PUT, &format!("/v1/secrets/{name}"))
                .query(&tenant_query(&tenant))
                .json(&json!({ "value": value }));
            let answer = api.send(request).await?;
            if !api.printed_json(&answer) {
                println!(
                    "secret {} of tenant {} set ({} bytes, stored encrypted)",
                    print::cell(&answer["name"]),
                    print::cell(&answer["tenant"]),
                    value.len()
                );
            }
            Ok(())
        }
        SecretCommand::List { tenant, client } => {
            let api = Api::new(client)?;
            let request = api.request(Method::GET, "/v1/secrets").query(&tenant_query(&tenant));
            let answer = api.send(request).await?;
            if !api.printed_json(&answer) {
                let rows: Vec<Vec<String>> = rows(&answer["secrets"])
                    .map(|s| {
                        vec![
                            print::cell(&s["tenant"]),
                            print::cell(&s["name"]),
                            print::time(&s["created_at"]),
                            print::time(&s["updated_at"]),
                        ]
                    })
                    .collect();
                print::table(&["TENANT", "NAME", "CREATED", "UPDATED"], &rows);
            }
            Ok(())
        }
        SecretCommand::Delete { name, tenant, client } => {
            let api = Api::new(client)?;
            let request = api
                .request(Method::DELETE, &format!("/v1/secrets/{name}"))
                .query(&tenant_query(&tenant));
            let answer = api.send(request).await?;
            if !api.printed_json(&answer) {
                println!(
                    "secret {} of tenant {} deleted",
                    print::cell(&answer["name"]),
                    print::cell(&answer["tenant"])
                );
            }
            Ok(())
        }
    }
}

fn rows(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

#[derive(Debug, clap::Args)]
pub struct UsageArgs {
    /// First day, UTC, YYYY-MM-DD (default: the first of the month of --to).
    #[arg(long)]
    pub from: Option<String>,
    /// Last day, UTC, included (default: today).
    #[arg(long)]
    pub to: Option<String>,
    /// Only this task type.
    #[arg(long)]
    pub task_type: Option<String>,
    /// Show each day, not only the totals per tenant and task type.
    #[arg(long)]
    pub days: bool,
    /// (Operator) only this tenant (default: every tenant).
    #[arg(long)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `sweep usage`: totals per tenant and task type over a range of days.
pub async fn usage(args: UsageArgs) -> anyhow::Result<()> {
    let api = Api::new(args.client)?;
    let mut query = tenant_query(&args.tenant);
    for (name, value) in [("from", &args.from), ("to", &args.to), ("task_type", &args.task_type)] {
        if let Some(v) = value {
            query.push((name, v.clone()));
        }
    }
    let answer = api.send(api.request(Method::GET, "/v1/usage").query(&query)).await?;
    if api.printed_json(&answer) {
        return Ok(());
    }
    println!(
        "usage from {} to {} (UTC days)",
        print::cell(&answer["from"]),
        print::cell(&answer["to"])
    );
    let (list, first): (&Value, &[&str]) = if args.days {
        (&answer["days"], &["DAY", "TENANT", "TASK_TYPE"])
    } else {
        (&answer["totals"], &["TENANT", "TASK_TYPE"])
    };
    let n = |v: &Value| v.as_i64().unwrap_or(0);
    let rows: Vec<Vec<String>> = rows(list)
        .map(|u| {
            let mut row = Vec::new();
            if args.days {
                row.push(print::cell(&u["day"]));
            }
            row.extend([
                print::cell(&u["tenant"]),
                print::cell(&u["task_type"]),
                print::cell(&u["attempts"]),
                print::cell(&u["failed"]),
                print::millis(n(&u["wall_ms"])),
                print::cell(&u["fuel"]),
                print::bytes(n(&u["peak_memory_bytes"]).unsigned_abs()),
                format!("{}/{}", n(&u["http_requests"]), n(&u["http_refused"])),
                print::bytes(n(&u["bytes_sent"]).unsigned_abs()),
                print::bytes(n(&u["bytes_received"]).unsigned_abs()),
            ]);
            row
        })
        .collect();
    let mut headers = first.to_vec();
    headers.extend([
        "ATTEMPTS",
        "FAILED",
        "WALL",
        "FUEL",
        "PEAK_MEM",
        "HTTP/REFUSED",
        "SENT",
        "RECEIVED",
    ]);
    print::table(&headers, &rows);
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct EgressArgs {
    pub name: String,
    /// A host the tenant's handlers may send HTTP requests to (repeat it, or separate with
    /// commas): `api.mail.example`, `hooks.example.net:8443`, `*.example.org`, `127.0.0.1:8025`.
    /// Replaces the whole list. Without --allow, --none or a limit: show the policy.
    #[arg(long, value_delimiter = ',')]
    pub allow: Vec<String>,
    /// Allow nothing (the default for every tenant).
    #[arg(long, conflicts_with = "allow")]
    pub none: bool,
    /// Requests one task may send (default: the deployment's, 50).
    #[arg(long)]
    pub max_requests: Option<u32>,
    /// Response body bytes one task may receive (default: 10 MiB).
    #[arg(long)]
    pub max_response_bytes: Option<u64>,
    /// Time one request may take, in milliseconds (default: 30000).
    #[arg(long)]
    pub request_timeout_ms: Option<u64>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `sweep tenant egress NAME [--allow ...]`: show or replace a tenant's egress policy.
pub async fn egress(args: EgressArgs) -> anyhow::Result<()> {
    let api = Api::new(args.client)?;
    let path = format!("/v1/tenants/{}/egress", args.name);
    let sets = !args.allow.is_empty()
        || args.none
        || args.max_requests.is_some()
        || args.max_response_bytes.is_some()
        || args.request_timeout_ms.is_some();
    let request = if sets {
        api.request(Method::PUT, &path).json(&json!({
            "allow": args.allow,
            "max_requests": args.max_requests,
            "max_response_bytes": args.max_response_bytes,
            "request_timeout_ms": args.request_timeout_ms,
        }))
    } else {
        api.request(Method::GET, &path)
    };
    let a = api.send(request).await?;
    if api.printed_json(&a) {
        return Ok(());
    }
    let allow: Vec<String> = rows(&a["allow"]).map(print::cell).collect();
    println!(
        "tenant {}: egress {}",
        print::cell(&a["tenant"]),
        match allow.as_slice() {
            [] => "allows nothing".to_owned(),
            hosts => format!("allows {}", hosts.join(", ")),
        }
    );
    let e = &a["effective"];
    let marked = |field: &str| if a[field].is_null() { " (default)" } else { "" };
    println!(
        "http limits per task: {} requests{}, {} of responses{}, {} per request{}",
        e["max_requests"],
        marked("max_requests"),
        print::bytes(e["max_response_bytes"].as_u64().unwrap_or(0)),
        marked("max_response_bytes"),
        print::millis(e["request_timeout_ms"].as_i64().unwrap_or(0)),
        marked("request_timeout_ms"),
    );
    Ok(())
}
