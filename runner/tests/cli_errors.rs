//! The CLI's errors as a user meets them: one line on stderr, `error: ` then the API's message
//! with its status and code, exit status 1, and no backtrace even with `RUST_BACKTRACE=1`;
//! nothing coloured when stderr is not a terminal.

#![allow(clippy::unwrap_used)]

mod admin_support;

use std::process::Command;

use admin_support::{migrated, serve};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::admin;
use sweep::queue::TenantCaps;

#[sqlx::test(migrations = false)]
async fn an_api_error_is_one_plain_line(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let (base, stop, server) = serve(&db).await;
    let (_, token) =
        admin::create_tenant(&db.pool(), "acme", &TenantCaps::default()).await.unwrap();
    let ran = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_sweep"))
            .args(["enqueue", "nope"])
            .env("SWEEP_URL", base)
            .env("SWEEP_TOKEN", token)
            .env("RUST_BACKTRACE", "1")
            .env("RUST_LIB_BACKTRACE", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8(ran.stderr).unwrap();
    assert_eq!(ran.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(
        stderr.starts_with("error: no module is registered for task_type \"nope\""),
        "{stderr}"
    );
    assert!(stderr.contains("(422 Unprocessable Entity, unknown_task_type)"), "{stderr}");
    assert!(!stderr.contains("backtrace") && !stderr.contains('\u{1b}'), "{stderr:?}");
    let _ = stop.send(());
    server.await.unwrap();
}
