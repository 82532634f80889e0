//! Bulk enqueue by binary COPY (`EnqueueMethod::Copy`, what `enqueue_many` takes for large
//! batches): the same rows and hints as the INSERT path, one notification, and nothing written
//! when any task is bad or the COPY fails part-way.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use chrono::{TimeZone, Utc};
use common::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgListener, PgPoolOptions},
    Connection, PgPool,
};
use sweep::queue::{
    self, EnqueueMethod, Enqueued, InvalidTask, ModuleSettings, NewTask, QueueError, Wakeups,
    COPY_MIN_BATCH, NOTIFY_CHANNEL,
};

async fn count_tasks(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sweep.tasks").fetch_one(pool).await.unwrap()
}

async fn register_empty(pool: &PgPool, tenant: &str, task_type: &str, settings: ModuleSettings) {
    let bytes = sweep_dev::modules::empty_module();
    let sha = sweep::sandbox::sha256_hex(&bytes);
    queue::register_module(pool, tenant, task_type, &sha, &bytes, &settings).await.unwrap();
}

/// A batch that uses every column the enqueue computes: tenants, types with and without a
/// module default for max_attempts, priorities, all three schedules, explicit max_attempts.
fn mixed_batch(n: usize) -> Vec<NewTask> {
    let at = Utc.with_ymd_and_hms(2031, 5, 6, 7, 8, 9).unwrap()
        + chrono::Duration::nanoseconds(123_456_789);
    (0..n)
        .map(|i| {
            let mut t =
                NewTask::new(["plain", "defaulted", "capped"][i % 3], json!({"i": i, "s": "é\"x"}))
                    .tenant(["default", "acme"][i % 2])
                    .priority((i % 7) as i32 - 3);
            t = match i % 5 {
                0 => t.delay(Duration::from_millis(1500 + i as u64)),
                // Marked in the payload: its run_at is absolute, the others relative.
                1 => {
                    t.payload = json!({"i": i, "at": true});
                    t.run_at(at)
                }
                _ => t,
            };
            if i % 4 == 0 {
                t = t.max_attempts(1 + (i % 9) as i32);
            }
            t
        })
        .collect()
}

