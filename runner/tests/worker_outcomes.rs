//! End to end through a real runner and real Wasm from `modules/`: results are stored, every
//! misbehaving fixture lands on its exact outcome kind and retry or dead-letter path, and a
//! new module version applies without a restart.

mod common;

use common::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::{self, ModuleSettings, NewTask, TaskState};

#[sqlx::test(migrations = false)]
async fn handler_output_is_stored_as_the_result(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let sha = register(&pool, "wordcount", "wordcount", ModuleSettings::default()).await;
    let runner = start_worker(&db, test_config());
    let id = queue::enqueue(&pool, NewTask::new("wordcount", json!({"text": "a b a", "top": 1})))
        .await
        .unwrap()
        .id;
    let t = wait_settled(&pool, id).await;
    assert_eq!(t.state, TaskState::Succeeded, "{t:#?}");
    assert_eq!(t.result, Some(json!({"words": 3, "lines": 1, "chars": 5, "top": [["a", 2]]})));
    assert_eq!(t.module_sha256, Some(sha), "the task records which module ran it");
    assert_eq!(
        t.logs.as_deref().map(str::trim),
        Some("counted 3 words in 1 lines"),
        "stderr is kept"
    );
    runner.stop().await;
}

/// (task type, module, settings, payload, expected kind of every attempt, max_attempts)
fn misbehaving(
) -> Vec<(&'static str, &'static str, ModuleSettings, serde_json::Value, FailureKind, i32)> {
    let s = ModuleSettings::default;
    vec![
        (
            "oof",
            "spinloop",
            ModuleSettings { fuel: Some(1_000_000), ..s() },
            json!({}),
            FailureKind::OutOfFuel,
            2,
        ),
        (
            "spin-timeout",
            "spinloop",
            ModuleSettings { fuel: Some(100_000_000_000), timeout_ms: Some(400), ..s() },
            json!({}),
            FailureKind::Timeout,
            1,
        ),
        (
            "sleeper",
            "sleep",
            ModuleSettings { timeout_ms: Some(400), ..s() },
            json!({}),
            FailureKind::Timeout,
            1,
        ),
        (
            "hog",
            "grow",
            ModuleSettings { memory_bytes: Some(16 << 20), ..s() },
            json!({}),
            FailureKind::MemoryLimit,
            1,
        ),
        ("deep", "recurse", s(), json!({}), FailureKind::StackOverflow, 1),
        ("chatty", "flood", s(), json!({}), FailureKind::OutputTooLarge, 1),
        ("crash", "panic", s(), json!({}), FailureKind::Trap, 2),
    ]
}

#[sqlx::test(migrations = false)]
async fn every_misbehaving_fixture_lands_on_its_outcome_and_dies(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let mut ids = Vec::new();
    for (task_type, module, settings, payload, kind, max_attempts) in misbehaving() {
        register(&pool, task_type, module, settings).await;
        let task = NewTask::new(task_type, payload).max_attempts(max_attempts);
        ids.push((queue::enqueue(&pool, task).await.unwrap().id, task_type, kind, max_attempts));
    }
    let runner = start_worker(&db, test_config());
    for (id, task_type, kind, max_attempts) in ids {
        let t = wait_settled(&pool, id).await;
        assert_eq!(t.state, TaskState::Dead, "{task_type}: {t:#?}");
        assert_eq!(error_kinds(&t), vec![kind; max_attempts as usize], "{task_type}: {t:#?}");
        let entry = &t.errors[0];
        assert!(entry["duration_ms"].is_u64() && entry["fuel_used"].is_u64(), "{entry}");
        let dead = queue::list_dead(&pool, None, Some(task_type), None, 10).await.unwrap();
        assert_eq!(dead[0].reason, kind.as_str());
    }
    runner.stop().await;
}

#[sqlx::test(migrations = false)]
async fn permanent_failure_dies_at_once_and_flaky_succeeds_after_retries(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    register(&pool, "permanent", "permanent", ModuleSettings::default()).await;
    register(&pool, "flaky", "flaky", ModuleSettings::default()).await;
    let permanent = queue::enqueue(&pool, NewTask::new("permanent", json!({}))).await.unwrap().id;
    let flaky =
        queue::enqueue(&pool, NewTask::new("flaky", json!({"fail_times": 2}))).await.unwrap().id;
    let runner = start_worker(&db, test_config());

    let t = wait_settled(&pool, permanent).await;
    assert_eq!(
        (t.state, t.attempts),
        (TaskState::Dead, 1),
        "max_attempts is 5, but permanent means no retry"
    );
    assert_eq!(error_kinds(&t), vec![FailureKind::HandlerError]);
    assert_eq!(t.errors[0]["exit_code"], 100);
    assert!(t.last_error.as_deref().unwrap_or("").contains("permanent"), "{t:#?}");

    let t = wait_settled(&pool, flaky).await;
    assert_eq!((t.state, t.attempts), (TaskState::Succeeded, 3));
    assert_eq!(error_kinds(&t), vec![FailureKind::HandlerError, FailureKind::HandlerError]);
    assert_eq!(t.result, Some(json!({"attempt": 3})));
    runner.stop().await;
}

