//! Client commands on cron schedules: `schedule create|list|show|pause|resume|delete`.

use anyhow::Context;
use reqwest::Method;
use serde_json::{json, Value};

use super::{print, tenant_query, Api, ClientArgs};

#[derive(Debug, clap::Args)]
pub struct ScheduleCreateArgs {
    /// Unique within the tenant.
    pub name: String,
    /// Five fields (minute hour day-of-month month day-of-week) or six (seconds first); quote
    /// it: `'*/5 * * * *'`.
    pub cron: String,
    /// The task type every tick enqueues (the tenant needs a module for it).
    pub task_type: String,
    /// The payload of every tick's task, a JSON object (`-` reads it from stdin). Default `{}`.
    pub payload: Option<String>,
    /// IANA time zone the expression is read in.
    #[arg(long, default_value = "UTC")]
    pub timezone: String,
    /// Higher runs first; negative is deferred work.
    #[arg(long, allow_hyphen_values = true)]
    pub priority: Option<i32>,
    /// Attempts before a tick's task dies (default: the module's, else 5).
    #[arg(long)]
    pub max_attempts: Option<i32>,
    /// `skip`: no task for a tick while the previous one is live; `allow`: one every tick.
    #[arg(long, default_value = "skip")]
    pub overlap: String,
    /// Ticks reached late (all runners were down): `latest` runs the latest once; `skip` none.
    #[arg(long, default_value = "latest")]
    pub catch_up: String,
    /// (Operator) for this tenant instead of `default`.
    #[arg(long)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, clap::Args)]
pub struct ScheduleNameArgs {
    pub name: String,
    /// (Operator) the tenant whose schedule this is (default `default`).
    #[arg(long)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum ScheduleCommand {
    /// Create a cron schedule: one task of a type per tick.
    Create(ScheduleCreateArgs),
    /// List schedules with their next and last run.
    List {
        /// (Operator) only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one schedule.
    Show(ScheduleNameArgs),
    /// Stop a schedule's ticks until it is resumed.
    Pause(ScheduleNameArgs),
    /// Tick again, from the first tick after now.
    Resume(ScheduleNameArgs),
    /// Delete a schedule (the tasks it enqueued stay).
    Delete(ScheduleNameArgs),
}

pub async fn schedule(command: ScheduleCommand) -> anyhow::Result<()> {
    let (api, method, path, query, body) = match command {
        ScheduleCommand::Create(args) => {
            let payload: Value = match args.payload.as_deref() {
                None => json!({}),
                Some("-") => serde_json::from_reader(std::io::stdin().lock())
                    .context("reading the payload from stdin")?,
                Some(text) => {
                    serde_json::from_str(text).context("the payload is not valid JSON")?
                }
            };
            let mut body = json!({
                "name": args.name,
                "cron": args.cron,
                "timezone": args.timezone,
                "task_type": args.task_type,
                "payload": payload,
                "overlap": args.overlap,
                "catch_up": args.catch_up,
            });
            if let Some(p) = args.priority {
                body["priority"] = p.into();
            }
            if let Some(m) = args.max_attempts {
                body["max_attempts"] = m.into();
            }
            let query = tenant_query(&args.tenant);
            (Api::new(args.client)?, Method::POST, "/v1/schedules".to_owned(), query, Some(body))
        }
        ScheduleCommand::List { tenant, client } => {
            let api = Api::new(client)?;
            let query = tenant_query(&tenant);
            let list = api.send(api.request(Method::GET, "/v1/schedules").query(&query)).await?;
            if !api.printed_json(&list) {
                print_schedules(&list);
            }
            return Ok(());
        }
        ScheduleCommand::Show(a) => named(a, Method::GET, "")?,
        ScheduleCommand::Pause(a) => named(a, Method::POST, "/pause")?,
        ScheduleCommand::Resume(a) => named(a, Method::POST, "/resume")?,
        ScheduleCommand::Delete(a) => named(a, Method::DELETE, "")?,
    };
    let deleted = method == Method::DELETE;
    let mut request = api.request(method, &path).query(&query);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let s = api.send(request).await?;
    if !api.printed_json(&s) {
        if deleted {
            println!("schedule {} deleted", print::cell(&s["name"]));
        } else {
            print_schedule(&s);
        }
    }
    Ok(())
}

type Call = (Api, Method, String, Vec<(&'static str, String)>, Option<Value>);

fn named(args: ScheduleNameArgs, method: Method, suffix: &str) -> anyhow::Result<Call> {
    let path = format!("/v1/schedules/{}{suffix}", args.name);
    Ok((Api::new(args.client)?, method, path, tenant_query(&args.tenant), None))
}

fn print_schedule(s: &Value) {
    let state = if s["paused"] == true { "paused" } else { "active" };
    println!("schedule {}: {state}", print::cell(&s["name"]));
    for key in [
        "tenant",
        "cron",
        "timezone",
        "task_type",
        "priority",
        "max_attempts",
        "overlap",
        "catch_up",
        "next_run_at",
        "last_run_at",
        "last_task_id",
        "skipped_ticks",
        "paused_at",
        "created_at",
    ] {
        if let Some(v) = s.get(key).filter(|v| !v.is_null()) {
            println!("  {key:<14}{}", print::cell(v));
        }
    }
    println!("  payload       {}", s["payload"]);
}

/// The schedules table (also under `sweep stats`).
pub(super) fn print_schedules(answer: &Value) {
    let empty = Vec::new();
    let rows: Vec<Vec<String>> = answer["schedules"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|s| {
            vec![
                print::cell(&s["tenant"]),
                print::cell(&s["name"]),
                print::cell(&s["cron"]),
                print::cell(&s["timezone"]),
                print::cell(&s["task_type"]),
                if s["paused"] == true { "paused".into() } else { "active".into() },
                print::time(&s["next_run_at"]),
                print::time(&s["last_run_at"]),
                print::cell(&s["last_task_id"]),
            ]
        })
        .collect();
    print::table(
        &[
            "TENANT",
            "NAME",
            "CRON",
            "TIMEZONE",
            "TASK_TYPE",
            "STATE",
            "NEXT_RUN",
            "LAST_RUN",
            "LAST_TASK",
        ],
        &rows,
    );
}
