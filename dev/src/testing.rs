//! Helpers shared by the integration tests: tasks, claims, a runner in-process with test
//! settings, and waiting for a task's state (polling the database with a deadline, never a
//! sleep that decides a verdict). Each test gets a fresh database from
//! `#[sqlx::test(migrations = false)]` and [`crate::migrated`].
#![allow(clippy::unwrap_used)]

use std::{sync::OnceLock, time::Duration};

use serde_json::json;
use sqlx::PgPool;
use sweep::queue::{self, ClaimedTask, FailureKind, NewTask, TaskId, TaskState, TaskView};
use uuid::Uuid;

use crate::{modules::module_bytes, Stores};

pub const LEASE: Duration = Duration::from_secs(60);

pub fn new_runner() -> Uuid {
    Uuid::new_v4()
}

pub fn task(task_type: &str, n: i64) -> NewTask {
    NewTask::new(task_type, json!({ "n": n }))
}

pub async fn enqueue_n(pool: &PgPool, task_type: &str, n: i64) -> Vec<TaskId> {
    let tasks: Vec<NewTask> = (0..n).map(|i| task(task_type, i)).collect();
    queue::enqueue_many(pool, &tasks).await.expect("enqueue").into_iter().map(|e| e.id).collect()
}

pub async fn claim(pool: &PgPool, runner: Uuid, n: usize) -> Vec<ClaimedTask> {
    queue::claim_batch(pool, runner, n, &[], LEASE).await.expect("claim")
}

/// Waits until `n` backends of this test's database wait on a lock.
pub async fn backends_waiting_on_a_lock(pool: &PgPool, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting >= n {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{waiting} of {n} backends blocked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A successful report of claimed task `c` with `result` (no module sha, no logs).
pub fn completion(c: &ClaimedTask, result: serde_json::Value) -> queue::Completion {
    queue::Completion {
        id: c.id,
        attempt: c.attempt,
        result,
        module_sha256: None,
        logs: None,
        follow_ups: Vec::new(),
        usage: None,
    }
}

pub async fn show(pool: &PgPool, id: TaskId) -> TaskView {
    queue::get_task(pool, None, id).await.expect("get_task")
}

pub async fn state(pool: &PgPool, id: TaskId) -> TaskState {
    show(pool, id).await.state
}

// ---- running real Wasm through a real runner ------------------------------------------

use sweep::{
    config::WorkerConfig,
    queue::{ModuleSettings, RetryPolicy},
    sandbox::{sha256_hex, CompileLimits, Limits, Sandbox, SandboxConfig},
    worker::{Worker, WorkerSummary},
};
use tokio::{sync::oneshot, task::JoinHandle};

/// Registers (and activates) module `file` as the handler for `task_type`.
pub async fn register(
    pool: &PgPool,
    task_type: &str,
    file: &str,
    settings: ModuleSettings,
) -> String {
    let bytes = module_bytes(file);
    let sha = sha256_hex(&bytes);
    queue::register_module(pool, "default", task_type, &sha, &bytes, &settings)
        .await
        .expect("register");
    sha
}

/// Settings for tests: small limits, instant retries, quick polling.
pub fn test_config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 4,
        spare_slots: 2,
        poll_interval: Duration::from_millis(50),
        retry: RetryPolicy {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(5),
            jitter: 0.0,
        },
        sandbox: SandboxConfig {
            max_concurrency: 6,
            defaults: Limits {
                fuel: 2_000_000_000,
                timeout: Duration::from_secs(10),
                memory_bytes: 64 << 20,
                output_bytes: 64 << 10,
            },
            ..SandboxConfig::default()
        },
        ..WorkerConfig::default()
    }
}

/// [`test_config`] with `concurrency` slots, no spare slots and no instance pool: for tests
/// that drive a runner next to an admin API and want its pace plain.
pub fn unpooled_config(concurrency: usize) -> WorkerConfig {
    let max_concurrency = u32::try_from(concurrency).unwrap_or(u32::MAX);
    WorkerConfig {
        concurrency,
        spare_slots: 0,
        sandbox: SandboxConfig { max_concurrency, pooling: false, ..test_config().sandbox },
        ..test_config()
    }
}

