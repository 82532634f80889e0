//! Sweep's SQL functions (the claim, queue hints, rate-limit buckets, retention): their source
//! is `runner/sql/`, one file per concern, embedded at build time and installed by
//! [`migrate`](super::migrate) after the schema migrations; their combined hash is what a store
//! checks at open, as it checks the migrations.
//!
//! Why not migrations: a migration is applied once and never edited, so a function kept in
//! migrations is restated whole by each change and read across many files. Here each function
//! has one file, a change to it is a diff of that file, and `git log -p runner/sql/claim.sql`
//! is the claim's history.
//!
//! Invariants:
//! - every file creates its functions with `create or replace` and nothing else: no tables,
//!   no data (schema belongs to `migrations/`, append-only and schema-only);
//! - all files are applied in one transaction, in [`FILES`] order, under the migrations'
//!   advisory lock, and the hash of what was applied, with the version of the `sweep` that
//!   applied it, is recorded in `sweep._functions` in that transaction;
//! - a store opens only when the recorded hash is this binary's ([`check`]); `sweep migrate`
//!   never replaces the functions of a newer release with an older one's.
//!
//! The rule for changing a function: a change that keeps its signature (name, argument types,
//! result columns) and its contract is made in place, and runners of the previous release,
//! still running during a rolling upgrade, call the new body. A change of signature or
//! contract gets a new name (`sweep_claim_from` beside `sweep_claim`, say), and the old function
//! stays, unchanged, for the previous release's runners; a migration may drop it once a
//! release no longer calls it. `create or replace` cannot change a function's result type, and
//! dropping a function a running runner calls would fail its next claim.

use std::sync::LazyLock;

use sha2::{Digest, Sha256};
use sqlx::{Connection, Executor, PgConnection, PgExecutor};

use super::{StoreError, PARTITIONS_AHEAD_DAYS};

/// One file of `runner/sql/`.
#[derive(Debug, Clone, Copy)]
pub struct SqlFile {
    pub name: &'static str,
    pub sql: &'static str,
}

macro_rules! sql_files {
    ($($name:literal),* $(,)?) => {
        &[$(SqlFile { name: $name, sql: include_str!(concat!("../../sql/", $name)) }),*]
    };
}

/// The files, in the order they are applied. Functions in PL/pgSQL may name functions of a
/// later file (their bodies are resolved when first run); a `language sql` body is checked
/// when it is created, so what it names must come earlier.
pub const FILES: &[SqlFile] = sql_files![
    "wake_queues.sql",
    "flow_tokens.sql",
    "claim.sql",
    "retention.sql",
    "dependencies.sql",
    "history_counts.sql",
    "hour_failures.sql",
    "usage_fold.sql"
];

/// The version of the `sweep` that carries these files.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// SHA-256 (hex) of the files as applied: each name and text, in order.
pub fn sha256() -> &'static str {
    static HASH: LazyLock<String> = LazyLock::new(|| {
        let mut hash = Sha256::new();
        for file in FILES {
            hash.update(file.name.as_bytes());
            hash.update([0]);
            hash.update(file.sql.as_bytes());
            hash.update([0]);
        }
        hex::encode(hash.finalize())
    });
    &HASH
}

/// What the database records of its functions: their hash and the `sweep` that applied them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub sha256: String,
    pub version: String,
}

impl Installed {
    fn newer_than_this_binary(&self) -> bool {
        release(&self.version) > release(VERSION)
    }
}

/// A version's release numbers (`0.10.2` → `[0, 10, 2]`), for ordering; what does not parse
/// counts as 0.
fn release(version: &str) -> Vec<u64> {
    let core = version.split(['-', '+']).next().unwrap_or_default();
    core.split('.').map(|n| n.parse().unwrap_or(0)).collect()
}

