//! The schema and the functions a store is built for: the baseline builds exactly the schema
//! the pre-release migrations built; a store refuses a schema or functions that are not its
//! binary's, and a database from before v0.1.0, naming what to do.

mod common;

use common::*;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{self, Role, Store, StoreError, MIGRATOR};

/// The catalog of the `sweep` schema as `scripts/schema-catalog.sh` prints it.
async fn catalog(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(include_str!("schema/catalog.sql")).fetch_all(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn the_baseline_builds_the_schema_the_chain_built(pool: PgPool) {
    let baseline = MIGRATOR.iter().find(|m| m.version == 1).expect("the baseline");
    sqlx::raw_sql(&baseline.sql).execute(&pool).await.expect("applying the baseline");
    let built = catalog(&pool).await;
    let chain: Vec<&str> = include_str!("schema/chain.txt")
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .collect();
    let missing: Vec<&&str> = chain.iter().filter(|l| !built.iter().any(|b| b == **l)).collect();
    let extra: Vec<&String> = built.iter().filter(|b| !chain.contains(&b.as_str())).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the baseline's schema differs from runner/tests/schema/chain.txt\n\
         only in the chain:\n{missing:#?}\nonly in the baseline:\n{extra:#?}"
    );
    assert_eq!(built, chain, "same lines, same order");
}

#[sqlx::test(migrations = false)]
async fn a_database_from_before_the_baseline_is_refused_untouched(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let db = migrated(options.clone()).await;
    // What a pre-release database holds: migration 1 was another file (0001_queue.sql).
    sqlx::query(
        "update sweep._sqlx_migrations set description = 'queue', checksum = '\\x0123'
         where version = 1",
    )
    .execute(&db.pool())
    .await
    .unwrap();
    let tables_before = catalog(&db.pool()).await;

    let opened = Store::open_with(options.clone(), Role::Runner, 1).await.expect_err("refused");
    assert!(matches!(opened, StoreError::PreRelease), "{opened}");
    assert!(opened.to_string().contains("before v0.1.0"), "{opened}");
    let migrated = queue::migrate_with(options).await.expect_err("refused");
    assert!(matches!(migrated, StoreError::PreRelease), "{migrated}");
    assert!(
        migrated.to_string().contains("CHANGELOG.md"),
        "names where the way out is: {migrated}"
    );
    assert_eq!(catalog(&db.pool()).await, tables_before, "nothing was changed");
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
