//! `sweep-bench stats`: `GET /v1/stats` against a long retained history.
//!
//! A fresh database with `--finished` succeeded tasks spread over the last days, `--tenants`
//! tenants and `--types` task types each, a backlog of live tasks, dead letters and an hour of
//! per-minute counters for every task type; then `--calls` calls of `GET /v1/stats` through
//! the admin API in this process, one at a time, as the operator (every tenant) and as one
//! tenant. Prints their latency percentiles against the target (p99 under 50 ms at
//! 10,000,000 finished tasks).

use anyhow::{bail, Context};
use serde_json::json;
use sweep::{
    admin::{self, AdminConfig, AdminState},
    queue::{self, NewTask, Role, Store, TenantCaps},
    sandbox::{Sandbox, SandboxConfig},
};
use tokio::{sync::oneshot, time::Instant};

use super::{fairness::verdict, fresh_database, quantile};
use crate::fixtures;

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// Succeeded tasks in the history.
    #[arg(long, default_value_t = 10_000_000)]
    pub finished: usize,
    /// Tenants the history, the backlog and the dead letters are spread over.
    #[arg(long, default_value_t = 100)]
    pub tenants: usize,
    /// Task types per tenant.
    #[arg(long, default_value_t = 10)]
    pub types: usize,
    /// Live (pending) tasks.
    #[arg(long, default_value_t = 20_000)]
    pub live: usize,
    /// Dead tasks.
    #[arg(long, default_value_t = 10_000)]
    pub dead: usize,
    /// Timed calls per caller.
    #[arg(long, default_value_t = 200)]
    pub calls: usize,
}

const OPERATOR: &str = "sweep-bench-operator-token";
const TARGET_P99_MS: f64 = 50.0;

pub async fn stats(url: &str, args: &StatsArgs) -> anyhow::Result<()> {
    if args.tenants == 0 || args.types == 0 || args.calls == 0 {
        bail!("--tenants, --types and --calls must be at least 1");
    }
    let store = fresh_database(url).await?;
    let pool = store.pool().clone();
    let mut tenants = Vec::with_capacity(args.tenants);
    let mut first_token = None;
    for i in 0..args.tenants {
        let name = format!("t{i}");
        let (_, token) = admin::create_tenant(&pool, &name, &TenantCaps::default()).await?;
        first_token.get_or_insert(token);
        tenants.push(name);
    }
    let types: Vec<String> = (0..args.types).map(|i| format!("type{i}")).collect();
    let started = Instant::now();
    fixtures::fill_finished_among(&pool, &tenants, &types, args.finished).await?;
    fixtures::fill_dead_among(&pool, &tenants, &types, args.dead).await?;
    fixtures::fill_minutes_among(&pool, &tenants, &types).await?;
    let live: Vec<NewTask> = (0..args.live)
        .map(|i| {
            NewTask::new(types[(i / tenants.len()) % types.len()].clone(), json!({ "i": i }))
                .tenant(tenants[i % tenants.len()].clone())
        })
        .collect();
    for chunk in live.chunks(10_000) {
        queue::enqueue_many(&pool, chunk).await?;
    }
    // What a runner's maintenance does within seconds of the fill.
    queue::fold_kept_counts(&pool).await?;
    fixtures::vacuum_tasks(&pool, true).await?;
    println!(
        "stats: {} finished, {} live, {} dead over {} tenants x {} types (filled in {:.0} s)",
        args.finished,
        args.live,
        args.dead,
        args.tenants,
        args.types,
        started.elapsed().as_secs_f64()
    );

    let admin_store = Store::open(url, Role::Admin, 4).await.context("opening the admin store")?;
    let config =
        AdminConfig { operator_token: Some(OPERATOR.to_owned()), ..AdminConfig::default() };
    let state = AdminState::new(&admin_store, Sandbox::new(SandboxConfig::default())?, config)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api_url = format!("http://{}/v1/stats", listener.local_addr()?);
    let (stop_api, api_stopped) = oneshot::channel::<()>();
    let api = tokio::spawn(admin::serve_on(listener, state, async {
        let _ = api_stopped.await;
    }));
    let client = reqwest::Client::new();
    let tenant_token = first_token.unwrap_or_default();
    let expected_rows = args.tenants * args.types;
    println!(
        "  {:<22} {:>6} {:>10} {:>10} {:>10} {:>10}",
        "caller", "types", "p50", "p95", "p99", "max"
    );
    let mut worst_p99: f64 = 0.0;
    for (caller, token, rows) in
        [("operator", OPERATOR, expected_rows), ("one tenant", tenant_token.as_str(), args.types)]
    {
        let mut took = Vec::with_capacity(args.calls);
        for i in 0..args.calls + 5 {
            let start = Instant::now();
            let answer = client.get(&api_url).bearer_auth(token).send().await?;
            let status = answer.status();
            let body: serde_json::Value = answer.json().await?;
            let elapsed = start.elapsed();
            let got = body["types"].as_array().map_or(0, Vec::len);
            if !status.is_success() || got != rows {
                bail!("{caller}: {status}, {got} task types (expected {rows}): {body}");
            }
            // The first few plan the statement and warm the caches.
            if i >= 5 {
                took.push(elapsed.as_secs_f64() * 1000.0);
            }
        }
        took.sort_by(f64::total_cmp);
        let at = |q| quantile(&took, q).unwrap_or(f64::NAN);
        worst_p99 = worst_p99.max(at(0.99));
        println!(
            "  {:<22} {:>6} {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>8.2}ms",
            caller,
            rows,
            at(0.5),
            at(0.95),
            at(0.99),
            took.last().copied().unwrap_or(f64::NAN)
        );
    }
    println!(
        "  target: p99 < {TARGET_P99_MS} ms (at 10,000,000 finished): {:.2} ms {}",
        worst_p99,
        verdict(worst_p99 < TARGET_P99_MS)
    );
    let _ = stop_api.send(());
    api.await??;
    admin_store.close().await;
    Ok(())
}
