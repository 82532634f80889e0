//! A runner's life around its tasks: runaway guests cannot starve a healthy task, a runner
//! killed mid-task has its work finished by another, and a graceful stop hands back what it
//! could not finish.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::{
    config::MaintenanceConfig,
    queue::{self, ModuleSettings, NewTask, TaskState},
};

fn running(t: &queue::TaskView) -> bool {
    t.state == TaskState::Running
}

#[sqlx::test(migrations = false)]
async fn runaway_guests_do_not_starve_a_healthy_task(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    // Limits far beyond the test's life: only the runner's fairness lets the healthy task in.
    let long = ModuleSettings {
        fuel: Some(200_000_000_000),
        timeout_ms: Some(120_000),
        ..Default::default()
    };
    register(&pool, "spin", "spinloop", long).await;
    register(&pool, "nap", "sleep", long).await;
    register(&pool, "wordcount", "wordcount", ModuleSettings::default()).await;
    let config = sweep::config::WorkerConfig {
        concurrency: 3,
        grace_period: Duration::from_millis(100),
        ..test_config()
    };
    let runner = start_worker(&db, config);

    let spin = queue::enqueue(&pool, NewTask::new("spin", json!({}))).await.unwrap().id;
    let nap = queue::enqueue(&pool, NewTask::new("nap", json!({}))).await.unwrap().id;
    wait_for(&pool, spin, "to run", running).await;
    wait_for(&pool, nap, "to run", running).await;

    let healthy = queue::enqueue(&pool, NewTask::new("wordcount", json!({"text": "still here"})))
        .await
        .unwrap()
        .id;
    let t = wait_settled(&pool, healthy).await;
    assert_eq!(t.state, TaskState::Succeeded);
    assert_eq!(state(&pool, spin).await, TaskState::Running, "the spinner still holds its slot");
    assert_eq!(state(&pool, nap).await, TaskState::Running, "the sleeper still holds its slot");

    // Past the grace period both are handed back, uncounted.
    let summary = runner.stop().await;
    assert_eq!(summary.released, 2);
    for id in [spin, nap] {
        let t = show(&pool, id).await;
        assert_eq!((t.state, t.attempts), (TaskState::Pending, 0));
    }
}

