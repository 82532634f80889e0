//! The task-end notification behind `GET /v1/tasks/{id}?wait=`: a task a waiter marked
//! (`queue::watch_task`) notifies `sweep_done` with its id from the statement that ends it (a
//! completion, a failure that kills it, a cancel), and only then: unmarked tasks, retried
//! attempts and already-ended tasks send nothing.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sweep::queue::{self, Completion, Failure, FailureKind, TaskId};

/// The next notification's task id, or `None` when nothing comes within `within`.
async fn next(listener: &mut PgListener, within: Duration) -> Option<TaskId> {
    let n = tokio::time::timeout(within, listener.recv()).await.ok()?.unwrap();
    Some(n.payload().parse().unwrap())
}

#[sqlx::test(migrations = false)]
async fn ended_tasks_notify_their_waiters_and_only_them(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen(queue::DONE_CHANNEL).await.unwrap();
    let runner = new_runner();
    enqueue_n(&pool, "t", 4).await;
    let claimed = claim(&pool, runner, 4).await;
    let [a, b, c, d] = [0, 1, 2, 3].map(|i| claimed[i].clone());

    // Marked: a completes, b fails for good (max 5 attempts, permanent), d is cancelled.
    for t in [&a, &b, &d] {
        assert!(queue::watch_task(&pool, None, t.id).await.unwrap());
    }
    let done = |t: &queue::ClaimedTask| Completion {
        id: t.id,
        attempt: t.attempt,
        result: json!({}),
        module_sha256: None,
        logs: None,
        follow_ups: Vec::new(),
        usage: None,
    };
    let failed = |t: &queue::ClaimedTask, permanent: bool| Failure {
        id: t.id,
        attempt: t.attempt,
        kind: FailureKind::HandlerError,
        message: "no".into(),
        permanent,
        retry_delay: Duration::from_secs(60),
        detail: json!({}),
        module_sha256: None,
        usage: None,
    };
    // c is not marked: its completion sends nothing.
    queue::complete_batch(&pool, runner, &[done(&c), done(&a)]).await.unwrap();
    assert_eq!(next(&mut listener, Duration::from_secs(10)).await, Some(a.id));
    queue::fail_batch(&pool, runner, &[failed(&b, true)]).await.unwrap();
    assert_eq!(next(&mut listener, Duration::from_secs(10)).await, Some(b.id));
    // A running task: the cancel is only a request; the end comes with its report.
    queue::cancel(&pool, None, d.id).await.unwrap();
    queue::fail_batch(&pool, runner, &[failed(&d, false)]).await.unwrap();
    assert_eq!(next(&mut listener, Duration::from_secs(10)).await, Some(d.id));

    // A marked task that fails with attempts left is not ended: no notification; a cancel of
    // it while it waits to retry ends it, and notifies.
    enqueue_n(&pool, "u", 1).await;
    let e = claim(&pool, runner, 1).await.remove(0);
    assert!(queue::watch_task(&pool, None, e.id).await.unwrap());
    queue::fail_batch(&pool, runner, &[failed(&e, false)]).await.unwrap();
    queue::cancel(&pool, None, e.id).await.unwrap();
    assert_eq!(next(&mut listener, Duration::from_secs(10)).await, Some(e.id));

    // Ended tasks cannot be marked (a waiter reads them instead), and nothing else came.
    assert!(!queue::watch_task(&pool, None, a.id).await.unwrap());
    assert!(!queue::watch_task(&pool, Some("another"), e.id).await.unwrap());
    // Notifications arrive in commit order: a marker sent now is the next one.
    sqlx::query("select pg_notify($1, '-1')")
        .bind(queue::DONE_CHANNEL)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(next(&mut listener, Duration::from_secs(10)).await, Some(-1));
}