#[sqlx::test(migrations = false)]
async fn a_task_type_without_a_module_fails_as_module_missing(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = start_worker(&db, test_config());
    let id =
        queue::enqueue(&pool, NewTask::new("ghost", json!({})).max_attempts(2)).await.unwrap().id;
    let t = wait_settled(&pool, id).await;
    assert_eq!(t.state, TaskState::Dead);
    assert_eq!(error_kinds(&t), vec![FailureKind::ModuleMissing, FailureKind::ModuleMissing]);
    runner.stop().await;
}

#[sqlx::test(migrations = false)]
async fn a_new_module_version_applies_without_restarting_the_runner(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let v1 = register(&pool, "job", "noop", ModuleSettings::default()).await;
    let runner = start_worker(&db, test_config());
    let first =
        queue::enqueue(&pool, NewTask::new("job", json!({"text": "x y"}))).await.unwrap().id;
    let t = wait_settled(&pool, first).await;
    assert_eq!((t.result, t.module_sha256), (Some(json!({})), Some(v1)));

    let v2 = register(&pool, "job", "wordcount", ModuleSettings::default()).await;
    let second =
        queue::enqueue(&pool, NewTask::new("job", json!({"text": "x y"}))).await.unwrap().id;
    let t = wait_settled(&pool, second).await;
    assert_eq!(t.result.as_ref().map(|r| r["words"].clone()), Some(json!(2)), "{t:#?}");
    assert_eq!(t.module_sha256, Some(v2));

    // Rolling back to version 1 applies just as fast.
    queue::activate_version(&pool, "default", "job", 1).await.unwrap();
    let third = queue::enqueue(&pool, NewTask::new("job", json!({}))).await.unwrap().id;
    assert_eq!(wait_settled(&pool, third).await.result, Some(json!({})));
    runner.stop().await;
}

#[sqlx::test(migrations = false)]
async fn a_result_over_the_tenant_limit_is_output_too_large_and_not_retried(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    // wordcount writes 48 bytes of stdout for this payload: 47 of compact JSON and a newline.
    let payload = json!({"text": "a b a", "top": 1});
    let limited = |n| sweep::queue::TenantCaps { max_result_bytes: Some(n), ..Default::default() };
    sweep::admin::create_tenant(&pool, "tight", &limited(16)).await.unwrap();
    sweep::admin::create_tenant(&pool, "roomy", &limited(48)).await.unwrap();
    let bytes = module_bytes("wordcount");
    let sha = sweep::sandbox::sha256_hex(&bytes);
    for tenant in ["default", "tight", "roomy"] {
        queue::register_module(&pool, tenant, "count", &sha, &bytes, &ModuleSettings::default())
            .await
            .unwrap();
    }
    let enqueue = |tenant: &'static str| {
        let task = NewTask::new("count", payload.clone()).tenant(tenant).max_attempts(3);
        let pool = pool.clone();
        async move { queue::enqueue(&pool, task).await.unwrap().id }
    };
    let (default, tight, roomy) =
        (enqueue("default").await, enqueue("tight").await, enqueue("roomy").await);
    // The runner's own default would let a 48-byte result through for everyone.
    let runner = start_worker(&db, test_config());

    let t = wait_settled(&pool, tight).await;
    assert_eq!((t.state, t.attempts), (TaskState::Dead, 1), "permanent: no retry of 3: {t:#?}");
    assert_eq!(error_kinds(&t), vec![FailureKind::OutputTooLarge]);
    let dead = queue::list_dead(&pool, Some("tight"), Some("count"), None, 10).await.unwrap();
    assert_eq!(dead[0].reason, FailureKind::OutputTooLarge.as_str());

    for (id, who) in [(default, "the runner default"), (roomy, "a limit of exactly its size")] {
        let t = wait_settled(&pool, id).await;
        assert_eq!(t.state, TaskState::Succeeded, "{who}: {t:#?}");
        assert_eq!(serde_json::to_vec(&t.result).unwrap().len(), 47, "{who}");
    }
    runner.stop().await;
}
