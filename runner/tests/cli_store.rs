//! The `sweep` binary and the schema: commands other than `migrate` neither create nor
//! migrate anything, and refuse a schema they were not built for with the command that
//! fixes it.

mod common;

use sqlx::{
    migrate::MigrateDatabase,
    postgres::{PgConnectOptions, PgPoolOptions},
    Postgres,
};

/// The URL of the test database `options` names, on the server `DATABASE_URL` names.
fn url_of(options: &PgConnectOptions) -> String {
    let server = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let base = &server[..server.rfind('/').expect("a database url")];
    format!("{base}/{}", options.get_database().expect("a database name"))
}

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
    let url = url_of(&options);
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
    let server = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let base = &server[..server.rfind('/').expect("a database url")];
    let url = format!("{base}/sweep_mistyped_{}", std::process::id());
    let out = sweep(&["tenant", "list", "--database-url", &url]).await;
    assert!(!out.status.success(), "tenant list succeeded against a missing database");
    assert!(!Postgres::database_exists(&url).await.expect("asking the server"), "created {url}");
}
