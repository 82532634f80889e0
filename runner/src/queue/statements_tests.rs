//! The statement check (Sweep's SQL is checked before it ships): every statement of the store
//! is prepared against a freshly migrated schema, on a connection with the default
//! `search_path`, so a misspelt column, a wrong type or a table named without its schema
//! fails here; and no statement is written anywhere but in a const its module lists.

use std::{collections::HashSet, path::Path};

use sqlx::{migrate::MigrateDatabase, Executor, Postgres};

use super::{statements, Role, Store};

fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `url` with its database name replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, _) = url.rsplit_once('/').unwrap_or((url, ""));
    format!("{base}/{name}")
}

#[tokio::test]
async fn every_statement_prepares_against_the_migrated_schema() {
    let name = format!("sweep_statements_{}", std::process::id());
    let url = with_database(&server_url(), &name);
    let _ = Postgres::drop_database(&url).await;
    super::migrate(&url).await.unwrap_or_else(|e| panic!("migrating {url}: {e}"));
    let store = Store::open(&url, Role::Admin, 1).await.expect("opening the store");
    let mut failures = Vec::new();
    let mut conn = store.pool().acquire().await.expect("connection");
    for (name, sql) in statements() {
        if let Err(e) = (&mut *conn).prepare(sql).await {
            failures.push(format!("{name}: {e}"));
        }
    }
    drop(conn);
    store.close().await;
    Postgres::drop_database(&url).await.expect("dropping the check database");
    assert!(failures.is_empty(), "statements that do not prepare:\n{}", failures.join("\n"));
}

#[test]
fn statements_are_listed_consts() {
    let listed: HashSet<&str> = statements().map(|(name, _)| name).collect();
    let mut offenders = Vec::new();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for file in rust_files(&src) {
        let text = std::fs::read_to_string(&file).expect("reading source");
        let shown = file.strip_prefix(&src).unwrap_or(&file).display().to_string();
        for call in ["sqlx::query(", "sqlx::query_as(", "sqlx::query_scalar(", "sqlx::raw_sql("] {
            for (at, _) in text.match_indices(call) {
                let arg: String = text[at + call.len()..]
                    .chars()
                    .skip_while(|c| c.is_whitespace())
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !listed.contains(arg.as_str()) {
                    let line = text[..at].lines().count();
                    offenders.push(format!("{shown}:{line}: {call}{arg}…"));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "SQL outside a listed statement const (add it to its module's STATEMENTS):\n{}",
        offenders.join("\n")
    );
}

fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("reading src").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path.ends_with("statements_tests.rs")
        {
            out.push(path);
        }
    }
    out
}
