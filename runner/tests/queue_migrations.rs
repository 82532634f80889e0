//! Migrations that move data: applied step by step to a database holding rows in the shape
//! the earlier migrations left them (by hand, or the way `sweep migrate` did before Sweep had
//! a schema of its own); and the store refusing a schema it was not built for.

mod common;

use common::*;
use serde_json::{json, Value};
use sqlx::{
    migrate::Migrator,
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{self, NewTask, Role, Store, StoreError, TaskState, MIGRATOR};

/// Applies every embedded migration whose version is in `versions`, in order.
async fn apply(pool: &PgPool, versions: impl Fn(i64) -> bool) {
    for m in MIGRATOR.iter().filter(|m| versions(m.version)) {
        sqlx::raw_sql(&m.sql)
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("migration {} failed: {e}", m.version));
    }
}

#[sqlx::test(migrations = false)]
async fn finished_tasks_move_out_of_the_live_table_with_everything_they_held(pool: PgPool) {
    apply(&pool, |v| v < 8).await;
    sqlx::raw_sql(include_str!("fixtures/rows_at_0007.sql")).execute(&pool).await.unwrap();

    apply(&pool, |v| v >= 8).await;

    let done = show(&pool, 1).await;
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.result, Some(json!({"ok": true})));
    assert_eq!(done.logs.as_deref(), Some("a log line"));
    assert_eq!(done.attempts, 2);
    assert_eq!(done.errors, json!([{"attempt": 1, "kind": FailureKind::Timeout}]));
    assert_eq!(done.module_sha256.as_deref(), Some("sha-1"));
    assert!(done.started_at.is_some() && done.finished_at.is_some());
    assert_eq!(state(&pool, 2).await, TaskState::Cancelled);
    assert_eq!(state(&pool, 3).await, TaskState::Pending);

    let live: Vec<(i64, String)> = sqlx::query_as("select id, state from sweep.tasks order by id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(live, vec![(3, TaskState::Pending.to_string())], "only live work stays in tasks");
    let refused = sqlx::query("update sweep.tasks set state = $1 where id = 3")
        .bind(TaskState::Succeeded.as_str())
        .execute(&pool)
        .await
        .expect_err("a finished state in tasks must be refused");
    assert!(refused.to_string().contains("tasks_state_live"), "{refused}");

    // The queue works on the migrated schema: the pending task runs to completion.
    let runner = new_runner();
    let c = claim(&pool, runner, 10).await;
    assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>(), vec![3]);
    let completion = queue::Completion {
        id: 3,
        attempt: 1,
        result: Value::Null,
        module_sha256: None,
        logs: None,
    };
    assert!(queue::complete_batch(&pool, runner, &[completion]).await.unwrap().is_empty());
    assert_eq!(state(&pool, 3).await, TaskState::Succeeded);
}

#[sqlx::test(migrations = false)]
async fn queues_are_built_from_the_tasks_and_modules_there_are(pool: PgPool) {
    apply(&pool, |v| v < 9).await;
    sqlx::raw_sql(include_str!("fixtures/rows_at_0008.sql")).execute(&pool).await.unwrap();

    apply(&pool, |v| v >= 9).await;

    let queues: Vec<(String, String, bool)> = sqlx::query_as(
        "select tenant, task_type, coalesce(next_run_at <= now(), false) from sweep.queues order by 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let has = |t: &str, ty: &str| queues.iter().find(|q| q.0 == t && q.1 == ty).map(|q| q.2);
    assert_eq!(queues.len(), 3, "{queues:?}");
    assert_eq!(has("acme", "mixed"), Some(true), "its pending task is due");
    assert_eq!(has("other", "later"), Some(false), "its retry is due in an hour");
    let idle: Option<Option<chrono::DateTime<chrono::Utc>>> = sqlx::query_scalar(
        "select next_run_at from sweep.queues where tenant = 'acme' and task_type = 'idle'",
    )
    .fetch_optional(&pool)
    .await
    .unwrap();
    assert_eq!(idle, Some(None), "a module without tasks gets a queue with nothing due");

    // The fair claim finds the due task and only that one.
    let got = claim(&pool, new_runner(), 10).await;
    assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), vec![1]);
}

