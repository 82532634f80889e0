//! Dependencies (`after`): a child waits `blocked` until every parent ended, becomes due once
//! with its parents' ends in `$parents`, is cancelled naming a parent that ended dead or
//! cancelled (or runs anyway), and bad parents refuse the enqueue, writing nothing.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{
    self, ClaimedTask, Failure, InvalidTask, NewTask, OnParentFailure, QueueError, TaskId,
};
use uuid::Uuid;

fn child(after: &[TaskId]) -> NewTask {
    NewTask::new("child", json!({"c": 1})).after(after.iter().copied())
}

async fn enqueue_one(pool: &PgPool, task: NewTask) -> Result<TaskId, QueueError> {
    queue::enqueue(pool, task).await.map(|e| e.id)
}

fn dies(c: &ClaimedTask) -> Failure {
    Failure {
        id: c.id,
        attempt: c.attempt,
        kind: FailureKind::HandlerError,
        message: "no".into(),
        permanent: true,
        retry_delay: Duration::ZERO,
        detail: json!({}),
        module_sha256: None,
        usage: None,
    }
}

/// Claims every due task of `task_type`.
async fn claim_type(pool: &PgPool, runner: Uuid, task_type: &str, n: usize) -> Vec<ClaimedTask> {
    queue::claim_batch(pool, runner, n, &[task_type.to_owned()], LEASE).await.unwrap()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_child_waits_blocked_then_runs_with_its_parents_results(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let parents = enqueue_n(&pool, "parent", 2).await;
    let id = enqueue_one(&pool, child(&parents)).await.unwrap();
    let t = show(&pool, id).await;
    assert_eq!((t.state, t.blocked_on), (TaskState::Blocked, Some(2)));
    assert!(claim_type(&pool, runner, "child", 10).await.is_empty(), "a blocked task is not due");

    let claimed = claim_type(&pool, runner, "parent", 10).await;
    let first = claimed.iter().find(|c| c.id == parents[0]).unwrap();
    let lost = queue::complete_batch(&pool, runner, &[completion(first, json!({"sum": 3}))])
        .await
        .unwrap();
    assert!(lost.is_empty());
    assert_eq!(show(&pool, id).await.blocked_on, Some(1));
    assert!(claim_type(&pool, runner, "child", 10).await.is_empty());

    let second = claimed.iter().find(|c| c.id == parents[1]).unwrap();
    queue::complete_batch(&pool, runner, &[completion(second, json!(7))]).await.unwrap();
    let t = show(&pool, id).await;
    assert_eq!((t.state, t.blocked_on), (TaskState::Pending, None));
    let got = claim_type(&pool, runner, "child", 10).await;
    assert_eq!(got.len(), 1);
    let input: Value = got[0].payload_value().unwrap();
    assert_eq!(
        input,
        json!({"c": 1, "$parents": [
            {"id": parents[0], "state": "succeeded", "result": {"sum": 3}},
            {"id": parents[1], "state": "succeeded", "result": 7},
        ]})
    );
    assert_eq!(count(&pool, "select count(*) from sweep.task_deps").await, 0, "edges cleaned");
}

#[sqlx::test(migrations = false)]
async fn parents_already_ended_count_as_ended(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let p = enqueue_n(&pool, "parent", 1).await[0];
    let c = claim(&pool, runner, 1).await.remove(0);
    queue::complete_batch(&pool, runner, &[completion(&c, json!({"r": 1}))]).await.unwrap();
    let id = enqueue_one(&pool, child(&[p, p])).await.unwrap();
    let t = show(&pool, id).await;
    assert_eq!(t.state, TaskState::Pending, "every parent ended: due at once");
    assert_eq!(t.payload["$parents"], json!([{"id": p, "state": "succeeded", "result": {"r": 1}}]));
}

#[sqlx::test(migrations = false)]
async fn a_failed_parent_cancels_its_descendants_naming_it(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let p = enqueue_n(&pool, "parent", 1).await[0];
    let a = enqueue_one(&pool, child(&[p])).await.unwrap();
    let b = enqueue_one(&pool, child(&[a])).await.unwrap();
    let runs =
        enqueue_one(&pool, child(&[a]).on_parent_failure(OnParentFailure::Run)).await.unwrap();
    let c = claim_type(&pool, runner, "parent", 1).await.remove(0);
    let report = queue::fail_batch(&pool, runner, &[dies(&c)]).await.unwrap();
    assert_eq!(report.dead, vec![p]);

    let t = show(&pool, a).await;
    assert_eq!(t.state, TaskState::Cancelled);
    assert_eq!(t.last_error.as_deref(), Some(format!("parent {p} ended dead").as_str()));
    assert_eq!(t.errors[0]["parent"], json!(p));
    let t = show(&pool, b).await;
    assert_eq!(t.state, TaskState::Cancelled, "cancelled in turn: {t:?}");
    assert_eq!(t.last_error.as_deref(), Some(format!("parent {a} ended cancelled").as_str()));
    let t = show(&pool, runs).await;
    assert_eq!(t.state, TaskState::Pending, "on_parent_failure = run");
    assert_eq!(t.payload["$parents"], json!([{"id": a, "state": "cancelled"}]));
}

#[sqlx::test(migrations = false)]
async fn cancelling_a_parent_or_a_blocked_child(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let p = enqueue_n(&pool, "parent", 2).await;
    let a = enqueue_one(&pool, child(&[p[0]])).await.unwrap();
    let b = enqueue_one(&pool, child(&[a, p[1]])).await.unwrap();
    // A blocked task is cancelled at once, and its children follow.
    assert_eq!(queue::cancel(&pool, None, a).await.unwrap(), queue::Cancel::Cancelled);
    assert_eq!(state(&pool, b).await, TaskState::Cancelled);
    // Its edges went with it: the parents end without finding them.
    assert_eq!(count(&pool, "select count(*) from sweep.task_deps").await, 0);
    let c = enqueue_one(&pool, child(&[p[1]])).await.unwrap();
    let done = queue::cancel_matching(&pool, "default", "parent", None).await.unwrap();
    assert_eq!(done.cancelled, 2);
    assert_eq!(state(&pool, c).await, TaskState::Cancelled);
}

#[sqlx::test(migrations = false)]
async fn bad_parents_are_named_and_nothing_is_written(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let mine = enqueue_n(&pool, "parent", 1).await[0];
    let theirs =
        enqueue_one(&pool, NewTask::new("parent", json!({})).tenant("other")).await.unwrap();
    let before = count(&pool, "select count(*) from sweep.tasks").await;

    let e = enqueue_one(&pool, child(&[mine, 999_999])).await.unwrap_err();
    assert!(
        matches!(&e, QueueError::Invalid(InvalidTask::InBatch { index: 0, source })
            if **source == InvalidTask::UnknownParent { index: 1, id: 999_999 }),
        "{e:?}"
    );
    assert!(e.to_string().contains("after[1]: no task 999999"), "{e}");
    let e = enqueue_one(&pool, child(&[theirs])).await.unwrap_err();
    assert!(e.to_string().contains("after[0]"), "another tenant's task is unknown: {e}");
    let batch = [child(&[mine]), child(&[mine]), child(&[theirs])];
    let e = queue::enqueue_many(&pool, &batch).await.unwrap_err();
    assert!(e.to_string().starts_with("task 2 of the batch: after[0]"), "{e}");

    // A parent that died already: refused unless the child runs anyway.
    let claimed = claim_type(&pool, runner, "parent", 2).await;
    let c = claimed.iter().find(|c| c.id == mine).unwrap();
    queue::fail_batch(&pool, runner, &[dies(c)]).await.unwrap();
    let e = enqueue_one(&pool, child(&[mine])).await.unwrap_err();
    assert!(e.to_string().contains("already ended dead"), "{e}");
    assert_eq!(count(&pool, "select count(*) from sweep.tasks").await, before - 1);
    assert_eq!(count(&pool, "select count(*) from sweep.task_deps").await, 0);

    let runs = child(&[mine]).on_parent_failure(OnParentFailure::Run);
    let id = enqueue_one(&pool, runs).await.unwrap();
    assert_eq!(state(&pool, id).await, TaskState::Pending);

    let keyed = child(&[mine]).dedup_key("k");
    assert_eq!(keyed.validate(), Err(InvalidTask::DedupKeyWithParents));
    let many = child(&vec![mine; queue::MAX_PARENTS + 1]);
    assert!(matches!(many.validate(), Err(InvalidTask::TooManyParents { .. })));
}

/// 10,000 parents completed by several runners at once, in batches: the child's count reaches
/// zero exactly once, and it is claimed exactly once.
#[sqlx::test(migrations = false)]
async fn a_child_of_ten_thousand_parents_becomes_due_exactly_once(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    const PARENTS: usize = 10_000;
    let db = migrated(db).await;
    let pool = db.pool();
    let parents: Vec<NewTask> =
        (0..PARENTS).map(|i| NewTask::new("parent", json!({"i": i}))).collect();
    let parents: Vec<TaskId> =
        queue::enqueue_many(&pool, &parents).await.unwrap().into_iter().map(|e| e.id).collect();
    let id = enqueue_one(&pool, child(&parents)).await.unwrap();
    assert_eq!(show(&pool, id).await.blocked_on, Some(PARENTS as i32));

    let lanes: Vec<_> = (0..4)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let runner = new_runner();
                loop {
                    let claimed = claim_type(&pool, runner, "parent", 250).await;
                    if claimed.is_empty() {
                        return;
                    }
                    let done: Vec<_> =
                        claimed.iter().map(|c| completion(c, json!({"i": c.id}))).collect();
                    let lost = queue::complete_batch(&pool, runner, &done).await.unwrap();
                    assert!(lost.is_empty());
                }
            })
        })
        .collect();
    for lane in lanes {
        lane.await.unwrap();
    }
    let t = show(&pool, id).await;
    assert_eq!((t.state, t.blocked_on), (TaskState::Pending, None));
    let entries = t.payload["$parents"].as_array().unwrap();
    assert_eq!(entries.len(), PARENTS);
    assert!(entries.iter().all(|e| e["state"] == "succeeded"));
    // Each parent's own result: those written on the edges by earlier statements and those
    // of the statement that released the child alike.
    assert!(entries.iter().all(|e| e["result"] == json!({ "i": e["id"] })), "{entries:?}");
    let runner = new_runner();
    assert_eq!(claim_type(&pool, runner, "child", 10).await.len(), 1);
    assert!(claim_type(&pool, runner, "child", 10).await.is_empty(), "claimed once");
}

#[sqlx::test(migrations = false)]
async fn results_are_passed_on_within_the_payload_limit(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let parents = enqueue_n(&pool, "parent", 3).await;
    // The child's payload is 7 bytes ({"c":1}); the limit leaves 40 for results.
    let task = [child(&parents)];
    let checked = queue::CheckedTasks::check(&task, 47).unwrap();
    let id = queue::enqueue_checked(&pool, &checked).await.unwrap()[0].id;
    let claimed = claim_type(&pool, runner, "parent", 3).await;
    let done: Vec<_> = claimed
        .iter()
        .map(|c| completion(c, json!({"s": "x".repeat(if c.id == parents[1] { 30 } else { 5 })})))
        .collect();
    queue::complete_batch(&pool, runner, &done).await.unwrap();
    let t = show(&pool, id).await;
    let entries = t.payload["$parents"].as_array().unwrap().clone();
    assert_eq!(entries[0]["result"], json!({"s": "xxxxx"}), "14 bytes (as Postgres prints it) fit");
    assert_eq!(entries[1]["result_omitted"], json!(true), "14 + 39 do not");
    assert_eq!(entries[2]["result_omitted"], json!(true), "nor anything after");
    assert!(entries[2].get("result").is_none());
}
