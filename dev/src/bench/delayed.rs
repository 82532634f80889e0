//! `sweep-bench fairness --only delayed`: delayed tasks on an idle runner at its defaults.
//!
//! - lateness: tasks enqueued one at a time, each with its own delay (200 ms to 2 s), into an
//!   idle queue; how late each attempt starts after its `run_at` (database clock);
//! - wave: N tasks that all become due at one instant (enqueued 2 s ahead) drained, against
//!   the same N tasks enqueued already due; each rate is N over the time from the moment the
//!   tasks could start (their `run_at`, or the enqueue's commit) to the last start.

use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;
use sweep::{
    config::WorkerConfig,
    queue::{self, ModuleSettings, NewTask},
    sandbox::sha256_hex,
    worker::Worker,
};
use tokio::{sync::oneshot, time::Instant};

use super::{fresh_database, print_percentiles};
use crate::fixtures;

const WAVE_AHEAD: Duration = Duration::from_secs(2);

pub async fn delayed(
    url: &str,
    config: &WorkerConfig,
    delayed: usize,
    wave: usize,
) -> anyhow::Result<()> {
    let store = fresh_database(url).await?;
    let pool = store.pool().clone();
    let noop = crate::modules::empty_module();
    queue::register_module(
        &pool,
        queue::DEFAULT_TENANT,
        "noop",
        &sha256_hex(&noop),
        &noop,
        &ModuleSettings::default(),
    )
    .await?;
    let worker = Worker::new(&store, config.clone())?;
    let (stop, stopped) = oneshot::channel::<()>();
    let runner = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    // Let the runner reach its idle wait before the first enqueue.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Lateness: each task its own delay, spread over 200 ms to 2 s, enqueued 5 ms apart.
    let mut ids = Vec::with_capacity(delayed);
    for i in 0..delayed {
        let delay = 200 + 1_800 * i as u64 / delayed.max(1) as u64;
        let task = NewTask::new("noop", json!({ "i": i })).delay(Duration::from_millis(delay));
        ids.push(queue::enqueue(&pool, task).await?.id);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    wait_drained(&pool, Duration::from_secs(30)).await?;
    let late = fixtures::start_waits(&pool, &ids).await?;

    // The wave, then the same tasks enqueued due, on the same idle runner.
    let due_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar(r#"select now() + $1 * interval '1 millisecond'"#)
            .bind(i64::try_from(WAVE_AHEAD.as_millis())?)
            .fetch_one(&pool)
            .await?;
    let tasks: Vec<NewTask> =
        (0..wave).map(|i| NewTask::new("wave", json!({ "i": i })).run_at(due_at)).collect();
    queue::register_module(
        &pool,
        queue::DEFAULT_TENANT,
        "wave",
        &sha256_hex(&noop),
        &noop,
        &ModuleSettings::default(),
    )
    .await?;
    queue::enqueue_many(&pool, &tasks).await?;
    wait_drained(&pool, WAVE_AHEAD + Duration::from_secs(60)).await?;
    let wave_secs = last_start_after(&pool, "wave", due_at).await?;

    queue::register_module(
        &pool,
        queue::DEFAULT_TENANT,
        "due",
        &sha256_hex(&noop),
        &noop,
        &ModuleSettings::default(),
    )
    .await?;
    let tasks: Vec<NewTask> = (0..wave).map(|i| NewTask::new("due", json!({ "i": i }))).collect();
    queue::enqueue_many(&pool, &tasks).await?;
    let committed: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar(r#"select now()"#).fetch_one(&pool).await?;
    wait_drained(&pool, Duration::from_secs(60)).await?;
    let due_secs = last_start_after(&pool, "due", committed).await?;
    let _ = stop.send(());
    runner.await??;

    println!();
    println!(
        "delayed: {delayed} tasks enqueued 200 ms to 2 s ahead into an idle queue; a wave of \
         {wave} tasks due at one instant against the same enqueued due (empty guest)"
    );
    print_percentiles("  start lateness (started_at - run_at)", late.clone());
    let mut sorted = late;
    sorted.sort_by(f64::total_cmp);
    let (p50, p99) = (
        super::quantile(&sorted, 0.5).unwrap_or(f64::NAN) * 1000.0,
        super::quantile(&sorted, 0.99).unwrap_or(f64::NAN) * 1000.0,
    );
    println!(
        "  target: p50 <= 2 ms, p99 <= 10 ms: {}",
        super::fairness::verdict(p50 <= 2.0 && p99 <= 10.0)
    );
    let (wave_rate, due_rate) = (wave as f64 / wave_secs, wave as f64 / due_secs);
    println!(
        "  wave {wave_rate:.0} tasks/s (from run_at to the last start), enqueued due \
         {due_rate:.0} tasks/s (from the commit): {:.2}x; target >= 0.9x: {}",
        wave_rate / due_rate,
        super::fairness::verdict(wave_rate / due_rate >= 0.9)
    );
    Ok(())
}

async fn wait_drained(pool: &PgPool, limit: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + limit;
    while fixtures::any_unfinished(pool).await? {
        if Instant::now() >= until {
            anyhow::bail!("tasks still unfinished after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Seconds from `from` to the last start of a finished task of `task_type`.
async fn last_start_after(
    pool: &PgPool,
    task_type: &str,
    from: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<f64> {
    let secs: Option<f64> = sqlx::query_scalar(
        r#"select extract(epoch from max(started_at) - $2)::float8
           from sweep.finished_tasks where task_type = $1"#,
    )
    .bind(task_type)
    .bind(from)
    .fetch_one(pool)
    .await?;
    secs.ok_or_else(|| anyhow::anyhow!("no {task_type} task finished"))
}
