//! Flow control in the claim: paused task types and tenants are skipped by every claimer,
//! enqueues are still accepted, running tasks finish, resuming lets the work be claimed, and
//! the state is in Postgres (a store opened later sees it).
//!
//! Every verdict is a count read from the database or from what a claim returned: no timing.

mod common;

use common::*;
use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{self, FlowError, ModuleSettings, NewTask, Role, Store, TenantCaps};

/// A module row for (`tenant`, `task_type`): the claim never runs it, so any bytes do.
async fn module_for(pool: &PgPool, tenant: &str, task_type: &str) {
    let bytes = format!("module {tenant}/{task_type}").into_bytes();
    let sha = sweep::sandbox::sha256_hex(&bytes);
    queue::register_module(pool, tenant, task_type, &sha, &bytes, &ModuleSettings::default())
        .await
        .expect("register");
}

async fn backlog(pool: &PgPool, tenant: &str, task_type: &str, n: usize) {
    let tasks: Vec<NewTask> =
        (0..n).map(|i| NewTask::new(task_type, json!({ "i": i })).tenant(tenant)).collect();
    queue::enqueue_many(pool, &tasks).await.expect("enqueue");
}

async fn tenant(pool: &PgPool, name: &str) {
    let hash = format!("{:064x}", name.len() * 7919 + 17);
    queue::create_tenant(pool, name, &hash, &TenantCaps::default()).await.expect("create tenant");
}

/// (task type, state) counts of one tenant's live tasks.
async fn count(pool: &PgPool, tenant: &str, task_type: &str, state: TaskState) -> i64 {
    sqlx::query_scalar(
        "select count(*) from sweep.tasks where tenant = $1 and task_type = $2 and state = $3",
    )
    .bind(tenant)
    .bind(task_type)
    .bind(state.as_str())
    .fetch_one(pool)
    .await
    .expect("count")
}

fn types(claimed: &[queue::ClaimedTask]) -> Vec<(String, String)> {
    let mut t: Vec<_> = claimed.iter().map(|c| (c.tenant.clone(), c.task_type.clone())).collect();
    t.sort();
    t.dedup();
    t
}

