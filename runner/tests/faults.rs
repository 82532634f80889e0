//! Fault tests: real `sweep run` processes on a Postgres server of the test's own, with
//! runners SIGKILLed and restarted while tasks run, the server restarted, then the server
//! down for a stretch (30 s by default). Verified from the database afterwards:
//!
//! - every task ended succeeded (its module always succeeds), none dead, none left live;
//! - each result matches its payload, and every id is there exactly once;
//! - every failed attempt is a lease rescued from a runner this test killed: no live runner
//!   lost a task to the restart or the outage (the reports of tasks that finished while the
//!   server was away were written when it came back);
//! - at no point did a task wait to be retried past its type's backoff cap.
//!
//! The short form runs in `cargo test`. `SWEEP_FAULTS=long` runs the long one (20,000 tasks,
//! 60 kills); `SWEEP_FAULT_TASKS`, `SWEEP_FAULT_KILLS` and `SWEEP_FAULT_OUTAGE_SECS` override
//! single settings. Run with `--nocapture` to see the counts and the recovery time.
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    collections::{HashMap, HashSet},
    process::Stdio,
    time::{Duration, Instant},
};

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use sweep::queue::{self, FailureKind, ModuleSettings, NewTask, TaskState};
use sweep_dev::pg::{PrivatePostgres, StopMode};
use tokio::process::{Child, Command};
use uuid::Uuid;

const RUNNERS: usize = 3;
const TASK_TYPE: &str = "nap";
const BACKOFF_CAP_MS: i64 = 500;

#[derive(Debug)]
struct Plan {
    tasks: usize,
    kills: usize,
    kill_every: Duration,
    outage: Duration,
}

impl Plan {
    fn from_env() -> Self {
        let long = std::env::var("SWEEP_FAULTS").is_ok_and(|v| v == "long");
        let var = |name: &str, default: u64| {
            std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
        };
        Plan {
            tasks: var("SWEEP_FAULT_TASKS", if long { 20_000 } else { 4_000 }) as usize,
            kills: var("SWEEP_FAULT_KILLS", if long { 60 } else { 12 }) as usize,
            kill_every: Duration::from_millis(if long { 1_000 } else { 300 }),
            outage: Duration::from_secs(var("SWEEP_FAULT_OUTAGE_SECS", 30)),
        }
    }
}

/// The task of number `n`: naps a little (so kills hit running tasks) and says how long.
fn nap(n: usize) -> NewTask {
    NewTask::new(TASK_TYPE, json!({ "sleep_ms": 80 + (n % 41), "n": n })).max_attempts(25)
}

struct Runner {
    child: Child,
    pid: u32,
}

fn start_runner(url: &str, log: &std::path::Path) -> Runner {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_sweep"))
        .args(["run", "--no-admin", "--lease-secs", "3", "--reaper-ms", "200", "--poll-ms", "200"])
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "sweep=info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("starting sweep run");
    let pid = child.id().unwrap();
    Runner { child, pid }
}

/// Fails the test if any task waits to be retried longer than its type's backoff cap (plus
/// the statement's own latency).
async fn assert_no_wait_past_the_cap(pool: &PgPool) {
    let worst: Option<f64> = sqlx::query_scalar(
        "select max(extract(epoch from run_at - now()) * 1000)::float8 from sweep.tasks \
         where state::text = $1",
    )
    .bind(TaskState::Retrying.as_str())
    .fetch_one(pool)
    .await
    .unwrap_or(None);
    if let Some(ms) = worst {
        assert!(ms <= (BACKOFF_CAP_MS + 250) as f64, "a task waits {ms:.0} ms to be retried");
    }
}

