//! Connecting: a pool sized for the runner, the database created if missing, migrations
//! applied.

use std::time::Duration;

use sqlx::{
    migrate::MigrateDatabase,
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool, Postgres,
};

use super::{QueueError, MIGRATOR};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    #[error("invalid database url: {0}")]
    BadUrl(#[source] sqlx::Error),
    #[error("cannot create database: {0}")]
    Create(#[source] sqlx::Error),
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] sqlx::Error),
    #[error("migrations failed: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
}

impl From<ConnectError> for QueueError {
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::BadUrl(e) | ConnectError::Create(e) | ConnectError::Connect(e) => {
                QueueError::Database(e)
            }
            ConnectError::Migrate(e) => QueueError::Database(sqlx::Error::Migrate(Box::new(e))),
        }
    }
}

/// Opens a pool of `max_connections`, creating the database if it does not exist and
/// applying pending migrations.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, ConnectError> {
    // Plans are made once per connection and must not depend on how large the tables were
    // at that moment. Every statement a runner repeats is an index lookup (the claim walks
    // `tasks_claim` in order and stops after a batch; reports and heartbeats find rows by
    // primary key or lease), but planned against an empty or freshly emptied table, a seq
    // scan or a walk of a whole partial index looks as cheap, and stale statistics once
    // turned the claim into a bitmap scan of the whole backlog plus a sort (9.6 ms against
    // 0.4 ms per claim). So: generic plans (no re-planning per call: planning was 20% of the
    // claim's backend CPU), and seq and bitmap scans priced out; the reads that do need a
    // full scan (admin stats) still get one, there being no other path. Pricing a path out
    // adds 1e10 to its cost, which crosses `jit_above_cost` and had such reads compiled by
    // LLVM (a 4-row stats read took 1.1 s, pruning the runners table 133 ms): so no JIT,
    // which never pays off for statements this short anyway.
    let options: PgConnectOptions =
        url.parse::<PgConnectOptions>().map_err(ConnectError::BadUrl)?.options([
            ("plan_cache_mode", "force_generic_plan"),
            ("enable_seqscan", "off"),
            ("enable_bitmapscan", "off"),
            ("jit", "off"),
        ]);
    if !Postgres::database_exists(url).await.map_err(ConnectError::Connect)? {
        Postgres::create_database(url).await.map_err(ConnectError::Create)?;
    }
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(ConnectError::Connect)?;
    migrate(&pool).await?;
    Ok(pool)
}

/// Applies pending migrations. Safe to run from many runners at once (sqlx takes an advisory
/// lock).
pub async fn migrate(pool: &PgPool) -> Result<(), ConnectError> {
    MIGRATOR.run(pool).await.map_err(ConnectError::Migrate)
}

/// True when every embedded migration has been applied.
pub async fn migrations_done(pool: &PgPool) -> Result<bool, QueueError> {
    let applied: Vec<i64> =
        sqlx::query_scalar(r#"select version from _sqlx_migrations where success"#)
            .fetch_all(pool)
            .await?;
    Ok(MIGRATOR.iter().all(|m| applied.contains(&m.version)))
}
