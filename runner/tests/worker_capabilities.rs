//! Capabilities through a real runner: a task whose module names secrets runs only when the
//! runner can open them (else `secrets_unavailable`, the guest never started); what it leaves
//! behind is redacted of their values; every attempt's usage is kept with it and added to the
//! day's totals.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use sweep::config::WorkerConfig;
use sweep::queue::{self, ModuleSettings, NewTask, PutSecret};
use sweep::sandbox::sha256_hex;
use sweep::secrets::SecretsKey;

const SECRET: &str = "sk-live-4f9a2c7e1b";

/// Writes `out` to stdout and `err` to stderr, then exits with `code`.
fn writer(out: &str, err: &str, code: i32) -> Vec<u8> {
    let esc = |s: &str| s.replace('"', "\\22").replace('\n', "\\0a");
    wat::parse_str(format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "{out}")
  (data (i32.const 2000) "{err}")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const {out_len}))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store (i32.const 0) (i32.const 2000))
    (i32.store (i32.const 4) (i32.const {err_len}))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
    (call $proc_exit (i32.const {code}))))"#,
        out = esc(out),
        err = esc(err),
        out_len = out.len(),
        err_len = err.len(),
    ))
    .unwrap()
}

async fn register(pool: &PgPool, task_type: &str, bytes: &[u8], secrets: &[&str]) {
    register_for(pool, "default", task_type, bytes, secrets).await;
}

async fn register_for(
    pool: &PgPool,
    tenant: &str,
    task_type: &str,
    bytes: &[u8],
    secrets: &[&str],
) {
    let secrets: Vec<String> = secrets.iter().map(|s| s.to_string()).collect();
    let settings = ModuleSettings { max_attempts: Some(1), ..ModuleSettings::default() };
    let options = queue::UploadOptions { secrets, reuse: None };
    queue::register_module_with(
        pool,
        tenant,
        task_type,
        &sha256_hex(bytes),
        bytes,
        &settings,
        &options,
    )
    .await
    .unwrap();
}

async fn set_secret(pool: &PgPool, key: &SecretsKey, name: &str, value: &str) {
    set_secret_for(pool, key, "default", name, value).await;
}

async fn set_secret_for(pool: &PgPool, key: &SecretsKey, tenant: &str, name: &str, value: &str) {
    let sealed = key.seal(tenant, name, value);
    let put = queue::put_secret(pool, tenant, name, &sealed).await.unwrap();
    assert!(matches!(put, PutSecret::Stored { .. }));
}

fn with_key(key: Option<SecretsKey>) -> WorkerConfig {
    WorkerConfig { secrets_key: key, ..test_config() }
}

