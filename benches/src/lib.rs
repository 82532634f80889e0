//! Shared fixtures for the criterion benches in `benches/benches/` (claim, enqueue, sandbox).
//!
//! Owns: where the bench database lives (`sweep_bench` on the server `DATABASE_URL` names,
//! created and migrated by [`sweep::queue::migrate`], opened as the runner's store), resetting
//! and filling its task table between measurements, and locating the no-op guest module.
//!
//! Fixture plumbing (truncate, vacuum, insert finished history) goes through
//! `sweep_dev::fixtures` and never runs inside a timed region; everything timed goes through
//! the public `sweep::queue` functions.

use std::path::PathBuf;

use serde_json::json;
use sqlx::PgPool;
use sweep::queue::{self, NewTask, Role, Store};
use sweep_dev::{db::database_url, fixtures};

/// Database the queue benches own; dropped and recreated freely.
pub const BENCH_DATABASE: &str = "sweep_bench";

/// Task type of the claimable tasks the benches enqueue.
pub const BENCH_TASK_TYPE: &str = "noop";

/// Task type of the finished rows the "retained history" benches insert.
pub const RETAINED_TASK_TYPE: &str = "retained";

/// Tasks per `enqueue_many` call when filling the table.
const FILL_CHUNK: usize = 50_000;

/// A multi-threaded runtime like the runner's (one worker per core).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

/// Opens the bench database (creating and migrating it first) as a runner would, with
/// `max_connections`.
pub async fn bench_pool(max_connections: u32) -> PgPool {
    let url = database_url(BENCH_DATABASE);
    queue::migrate(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot migrate the bench database at {url}: {e}"));
    Store::open(&url, Role::Runner, max_connections)
        .await
        .unwrap_or_else(|e| panic!("cannot open the bench database at {url}: {e}"))
        .pool()
        .clone()
}

/// Reads a positive integer from the environment, else `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.replace('_', "").parse().ok()).unwrap_or(default)
}

/// Deletes every task except the retained finished history, then vacuums and analyzes so each
/// measurement starts from the same physical state (fixture only; never timed).
pub async fn reset_live_tasks(pool: &PgPool, keep_retained: bool) {
    let keep = keep_retained.then_some(RETAINED_TASK_TYPE);
    fixtures::reset(pool, keep).await.expect("reset the bench tables");
}

/// `vacuum analyze tasks`.
pub async fn vacuum_analyze(pool: &PgPool) {
    fixtures::vacuum_tasks(pool, true).await.expect("vacuum analyze tasks");
}

/// `vacuum tasks` (no analyze: planner statistics stay as the fixture left them).
pub async fn vacuum(pool: &PgPool) {
    fixtures::vacuum_tasks(pool, false).await.expect("vacuum tasks");
}

/// The tasks the benches enqueue: a no-op payload.
pub fn bench_tasks(n: usize, offset: usize) -> Vec<NewTask> {
    (0..n).map(|i| NewTask::new(BENCH_TASK_TYPE, json!({ "i": offset + i }))).collect()
}

/// Enqueues `n` due tasks through the public API, in chunks.
pub async fn fill(pool: &PgPool, n: usize) {
    let mut done = 0;
    while done < n {
        let chunk = FILL_CHUNK.min(n - done);
        queue::enqueue_many(pool, &bench_tasks(chunk, done)).await.expect("enqueue fill");
        done += chunk;
    }
}

/// Inserts `n` finished (`succeeded`) tasks, the history a long-running queue keeps until
/// retention deletes it. Direct SQL: going through claim + complete would take minutes.
pub async fn insert_retained(pool: &PgPool, n: usize) {
    fixtures::fill_finished(pool, RETAINED_TASK_TYPE, n).await.expect("insert retained history");
}

/// Counts finished tasks of `task_type` (fixture only).
pub async fn count_finished(pool: &PgPool, task_type: &str) -> i64 {
    fixtures::count_finished(pool, task_type).await.expect("count finished tasks")
}

/// The no-op guest module built by `scripts/build-modules.sh` (override: `SWEEP_NOOP_WASM`).
pub fn noop_wasm() -> Vec<u8> {
    let path = std::env::var_os("SWEEP_NOOP_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| sweep_dev::modules::modules_dir().join("noop.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("cannot read {} ({e}); run scripts/build-modules.sh noop first", path.display())
    })
}
