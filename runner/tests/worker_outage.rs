//! Runners across Postgres outages, on a server of the test's own: a task that finishes while
//! the database is away is recorded as finished once it is back (not rescued and run again);
//! past the report hold the runner gives its reports up and lets the leases lapse, so the tasks
//! run again; a lease the runner no longer holds is not renewed.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::{
    config::WorkerConfig,
    queue::{self, FailureKind, ModuleSettings, NewTask, TaskId, TaskState},
    worker::Worker,
};
use sweep_dev::pg::{PrivatePostgres, StopMode};

const LEASE: Duration = Duration::from_secs(3);
/// Longer than the lease, so every lease has expired by the time the server is back, and far
/// longer than the tasks, which finish while it is away.
const OUTAGE: Duration = Duration::from_secs(6);
/// Longer than stopping the server takes (so they finish while it is away, not before).
const TASK_MS: u64 = 2000;

fn config() -> WorkerConfig {
    let mut c = WorkerConfig { lease: LEASE, ..test_config() };
    c.maintenance.reaper_interval = Duration::from_millis(100);
    c
}

async fn server() -> (PrivatePostgres, Stores) {
    let pg = tokio::task::spawn_blocking(|| PrivatePostgres::start().expect("private postgres"))
        .await
        .unwrap();
    let db = migrated(pg.create_database("outage").await.unwrap()).await;
    register(&db.pool(), "nap", "sleep", ModuleSettings::default()).await;
    (pg, db)
}

async fn outage(pg: &PrivatePostgres, length: Duration) {
    tokio::task::block_in_place(|| pg.stop_server(StopMode::Fast)).expect("stopping postgres");
    tokio::time::sleep(length).await;
    tokio::task::block_in_place(|| pg.start_server()).expect("starting postgres");
}

async fn enqueue_naps(db: &Stores, n: usize) -> Vec<TaskId> {
    let tasks: Vec<NewTask> =
        (0..n).map(|i| NewTask::new("nap", json!({ "sleep_ms": TASK_MS, "n": i }))).collect();
    queue::enqueue_many(&db.pool(), &tasks).await.unwrap().into_iter().map(|e| e.id).collect()
}

/// Runs one short nap to its end, so the module is compiled and the task type's capabilities
/// are cached (for the runner's `capabilities_ttl`: set it longer than the test). Without it,
/// a claimed task's first run reads both from the database: "running" in the table would not
/// mean its guest had started, and a task that waited out the outage for those reads would
/// start late and be reported in time, which is not what these tests are about.
async fn warm_up(db: &Stores) {
    let task = NewTask::new("nap", json!({ "sleep_ms": 0 }));
    let id = queue::enqueue(&db.pool(), task).await.unwrap().id;
    assert_eq!(wait_settled(&db.pool(), id).await.state, TaskState::Succeeded);
}

async fn wait_running(db: &Stores, ids: &[TaskId]) {
    for &id in ids {
        wait_for(&db.pool(), id, "running", |t| t.state == TaskState::Running).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_finishes_during_an_outage_is_recorded_as_finished() {
    let (pg, db) = server().await;
    // Two runners, so one's reaper could rescue the other's leases when the server is back.
    let (a, b) = (start_worker(&db, config()), start_worker(&db, config()));
    let ids = enqueue_naps(&db, 8).await;
    wait_running(&db, &ids).await;

    outage(&pg, OUTAGE).await;
    // Right after the restart the leases look expired to any reaper; one that reconnected
    // first (this test's) must leave them to their runners.
    let rescued = queue::reap_expired(&db.pool(), uuid::Uuid::new_v4(), 100, config().retry, LEASE)
        .await
        .unwrap();
    assert!(rescued.retrying.is_empty() && rescued.dead.is_empty(), "{rescued:?}");

    for &id in &ids {
        let t = wait_settled(&db.pool(), id).await;
        assert_eq!(t.state, TaskState::Succeeded, "{t:#?}");
        assert_eq!(t.attempts, 1, "run once, not rescued: {t:#?}");
        assert!(error_kinds(&t).is_empty(), "{t:#?}");
        assert_eq!(t.result, Some(json!({ "slept_ms": TASK_MS })));
    }
    // The premise: the reports were written after the restart, not before the server stopped.
    let early: i64 = sqlx::query_scalar(
        "select count(*) from sweep.finished_tasks where finished_at < pg_postmaster_start_time()",
    )
    .fetch_one(&db.pool())
    .await
    .unwrap();
    assert_eq!(early, 0, "tasks finished before the outage began");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_past_the_hold_are_given_up_and_their_tasks_run_again() {
    let (pg, db) = server().await;
    let config = WorkerConfig {
        report_hold: Duration::from_millis(500),
        capabilities_ttl: Duration::from_secs(600),
        ..config()
    };
    let runner = start_worker(&db, config);
    warm_up(&db).await;
    let ids = enqueue_naps(&db, 4).await;
    wait_running(&db, &ids).await;

    outage(&pg, OUTAGE).await;

    for &id in &ids {
        let t = wait_settled(&db.pool(), id).await;
        assert_eq!(t.state, TaskState::Succeeded, "{t:#?}");
        assert_eq!(error_kinds(&t), vec![FailureKind::LeaseExpired], "{t:#?}");
        assert_eq!(t.attempts, 2);
    }
    runner.stop().await;
}

#[sqlx::test(migrations = false)]
async fn a_lease_the_runner_no_longer_holds_lapses(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    register(&pool, "t", "noop", ModuleSettings::default()).await;
    let worker = Worker::new(&db.runner, config()).unwrap();
    // Claimed under the runner's id but never handed to it: as a task whose report the runner
    // gave up. Its heartbeats must not keep the lease alive.
    let id = queue::enqueue(&pool, task("t", 1)).await.unwrap().id;
    let orphan = queue::claim_batch(&pool, worker.id(), 1, &[], LEASE).await.unwrap();
    assert_eq!(orphan[0].id, id);
    let running = run_worker(worker);

    let t = wait_settled(&pool, id).await;
    assert_eq!(t.state, TaskState::Succeeded, "{t:#?}");
    assert_eq!(error_kinds(&t), vec![FailureKind::LeaseExpired]);
    running.stop().await;
}
