//! The per-tenant running cap (`tenants.max_running`), enforced by `claim_batch`: two runners
//! claiming at once never run more of a capped tenant's tasks than its cap, a capped tenant's
//! flood does not keep other tenants' work from being claimed, and uncapped tenants are
//! untouched.

#![allow(clippy::unwrap_used)]

use std::sync::{
    atomic::{AtomicI64, Ordering},
    Arc,
};
use std::time::Duration;

use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{self, Completion, NewTask, TaskState, TenantCaps};
use sweep_dev::migrated;
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(60);

async fn capped_tenant(pool: &PgPool, name: &str, max_running: i32) {
    let caps = TenantCaps { max_running: Some(max_running), ..TenantCaps::default() };
    let hash = sweep::sandbox::sha256_hex(name.as_bytes());
    queue::create_tenant(pool, name, &hash, &caps).await.expect("create tenant");
}

async fn enqueue(pool: &PgPool, tenant: &str, n: usize, priority: i32) {
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| NewTask::new("t", json!({ "i": i })).tenant(tenant).priority(priority))
        .collect();
    queue::enqueue_many(pool, &tasks).await.expect("enqueue");
}

async fn running(pool: &PgPool, tenant: &str) -> i64 {
    sqlx::query_scalar("select count(*) from sweep.tasks where state = $2 and tenant = $1")
        .bind(tenant)
        .bind(TaskState::Running.as_str())
        .fetch_one(pool)
        .await
        .expect("count running")
}

async fn complete(pool: &PgPool, runner: Uuid, tasks: &[queue::ClaimedTask]) {
    let done: Vec<Completion> = tasks
        .iter()
        .map(|c| Completion {
            id: c.id,
            attempt: c.attempt,
            result: json!({}),
            module_sha256: None,
            logs: None,
            follow_ups: Vec::new(),
            usage: None,
        })
        .collect();
    let lost = queue::complete_batch(pool, runner, &done).await.expect("complete");
    assert!(lost.is_empty());
}

#[sqlx::test(migrations = false)]
async fn two_runners_together_never_exceed_the_cap(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    const CAP: i64 = 3;
    capped_tenant(&pool, "capped", CAP as i32).await;
    enqueue(&pool, "capped", 120, 0).await;
    enqueue(&pool, "default", 40, 0).await;

    // Claimed-and-not-yet-completed tasks of the capped tenant, as the runners see them: bumped
    // after a claim committed, lowered before its completion commits, so it never exceeds what
    // the database holds as running, which must never exceed the cap.
    let held = Arc::new(AtomicI64::new(0));
    let high_water = Arc::new(AtomicI64::new(0));
    let runners = (0..2).map(|k| {
        let (pool, held, high_water) = (pool.clone(), held.clone(), high_water.clone());
        tokio::spawn(async move {
            let runner = Uuid::new_v4();
            let (mut capped, mut other) = (0, 0);
            let mut idle_rounds = 0;
            while idle_rounds < 20 {
                let batch =
                    queue::claim_batch(&pool, runner, 2 + k, &[], LEASE).await.expect("claim");
                let mine = batch.iter().filter(|c| c.tenant == "capped").count() as i64;
                let now = held.fetch_add(mine, Ordering::SeqCst) + mine;
                high_water.fetch_max(now, Ordering::SeqCst);
                assert!(now <= CAP, "runner {k} sees {now} capped tasks held, cap is {CAP}");
                let in_db = running(&pool, "capped").await;
                assert!(in_db <= CAP, "{in_db} capped tasks running, cap is {CAP}");
                if batch.is_empty() {
                    idle_rounds += 1;
                    tokio::task::yield_now().await;
                    continue;
                }
                idle_rounds = 0;
                capped += mine;
                other += batch.len() as i64 - mine;
                // Hold the tasks a moment so the two runners overlap.
                tokio::time::sleep(Duration::from_millis(2)).await;
                held.fetch_sub(mine, Ordering::SeqCst);
                complete(&pool, runner, &batch).await;
            }
            (capped, other)
        })
    });
    let (mut capped, mut other) = (0, 0);
    for r in runners {
        let (c, o) = r.await.expect("runner");
        capped += c;
        other += o;
    }
    assert_eq!((capped, other), (120, 40), "every task was claimed exactly once");
    assert!(high_water.load(Ordering::SeqCst) >= 2, "the runners did run tasks side by side");
}

