//! The `sweep` binary and the schema: commands other than `migrate` neither create nor
//! migrate anything, and refuse a schema they were not built for with the command that
//! fixes it.

mod common;

use sweep_dev::db::database_url;

use sqlx::{
    migrate::MigrateDatabase,
    postgres::{PgConnectOptions, PgPoolOptions},
    Postgres,
};

async fn sweep(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sweep"))
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .await
        .expect("running sweep")
}

#[sqlx::test(migrations = false)]
async fn run_refuses_an_unmigrated_database_and_names_the_command(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let url = database_url(options.get_database().expect("a database name"));
    let out = sweep(&["run", "--no-admin", "--database-url", &url]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sweep run started on an empty database");
    assert!(stderr.contains("run `sweep migrate`"), "{stderr}");

    let out = sweep(&["migrate", "--database-url", &url]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = sweep(&["tenant", "list", "--database-url", &url]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn a_mistyped_database_url_creates_nothing() {
    let url = database_url(&format!("sweep_mistyped_{}", std::process::id()));
    let out = sweep(&["tenant", "list", "--database-url", &url]).await;
    assert!(!out.status.success(), "tenant list succeeded against a missing database");
    assert!(!Postgres::database_exists(&url).await.expect("asking the server"), "created {url}");
}
