//! Enqueueing: single and bulk, scheduling, dedup keys, and bad input that writes nothing.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{self, InvalidTask, NewTask, QueueError, TaskState};

async fn count_tasks(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sweep.tasks").fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn enqueue_one_is_pending_with_its_fields(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let e = queue::enqueue(
        &pool,
        NewTask::new("mail", json!({"to": "ada"})).priority(7).max_attempts(3),
    )
    .await
    .unwrap();
    assert!(e.created);
    let t = show(&pool, e.id).await;
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!((t.task_type.as_str(), t.priority, t.max_attempts, t.attempts), ("mail", 7, 3, 0));
    assert_eq!(t.payload, json!({"to": "ada"}));
    assert_eq!(t.tenant, "default");
}

#[sqlx::test(migrations = false)]
async fn bulk_enqueue_returns_ids_in_input_order(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let tasks: Vec<NewTask> = (0..20_000).map(|i| task("bulk", i)).collect();
    let ids = queue::enqueue_many(&pool, &tasks).await.unwrap();
    assert_eq!(ids.len(), 20_000);
    assert!(ids.iter().all(|e| e.created));
    assert!(ids.windows(2).all(|w| w[0].id < w[1].id), "ids follow input order");
    assert_eq!(count_tasks(&pool).await, 20_000);
    // Spot-check the mapping: the i-th id holds the i-th payload.
    for i in [0usize, 12_345, 19_999] {
        assert_eq!(show(&pool, ids[i].id).await.payload, json!({ "n": i }));
    }
}

#[sqlx::test(migrations = false)]
async fn delay_and_run_at_set_when_a_task_is_due(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let later = queue::enqueue(&pool, task("t", 1).delay(Duration::from_secs(3600))).await.unwrap();
    let at = chrono::Utc::now() + chrono::Duration::minutes(30);
    let scheduled = queue::enqueue(&pool, task("t", 2).run_at(at)).await.unwrap();
    let now = queue::enqueue(&pool, task("t", 3)).await.unwrap();
    let claimed = claim(&pool, new_runner(), 10).await;
    assert_eq!(claimed.iter().map(|c| c.id).collect::<Vec<_>>(), vec![now.id]);
    let t = show(&pool, later.id).await;
    let wait = t.run_at.unwrap() - chrono::Utc::now();
    assert!(
        wait > chrono::Duration::minutes(59) && wait <= chrono::Duration::minutes(60),
        "{wait}"
    );
    let t = show(&pool, scheduled.id).await;
    assert_eq!(t.run_at.unwrap().timestamp_micros(), at.timestamp_micros());
}

#[sqlx::test(migrations = false)]
async fn dedup_key_returns_the_live_task(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let first = queue::enqueue(&pool, task("t", 1).dedup_key("order-42")).await.unwrap();
    let again = queue::enqueue(&pool, task("t", 2).dedup_key("order-42")).await.unwrap();
    assert_eq!(again, queue::Enqueued { id: first.id, created: false });
    // Another tenant's key is its own.
    let other =
        queue::enqueue(&pool, task("t", 3).dedup_key("order-42").tenant("acme")).await.unwrap();
    assert!(other.created);
    // Same key twice inside one batch: one task, both rows get its id.
    let batch = queue::enqueue_many(
        &pool,
        &[
            task("t", 4).dedup_key("k"),
            task("t", 5),
            task("t", 6).dedup_key("k"),
            task("t", 7).dedup_key("order-42"),
        ],
    )
    .await
    .unwrap();
    assert!(batch[0].created && batch[1].created);
    assert_eq!(batch[2], queue::Enqueued { id: batch[0].id, created: false });
    assert_eq!(batch[3], queue::Enqueued { id: first.id, created: false });
    assert_eq!(count_tasks(&pool).await, 4);
}

#[sqlx::test(migrations = false)]
async fn dedup_key_is_free_again_once_the_task_finished(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let first = queue::enqueue(&pool, task("t", 1).dedup_key("k")).await.unwrap();
    let c = claim(&pool, runner, 1).await.remove(0);
    // Still running: the key is held.
    assert!(!queue::enqueue(&pool, task("t", 2).dedup_key("k")).await.unwrap().created);
    let done = completion(&c, json!({}));
    assert!(queue::complete_batch(&pool, runner, &[done]).await.unwrap().is_empty());
    let second = queue::enqueue(&pool, task("t", 3).dedup_key("k")).await.unwrap();
    assert!(second.created);
    assert_ne!(second.id, first.id);
}

#[sqlx::test(migrations = false)]
async fn bad_input_is_a_typed_error_and_writes_nothing(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let cases: Vec<(NewTask, fn(&InvalidTask) -> bool)> = vec![
        (NewTask::new("", json!({})), |e| matches!(e, InvalidTask::EmptyTaskType)),
        (NewTask::new("x".repeat(200), json!({})), |e| {
            matches!(e, InvalidTask::TaskTypeTooLong { .. })
        }),
        (NewTask::new("t", json!("str")), |e| matches!(e, InvalidTask::PayloadNotObject(_))),
        (task("t", 1).max_attempts(0), |e| matches!(e, InvalidTask::MaxAttemptsOutOfRange { .. })),
        (task("t", 1).max_attempts(-4), |e| matches!(e, InvalidTask::MaxAttemptsOutOfRange { .. })),
        (task("t", 1).run_at(chrono::DateTime::from_timestamp(0, 0).unwrap()), |e| {
            matches!(e, InvalidTask::RunAtOutOfRange(_))
        }),
    ];
    for (bad, is_expected) in cases {
        match queue::enqueue(&pool, bad.clone()).await {
            Err(QueueError::Invalid(InvalidTask::InBatch { index: 0, source })) => {
                assert!(is_expected(&source), "{bad:?} gave {source}")
            }
            other => panic!("{bad:?} gave {other:?}"),
        }
    }
    // One bad task rejects the whole batch.
    let batch = vec![task("t", 1), task("t", 2), NewTask::new("t", json!(null))];
    match queue::enqueue_many(&pool, &batch).await {
        Err(QueueError::Invalid(InvalidTask::InBatch { index: 2, .. })) => {}
        other => panic!("got {other:?}"),
    }
    assert_eq!(count_tasks(&pool).await, 0);
}

#[sqlx::test(migrations = false)]
async fn tasks_take_max_attempts_from_their_active_module_unless_they_set_it(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let settings = queue::ModuleSettings { max_attempts: Some(2), ..Default::default() };
    queue::register_module(&pool, "default", "m", &"a".repeat(64), b"\0asm", &settings)
        .await
        .unwrap();
    let tasks = vec![
        task("m", 1),
        task("m", 2).max_attempts(9),
        task("m", 3).tenant("other"),
        task("n", 4),
    ];
    let plain = queue::enqueue_many(&pool, &tasks).await.unwrap();
    let deduped: Vec<NewTask> =
        tasks.iter().enumerate().map(|(i, t)| t.clone().dedup_key(format!("k{i}"))).collect();
    let with_keys = queue::enqueue_many(&pool, &deduped).await.unwrap();
    for enqueued in [plain, with_keys] {
        let mut got = Vec::new();
        for e in enqueued {
            got.push(queue::get_task(&pool, None, e.id).await.unwrap().max_attempts);
        }
        assert_eq!(got, vec![2, 9, 5, 5], "module default, explicit, other tenant, no module");
    }
}