#[sqlx::test(migrations = false)]
async fn a_runner_killed_mid_task_has_its_task_finished_by_another(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    register(
        &pool,
        "nap",
        "sleep",
        ModuleSettings { timeout_ms: Some(120_000), ..Default::default() },
    )
    .await;
    let id =
        queue::enqueue(&pool, NewTask::new("nap", json!({"wake_on_attempt": 2}))).await.unwrap().id;

    // A real `sweep run` process takes the task and hangs in it.
    let name: String =
        sqlx::query_scalar("select current_database()").fetch_one(&pool).await.unwrap();
    let url = sweep_dev::db::database_url(&name);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sweep"))
        .args([
            "run",
            "--no-admin", // no port to collide with anything else on the machine
            "--database-url",
            &url,
            "--lease-secs",
            "3",
            "--poll-ms",
            "50",
            "--concurrency",
            "2",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn sweep run");
    let t = wait_for(&pool, id, "to run", running).await;
    assert_eq!(t.attempts, 1);

    child.kill().await.expect("SIGKILL"); // no chance to hand anything back
    child.wait().await.expect("reaped");
    assert_eq!(
        state(&pool, id).await,
        TaskState::Running,
        "the dead runner's lease is still there"
    );

    let config = sweep::config::WorkerConfig {
        maintenance: MaintenanceConfig {
            reaper_interval: Duration::from_millis(100),
            ..MaintenanceConfig::default()
        },
        ..test_config()
    };
    let rescuer = start_worker(&db, config);
    let t = wait_settled(&pool, id).await;
    assert_eq!((t.state, t.attempts), (TaskState::Succeeded, 2), "{t:#?}");
    assert_eq!(error_kinds(&t), vec![FailureKind::LeaseExpired]);
    assert_eq!(t.result, Some(json!({"woke_on_attempt": 2})));
    rescuer.stop().await;
}

#[sqlx::test(migrations = false)]
async fn stopping_lets_short_tasks_finish_and_leaves_nothing_running(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    register(&pool, "noop", "noop", ModuleSettings::default()).await;
    let ids = enqueue_n(&pool, "noop", 40).await;
    let runner = start_worker(&db, test_config());
    assert_eq!(wait_settled(&pool, ids[0]).await.state, TaskState::Succeeded);
    let summary = runner.stop().await;
    assert_eq!(summary.released, 0, "short tasks finish within the grace period");
    let running: i64 = sqlx::query_scalar("select count(*) from sweep.tasks where state = $1")
        .bind(TaskState::Running.as_str())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(running, 0);
    assert!(queue::list_runners(&pool).await.unwrap().is_empty(), "the runner deregistered");
}

#[sqlx::test(migrations = false)]
async fn a_newly_due_task_type_starts_while_long_tasks_hold_every_slot(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let long = ModuleSettings {
        fuel: Some(200_000_000_000),
        timeout_ms: Some(120_000),
        ..Default::default()
    };
    register(&pool, "nap", "sleep", long).await;
    register(&pool, "wordcount", "wordcount", ModuleSettings::default()).await;
    // Two slots and a backlog of sleepers that would hold them for two minutes each.
    let config = sweep::config::WorkerConfig {
        concurrency: 2,
        spare_slots: 1,
        grace_period: Duration::from_millis(100),
        ..test_config()
    };
    let runner = start_worker(&db, config);
    let naps: Vec<_> = (0..5).map(|i| NewTask::new("nap", json!({ "i": i }))).collect();
    queue::enqueue_many(&pool, &naps).await.unwrap();
    let held = || async {
        let n: i64 = sqlx::query_scalar(
            "select count(*) from sweep.tasks where task_type = 'nap' and state = $1",
        )
        .bind(TaskState::Running.as_str())
        .fetch_one(&pool)
        .await
        .unwrap();
        n
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while held().await < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the sleepers never filled the slots");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The new type has nothing running anywhere: it gets the spare slot at once.
    let quick =
        queue::enqueue(&pool, NewTask::new("wordcount", json!({"text": "a b"}))).await.unwrap().id;
    let t = wait_settled(&pool, quick).await;
    assert_eq!(t.state, TaskState::Succeeded);
    assert_eq!(held().await, 2, "the spare slot went to the new type, not to a third sleeper");
    runner.stop().await;
}

/// A runner that finds nothing due sleeps until the earliest due time the queue hints hold,
/// not for its poll interval: with a poll interval far longer than the test may take, delayed
/// tasks still start once due, and none before.
#[sqlx::test(migrations = false)]
async fn delayed_tasks_start_when_due_not_at_the_next_poll(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    register(&pool, "wordcount", "wordcount", ModuleSettings::default()).await;
    let poll = Duration::from_secs(600);
    let config = sweep::config::WorkerConfig { poll_interval: poll, ..test_config() };
    let runner = start_worker(&db, config);
    let task =
        |ms| NewTask::new("wordcount", json!({"text": "later"})).delay(Duration::from_millis(ms));
    // Two delays: the runner wakes for the first, then sleeps again until the second.
    let first = queue::enqueue(&pool, task(300)).await.expect("enqueue").id;
    let second = queue::enqueue(&pool, task(900)).await.expect("enqueue").id;
    for id in [first, second] {
        let t = wait_settled(&pool, id).await;
        assert_eq!(t.state, TaskState::Succeeded);
        let (run_at, started) = (t.run_at.expect("run_at"), t.started_at.expect("started"));
        let late = (started - run_at).to_std().expect("started no earlier than its run_at");
        assert!(late < poll / 2, "task {id} started {late:?} after its run_at");
    }
    runner.stop().await;
}
