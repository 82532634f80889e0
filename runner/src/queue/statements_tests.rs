//! The statement check (Sweep's SQL is checked before it ships): every statement of the store
//! is prepared against a freshly migrated schema, on a connection with the default
//! `search_path`, so a misspelt column, a wrong type or a table named without its schema
//! fails here; and no statement is written anywhere but in a const its module lists.

use std::{collections::HashSet, path::Path};

use sqlx::{migrate::MigrateDatabase, Executor, Postgres, Row};

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

/// A page of tasks after a cursor is an index range in every table, in the generic plan a
/// prepared statement settles on: the cursor is an index condition, never a filter applied
/// while walking every id above it.
#[tokio::test]
async fn a_task_page_after_a_cursor_is_an_index_range() {
    let name = format!("sweep_task_page_{}", std::process::id());
    let url = with_database(&server_url(), &name);
    let _ = Postgres::drop_database(&url).await;
    super::migrate(&url).await.unwrap_or_else(|e| panic!("migrating {url}: {e}"));
    let store = Store::open(&url, Role::Admin, 1).await.expect("opening the store");
    let mut conn = store.pool().acquire().await.expect("connection");
    let setup = r#"
        insert into sweep.finished_tasks (id, tenant, task_type, payload, state, priority,
                                          attempts, max_attempts, run_at, errors, created_at)
        select g, 't' || (g % 10), 'noop', '{}', 'succeeded', 0, 1, 5, now(), '[]', now()
        from generate_series(1, 50000) g;
        insert into sweep.tasks (tenant, task_type, payload)
        select 't' || (g % 10), 'noop', '{}' from generate_series(1, 20000) g;
        analyze sweep.finished_tasks, sweep.tasks;
        set plan_cache_mode = force_generic_plan;
    "#;
    (&mut *conn).execute(setup).await.expect("setup");
    let prepare = format!("prepare page as {}", super::views::LIST_TASKS);
    (&mut *conn).execute(prepare.as_str()).await.expect("prepare");
    let row = (&mut *conn).fetch_one(EXPLAIN_PAGE).await.expect("explain");
    let plan: serde_json::Value = row.try_get(0).expect("a JSON plan");
    let mut scans = Vec::new();
    collect_scans(&plan[0]["Plan"], &mut scans);
    drop(conn);
    store.close().await;
    Postgres::drop_database(&url).await.expect("dropping the check database");
    assert!(scans.len() >= 3, "{scans:?}");
    for (node, relation, cond) in &scans {
        assert!(
            node.contains("Index") && cond.contains("id < "),
            "{node} on {relation} without the cursor as its index condition: {cond:?}"
        );
    }
}

const EXPLAIN_PAGE: &str = r#"
    explain (format json)
    execute page(null, null, null, null, null, 1000, 50, null, null, null, null)
    "#;

/// (node type, relation, index condition) of every scan of a task table in a JSON plan.
fn collect_scans(plan: &serde_json::Value, out: &mut Vec<(String, String, String)>) {
    let relation = plan["Relation Name"].as_str().unwrap_or_default();
    let index = plan["Index Name"].as_str().unwrap_or_default();
    let table = if relation.is_empty() { index } else { relation };
    if ["tasks", "finished_tasks", "dead_tasks"].iter().any(|t| table.starts_with(t))
        && !plan["Node Type"].as_str().unwrap_or_default().starts_with("Bitmap Heap")
    {
        out.push((
            plan["Node Type"].as_str().unwrap_or_default().to_owned(),
            table.to_owned(),
            plan["Index Cond"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        collect_scans(child, out);
    }
}