/// Runs the embedded migrations whose version is in `versions` the way `sweep migrate` did
/// before Sweep had its own schema: sqlx's migrator on a plain connection, so tables and the
/// bookkeeping (`_sqlx_migrations`) land in `public`.
async fn migrate_the_old_way(pool: &PgPool, versions: impl Fn(i64) -> bool) {
    let old = Migrator {
        migrations: MIGRATOR.iter().filter(|m| versions(m.version)).cloned().collect(),
        ..Migrator::DEFAULT
    };
    old.run(pool).await.expect("old-style migration");
}

#[sqlx::test(migrations = false)]
async fn an_installation_in_public_moves_to_the_sweep_schema_with_every_row(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let pool = PgPool::connect_with(options.clone()).await.unwrap();
    migrate_the_old_way(&pool, |v| v < 10).await;
    sqlx::raw_sql(include_str!("fixtures/rows_at_0009.sql")).execute(&pool).await.unwrap();
    let before = Store::open_with(options.clone(), Role::Runner, 1).await.expect_err("old schema");
    assert!(before.to_string().contains("sweep migrate"), "{before}");

    let applied = queue::migrate_with(options.clone()).await.expect("migrating");
    let since_the_move: Vec<i64> =
        MIGRATOR.iter().map(|m| m.version).filter(|&v| v >= 10).collect();
    assert_eq!(applied, since_the_move);

    let leftover: Vec<(String,)> = sqlx::query_as(
        "select tablename::text from pg_tables where schemaname = 'public' order by 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let leftover: Vec<&str> = leftover.iter().map(|(t,)| t.as_str()).collect();
    assert_eq!(leftover, vec!["_sqlx_migrations", "orders"], "only the application's tables stay");
    let app_rows: Vec<(i64,)> = sqlx::query_as("select version from public._sqlx_migrations")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(app_rows, vec![(20240101000000,)]);
    let counts: (i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from sweep.tenants), (select count(*) from sweep.modules),
                (select count(*) from sweep.active_modules), (select count(*) from sweep.tasks),
                (select count(*) from sweep.finished_tasks), (select count(*) from sweep.dead_tasks),
                (select count(*) from sweep.runners)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(counts, (1, 1, 1, 2, 2, 1, 1));

    // Every row reads back through the store, and the queue works on the moved tables.
    let db = migrated(options).await;
    let pool = db.pool();
    let tenant = queue::get_tenant(&pool, "acme").await.unwrap().expect("tenant");
    assert_eq!((tenant.weight, tenant.caps.max_running), (3, Some(7)));
    assert_eq!(show(&pool, 3).await.result, Some(json!({"ok": true})));
    assert_eq!(state(&pool, 4).await, TaskState::Cancelled);
    assert_eq!(state(&pool, 5).await, TaskState::Dead);
    assert_eq!(state(&pool, 2).await, TaskState::Retrying);
    let runner = new_runner();
    let got = claim(&pool, runner, 10).await;
    assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), vec![1]);
    assert_eq!(got[0].module.as_ref().map(|m| m.settings.fuel), Some(Some(1000)));
    let done = completion(&got[0], json!({"resized": true}));
    assert!(queue::complete_batch(&pool, runner, &[done]).await.unwrap().is_empty());
    assert_eq!(state(&pool, 1).await, TaskState::Succeeded);
    let next = queue::enqueue(&pool, NewTask::new("resize", json!({})).tenant("acme")).await;
    assert_eq!(next.unwrap().id, 6, "ids continue from the moved sequence");
    assert_eq!(queue::requeue(&pool, None, 5).await.unwrap(), 5);
}