#[sqlx::test(migrations = false)]
async fn a_paused_type_is_skipped_by_two_claimers_until_resumed(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    module_for(&pool, "default", "held").await;
    module_for(&pool, "default", "free").await;
    backlog(&pool, "default", "held", 6).await;
    backlog(&pool, "default", "free", 6).await;
    // One task of the type is running when the pause comes: it finishes normally.
    let (a, b) = (new_runner(), new_runner());
    let early = queue::claim_batch(&pool, a, 1, &["held".to_owned()], LEASE).await.unwrap();
    assert_eq!(early.len(), 1);

    let control = queue::pause_queue(&pool, "default", "held", "tenant:default").await.unwrap();
    assert!(control.paused && control.paused_at.is_some());
    assert_eq!(control.paused_by.as_deref(), Some("tenant:default"));
    // Pausing again keeps the first pause's time and author.
    let again = queue::pause_queue(&pool, "default", "held", "operator").await.unwrap();
    assert_eq!((again.paused_at, again.paused_by), (control.paused_at, control.paused_by));

    let by_a = claim(&pool, a, 10).await;
    let by_b = claim(&pool, b, 10).await;
    assert_eq!(by_a.len() + by_b.len(), 6, "only the free type's six");
    assert!(by_a.iter().chain(&by_b).all(|c| c.task_type == "free"));
    // Enqueues are accepted while paused, and still not claimed.
    backlog(&pool, "default", "held", 2).await;
    assert!(claim(&pool, b, 10).await.is_empty());
    assert!(queue::claim_batch(&pool, b, 10, &["held".to_owned()], LEASE)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(count(&pool, "default", "held", TaskState::Pending).await, 7);
    // The task that was running when the pause came completes.
    let done: Vec<_> = early.iter().map(|c| completion(c, json!({}))).collect();
    assert!(queue::complete_batch(&pool, a, &done).await.unwrap().is_empty());

    let resumed = queue::resume_queue(&pool, "default", "held").await.unwrap();
    assert!(!resumed.paused && resumed.paused_at.is_none() && resumed.paused_by.is_none());
    let by_b = claim(&pool, b, 4).await;
    let by_a = claim(&pool, a, 10).await;
    assert_eq!(by_a.len() + by_b.len(), 7, "every waiting task of the resumed type");
    assert_eq!(count(&pool, "default", "held", TaskState::Running).await, 7);
}

#[sqlx::test(migrations = false)]
async fn the_single_queue_claim_skips_a_paused_queue(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    // One due queue and no limit: the claim's direct path, which must skip it too.
    module_for(&pool, "default", "only").await;
    backlog(&pool, "default", "only", 3).await;
    queue::pause_queue(&pool, "default", "only", "operator").await.unwrap();
    assert!(claim(&pool, new_runner(), 5).await.is_empty());
    queue::resume_queue(&pool, "default", "only").await.unwrap();
    assert_eq!(claim(&pool, new_runner(), 5).await.len(), 3);
}

#[sqlx::test(migrations = false)]
async fn a_tenant_pause_covers_its_types_new_ones_included(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    tenant(&pool, "acme").await;
    tenant(&pool, "other").await;
    module_for(&pool, "acme", "one").await;
    module_for(&pool, "acme", "two").await;
    module_for(&pool, "other", "one").await;
    backlog(&pool, "acme", "one", 3).await;
    backlog(&pool, "other", "one", 3).await;
    // `two` has its own pause, which the tenant's pause and resume leave alone.
    queue::pause_queue(&pool, "acme", "two", "tenant:acme").await.unwrap();

    let paused = queue::pause_tenant(&pool, "acme", "operator").await.unwrap();
    assert!(paused.paused && paused.paused_at.is_some());
    assert_eq!(paused.paused_by.as_deref(), Some("operator"));
    // Queues created after the pause copy it: by an upload, and by a first enqueue.
    module_for(&pool, "acme", "three").await;
    backlog(&pool, "acme", "three", 2).await;
    backlog(&pool, "acme", "two", 2).await;
    backlog(&pool, "acme", "unregistered", 2).await;

    let got = claim(&pool, new_runner(), 20).await;
    assert_eq!(types(&got), vec![("other".to_owned(), "one".to_owned())]);
    let controls = queue::list_queue_controls(&pool, Some("acme")).await.unwrap();
    let names: Vec<&str> = controls.iter().map(|c| c.task_type.as_str()).collect();
    assert_eq!(names, ["one", "three", "two", "unregistered"]);
    assert!(controls.iter().all(|c| c.paused && c.tenant_paused));
    let tenants = queue::list_paused_tenants(&pool, None).await.unwrap();
    assert_eq!(tenants, vec![paused.clone()]);

    let resumed = queue::resume_tenant(&pool, "acme").await.unwrap();
    assert!(!resumed.paused && resumed.paused_by.is_none());
    let got = claim(&pool, new_runner(), 20).await;
    assert_eq!(got.len(), 3 + 2 + 2, "one, three and unregistered; two is still paused");
    assert!(got.iter().all(|c| c.tenant == "acme" && c.task_type != "two"));
    let controls = queue::list_queue_controls(&pool, None).await.unwrap();
    assert_eq!(controls.len(), 1);
    assert_eq!((controls[0].task_type.as_str(), controls[0].tenant_paused), ("two", false));
}

#[sqlx::test(migrations = false)]
async fn a_pause_is_seen_by_a_store_opened_later(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    tenant(&pool, "acme").await;
    module_for(&pool, "default", "held").await;
    module_for(&pool, "acme", "work").await;
    backlog(&pool, "default", "held", 2).await;
    backlog(&pool, "acme", "work", 2).await;
    queue::pause_queue(&pool, "default", "held", "operator").await.unwrap();
    queue::pause_tenant(&pool, "acme", "operator").await.unwrap();
    db.runner.close().await;

    // A runner started afterwards: its own store, its own connections.
    let restarted = Store::open_with(db.options.clone(), Role::Runner, 2).await.unwrap();
    let got = queue::claim_batch(&restarted, new_runner(), 10, &[], LEASE).await.unwrap();
    assert!(got.is_empty(), "{got:?}");
    let stats = queue::list_queue_controls(&restarted, None).await.unwrap();
    assert_eq!(stats.len(), 2);
    restarted.close().await;
}

#[sqlx::test(migrations = false)]
async fn pausing_what_does_not_exist_writes_nothing(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    backlog(&pool, "default", "nomodule", 1).await;
    let before: Vec<(String, bool)> =
        sqlx::query_as("select task_type, paused from sweep.queues order by 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    match queue::pause_queue(&pool, "default", "nomodule", "operator").await {
        Err(e @ FlowError::NoModule { .. }) => assert!(e.to_string().contains("task_type")),
        other => panic!("expected NoModule, got {other:?}"),
    }
    assert!(matches!(
        queue::pause_queue(&pool, "default", "never-seen", "operator").await,
        Err(FlowError::NoModule { .. })
    ));
    assert!(matches!(
        queue::pause_queue(&pool, "default", "bad type!", "operator").await,
        Err(FlowError::BadName(_))
    ));
    assert!(matches!(
        queue::pause_tenant(&pool, "nobody", "operator").await,
        Err(FlowError::TenantNotFound(_))
    ));
    let after: Vec<(String, bool)> =
        sqlx::query_as("select task_type, paused from sweep.queues order by 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(before, after);
    assert!(queue::list_paused_tenants(&pool, None).await.unwrap().is_empty());
    assert_eq!(claim(&pool, new_runner(), 5).await.len(), 1);
}