async fn live_tasks(pool: &PgPool) -> Option<i64> {
    sqlx::query_scalar("select count(*) from sweep.tasks").fetch_one(pool).await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_survive_killed_runners_a_restart_and_an_outage() {
    let plan = Plan::from_env();
    let pg = tokio::task::spawn_blocking(|| PrivatePostgres::start().unwrap()).await.unwrap();
    let db = migrated(pg.create_database("faults").await.unwrap()).await;
    let url = pg.url("faults");
    let pool = db.admin.pool().clone();
    let settings = ModuleSettings {
        backoff_base_ms: Some(100),
        backoff_cap_ms: Some(BACKOFF_CAP_MS),
        ..ModuleSettings::default()
    };
    register(&pool, TASK_TYPE, "sleep", settings).await;
    for chunk in (0..plan.tasks).collect::<Vec<_>>().chunks(1000) {
        let tasks: Vec<NewTask> = chunk.iter().map(|&n| nap(n)).collect();
        queue::enqueue_many(&pool, &tasks).await.unwrap();
    }
    let log = pg.data_dir().with_extension("runners.log");
    let mut runners: Vec<Runner> = (0..RUNNERS).map(|_| start_runner(&url, &log)).collect();
    let mut killed: HashSet<u32> = HashSet::new();
    let started = Instant::now();

    // Kills, one runner at a time, round robin; the server restarted half-way through.
    for k in 0..plan.kills {
        tokio::time::sleep(plan.kill_every).await;
        if k == plan.kills / 2 {
            tokio::task::block_in_place(|| {
                pg.stop_server(StopMode::Fast).unwrap();
                pg.start_server().unwrap();
            });
        }
        let victim = &mut runners[k % RUNNERS];
        victim.child.start_kill().unwrap();
        victim.child.wait().await.unwrap();
        killed.insert(victim.pid);
        *victim = start_runner(&url, &log);
        assert_no_wait_past_the_cap(&pool).await;
    }

    // The outage, while tasks are still running: their runners must hold on to the results.
    let running_before: i64 =
        sqlx::query_scalar("select count(*) from sweep.tasks where state::text = $1")
            .bind(TaskState::Running.as_str())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(running_before > 0, "the tasks ran out before the outage: raise SWEEP_FAULT_TASKS");
    tokio::task::block_in_place(|| pg.stop_server(StopMode::Fast).unwrap());
    tokio::time::sleep(plan.outage).await;
    tokio::task::block_in_place(|| pg.start_server().unwrap());
    let back = Instant::now();

    // Faults over: everything settles, and nothing waits past its backoff cap meanwhile.
    let deadline = back + Duration::from_secs(180);
    loop {
        assert_no_wait_past_the_cap(&pool).await;
        if live_tasks(&pool).await == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "tasks still live 3 minutes after the faults");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovery = back.elapsed();
    for r in &mut runners {
        let status = r.child.try_wait().unwrap();
        assert!(status.is_none(), "runner {} exited ({status:?}); see {}", r.pid, log.display());
    }

    let runner_pids: HashMap<Uuid, i32> =
        sqlx::query_as::<_, (Uuid, i32)>("select id, pid from sweep.runners")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let rows: Vec<(i64, String, Value, Option<Value>, i32, Value)> = sqlx::query_as(
        "select id, state::text, payload, result, attempts, errors from sweep.finished_tasks",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let dead: i64 =
        sqlx::query_scalar("select count(*) from sweep.dead_tasks").fetch_one(&pool).await.unwrap();

    let mut seen = HashSet::new();
    let mut rescued = 0;
    for (id, state, payload, result, attempts, errors) in &rows {
        assert!(seen.insert(*id), "task {id} finished twice");
        assert_eq!(state, TaskState::Succeeded.as_str(), "task {id}");
        assert_eq!(result.as_ref(), Some(&json!({ "slept_ms": payload["sleep_ms"] })), "task {id}");
        let errors = errors.as_array().unwrap();
        assert_eq!(*attempts as usize, errors.len() + 1, "task {id}: {errors:?}");
        for e in errors {
            assert_eq!(e["kind"], FailureKind::LeaseExpired.as_str(), "task {id}: {e}");
            let owner: Uuid = e["runner"].as_str().unwrap().parse().unwrap();
            let pid = runner_pids.get(&owner).copied();
            assert!(
                pid.is_some_and(|p| killed.contains(&(p as u32))),
                "task {id} lost a lease of runner {owner} (pid {pid:?}), which was not killed"
            );
            rescued += 1;
        }
    }
    assert_eq!(dead, 0);
    assert_eq!(rows.len(), plan.tasks, "every task finished exactly once");
    println!(
        "faults: {} tasks, {} kills, 1 restart, {:?} outage; {} succeeded, {dead} dead, \
         {rescued} attempts rescued from killed runners; settled {:.1} s after the server came \
         back ({:.1} s in all)",
        plan.tasks,
        plan.kills,
        plan.outage,
        rows.len(),
        recovery.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    for mut r in runners {
        let _ = r.child.start_kill();
        let _ = r.child.wait().await;
    }
    let _ = std::fs::remove_file(log);
}
