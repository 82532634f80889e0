//! `sweep-bench claim-scale`: the fair claim's cost against the number of due tenants.
//!
//! For each count of due tenants: a fresh database with that many tenants (each its own
//! queue, tasks spread evenly), `--running` tasks already claimed by another runner (as a
//! runner's claim-ahead buffer holds them), then `--claims` claims of `--batch` tasks, each
//! in a transaction rolled back, so every claim meets the same state. Prints the time per
//! claim as the client sees it and, when the server preloads `pg_stat_statements`, the
//! statements that took the most time. The last database is left in place, for EXPLAIN.

use std::time::Duration;

use sqlx::Connection;
use sweep::{
    queue::{self, NewTask},
    sandbox::sha256_hex,
};
use tokio::time::Instant;

use super::fresh_database;
use crate::fixtures;

#[derive(Debug, clap::Args)]
pub struct ClaimScaleArgs {
    /// Due tenants, one run each.
    #[arg(long, value_delimiter = ',', default_values_t = [10, 100, 1_000, 10_000])]
    pub tenants: Vec<usize>,
    /// Tasks in the table in each run (at least 2 per tenant).
    #[arg(long, default_value_t = 20_000)]
    pub tasks: usize,
    /// Tasks claimed (running) before the timed claims.
    #[arg(long, default_value_t = 1_000)]
    pub running: usize,
    /// Timed claims per run.
    #[arg(long, default_value_t = 200)]
    pub claims: usize,
    /// Tasks each claim asks for.
    #[arg(long, default_value_t = 250)]
    pub batch: usize,
}

pub async fn claim_scale(url: &str, args: &ClaimScaleArgs) -> anyhow::Result<()> {
    println!(
        "claim-scale: claims of {} rolled back, {} running, {} tasks over the due tenants",
        args.batch, args.running, args.tasks
    );
    println!("  {:>8} {:>12} {:>12} {:>14}", "tenants", "ms/claim", "tasks/claim", "us/task");
    for &n in &args.tenants {
        let store = fresh_database(url).await?;
        let pool = store.pool().clone();
        let noop = crate::modules::empty_module();
        fixtures::add_busy_tenants(&pool, "t", n, "noop", &sha256_hex(&noop), &noop).await?;
        let per = (args.tasks / n.max(1)).max(2);
        let tasks: Vec<NewTask> = (0..n * per)
            .map(|i| {
                NewTask::new("noop", serde_json::json!({ "i": i })).tenant(format!("t{}", i % n))
            })
            .collect();
        for chunk in tasks.chunks(10_000) {
            queue::enqueue_many(&pool, chunk).await?;
        }
        let other = uuid::Uuid::new_v4();
        let mut held = 0;
        while held < args.running {
            let got = queue::claim_batch(
                &pool,
                other,
                (args.running - held).min(args.batch),
                &[],
                Duration::from_secs(3600),
            )
            .await?;
            if got.is_empty() {
                break;
            }
            held += got.len();
        }
        fixtures::vacuum_tasks(&pool, true).await?;
        let stats = fixtures::statement_stats_reset(&pool).await;
        let mut conn = pool.acquire().await?;
        let runner = uuid::Uuid::new_v4();
        let (mut total, mut got) = (Duration::ZERO, 0usize);
        for i in 0..args.claims + 5 {
            let mut tx = conn.begin().await?;
            let started = Instant::now();
            let claimed =
                queue::claim_batch(&mut *tx, runner, args.batch, &[], Duration::from_secs(60))
                    .await?;
            let took = started.elapsed();
            tx.rollback().await?;
            // The first few plan the statements and warm the caches.
            if i >= 5 {
                total += took;
                got += claimed.len();
            }
        }
        let ms = total.as_secs_f64() * 1000.0 / args.claims as f64;
        let per_claim = got as f64 / args.claims as f64;
        println!(
            "  {:>8} {:>12.3} {:>12.1} {:>14.1}",
            n,
            ms,
            per_claim,
            ms * 1000.0 / per_claim.max(1.0)
        );
        if stats.is_some() {
            for (calls, total, mean, rows, query) in fixtures::statement_stats_top(&pool, 4).await?
            {
                println!("      {calls:>6} calls {total:>9.1} ms {mean:>8.3} ms/call {rows:>8} rows  {query}");
            }
        }
    }
    Ok(())
}
