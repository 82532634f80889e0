//! Helpers shared by the integration tests. Each test gets a fresh database from
//! `#[sqlx::test(migrator = "sweep::queue::MIGRATOR")]` (DATABASE_URL names the server).
#![allow(dead_code)]

use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;
use sweep::queue::{self, ClaimedTask, NewTask, TaskId, TaskState, TaskView};
use uuid::Uuid;

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

pub async fn show(pool: &PgPool, id: TaskId) -> TaskView {
    queue::get_task(pool, None, id).await.expect("get_task")
}

pub async fn state(pool: &PgPool, id: TaskId) -> TaskState {
    show(pool, id).await.state
}
