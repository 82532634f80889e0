//! A 1,000-step double diamond workflow (one step, 499 after it, a join of those 499, 498 after
//! the join, a last join of those) run by real `sweep run` processes on a Postgres server of
//! the test's own, with runners SIGKILLed and restarted while steps run (as `faults.rs` does).
//! Verified from the database afterwards: every step succeeded exactly once, none died; each
//! join ran with exactly its parents' results, each parent once (it became due once, when its
//! last parent ended); every failed attempt is a lease rescued from a killed runner; no edge
//! and no blocked task is left behind.
//!
//! `SWEEP_FAULT_KILLS` overrides the number of kills (default 8, one every 300 ms).
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    collections::{HashMap, HashSet},
    process::Stdio,
    time::{Duration, Instant},
};

use common::*;
use serde_json::{json, Value};
use sweep::queue::{self, FailureKind, ModuleSettings, NewStep, NewTask, TaskId, WorkflowState};
use sweep_dev::pg::PrivatePostgres;
use tokio::process::{Child, Command};
use uuid::Uuid;

const RUNNERS: usize = 3;

fn start_runner(url: &str, log: &std::path::Path) -> (Child, u32) {
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
    (child, pid)
}

fn nap(name: String, after: Vec<String>, n: usize) -> NewStep {
    let task = NewTask::new("nap", json!({"sleep_ms": 60 + (n % 41)})).max_attempts(25);
    NewStep { name, task, after }
}

fn join(name: &str, after: Vec<String>) -> NewStep {
    NewStep { name: name.into(), task: NewTask::new("join", json!({})).max_attempts(25), after }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_step_diamond_completes_through_killed_runners() {
    let kills: usize =
        std::env::var("SWEEP_FAULT_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let pg = tokio::task::spawn_blocking(|| PrivatePostgres::start().unwrap()).await.unwrap();
    let db = migrated(pg.create_database("diamond").await.unwrap()).await;
    let url = pg.url("diamond");
    let pool = db.admin.pool().clone();
    let settings = ModuleSettings {
        backoff_base_ms: Some(100),
        backoff_cap_ms: Some(500),
        ..ModuleSettings::default()
    };
    register(&pool, "nap", "sleep", settings.clone()).await;
    register(&pool, "join", "spawn", settings).await;

    let first: Vec<String> = (0..499).map(|i| format!("a{i}")).collect();
    let second: Vec<String> = (0..498).map(|i| format!("b{i}")).collect();
    let mut steps = vec![nap("top".into(), vec![], 0)];
    steps.extend(first.iter().enumerate().map(|(i, n)| nap(n.clone(), vec!["top".into()], i)));
    steps.push(join("middle", first.clone()));
    steps.extend(second.iter().enumerate().map(|(i, n)| nap(n.clone(), vec!["middle".into()], i)));
    steps.push(join("bottom", second.clone()));
    assert_eq!(steps.len(), 1000);
    let created = queue::create_workflow(&pool, "default", &steps, usize::MAX).await.unwrap();
    let ids: HashMap<String, TaskId> =
        created.steps.iter().map(|s| (s.name.clone(), s.task)).collect();

    let log = pg.data_dir().with_extension("diamond.log");
    let mut runners: Vec<(Child, u32)> = (0..RUNNERS).map(|_| start_runner(&url, &log)).collect();
    let mut killed: HashSet<u32> = HashSet::new();
    let started = Instant::now();
    for k in 0..kills {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let victim = &mut runners[k % RUNNERS];
        victim.0.start_kill().unwrap();
        victim.0.wait().await.unwrap();
        killed.insert(victim.1);
        *victim = start_runner(&url, &log);
    }

    let deadline = Instant::now() + Duration::from_secs(240);
    let w = loop {
        let w = queue::get_workflow(&pool, None, created.id).await.unwrap();
        if w.state != WorkflowState::Running {
            break w;
        }
        assert!(Instant::now() < deadline, "the workflow is still running after 4 minutes");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(w.state, WorkflowState::Succeeded);
    let settled = started.elapsed();

    // Each join ran with exactly its parents, each once, in id order.
    for (name, parents) in [("middle", &first), ("bottom", &second)] {
        let step = w.steps.iter().find(|s| s.name == *name).unwrap();
        let want: Vec<TaskId> = parents.iter().map(|p| ids[p]).collect();
        assert_eq!(step.result.as_ref().unwrap()["parents"], json!(want), "{name}");
    }
    let runner_pids: HashMap<Uuid, i32> =
        sqlx::query_as::<_, (Uuid, i32)>("select id, pid from sweep.runners")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let rows: Vec<(i64, i32, Value)> =
        sqlx::query_as("select id, attempts, errors from sweep.finished_tasks")
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut seen = HashSet::new();
    let mut rescued = 0;
    for (id, attempts, errors) in &rows {
        assert!(seen.insert(*id), "task {id} finished twice");
        let errors = errors.as_array().unwrap();
        assert_eq!(*attempts as usize, errors.len() + 1, "task {id}: {errors:?}");
        for e in errors {
            assert_eq!(e["kind"], FailureKind::LeaseExpired.as_str(), "task {id}: {e}");
            let owner: Uuid = e["runner"].as_str().unwrap().parse().unwrap();
            let pid = runner_pids.get(&owner).copied();
            assert!(pid.is_some_and(|p| killed.contains(&(p as u32))), "task {id}: {e}");
            rescued += 1;
        }
    }
    assert_eq!(rows.len(), 1000, "every step finished exactly once");
    let left: (i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from sweep.tasks), (select count(*) from sweep.task_deps),
                (select count(*) from sweep.dead_tasks)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, (0, 0, 0), "no live task, edge or dead task left");
    println!(
        "diamond: 1000 steps, {kills} kills, {rescued} attempts rescued from killed runners; \
         done in {:.1} s",
        settled.as_secs_f64()
    );
    for (mut child, _) in runners {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    let _ = std::fs::remove_file(log);
}