/// Compile limits with room for a language runtime: a componentize-py component defines
/// ~14,000 functions in ~12 MB of code, CPython's interpreter loop alone is a ~200 KB
/// function. Set by the tests that run the Python and JavaScript guests rather than taken
/// from the defaults, which are the operator's to choose.
pub fn runtime_compile_limits() -> CompileLimits {
    CompileLimits {
        max_functions: 200_000,
        max_code_bytes: 128 << 20,
        max_function_bytes: 8 << 20,
        max_locals: 100_000,
        cpu: Duration::from_secs(300),
        memory_bytes: 8 << 30,
        wall: Duration::from_secs(600),
        ..CompileLimits::default()
    }
}

/// A sandbox with default settings on the pooling (`true`) or on-demand allocator, built once
/// per test binary: each one reserves its instance pool.
pub fn shared_sandbox(pooling: bool) -> &'static Sandbox {
    static POOLED: OnceLock<Sandbox> = OnceLock::new();
    static ON_DEMAND: OnceLock<Sandbox> = OnceLock::new();
    let cell = if pooling { &POOLED } else { &ON_DEMAND };
    cell.get_or_init(|| {
        Sandbox::new(SandboxConfig { pooling, ..SandboxConfig::default() }).expect("sandbox builds")
    })
}

/// Both shared sandboxes, for tests that must hold under either allocator.
pub fn both_allocators() -> [&'static Sandbox; 2] {
    [shared_sandbox(true), shared_sandbox(false)]
}

/// A runner running in this process until [`RunningWorker::stop`].
#[derive(Debug)]
pub struct RunningWorker {
    pub id: uuid::Uuid,
    stop: oneshot::Sender<()>,
    handle: JoinHandle<WorkerSummary>,
}

pub fn start_worker(db: &Stores, config: WorkerConfig) -> RunningWorker {
    start_worker_on(&db.runner, config)
}

/// [`start_worker`] on a runner store of the caller's (e.g. one opened through a pooler).
pub fn start_worker_on(store: &queue::Store, config: WorkerConfig) -> RunningWorker {
    run_worker(Worker::new(store, config).expect("worker"))
}

/// Runs a worker built by the caller (who may need its id before it runs).
pub fn run_worker(worker: Worker) -> RunningWorker {
    let id = worker.id();
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
            .expect("worker run")
    });
    RunningWorker { id, stop, handle }
}

impl RunningWorker {
    pub async fn stop(self) -> WorkerSummary {
        let _ = self.stop.send(());
        self.handle.await.expect("worker task")
    }
}

/// Waits (polling the database) until task `id` satisfies `done`, for at most a minute.
pub async fn wait_for(
    pool: &PgPool,
    id: TaskId,
    what: &str,
    done: impl Fn(&TaskView) -> bool,
) -> TaskView {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let t = show(pool, id).await;
        if done(&t) {
            return t;
        }
        assert!(tokio::time::Instant::now() < deadline, "task {id} never became {what}: {t:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn wait_settled(pool: &PgPool, id: TaskId) -> TaskView {
    wait_for(pool, id, "succeeded or dead", |t| {
        matches!(t.state, TaskState::Succeeded | TaskState::Dead)
    })
    .await
}

/// Waits until task `id` is no longer live (succeeded, cancelled or dead).
pub async fn wait_ended(pool: &PgPool, id: TaskId) -> TaskView {
    wait_for(pool, id, "finished, cancelled or dead", |t| !t.state.is_live()).await
}

/// The kind of each entry of a task's error history (an unknown kind fails the test).
pub fn error_kinds(t: &TaskView) -> Vec<FailureKind> {
    t.errors.as_array().map_or_else(Vec::new, |a| {
        a.iter()
            .map(|e| {
                let kind = e["kind"].as_str().unwrap_or_default();
                kind.parse().unwrap_or_else(|e| panic!("task {}: {e}", t.id))
            })
            .collect()
    })
}

/// An error and its sources, one after the other (`a: b: c`), for a test's panic message.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}
