//! Every transition out of `running`, the fence that rejects a lost lease, dead-lettering,
//! requeue, cancel and release.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::{self, ClaimedTask, Completion, Failure, QueueError, TaskState};
use uuid::Uuid;

fn failure(c: &ClaimedTask, permanent: bool, delay: Duration) -> Failure {
    Failure {
        id: c.id,
        attempt: c.attempt,
        kind: FailureKind::HandlerError,
        message: format!("boom at attempt {}", c.attempt),
        permanent,
        retry_delay: delay,
        detail: json!({ "duration_ms": 12, "fuel_used": 345 }),
        module_sha256: Some("abc".into()),
        usage: None,
    }
}

fn success(c: &ClaimedTask, result: Value) -> Completion {
    Completion {
        id: c.id,
        attempt: c.attempt,
        result,
        module_sha256: Some("sha".into()),
        logs: None,
        follow_ups: Vec::new(),
        usage: None,
    }
}

#[sqlx::test(migrations = false)]
async fn running_to_succeeded_stores_the_result(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    enqueue_n(&pool, "t", 1).await;
    let c = claim(&pool, runner, 1).await.remove(0);
    let lost =
        queue::complete_batch(&pool, runner, &[success(&c, json!({"ok": 1}))]).await.unwrap();
    assert!(lost.is_empty());
    let t = show(&pool, c.id).await;
    assert_eq!(t.state, TaskState::Succeeded);
    assert_eq!(t.result, Some(json!({"ok": 1})));
    assert_eq!(t.module_sha256.as_deref(), Some("sha"));
    assert!(t.finished_at.is_some());
    let (live, history): (i64, i64) = sqlx::query_as(
        "select (select count(*) from sweep.tasks), (select count(*) from sweep.finished_tasks)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((live, history), (0, 1), "the finished row moved out of the hot table");
}

#[sqlx::test(migrations = false)]
async fn failed_attempt_retries_later_with_history(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    enqueue_n(&pool, "t", 1).await;
    let c = claim(&pool, runner, 1).await.remove(0);
    let report = queue::fail_batch(&pool, runner, &[failure(&c, false, Duration::from_secs(120))])
        .await
        .unwrap();
    assert_eq!((report.retrying, report.dead, report.lost), (vec![c.id], vec![], vec![]));
    let t = show(&pool, c.id).await;
    assert_eq!(t.state, TaskState::Retrying);
    assert_eq!(t.last_error.as_deref(), Some("boom at attempt 1"));
    let wait = t.run_at.unwrap() - chrono::Utc::now();
    assert!(wait > chrono::Duration::seconds(100), "retry is scheduled after the backoff: {wait}");
    let entry = &t.errors[0];
    assert_eq!(entry["attempt"], 1);
    assert_eq!(entry["kind"], FailureKind::HandlerError.as_str());
    assert_eq!(entry["fuel_used"], 345);
    assert!(entry["at"].is_string());
    // Not due yet, so not claimable.
    assert!(claim(&pool, runner, 1).await.is_empty());
}

#[sqlx::test(migrations = false)]
async fn retrying_task_runs_again_and_the_last_attempt_goes_dead(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let id = queue::enqueue(&pool, task("t", 1).max_attempts(3)).await.unwrap().id;
    for attempt in 1..=3 {
        let c = claim(&pool, runner, 1).await.remove(0);
        assert_eq!((c.id, c.attempt), (id, attempt));
        let report =
            queue::fail_batch(&pool, runner, &[failure(&c, false, Duration::ZERO)]).await.unwrap();
        if attempt < 3 {
            assert_eq!(report.retrying, vec![id]);
        } else {
            assert_eq!(report.dead, vec![id]);
        }
    }
    let t = show(&pool, id).await;
    assert_eq!(t.state, TaskState::Dead);
    assert_eq!(t.attempts, 3);
    let history: Vec<i64> =
        t.errors.as_array().unwrap().iter().map(|e| e["attempt"].as_i64().unwrap()).collect();
    assert_eq!(history, vec![1, 2, 3]);
    let live: i64 =
        sqlx::query_scalar("select count(*) from sweep.tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(live, 0, "the row left tasks");
    let dead = queue::list_dead(&pool, None, Some("t"), None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, FailureKind::HandlerError.as_str());
    assert_eq!(dead[0].module_sha256.as_deref(), Some("abc"));
}

#[sqlx::test(migrations = false)]
async fn permanent_failure_goes_dead_at_once(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    enqueue_n(&pool, "t", 1).await;
    let c = claim(&pool, runner, 1).await.remove(0);
    let report =
        queue::fail_batch(&pool, runner, &[failure(&c, true, Duration::ZERO)]).await.unwrap();
    assert_eq!(report.dead, vec![c.id]);
    assert_eq!(state(&pool, c.id).await, TaskState::Dead);
}

#[sqlx::test(migrations = false)]
async fn a_report_after_the_lease_was_lost_is_rejected(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let (a, b) = (new_runner(), new_runner());
    enqueue_n(&pool, "t", 2).await;
    let mine = queue::claim_batch(&pool, a, 2, &[], Duration::ZERO).await.unwrap();
    // Runner a stops heartbeating; the reaper rescues both tasks and b runs the first again.
    let no_backoff = queue::RetryPolicy { jitter: 0.0, base: Duration::ZERO, cap: Duration::ZERO };
    let rescued = queue::reap_expired(&pool, b, 10, no_backoff, Duration::ZERO).await.unwrap();
    assert_eq!(rescued.retrying.len(), 2);
    let (c0, c1) = (&mine[0], &mine[1]);
    // Complete from the old lease: rejected, nothing overwritten.
    let lost = queue::complete_batch(&pool, a, &[success(c0, json!("stale"))]).await.unwrap();
    assert_eq!(lost, vec![c0.id]);
    let report = queue::fail_batch(&pool, a, &[failure(c1, true, Duration::ZERO)]).await.unwrap();
    assert_eq!(report.lost, vec![c1.id]);
    assert_eq!(
        state(&pool, c1.id).await,
        TaskState::Retrying,
        "the stale permanent failure did not kill it"
    );
    // The new attempt completes; the old one still cannot overwrite it.
    let again = claim(&pool, b, 2).await;
    assert_eq!(again.len(), 2);
    assert!(again.iter().all(|c| c.attempt == 2));
    let done: Vec<_> = again.iter().map(|c| success(c, json!("fresh"))).collect();
    assert!(queue::complete_batch(&pool, b, &done).await.unwrap().is_empty());
    assert_eq!(
        queue::complete_batch(&pool, a, &[success(c0, json!("stale"))]).await.unwrap(),
        vec![c0.id]
    );
    assert_eq!(show(&pool, c0.id).await.result, Some(json!("fresh")));
}

#[sqlx::test(migrations = false)]
async fn wrong_attempt_or_owner_is_fenced_out(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    enqueue_n(&pool, "t", 1).await;
    let c = claim(&pool, runner, 1).await.remove(0);
    let stale = ClaimedTask { attempt: c.attempt + 1, ..c.clone() };
    assert_eq!(
        queue::complete_batch(&pool, runner, &[success(&stale, json!(1))]).await.unwrap(),
        vec![c.id]
    );
    assert_eq!(
        queue::complete_batch(&pool, Uuid::new_v4(), &[success(&c, json!(1))]).await.unwrap(),
        vec![c.id]
    );
    assert_eq!(state(&pool, c.id).await, TaskState::Running);
}

#[sqlx::test(migrations = false)]
async fn large_mixed_batches_apply_each_report_to_its_own_task(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    enqueue_n(&pool, "t", 600).await;
    let mut claimed = claim(&pool, runner, 600).await;
    assert_eq!(claimed.len(), 600);
    // Reports arrive in any order: shuffle deterministically (reverse, then interleave).
    claimed.reverse();
    let (to_complete, to_fail) = claimed.split_at(400);

    // 400 completions, each with its own result; one of them at a stale attempt.
    let mut completions: Vec<Completion> =
        to_complete.iter().map(|c| success(c, json!({ "id": c.id }))).collect();
    completions[7].attempt += 1;
    let lost = queue::complete_batch(&pool, runner, &completions).await.unwrap();
    assert_eq!(lost, vec![completions[7].id]);
    for c in completions.iter().step_by(37).filter(|c| c.id != completions[7].id) {
        let t = show(&pool, c.id).await;
        assert_eq!((t.state, t.result), (TaskState::Succeeded, Some(json!({ "id": c.id }))));
    }

    // 200 failures: even positions permanent (dead), odd ones retry with their own message.
    let failures: Vec<Failure> = to_fail
        .iter()
        .enumerate()
        .map(|(i, c)| Failure {
            message: format!("failure of {}", c.id),
            ..failure(c, i % 2 == 0, Duration::from_secs(60))
        })
        .collect();
    let report = queue::fail_batch(&pool, runner, &failures).await.unwrap();
    assert_eq!((report.dead.len(), report.retrying.len(), report.lost.len()), (100, 100, 0));
    for (i, f) in failures.iter().enumerate().step_by(13) {
        let t = show(&pool, f.id).await;
        let expected = if i % 2 == 0 { TaskState::Dead } else { TaskState::Retrying };
        assert_eq!(t.state, expected, "task {}", f.id);
        assert_eq!(t.last_error.as_deref(), Some(f.message.as_str()));
        assert_eq!(t.errors[0]["message"], json!(f.message));
        assert_eq!(t.errors[0]["attempt"], json!(1));
    }
}

#[sqlx::test(migrations = false)]
async fn reports_that_wait_behind_a_heartbeat_still_apply(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    enqueue_n(&pool, "t", 2).await;
    let claimed = claim(&pool, runner, 2).await;
    // A heartbeat renews both leases and holds the rows until it commits.
    let mut beat = pool.begin().await.unwrap();
    let held: Vec<_> = claimed.iter().map(|c| (c.id, c.attempt)).collect();
    assert_eq!(queue::heartbeat_leases(&mut *beat, runner, LEASE, &held).await.unwrap(), 2);
    // Both reports start now, so the renewed row versions are newer than their snapshots.
    let f = failure(&claimed[0], false, Duration::from_secs(60));
    let failing = tokio::spawn({
        let pool = pool.clone();
        async move { queue::fail_batch(&pool, runner, &[f]).await }
    });
    let c = success(&claimed[1], json!("done"));
    let completing = tokio::spawn({
        let pool = pool.clone();
        async move { queue::complete_batch(&pool, runner, &[c]).await }
    });
    backends_waiting_on_a_lock(&pool, 2).await;
    beat.commit().await.unwrap();

    let report = failing.await.unwrap().unwrap();
    assert_eq!((report.retrying, report.lost), (vec![claimed[0].id], vec![]));
    assert!(completing.await.unwrap().unwrap().is_empty(), "completion lost");
    assert_eq!(state(&pool, claimed[0].id).await, TaskState::Retrying);
    assert_eq!(state(&pool, claimed[1].id).await, TaskState::Succeeded);
}

#[sqlx::test(migrations = false)]
async fn requeue_brings_a_dead_task_back_with_its_history(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let id = queue::enqueue(&pool, task("t", 1).max_attempts(1)).await.unwrap().id;
    let c = claim(&pool, runner, 1).await.remove(0);
    queue::fail_batch(&pool, runner, &[failure(&c, false, Duration::ZERO)]).await.unwrap();
    assert_eq!(state(&pool, id).await, TaskState::Dead);

    assert_eq!(queue::requeue(&pool, None, id).await.unwrap(), id);
    let t = show(&pool, id).await;
    assert_eq!((t.state, t.attempts), (TaskState::Pending, 0));
    assert_eq!(t.errors.as_array().unwrap().len(), 1, "history kept");
    assert!(queue::list_dead(&pool, None, None, None, 10).await.unwrap().is_empty());
    // Runs again from attempt 1.
    assert_eq!(claim(&pool, runner, 1).await[0].attempt, 1);
    assert!(matches!(queue::requeue(&pool, None, id).await, Err(QueueError::TaskNotFound(_))));
}

#[sqlx::test(migrations = false)]
async fn requeue_refuses_when_its_dedup_key_is_taken(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let id = queue::enqueue(&pool, task("t", 1).max_attempts(1).dedup_key("k")).await.unwrap().id;
    let c = claim(&pool, runner, 1).await.remove(0);
    queue::fail_batch(&pool, runner, &[failure(&c, true, Duration::ZERO)]).await.unwrap();
    let newer = queue::enqueue(&pool, task("t", 2).dedup_key("k")).await.unwrap();
    assert!(newer.created);
    assert!(matches!(queue::requeue(&pool, None, id).await, Err(QueueError::DedupKeyTaken { .. })));
    assert_eq!(state(&pool, id).await, TaskState::Dead, "nothing lost");
}

#[sqlx::test(migrations = false)]
async fn cancel_applies_to_waiting_tasks_and_asks_running_ones(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let ids = enqueue_n(&pool, "t", 3).await;
    queue::cancel(&pool, None, ids[0]).await.unwrap();
    assert_eq!(state(&pool, ids[0]).await, TaskState::Cancelled);
    assert!(show(&pool, ids[0]).await.finished_at.is_some());

    let running = claim(&pool, runner, 2).await;
    // A running task: the cancel is a request to its runner (worker_cancel.rs follows it).
    assert_eq!(
        queue::cancel(&pool, None, running[0].id).await.unwrap(),
        queue::Cancel::Requested { attempt: running[0].attempt, runner }
    );
    assert_eq!(state(&pool, running[0].id).await, TaskState::Running);
    queue::fail_batch(&pool, runner, &[failure(&running[1], false, Duration::from_secs(60))])
        .await
        .unwrap();
    queue::cancel(&pool, None, running[1].id).await.unwrap();
    assert_eq!(state(&pool, running[1].id).await, TaskState::Cancelled);
    assert!(matches!(
        queue::cancel(&pool, None, ids[0]).await,
        Err(QueueError::NotCancellable { state: TaskState::Cancelled, .. })
    ));
    assert!(matches!(
        queue::cancel(&pool, None, 999_999).await,
        Err(QueueError::TaskNotFound(999_999))
    ));
}

#[sqlx::test(migrations = false)]
async fn tenant_scope_hides_other_tenants_tasks(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let id = queue::enqueue(&pool, task("t", 1).tenant("acme")).await.unwrap().id;
    assert!(matches!(
        queue::get_task(&pool, Some("globex"), id).await,
        Err(QueueError::TaskNotFound(_))
    ));
    assert!(matches!(
        queue::cancel(&pool, Some("globex"), id).await,
        Err(QueueError::TaskNotFound(_))
    ));
    assert_eq!(queue::get_task(&pool, Some("acme"), id).await.unwrap().id, id);
    queue::cancel(&pool, Some("acme"), id).await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn release_hands_unstarted_tasks_back_uncounted(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    enqueue_n(&pool, "t", 2).await;
    let claimed = claim(&pool, runner, 2).await;
    let handed: Vec<_> = claimed.iter().map(|c| (c.id, c.attempt)).collect();
    let released = queue::release_batch(&pool, runner, &handed).await.unwrap();
    assert_eq!(released.len(), 2);
    for c in &claimed {
        let t = show(&pool, c.id).await;
        assert_eq!((t.state, t.attempts), (TaskState::Pending, 0));
    }
}
