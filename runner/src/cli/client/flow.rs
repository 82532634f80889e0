//! Flow-control commands: `sweep queue pause|resume|rate-limit` (a task type of a tenant) and
//! the operator's `sweep tenant pause|resume`, through the admin API.
//!
//! Invariant: as every client command, nothing is checked here that the API does not check.

use reqwest::Method;
use serde_json::Value;

use super::{print, tenant_query, Api, ClientArgs};

#[derive(Debug, clap::Subcommand)]
pub enum QueueCommand {
    /// Pause a task type: claims skip it (enqueues are still accepted, running tasks finish).
    Pause(QueueArgs),
    /// Lift a task type's pause (a pause of its whole tenant stays).
    Resume(QueueArgs),
    /// Limit how fast a task type starts, across all runners (or --clear the limit).
    RateLimit(RateLimitArgs),
}

#[derive(Debug, clap::Args)]
pub struct RateLimitArgs {
    /// Most starts per second on average (may be fractional).
    #[arg(long, required_unless_present = "clear", conflicts_with = "clear")]
    pub rate: Option<f64>,
    /// Most starts at once (default: the rate rounded up, at least 1).
    #[arg(long, conflicts_with = "clear")]
    pub burst: Option<i32>,
    /// Remove the task type's rate limit.
    #[arg(long)]
    pub clear: bool,
    #[command(flatten)]
    pub queue: QueueArgs,
}

#[derive(Debug, clap::Args)]
pub struct QueueArgs {
    pub task_type: String,
    /// (Operator) the tenant whose task type this is (default: `default`).
    #[arg(long)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn queue(command: QueueCommand) -> anyhow::Result<()> {
    let (args, action) = match command {
        QueueCommand::Pause(args) => (args, "pause"),
        QueueCommand::Resume(args) => (args, "resume"),
        QueueCommand::RateLimit(args) => return rate_limit(args).await,
    };
    let api = Api::new(args.client)?;
    let path = format!("/v1/queues/{}/{action}", args.task_type);
    let answer =
        api.send(api.request(Method::POST, &path).query(&tenant_query(&args.tenant))).await?;
    if !api.printed_json(&answer) {
        println!("{}", describe_queue(&answer));
    }
    Ok(())
}

async fn rate_limit(args: RateLimitArgs) -> anyhow::Result<()> {
    let api = Api::new(args.queue.client)?;
    let path = format!("/v1/queues/{}/rate-limit", args.queue.task_type);
    let query = tenant_query(&args.queue.tenant);
    let request = match args.rate {
        Some(rate) if !args.clear => {
            // The API checks the values; this only fills in the default burst.
            let burst = args.burst.unwrap_or_else(|| default_burst(rate));
            let body = serde_json::json!({ "rate_per_sec": rate, "burst": burst });
            api.request(Method::PUT, &path).query(&query).json(&body)
        }
        _ => api.request(Method::DELETE, &path).query(&query),
    };
    let answer = api.send(request).await?;
    if !api.printed_json(&answer) {
        println!("{}", describe_queue(&answer));
    }
    Ok(())
}

/// The rate rounded up, at least 1 (a value the API refuses stays refused there).
fn default_burst(rate: f64) -> i32 {
    if rate.is_finite() && rate >= 1.0 && rate <= f64::from(i32::MAX) {
        rate.ceil() as i32
    } else {
        1
    }
}

/// One line for a queue's flow-control state (a `QueueControl`).
pub fn describe_queue(q: &Value) -> String {
    let mut line = format!("{}/{}: ", print::cell(&q["tenant"]), print::cell(&q["task_type"]));
    if q["paused_at"].is_null() {
        line.push_str("running");
    } else {
        line.push_str(&format!(
            "paused since {} by {}",
            print::time(&q["paused_at"]),
            print::cell(&q["paused_by"])
        ));
    }
    if q["tenant_paused"] == true {
        line.push_str(" (its tenant is paused)");
    }
    if !q["rate_per_sec"].is_null() {
        line.push_str(&format!(
            ", at most {}/s (burst {})",
            print::cell(&q["rate_per_sec"]),
            print::cell(&q["burst"])
        ));
    }
    line
}

/// `sweep tenant pause|resume NAME` (operator token).
pub async fn tenant_pause(name: &str, pause: bool, client: ClientArgs) -> anyhow::Result<()> {
    let api = Api::new(client)?;
    let action = if pause { "pause" } else { "resume" };
    let answer =
        api.send(api.request(Method::POST, &format!("/v1/tenants/{name}/{action}"))).await?;
    if !api.printed_json(&answer) {
        if answer["paused"] == true {
            println!(
                "tenant {}: paused since {} by {}",
                print::cell(&answer["tenant"]),
                print::time(&answer["paused_at"]),
                print::cell(&answer["paused_by"])
            );
        } else {
            println!("tenant {}: running", print::cell(&answer["tenant"]));
        }
    }
    Ok(())
}

/// The flow-control part of `GET /v1/stats` (paused tenants and queues), if any.
pub fn print_controls(stats: &Value) {
    let empty = Vec::new();
    let tenants = stats["paused_tenants"].as_array().unwrap_or(&empty);
    let queues = stats["queues"].as_array().unwrap_or(&empty);
    if tenants.is_empty() && queues.is_empty() {
        return;
    }
    println!();
    for t in tenants {
        println!(
            "tenant {}: paused since {} by {}",
            print::cell(&t["tenant"]),
            print::time(&t["paused_at"]),
            print::cell(&t["paused_by"])
        );
    }
    for q in queues {
        println!("{}", describe_queue(q));
    }
}