#[sqlx::test(migrations = false)]
async fn a_claim_in_flight_is_counted_by_the_other_runner(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    // Runner A's claim has not committed yet when runner B claims: B must not count A's
    // tasks as free slots (its snapshot cannot see them), so B skips the tenant.
    capped_tenant(&pool, "capped", 3).await;
    enqueue(&pool, "capped", 20, 0).await;
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());

    let mut in_flight = pool.begin().await.expect("begin");
    let by_a = queue::claim_batch(&mut *in_flight, a, 10, &[], LEASE).await.expect("claim a");
    assert_eq!(by_a.len(), 3);
    let by_b = queue::claim_batch(&pool, b, 10, &[], LEASE).await.expect("claim b");
    assert!(by_b.is_empty(), "B claimed {} while A's claim was in flight", by_b.len());
    in_flight.commit().await.expect("commit");

    assert!(queue::claim_batch(&pool, b, 10, &[], LEASE).await.expect("claim b").is_empty());
    assert_eq!(running(&pool, "capped").await, 3);
    complete(&pool, a, &by_a[..2]).await;
    assert_eq!(queue::claim_batch(&pool, b, 10, &[], LEASE).await.expect("claim b").len(), 2);
    assert_eq!(running(&pool, "capped").await, 3);
}

#[sqlx::test(migrations = false)]
async fn a_capped_tenants_flood_leaves_room_for_others(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    capped_tenant(&pool, "flood", 2).await;
    // The flood is first in line (higher priority) and far larger than a batch.
    enqueue(&pool, "flood", 500, 10).await;
    enqueue(&pool, "default", 10, 0).await;
    let runner = Uuid::new_v4();

    let first = queue::claim_batch(&pool, runner, 50, &[], LEASE).await.expect("claim");
    let flood: Vec<_> = first.iter().filter(|c| c.tenant == "flood").cloned().collect();
    assert_eq!(flood.len(), 2, "the flood gets its two slots and no more");
    assert_eq!(first.len(), 12, "everyone else gets the rest of the batch");

    // With the flood at its cap and the rest done, nothing more is claimable.
    let second = queue::claim_batch(&pool, Uuid::new_v4(), 50, &[], LEASE).await.expect("claim");
    assert!(second.is_empty());

    // A finished task frees one slot.
    complete(&pool, runner, &flood[..1]).await;
    let third = queue::claim_batch(&pool, runner, 50, &[], LEASE).await.expect("claim");
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].tenant, "flood");
    assert_eq!(running(&pool, "flood").await, 2);
}

#[sqlx::test(migrations = false)]
async fn a_zero_cap_holds_the_tenants_tasks_and_raising_it_releases_them(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    capped_tenant(&pool, "paused", 0).await;
    enqueue(&pool, "paused", 5, 0).await;
    let runner = Uuid::new_v4();
    assert!(queue::claim_batch(&pool, runner, 10, &[], LEASE).await.expect("claim").is_empty());

    let caps = TenantCaps { max_running: Some(4), ..TenantCaps::default() };
    queue::set_tenant_caps(&pool, "paused", &caps).await.expect("set caps");
    assert_eq!(queue::claim_batch(&pool, runner, 10, &[], LEASE).await.expect("claim").len(), 4);

    let uncapped = TenantCaps::default();
    queue::set_tenant_caps(&pool, "paused", &uncapped).await.expect("set caps");
    assert_eq!(queue::claim_batch(&pool, runner, 10, &[], LEASE).await.expect("claim").len(), 1);
}

#[sqlx::test(migrations = false)]
async fn caps_of_one_tenant_do_not_limit_another(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    capped_tenant(&pool, "small", 1).await;
    capped_tenant(&pool, "large", 30).await;
    enqueue(&pool, "small", 10, 0).await;
    enqueue(&pool, "large", 10, 0).await;
    enqueue(&pool, "default", 10, 0).await;
    let got = queue::claim_batch(&pool, Uuid::new_v4(), 100, &[], LEASE).await.expect("claim");
    let count = |t: &str| got.iter().filter(|c| c.tenant == t).count();
    assert_eq!((count("small"), count("large"), count("default")), (1, 10, 10));
}