/// Every stored column of the live tasks in id order, with the parts that depend on the
/// moment of the enqueue made relative to it (`created_at`, the transaction's `now()`).
async fn rows(pool: &PgPool) -> Vec<Value> {
    sqlx::query_scalar(
        "select to_jsonb(t) - '{id,created_at,updated_at,run_at}'::text[]
                || jsonb_build_object(
                     'run_at', case when t.payload ? 'at' then to_jsonb(t.run_at)
                                    else to_jsonb(t.run_at - t.created_at) end,
                     'updated_is_created', t.updated_at = t.created_at)
         from sweep.tasks t order by t.id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The queues' rows, and whether each hint is exactly its queue's earliest run_at.
async fn queues(pool: &PgPool) -> Vec<(String, String, i32, Option<i32>, bool)> {
    sqlx::query_as(
        "select q.tenant, q.task_type, q.weight, q.max_running,
                q.next_run_at is not distinct from
                  (select min(t.run_at) from sweep.tasks t
                   where t.tenant = q.tenant and t.task_type = q.task_type)
         from sweep.queues q order by 1, 2",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn empty_queue(pool: &PgPool) {
    sqlx::query("truncate sweep.tasks").execute(pool).await.unwrap();
    sqlx::query("delete from sweep.queues").execute(pool).await.unwrap();
}

/// Follow-ups take their max_attempts as an enqueue does: their own, else the active module's
/// of their queue (their parent's tenant, their type), else the default.
#[sqlx::test(migrations = false)]
async fn follow_ups_take_their_own_queues_module_default(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    sweep::admin::create_tenant(&pool, "acme", &queue::TenantCaps::default()).await.unwrap();
    for (tenant, default) in [("default", 9), ("acme", 7)] {
        let settings = ModuleSettings { max_attempts: Some(default), ..ModuleSettings::default() };
        register_empty(&pool, tenant, "defaulted", settings).await;
    }
    queue::enqueue(&pool, NewTask::new("parent", json!({})).tenant("acme")).await.unwrap();
    let runner = uuid::Uuid::new_v4();
    let lease = Duration::from_secs(60);
    let parent = queue::claim_batch(&pool, runner, 1, &["parent".to_owned()], lease).await.unwrap();
    let done = queue::Completion {
        id: parent[0].id,
        attempt: parent[0].attempt,
        result: json!({}),
        module_sha256: None,
        logs: None,
        follow_ups: vec![
            NewTask::new("defaulted", json!({"n": 0})),
            NewTask::new("defaulted", json!({"n": 1})).max_attempts(3),
            NewTask::new("plain", json!({"n": 2})),
        ],
        usage: None,
    };
    assert!(queue::complete_batch(&pool, runner, &[done]).await.unwrap().is_empty());
    let got: Vec<(String, String, i32)> = sqlx::query_as(
        "select tenant, task_type, max_attempts from sweep.tasks order by (payload ->> 'n')::int",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let acme = |t: &str, n| ("acme".to_owned(), t.to_owned(), n);
    assert_eq!(
        got,
        [acme("defaulted", 7), acme("defaulted", 3), acme("plain", queue::DEFAULT_MAX_ATTEMPTS)]
    );
}

#[sqlx::test(migrations = false)]
async fn copy_writes_the_rows_and_hints_insert_writes(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    sweep::admin::create_tenant(&pool, "acme", &queue::TenantCaps::default()).await.unwrap();
    queue::set_tenant_weight(&pool, "acme", 3).await.unwrap();
    // Each tenant's "defaulted" module sets a default of its own: a task takes its queue's.
    for (tenant, default) in [("default", 9), ("acme", 7)] {
        let defaults = ModuleSettings { max_attempts: Some(default), ..ModuleSettings::default() };
        register_empty(&pool, tenant, "defaulted", defaults).await;
        let capped = ModuleSettings { max_running: Some(4), ..ModuleSettings::default() };
        register_empty(&pool, tenant, "capped", capped).await;
    }
    let batch = mixed_batch(3_000);

    let mut got = Vec::new();
    for method in [EnqueueMethod::Insert, EnqueueMethod::Copy] {
        empty_queue(&pool).await;
        let ids = queue::enqueue_many_using(&pool, &batch, usize::MAX, method).await.unwrap();
        assert_eq!(ids.len(), batch.len());
        assert!(ids.iter().all(|e| e.created), "{method:?}");
        assert!(ids.windows(2).all(|w| w[0].id < w[1].id), "{method:?}: ids in input order");
        // The i-th id holds the i-th task.
        for i in [0, 1, 1_234, 2_999] {
            assert_eq!(show(&pool, ids[i].id).await.payload, batch[i].payload, "{method:?}");
        }
        let hints = queues(&pool).await;
        assert_eq!(hints.len(), 6, "{method:?}: one queue row per (tenant, type)");
        assert!(
            hints.iter().all(|q| q.4),
            "{method:?}: every hint is its earliest task: {hints:?}"
        );
        got.push((rows(&pool).await, hints));
    }
    let (insert, copy) = (&got[0], &got[1]);
    assert_eq!(insert.0.len(), 3_000);
    for (i, (a, b)) in insert.0.iter().zip(&copy.0).enumerate() {
        assert_eq!(a, b, "row {i}: insert vs copy");
    }
    assert_eq!(insert.1, copy.1, "queue rows (weights, running limits copied alike)");
    // The defaults really were exercised.
    for (tenant, default) in [("default", 9), ("acme", 7)] {
        // The tasks of the type without a max_attempts of their own (`mixed_batch` gives one
        // to every fourth).
        let defaulted: Vec<&Value> = insert
            .0
            .iter()
            .filter(|r| r["tenant"] == tenant && r["task_type"] == "defaulted")
            .filter(|r| r["payload"]["i"].as_u64().is_some_and(|i| i % 4 != 0))
            .collect();
        assert!(!defaulted.is_empty(), "{tenant}");
        assert!(
            defaulted.iter().all(|r| r["max_attempts"] == default),
            "{tenant}: its own module's default, never another tenant's"
        );
    }
    assert!(insert.0.iter().any(|r| r["max_attempts"] == 5));
    assert_eq!(insert.0[0]["state"], "pending");
}

#[sqlx::test(migrations = false)]
async fn large_batches_take_copy_and_small_ones_insert_alike(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    // Around the threshold, through the default method: both sides give complete batches.
    for n in [COPY_MIN_BATCH - 1, COPY_MIN_BATCH, COPY_MIN_BATCH + 1] {
        let tasks: Vec<NewTask> = (0..n as i64).map(|i| task("t", i)).collect();
        let ids = queue::enqueue_many(&pool, &tasks).await.unwrap();
        assert_eq!(ids.len(), n);
        assert_eq!(show(&pool, ids[n - 1].id).await.payload, tasks[n - 1].payload);
    }
    let total = 3 * COPY_MIN_BATCH as i64;
    assert_eq!(count_tasks(&pool).await, total);
    // Inside the caller's transaction: uncommitted work is theirs to roll back.
    let mut tx = pool.begin().await.unwrap();
    let tasks: Vec<NewTask> = (0..2_000).map(|i| task("t", i)).collect();
    queue::enqueue_many(&mut *tx, &tasks).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(count_tasks(&pool).await, total, "rolled back with the caller's transaction");
    let mut tx = pool.begin().await.unwrap();
    queue::enqueue_many(&mut *tx, &tasks).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count_tasks(&pool).await, total + 2_000);
}

#[sqlx::test(migrations = false)]
async fn dedup_keys_keep_their_meaning_when_copy_is_asked(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let held = queue::enqueue(&pool, task("t", 0).dedup_key("k-live")).await.unwrap();
    let mut tasks: Vec<NewTask> = (1..2_000).map(|i| task("t", i)).collect();
    tasks.push(task("t", 2_000).dedup_key("k-live"));
    tasks.push(task("t", 2_001).dedup_key("k-new"));
    tasks.push(task("t", 2_002).dedup_key("k-new"));
    let ids =
        queue::enqueue_many_using(&pool, &tasks, usize::MAX, EnqueueMethod::Copy).await.unwrap();
    let n = ids.len();
    assert_eq!(ids[n - 3], Enqueued { id: held.id, created: false }, "the live task's id");
    assert!(ids[n - 2].created);
    assert_eq!(ids[n - 1], Enqueued { id: ids[n - 2].id, created: false }, "one task per key");
    assert_eq!(count_tasks(&pool).await, 1 + 1_999 + 1);
}

#[sqlx::test(migrations = false)]
async fn one_notification_per_batch_wakes_an_idle_claimer(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let wakeups = Wakeups::listen(&pool).await.unwrap();
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen(NOTIFY_CHANNEL).await.unwrap();
    let runner = new_runner();
    assert!(claim(&pool, runner, 1).await.is_empty());
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move {
            // Far longer than the test may take: only the notification can end this wait.
            let woken = wakeups.wait(Duration::from_secs(3600)).await;
            (woken, claim(&pool, runner, 10).await)
        })
    };
    let tasks: Vec<NewTask> = (0..5_000).map(|i| task("t", i)).collect();
    queue::enqueue_many_using(&pool, &tasks, usize::MAX, EnqueueMethod::Copy).await.unwrap();
    let (woken, claimed) = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the claimer was not woken by the batch's NOTIFY")
        .unwrap();
    assert!(woken);
    assert_eq!(claimed.len(), 10, "the batch was claimable once woken");

    // Notifications arrive in commit order: everything before this marker is the batch's.
    sqlx::query("select pg_notify($1, 'marker')")
        .bind(NOTIFY_CHANNEL)
        .execute(&pool)
        .await
        .unwrap();
    let mut before_marker = 0;
    loop {
        let n =
            tokio::time::timeout(Duration::from_secs(30), listener.recv()).await.unwrap().unwrap();
        if n.payload() == "marker" {
            break;
        }
        before_marker += 1;
    }
    assert_eq!(before_marker, 1, "one notification for the whole batch");
}

#[sqlx::test(migrations = false)]
async fn a_bad_task_anywhere_writes_nothing(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let mut tasks: Vec<NewTask> = (0..3_000).map(|i| task("t", i)).collect();
    tasks[2_500].payload = json!([1]);
    let e = queue::enqueue_many_using(&pool, &tasks, usize::MAX, EnqueueMethod::Copy)
        .await
        .unwrap_err();
    match e {
        QueueError::Invalid(InvalidTask::InBatch { index: 2_500, source }) => {
            assert_eq!(*source, InvalidTask::PayloadNotObject("an array"))
        }
        other => panic!("{other:?}"),
    }
    // The payload limit: `{"n":1234}` is 10 bytes, `{"n":12345}` 11.
    let mut tasks: Vec<NewTask> = (0..3_000).map(|i| task("t", i)).collect();
    tasks[1_700].payload = json!({"n": 12_345});
    for method in [EnqueueMethod::Copy, EnqueueMethod::Insert] {
        match queue::enqueue_many_using(&pool, &tasks, 10, method).await.unwrap_err() {
            QueueError::Invalid(InvalidTask::InBatch { index: 1_700, source }) => {
                assert_eq!(*source, InvalidTask::PayloadTooLarge { size: 11, limit: 10 })
            }
            other => panic!("{method:?}: {other:?}"),
        }
    }
    assert_eq!(count_tasks(&pool).await, 0);
    let queues: i64 =
        sqlx::query_scalar("select count(*) from sweep.queues").fetch_one(&pool).await.unwrap();
    assert_eq!(queues, 0, "not even a queue row");
    queue::enqueue_many_using(&pool, &tasks, 11, EnqueueMethod::Copy).await.unwrap();
    assert_eq!(count_tasks(&pool).await, 3_000);
}

#[sqlx::test(migrations = false)]
async fn a_copy_that_fails_part_way_leaves_nothing(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    // Valid to the queue, refused by Postgres at row 2,900 of the COPY (jsonb has no NUL).
    let mut tasks: Vec<NewTask> = (0..3_000).map(|i| task("t", i)).collect();
    tasks[2_900].payload = json!({"s": "a\u{0}b"});
    let mut conn = pool.acquire().await.unwrap();
    let e = queue::enqueue_many_using(&mut *conn, &tasks, usize::MAX, EnqueueMethod::Copy)
        .await
        .unwrap_err();
    assert!(matches!(e, QueueError::Database(_)), "{e:?}");
    assert_eq!(count_tasks(&pool).await, 0);
    // The same connection is usable and not left inside a transaction: what it enqueues
    // next is visible to the others at once.
    let good: Vec<NewTask> = (0..2_000).map(|i| task("t", i)).collect();
    queue::enqueue_many_using(&mut *conn, &good, usize::MAX, EnqueueMethod::Copy).await.unwrap();
    assert_eq!(count_tasks(&pool).await, 2_000);

    // Inside the caller's transaction, the failed batch is undone and the rest is kept.
    let mut tx = conn.begin().await.unwrap();
    queue::enqueue(&mut *tx, task("t", -1)).await.unwrap();
    assert!(queue::enqueue_many_using(&mut *tx, &tasks, usize::MAX, EnqueueMethod::Copy)
        .await
        .is_err());
    queue::enqueue(&mut *tx, task("t", -2)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count_tasks(&pool).await, 2_002);
}

#[sqlx::test(migrations = false)]
async fn copy_goes_through_a_transaction_pooler(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    // Two server connections for eight clients: a named statement, or one outside the
    // transaction, would meet another client's server connection.
    let bouncer = sweep_dev::pgbouncer::PgBouncer::start(&db.options, 2, &[]).await;
    let store = queue::StoreOptions { pooled: true, listen: None }
        .open_with(bouncer.options(), queue::Role::Admin, 8)
        .await
        .unwrap_or_else(|e| panic!("opening a pooled store: {e}\n{}", bouncer.log()));
    let mut running = Vec::new();
    for k in 0..4i64 {
        let store = store.clone();
        running.push(tokio::spawn(async move {
            for round in 0..3i64 {
                let tasks: Vec<NewTask> =
                    (0..1_500).map(|i| task("t", k * 1_000_000 + round * 10_000 + i)).collect();
                let ids =
                    queue::enqueue_many_using(&store, &tasks, usize::MAX, EnqueueMethod::Copy)
                        .await
                        .unwrap();
                assert_eq!(ids.len(), 1_500);
            }
            // A failed COPY leaves the pooled connection clean for the next client.
            let mut bad: Vec<NewTask> = (0..1_500).map(|i| task("t", i)).collect();
            bad[700].payload = json!({"s": "\u{0}"});
            assert!(queue::enqueue_many_using(&store, &bad, usize::MAX, EnqueueMethod::Copy)
                .await
                .is_err());
        }));
    }
    for r in running {
        r.await.unwrap();
    }
    assert_eq!(count_tasks(&pool).await, 4 * 3 * 1_500, "{}", bouncer.log());
    assert!(queues(&pool).await.iter().all(|q| q.4), "hints are right");
}

/// A completion carrying thousands of follow-ups writes them by `COPY`: the rows an enqueue of
/// the same tasks writes, in the parent's tenant, with its queues' hints, and the ids recorded
/// in the parent's result in request order; nothing for a parent fenced out or cancelled, in
/// the same batch.
#[sqlx::test(migrations = false)]
async fn follow_ups_by_copy_write_the_rows_an_enqueue_writes(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    sweep::admin::create_tenant(&pool, "acme", &queue::TenantCaps::default()).await.unwrap();
    for (tenant, default) in [("default", 9), ("acme", 7)] {
        let defaults = ModuleSettings { max_attempts: Some(default), ..ModuleSettings::default() };
        register_empty(&pool, tenant, "defaulted", defaults).await;
    }
    let batch = mixed_batch(2 * COPY_MIN_BATCH);
    // Every live row of the follow-ups in the order of the batch.
    let follow_up_rows = || async {
        let rows: Vec<Value> = sqlx::query_scalar(
            "select to_jsonb(t) - '{id,created_at,updated_at,run_at}'::text[]
                    || jsonb_build_object(
                         'run_at', case when t.payload ? 'at' then to_jsonb(t.run_at)
                                        else to_jsonb(t.run_at - t.created_at) end,
                         'updated_is_created', t.updated_at = t.created_at)
             from sweep.tasks t where t.task_type <> 'parent'
             order by (t.payload ->> 'i')::int",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        rows
    };
    queue::enqueue_many_using(&pool, &batch, usize::MAX, EnqueueMethod::Insert).await.unwrap();
    let enqueued = follow_up_rows().await;
    empty_queue(&pool).await;

    // Four parents, in `default` and `acme`: one gets each tenant's half of the batch, one is
    // fenced out, one was asked to stop.
    let mut parents = Vec::new();
    for tenant in ["default", "acme", "acme", "default"] {
        let id = queue::enqueue(&pool, NewTask::new("parent", json!({})).tenant(tenant))
            .await
            .unwrap()
            .id;
        parents.push(id);
    }
    let runner = uuid::Uuid::new_v4();
    let lease = Duration::from_secs(60);
    let claimed =
        queue::claim_batch(&pool, runner, 4, &["parent".to_owned()], lease).await.unwrap();
    assert_eq!(claimed.len(), 4);
    queue::cancel(&pool, None, parents[3]).await.unwrap();
    let of = |tenant: &str| -> Vec<NewTask> {
        batch.iter().filter(|t| t.tenant == tenant).cloned().collect()
    };
    let completions: Vec<queue::Completion> = parents
        .iter()
        .zip([of("default"), of("acme"), of("acme"), of("default")])
        .enumerate()
        .map(|(i, (&id, follow_ups))| {
            let c = claimed.iter().find(|c| c.id == id).unwrap();
            queue::Completion {
                id,
                // The third parent reports an attempt it does not hold.
                attempt: c.attempt + i32::from(i == 2),
                result: json!({"parent": i}),
                module_sha256: None,
                logs: None,
                follow_ups,
                usage: None,
            }
        })
        .collect();
    let lost = queue::complete_batch(&pool, runner, &completions).await.unwrap();
    assert_eq!(lost, [parents[2]], "the fenced-out parent");

    assert_eq!(follow_up_rows().await, enqueued, "the rows an enqueue of the batch writes");
    let hints = queues(&pool).await;
    let follow_up_queues: Vec<_> = hints.iter().filter(|q| q.1 != "parent").collect();
    assert_eq!(follow_up_queues.len(), 6);
    assert!(follow_up_queues.iter().all(|q| q.4), "every hint is its earliest task: {hints:?}");
    for (i, parent) in parents.iter().enumerate().take(2) {
        let view = show(&pool, *parent).await;
        let ids: Vec<i64> = serde_json::from_value(view.result.unwrap()["$enqueued"].clone())
            .expect("the follow-ups' ids in the result");
        assert_eq!(ids.len(), completions[i].follow_ups.len());
        for (id, asked) in ids.iter().zip(&completions[i].follow_ups) {
            let got = show(&pool, *id).await;
            assert_eq!(
                (got.tenant.as_str(), &got.payload),
                (asked.tenant.as_str(), &asked.payload)
            );
        }
    }
    assert_eq!(state(&pool, parents[2]).await, TaskState::Running, "fenced out: untouched");
    let stopped = show(&pool, parents[3]).await;
    assert_eq!((stopped.state, stopped.result), (TaskState::Cancelled, None));

    // Follow-ups naming another tenant than their parent's go to the parent's, as with the
    // statement path.
    empty_queue(&pool).await;
    let parent =
        queue::enqueue(&pool, NewTask::new("parent", json!({})).tenant("acme")).await.unwrap().id;
    let claimed =
        queue::claim_batch(&pool, runner, 1, &["parent".to_owned()], lease).await.unwrap();
    let follow_ups: Vec<NewTask> =
        (0..COPY_MIN_BATCH as i64).map(|i| task("t", i).tenant("default")).collect();
    let done = queue::Completion {
        id: parent,
        attempt: claimed[0].attempt,
        result: json!({}),
        module_sha256: None,
        logs: None,
        follow_ups,
        usage: None,
    };
    assert!(queue::complete_batch(&pool, runner, &[done]).await.unwrap().is_empty());
    let tenants: Vec<(String, i64)> =
        sqlx::query_as("select tenant, count(*) from sweep.tasks group by 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(tenants, [("acme".to_owned(), COPY_MIN_BATCH as i64)]);
}