#[sqlx::test(migrations = false)]
async fn the_store_refuses_a_schema_it_was_not_built_for(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let missing = Store::open_with(options.clone(), Role::Runner, 1).await.expect_err("empty");
    assert!(matches!(missing, StoreError::SchemaMissing), "{missing}");
    assert!(missing.to_string().contains("run `sweep migrate`"), "{missing}");

    let db = migrated(options.clone()).await;
    // The latest migration's bookkeeping row taken out and put back: the schema itself is
    // untouched, only what the store reads of it.
    let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap();
    let taken: (i64, String, bool, Vec<u8>, i64) = sqlx::query_as(
        "delete from sweep._sqlx_migrations where version = $1
         returning version, description, success, checksum, execution_time",
    )
    .bind(latest)
    .fetch_one(&db.pool())
    .await
    .unwrap();
    let behind = Store::open_with(options.clone(), Role::Admin, 1).await.expect_err("behind");
    assert!(matches!(behind, StoreError::SchemaBehind { .. }), "{behind}");
    assert!(behind.to_string().contains("run `sweep migrate`"), "{behind}");
    sqlx::query(
        "insert into sweep._sqlx_migrations (version, description, success, checksum,
                                              execution_time)
         values ($1, $2, $3, $4, $5)",
    )
    .bind(taken.0)
    .bind(taken.1)
    .bind(taken.2)
    .bind(taken.3)
    .bind(taken.4)
    .execute(&db.pool())
    .await
    .unwrap();
    assert_eq!(queue::migrate_with(options.clone()).await.unwrap(), Vec::<i64>::new());
    Store::open_with(options.clone(), Role::Admin, 1).await.expect("current again");

    sqlx::query(
        "insert into sweep._sqlx_migrations (version, description, success, checksum,
                                              execution_time)
         values (99990101000000, 'from a newer sweep', true, '\\x00', 1)",
    )
    .execute(&db.pool())
    .await
    .unwrap();
    let ahead = Store::open_with(options, Role::Runner, 1).await.expect_err("ahead");
    assert!(matches!(ahead, StoreError::SchemaAhead { .. }), "{ahead}");
    assert!(ahead.to_string().contains("newer"), "{ahead}");
}

#[sqlx::test(migrations = false)]
async fn the_store_refuses_functions_that_are_not_its_own(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let db = migrated(options.clone()).await;
    let installed = queue::installed_functions(&db.pool()).await.unwrap().expect("recorded");
    assert_eq!(installed.sha256, queue::functions_sha256());
    assert_eq!(installed.version, env!("CARGO_PKG_VERSION"));

    // Another build's functions (same release): the store names the command, which fixes it.
    sqlx::query("update sweep._functions set sha256 = repeat('0', 64)")
        .execute(&db.pool())
        .await
        .unwrap();
    let differ = Store::open_with(options.clone(), Role::Runner, 1).await.expect_err("differ");
    assert!(matches!(differ, StoreError::FunctionsDiffer { .. }), "{differ}");
    assert!(differ.to_string().contains("run `sweep migrate`"), "{differ}");
    assert!(differ.to_string().contains("000000000000"), "names the installed hash: {differ}");
    assert_eq!(queue::migrate_with(options.clone()).await.unwrap(), Vec::<i64>::new());
    Store::open_with(options.clone(), Role::Runner, 1).await.expect("functions reinstalled");

    // A newer release's functions: the store asks for a newer sweep, and migrate leaves them.
    sqlx::query("update sweep._functions set sha256 = repeat('1', 64), sweep_version = '99.0.0'")
        .execute(&db.pool())
        .await
        .unwrap();
    let ahead = Store::open_with(options.clone(), Role::Admin, 1).await.expect_err("ahead");
    assert!(matches!(ahead, StoreError::FunctionsAhead { .. }), "{ahead}");
    assert!(ahead.to_string().contains("run a newer sweep"), "{ahead}");
    let refused = queue::migrate_with(options.clone()).await.expect_err("no downgrade");
    assert!(matches!(refused, StoreError::FunctionsAhead { .. }), "{refused}");
    let kept = queue::installed_functions(&db.pool()).await.unwrap().expect("recorded");
    assert_eq!((kept.sha256.as_str(), kept.version.as_str()), (&*"1".repeat(64), "99.0.0"));
}

#[sqlx::test(migrations = false)]
async fn migrate_puts_back_a_function_changed_by_hand(_: PgPoolOptions, options: PgConnectOptions) {
    let db = migrated(options.clone()).await;
    let body = || async {
        sqlx::query_scalar::<_, String>(
            "select prosrc from pg_proc where oid = 'sweep.sweep_tenant_free_slots'::regproc",
        )
        .fetch_one(&db.pool())
        .await
        .unwrap()
    };
    let ours = body().await;
    sqlx::raw_sql(
        "create or replace function sweep.sweep_tenant_free_slots(p_tenant text, p_max integer)
         returns integer language sql as 'select 0'",
    )
    .execute(&db.pool())
    .await
    .unwrap();
    assert_ne!(body().await, ours);

    queue::migrate_with(options).await.unwrap();
    assert_eq!(body().await, ours, "every file is installed again, whatever the hash says");
}