#[sqlx::test(migrations = false)]
async fn what_a_task_leaves_behind_is_redacted_and_its_usage_kept(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let (key, _) = SecretsKey::generate();
    set_secret(&pool, &key, "API_KEY", SECRET).await;
    let out = format!(r#"{{"sent_with": "{SECRET}", "n": 1}}"#);
    register(&pool, "leaky", &writer(&out, &format!("auth: Bearer {SECRET}\n"), 0), &["API_KEY"])
        .await;
    register(&pool, "failing", &writer("", &format!("rejected key {SECRET}"), 1), &["API_KEY"])
        .await;
    let runner = start_worker(&db, with_key(Some(key)));
    let ok = queue::enqueue(&pool, NewTask::new("leaky", json!({}))).await.unwrap().id;
    let bad = queue::enqueue(&pool, NewTask::new("failing", json!({}))).await.unwrap().id;
    let ok = wait_settled(&pool, ok).await;
    let bad = wait_settled(&pool, bad).await;
    runner.stop().await;

    assert_eq!(ok.state, TaskState::Succeeded, "{ok:#?}");
    assert_eq!(ok.result, Some(json!({"sent_with": "[redacted:API_KEY]", "n": 1})));
    assert_eq!(ok.logs.as_deref(), Some("auth: Bearer [redacted:API_KEY]\n"));
    let usage = ok.usage.clone().expect("the successful attempt's usage");
    assert!(usage["fuel_used"].as_i64().unwrap() > 0, "{usage}");
    assert!(usage["duration_ms"].is_i64() && usage["peak_memory_bytes"].is_i64(), "{usage}");

    assert_eq!(bad.state, TaskState::Dead, "{bad:#?}");
    let entry = &bad.errors[0];
    assert_eq!(entry["kind"], "handler_error");
    assert_eq!(entry["stderr"], "rejected key [redacted:API_KEY]");
    assert!(!entry["message"].as_str().unwrap().contains(SECRET), "{entry}");
    assert!(entry["fuel_used"].as_i64().unwrap() > 0, "{entry}");
    assert_eq!(entry["http_requests"], 0);

    // Nowhere in what was stored, in any table.
    let stored: Vec<String> = sqlx::query_scalar(
        "select t::text from sweep.finished_tasks t union all select d::text from sweep.dead_tasks d",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(stored.len(), 2);
    assert!(stored.iter().all(|row| !row.contains(SECRET)), "{stored:#?}");

    // The day's totals, folded by the runner's maintenance or not yet.
    let today = chrono::Utc::now().date_naive();
    let days = queue::usage_days(&pool, None, None, today, today).await.unwrap();
    let totals: Vec<(&str, i64, i64, i64)> =
        days.iter().map(|d| (d.task_type.as_str(), d.attempts, d.succeeded, d.failed)).collect();
    assert_eq!(totals, [("failing", 1, 0, 1), ("leaky", 1, 1, 0)]);
}

#[sqlx::test(migrations = false)]
async fn a_runner_that_cannot_give_the_secrets_does_not_run_the_task(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let (key, _) = SecretsKey::generate();
    set_secret(&pool, &key, "API_KEY", SECRET).await;
    // The guest would write to stderr if it ran.
    register(&pool, "needs", &writer("{}", "I ran", 0), &["API_KEY", "GONE"]).await;
    register(&pool, "needs_one", &writer("{}", "I ran", 0), &["API_KEY"]).await;
    register(&pool, "plain", &writer("{}", "", 0), &[]).await;

    // No key: refused, saying so; a module that names no secret runs as ever.
    let runner = start_worker(&db, with_key(None));
    let refused = queue::enqueue(&pool, NewTask::new("needs_one", json!({}))).await.unwrap().id;
    let plain = queue::enqueue(&pool, NewTask::new("plain", json!({}))).await.unwrap().id;
    let refused = wait_settled(&pool, refused).await;
    assert_eq!(wait_settled(&pool, plain).await.state, TaskState::Succeeded);
    runner.stop().await;
    assert_eq!(refused.state, TaskState::Dead);
    assert_eq!(error_kinds(&refused), [FailureKind::SecretsUnavailable]);
    let entry = &refused.errors[0];
    assert!(entry["message"].as_str().unwrap().contains("SWEEP_SECRETS_KEY"), "{entry}");
    assert!(entry.get("stderr").is_none(), "the guest never ran: {entry}");

    // Another key: refused, naming the key it needs.
    let runner = start_worker(&db, with_key(Some(SecretsKey::generate().0)));
    let other_key = queue::enqueue(&pool, NewTask::new("needs_one", json!({}))).await.unwrap().id;
    let other_key = wait_settled(&pool, other_key).await;
    runner.stop().await;
    assert_eq!(error_kinds(&other_key), [FailureKind::SecretsUnavailable]);
    assert!(other_key.errors[0]["message"].as_str().unwrap().contains(key.id()));

    // The right key, but a named secret is gone.
    let runner = start_worker(&db, with_key(Some(key)));
    let gone = queue::enqueue(&pool, NewTask::new("needs", json!({}))).await.unwrap().id;
    let gone = wait_settled(&pool, gone).await;
    runner.stop().await;
    assert_eq!(error_kinds(&gone), [FailureKind::SecretsUnavailable]);
    assert!(gone.errors[0]["message"].as_str().unwrap().contains("secret GONE"), "{gone:#?}");
}

/// Tenant `name` with secret API_KEY = `value` and a module "leaky" that prints that value in
/// its result, so that the result comes back redacted only when the task was given exactly
/// its own tenant's secret.
async fn leaky_tenant(pool: &PgPool, key: &SecretsKey, name: &str, value: &str) {
    let token = sha256_hex(name.as_bytes());
    queue::create_tenant(pool, name, &token, &queue::TenantCaps::default()).await.unwrap();
    set_secret_for(pool, key, name, "API_KEY", value).await;
    register_for(
        pool,
        name,
        "leaky",
        &writer(&format!(r#"{{"k": "{value}"}}"#), "", 0),
        &["API_KEY"],
    )
    .await;
}

#[sqlx::test(migrations = false)]
async fn a_batch_over_many_tenants_gives_each_task_its_own_tenants_capabilities(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let (key, _) = SecretsKey::generate();
    let tenants: Vec<String> = (0..6).map(|i| format!("acme{i}")).collect();
    for (i, tenant) in tenants.iter().enumerate() {
        leaky_tenant(&pool, &key, tenant, &format!("sk-{i}-{SECRET}")).await;
        let allow = vec![format!("api{i}.example.org")];
        let egress = queue::TenantEgress { tenant: tenant.clone(), allow, ..Default::default() };
        queue::set_egress(&pool, &egress).await.unwrap();
    }

    // What the runner reads for a batch: each key's own tenant's rows, a key that does not
    // exist left out.
    let mut keys: Vec<(String, String, i32)> =
        tenants.iter().map(|t| (t.clone(), "leaky".to_owned(), 1)).collect();
    keys.push(("acme0".to_owned(), "leaky".to_owned(), 2));
    let mut found = queue::task_capabilities_many(&pool, &keys).await.unwrap();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let read: Vec<(&str, Vec<String>, Vec<String>)> = found
        .iter()
        .map(|((tenant, _, _), rows)| {
            let names = rows.sealed.iter().map(|(n, _)| n.clone()).collect();
            (tenant.as_str(), rows.allow.clone(), names)
        })
        .collect();
    let expected: Vec<(&str, Vec<String>, Vec<String>)> = tenants
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), vec![format!("api{i}.example.org")], vec!["API_KEY".into()]))
        .collect();
    assert_eq!(read, expected);

    // Enqueued before the runner starts, so that its first claims take tasks of several
    // tenants together and read their capabilities in one query: each task still runs with
    // its own tenant's secret (its result names it, redacted), never another's.
    let mut ids = Vec::new();
    for tenant in &tenants {
        for n in 0..2 {
            let task = NewTask::new("leaky", json!({ "n": n })).tenant(tenant.clone());
            ids.push(queue::enqueue(&pool, task).await.unwrap().id);
        }
    }
    let runner = start_worker(&db, with_key(Some(key)));
    for id in ids {
        let task = wait_settled(&pool, id).await;
        assert_eq!(task.state, TaskState::Succeeded, "{task:#?}");
        assert_eq!(task.result, Some(json!({"k": "[redacted:API_KEY]"})), "{task:#?}");
    }
    runner.stop().await;
}