/// Installs the functions on `conn`, which holds the migrations' advisory lock and has just
/// brought the schema up to date, in one transaction: every file, the bookkeeping row, the
/// day partitions of history the next [`PARTITIONS_AHEAD_DAYS`] need, and (once) the kept
/// counts' triggers. Refuses, changing
/// nothing, when a newer `sweep` installed what is there.
pub(super) async fn install(conn: &mut PgConnection) -> Result<(), StoreError> {
    let mut tx = conn.begin().await?;
    if let Some(installed) = installed(&mut *tx).await? {
        if installed.newer_than_this_binary() {
            return Err(StoreError::FunctionsAhead {
                installed: installed.version,
                ours: VERSION.to_owned(),
            });
        }
    }
    for file in FILES {
        tx.execute(file.sql)
            .await
            .map_err(|source| StoreError::Function { file: file.name, source })?;
    }
    sqlx::query(RECORD).bind(sha256()).bind(VERSION).execute(&mut *tx).await?;
    sqlx::query(ADD_PARTITIONS).bind(PARTITIONS_AHEAD_DAYS).execute(&mut *tx).await?;
    sqlx::query(ATTACH_KEPT_COUNTS).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Fails unless the database's functions are this binary's, naming the command that fixes it.
pub(super) async fn check<'c, E: PgExecutor<'c>>(executor: E) -> Result<(), StoreError> {
    match installed(executor).await? {
        None => Err(StoreError::FunctionsMissing),
        Some(installed) if installed.sha256 == sha256() => Ok(()),
        Some(installed) if installed.newer_than_this_binary() => {
            Err(StoreError::FunctionsAhead { installed: installed.version, ours: VERSION.into() })
        }
        Some(installed) => Err(StoreError::FunctionsDiffer {
            installed: installed.version,
            installed_sha256: short(&installed.sha256).to_owned(),
            ours: VERSION.to_owned(),
            ours_sha256: short(sha256()).to_owned(),
        }),
    }
}

/// What the database records of its functions, if anything.
pub async fn installed<'c, E: PgExecutor<'c>>(
    executor: E,
) -> Result<Option<Installed>, StoreError> {
    let row: Option<(String, String)> = sqlx::query_as(INSTALLED).fetch_optional(executor).await?;
    Ok(row.map(|(sha256, version)| Installed { sha256, version }))
}

/// The first 12 hex digits of a hash, for messages.
fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}

const INSTALLED: &str = "select sha256, sweep_version from sweep._functions";
const RECORD: &str = r#"
    insert into sweep._functions (sha256, sweep_version) values ($1, $2)
    on conflict (singleton) do update
    set sha256 = excluded.sha256, sweep_version = excluded.sweep_version,
        installed_at = excluded.installed_at
    "#;
const ADD_PARTITIONS: &str =
    "select sweep.sweep_finished_add_partitions(now(), now() + $1 * interval '1 day')";
/// Attaches the kept counts' triggers the first time, counting what there is.
const ATTACH_KEPT_COUNTS: &str =
    "select sweep.sweep_history_attach(), sweep.sweep_hour_failures_attach()";

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] =
    statements![INSTALLED, RECORD, ADD_PARTITIONS, ATTACH_KEPT_COUNTS];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_runner_sql_is_applied_once() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sql");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("reading runner/sql")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".sql"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = FILES.iter().map(|f| f.name.to_owned()).collect();
        listed.sort();
        assert_eq!(listed, on_disk, "FILES must list every .sql file of runner/sql once");
    }

    #[test]
    fn files_only_create_or_replace_functions() {
        for file in FILES {
            let code: String = file
                .sql
                .lines()
                .filter(|line| !line.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
                .to_lowercase();
            let creates = code.matches("create ").count();
            let functions = code.matches("create or replace function ").count();
            // `create table` and `create trigger` inside a function body are DDL the function
            // runs when called, not this file.
            let in_bodies =
                code.matches("create table ").count() + code.matches("create trigger ").count();
            assert!(functions > 0, "{} creates no function", file.name);
            assert_eq!(
                creates,
                functions + in_bodies,
                "{}: a file of runner/sql only creates or replaces functions",
                file.name
            );
        }
    }

    #[test]
    fn releases_order_by_number_not_text() {
        assert!(release("0.10.0") > release("0.9.3"));
        assert!(release("1.0.0") > release("0.99.99"));
        assert_eq!(release("0.2.0-rc.1"), release("0.2.0"));
        assert!(release("garbage") <= release(VERSION));
    }
}
