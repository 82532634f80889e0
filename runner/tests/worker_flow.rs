//! Flow control with real runners on one database: claims on two runners skip a paused task
//! type while they run the other type's tasks enqueued beside it, and run it once resumed;
//! three runners together keep a rate limit, counted from the tasks' start times. Verdicts
//! come from the database, polled with a deadline.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::{
    queue::{self, ModuleSettings, NewTask, RateLimit},
    sandbox::sha256_hex,
};

const DEADLINE: Duration = Duration::from_secs(60);

async fn register_empty(pool: &PgPool, task_type: &str) {
    let bytes = sweep_dev::modules::empty_module();
    let sha = sha256_hex(&bytes);
    queue::register_module(pool, "default", task_type, &sha, &bytes, &ModuleSettings::default())
        .await
        .expect("register");
}

/// Tasks of `task_type` that succeeded, and those that ever started (live or finished).
async fn progress(pool: &PgPool, task_type: &str) -> (i64, i64) {
    sqlx::query_as(
        r#"
        select count(*) filter (where state = 'succeeded'),
               count(*) filter (where started_at is not null)
        from (select state::text, started_at from sweep.tasks where task_type = $1
              union all
              select state::text, started_at from sweep.finished_tasks where task_type = $1) t
        "#,
    )
    .bind(task_type)
    .fetch_one(pool)
    .await
    .expect("progress")
}

async fn wait_succeeded(pool: &PgPool, task_type: &str, n: i64) {
    let until = Instant::now() + DEADLINE;
    loop {
        if progress(pool, task_type).await.0 >= n {
            return;
        }
        assert!(Instant::now() < until, "{task_type}: {n} tasks did not succeed in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn two_runners_skip_a_paused_type_and_run_it_once_resumed(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    register_empty(&pool, "held").await;
    register_empty(&pool, "free").await;
    queue::pause_queue(&pool, "default", "held", "operator").await.expect("pause");
    let runners: Vec<_> = (0..2).map(|_| start_worker(&db, test_config())).collect();

    // Interleaved and equally due: a claim that ignored the pause would share its slots
    // between the two types (fair share), so `held` tasks would start beside `free` ones.
    let tasks: Vec<NewTask> = (0..60)
        .map(|i| NewTask::new(if i % 2 == 0 { "held" } else { "free" }, json!({ "i": i })))
        .collect();
    queue::enqueue_many(&pool, &tasks).await.expect("enqueues are accepted while paused");
    wait_succeeded(&pool, "free", 30).await;
    assert_eq!(progress(&pool, "held").await, (0, 0), "a paused task started");

    queue::resume_queue(&pool, "default", "held").await.expect("resume");
    wait_succeeded(&pool, "held", 30).await;
    for runner in runners {
        runner.stop().await;
    }
    assert_eq!(progress(&pool, "held").await, (30, 30));
}

#[sqlx::test(migrations = false)]
async fn three_runners_together_keep_a_rate_limit(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    register_empty(&pool, "metered").await;
    let (rate, burst) = (40.0, 5);
    let limit = RateLimit { rate_per_sec: rate, burst };
    queue::set_rate_limit(&pool, "default", "metered", Some(limit)).await.expect("limit");
    let tasks: Vec<NewTask> = (0..80).map(|i| NewTask::new("metered", json!({ "i": i }))).collect();
    queue::enqueue_many(&pool, &tasks).await.expect("enqueue");
    let runners: Vec<_> = (0..3).map(|_| start_worker(&db, test_config())).collect();
    wait_succeeded(&pool, "metered", 80).await;
    for runner in runners {
        runner.stop().await;
    }

    // Seconds since the first start, by the database's clock (the bucket's).
    let starts: Vec<f64> = sqlx::query_scalar(
        r#"
        select extract(epoch from started_at - min(started_at) over ())::float8
        from sweep.finished_tasks where task_type = 'metered' order by started_at
        "#,
    )
    .fetch_all(&pool)
    .await
    .expect("starts");
    assert_eq!(starts.len(), 80);
    // In every window [starts[i], starts[j]] at most burst + rate * length tasks started.
    let mut worst = f64::MIN;
    for i in 0..starts.len() {
        for j in i..starts.len() {
            let allowed = f64::from(burst) + rate * (starts[j] - starts[i]);
            worst = worst.max((j - i + 1) as f64 - allowed);
        }
    }
    let span = starts.last().copied().unwrap_or_default();
    let ceiling = f64::from(burst) + rate * span;
    eprintln!(
        "80 starts in {span:.3} s on 3 runners: {:.1}% of the ceiling, worst window {worst:+.3}",
        100.0 * 80.0 / ceiling
    );
    assert!(worst <= 1e-6, "a window held {worst:.3} starts more than the bucket allows");
}
