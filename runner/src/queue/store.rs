//! The store: Sweep's side of Postgres, opened once per role, and the explicit migrate step.
//!
//! Roles: the runner (claims, reports, heartbeats, maintenance) and the admin side (the API,
//! the dashboard, the CLI's operator commands) each open their own [`Store`], so neither can
//! take the other's connections and `pg_stat_activity` says who is who. No role sets
//! connection-wide planner settings: the hot-path functions carry their own (`SET` clauses
//! in runner/sql/), so they cannot leak into a stats read. The third role
//! is the user's own connection or transaction: every queue function takes an executor, so an
//! application enqueues (or completes a task) inside its transaction, with no store at all.
//!
//! Invariants:
//! - every Sweep table, function and the migration bookkeeping live in schema [`SCHEMA`];
//!   statements name it, so they work under any `search_path`;
//! - opening a store never creates or migrates anything: it checks the schema is exactly the
//!   one this binary was built with and says which command fixes it when not;
//! - only [`migrate`] (and the commands that set up throwaway databases) creates a database.

use std::{sync::Arc, time::Duration};

use sqlx::{
    migrate::{Migrate, MigrateDatabase, Migrator},
    postgres::{PgConnectOptions, PgPoolOptions},
    Connection, Executor, PgConnection, PgExecutor, PgPool, Postgres,
};

use super::{functions, MIGRATOR};

/// The schema holding every Sweep object.
pub const SCHEMA: &str = "sweep";

/// A pooled connection idle at least this long is pinged before it is handed out (a failed
/// ping drops it and the pool opens another), as sqlx does for every acquire by default.
/// One used more recently is handed out as it is: the ping is a round trip on every claim,
/// report and enqueue, and on an idle queue it was a tenth of the enqueue-to-start time. A
/// connection that broke within the window fails its next statement instead, which every
/// caller already handles (HikariCP's `aliveBypassWindowMs` makes the same trade, at 500 ms).
const PING_AFTER_IDLE: Duration = Duration::from_millis(500);

/// Who a store works for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A runner: claims, reports, heartbeats and maintenance.
    Runner,
    /// The admin API, the dashboard and the CLI's operator commands.
    Admin,
}

impl Role {
    fn application_name(self) -> &'static str {
        match self {
            Role::Runner => "sweep runner",
            Role::Admin => "sweep admin",
        }
    }
}

/// A connection pool to a migrated Sweep database, opened for one [`Role`]. Pass `&store` to
/// the queue functions: it runs their statements as its connection needs (see
/// [`StoreOptions::pooled`]).
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    role: Role,
    pooled: bool,
    /// Shared, not copied: a runner clones its store into every task it spawns.
    listen: Option<Arc<PgConnectOptions>>,
}

/// How a store reaches Postgres. The default: directly, LISTEN on the same database URL.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// The database URL goes through a transaction pooler (PgBouncer with
    /// `pool_mode = transaction`), which hands the server connection to another client after
    /// every transaction. Such a store runs each statement unnamed in a transaction of its own
    /// (see `queue/pooler.rs`) and connects without the startup parameters PgBouncer refuses
    /// (`extra_float_digits`). Sweep cannot see a pooler on the wire (PgBouncer answers like
    /// Postgres, parameter statuses included), so this is said, not detected.
    pub pooled: bool,
    /// A direct connection to the same database for runners' LISTEN (a pooler would drop the
    /// session that holds it). `None`: the database URL, unless pooled; then runners poll.
    pub listen: Option<PgConnectOptions>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("invalid database url: {0}")]
    BadUrl(#[source] sqlx::Error),
    #[error("cannot create database: {0}")]
    Create(#[source] sqlx::Error),
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] sqlx::Error),
    #[error(
        "cannot connect to the database: {0}. That refusal comes from a connection pooler \
         (PgBouncer): behind a transaction pooler open the store as pooled (--pooled, \
         SWEEP_DATABASE_POOLED=1) and keep `options` out of the URL; `sweep migrate` needs a \
         direct connection"
    )]
    Pooler(#[source] sqlx::Error),
    #[error("the database has no Sweep schema yet: run `sweep migrate` first")]
    SchemaMissing,
    #[error(
        "the database holds a Sweep schema from before v0.1.0, which this sweep does not \
         upgrade: migrate a new database and move the waiting tasks over (CHANGELOG.md, \
         v0.1.0, \"Upgrading\")"
    )]
    PreRelease,
    #[error(
        "the Sweep schema is at migration {applied}, this binary needs {wanted}: \
         run `sweep migrate` first"
    )]
    SchemaBehind { applied: i64, wanted: i64 },
    #[error(
        "the Sweep schema is at migration {applied}, newer than this binary knows \
         ({known}): run a newer sweep"
    )]
    SchemaAhead { applied: i64, known: i64 },
    #[error("migration {version} failed half-way earlier: run `sweep migrate` again")]
    SchemaDirty { version: i64 },
    #[error("the database has no Sweep functions yet: run `sweep migrate` first")]
    FunctionsMissing,
    #[error(
        "the database's Sweep functions (sha256 {installed_sha256}…, installed by sweep \
         {installed}) are not this binary's ({ours_sha256}…, sweep {ours}): run `sweep migrate` \
         with this binary first"
    )]
    FunctionsDiffer {
        installed: String,
        installed_sha256: String,
        ours: String,
        ours_sha256: String,
    },
    #[error(
        "the database's Sweep functions were installed by sweep {installed}, newer than this \
         binary ({ours}): run a newer sweep"
    )]
    FunctionsAhead { installed: String, ours: String },
    #[error("installing the Sweep functions of runner/sql/{file}: {source}")]
    Function {
        file: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "the migration connection has search_path {search_path:?}, not the sweep it asked for: \
         something between Sweep and Postgres (a pooler?) dropped its startup options; \
         run `sweep migrate` with a direct database URL"
    )]
    NotDirect { search_path: String },
    #[error("migrations failed: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl StoreError {
    /// True when the server could not be reached (rather than refusing us or our schema).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, StoreError::Connect(e) | StoreError::Database(e) if super::is_unreachable(e))
    }
}

impl Store {
    /// Opens a pool of `max_connections` for `role` to the database at `url`, which must hold
    /// the schema this binary was built with, directly (see [`StoreOptions::open`]).
    pub async fn open(url: &str, role: Role, max_connections: u32) -> Result<Store, StoreError> {
        StoreOptions::default().open(url, role, max_connections).await
    }

    /// [`Store::open`] from parsed connect options.
    pub async fn open_with(
        options: PgConnectOptions,
        role: Role,
        max_connections: u32,
    ) -> Result<Store, StoreError> {
        StoreOptions::default().open_with(options, role, max_connections).await
    }

    /// The pool itself, for statements of the caller's own (or a transaction begun on it).
    /// Through a transaction pooler only `&store` runs Sweep's statements safely.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether the store was opened as going through a transaction pooler.
    pub fn pooled(&self) -> bool {
        self.pooled
    }

    /// The direct connection runners LISTEN on, if one was given (see [`StoreOptions::listen`]).
    pub fn listen_options(&self) -> Option<&PgConnectOptions> {
        self.listen.as_deref()
    }

    /// Waits for checked-out connections to come back, then closes the pool.
    pub async fn close(&self) {
        close_pool(&self.pool).await;
    }
}

/// Closes `pool` and waits until none of its connections is open any more (at most 10 s).
///
/// `Pool::close` (sqlx 0.8) can return while a connection dropped a moment earlier (a LISTEN
/// task's, say) is still on its way back through a spawned return-to-pool task; a server
/// stopped right after (as `sweep dev` stops its Postgres) then terminates that connection and
/// sqlx logs a warning. Waiting for the pool's size to reach zero closes that window.
pub async fn close_pool(pool: &PgPool) {
    pool.close().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pool.size() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl StoreOptions {
    /// Opens a pool of `max_connections` for `role` to the database at `url`, which must hold
    /// the schema this binary was built with.
    pub async fn open(
        &self,
        url: &str,
        role: Role,
        max_connections: u32,
    ) -> Result<Store, StoreError> {
        let options = url.parse::<PgConnectOptions>().map_err(StoreError::BadUrl)?;
        self.open_with(options, role, max_connections).await
    }

    /// [`StoreOptions::open`] from parsed connect options.
    pub async fn open_with(
        &self,
        options: PgConnectOptions,
        role: Role,
        max_connections: u32,
    ) -> Result<Store, StoreError> {
        let mut options = options.application_name(role.application_name());
        if self.pooled {
            // PgBouncer refuses startup parameters it does not know ("unsupported startup
            // parameter"); this one only shapes floats sent as text, which Sweep never reads.
            options = options.extra_float_digits(None);
        }
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_AFTER_IDLE {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await
            .map_err(connect_error)?;
        let listen = self
            .listen
            .clone()
            .map(|listen| Arc::new(listen.application_name(role.application_name())));
        let store = Store { pool, role, pooled: self.pooled, listen };
        check_schema(&store).await?;
        Ok(store)
    }
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    pub database_created: bool,
    /// The versions applied by this call, in order.
    pub applied: Vec<i64>,
    /// SHA-256 of the SQL functions now installed (this binary's, `runner/sql/`).
    pub functions_sha256: &'static str,
}

/// Creates the database if it does not exist, brings its Sweep schema up to date and installs
/// this binary's SQL functions (`queue/functions.rs`). Safe to run from several hosts at once
/// (every step holds an advisory lock).
///
/// Needs a direct connection, never one through a transaction pooler: sqlx's migrator holds a
/// session advisory lock across the migrations (through a pooler it would be taken on one
/// server connection and released on another, so it neither excludes nor goes away), and the
/// migrations rely on `search_path = sweep` from the startup options, which PgBouncer refuses
/// ("unsupported startup parameter: options") or, told to ignore them, drops: then this stops
/// before any migration runs ([`StoreError::NotDirect`]).
pub async fn migrate(url: &str) -> Result<Migrated, StoreError> {
    let options = url.parse::<PgConnectOptions>().map_err(StoreError::BadUrl)?;
    let database_created = if Postgres::database_exists(url).await.map_err(connect_error)? {
        false
    } else {
        Postgres::create_database(url).await.map_err(StoreError::Create)?;
        true
    };
    let applied = migrate_with(options).await?;
    Ok(Migrated { database_created, applied, functions_sha256: functions::sha256() })
}

/// Brings the Sweep schema of an existing database up to date and installs this binary's SQL
/// functions; returns the versions applied.
pub async fn migrate_with(options: PgConnectOptions) -> Result<Vec<i64>, StoreError> {
    // Every migration runs with the Sweep schema as the only one to create in or look in, so
    // migrations name tables plainly and can never touch an application's own. Checked before
    // anything is written (as a plain string: one message, which no pooler can split).
    let mut conn = PgConnection::connect_with(&options.clone().options([("search_path", SCHEMA)]))
        .await
        .map_err(connect_error)?;
    let search_path: String = sqlx::Row::try_get(&conn.fetch_one(SEARCH_PATH).await?, 0)?;
    if search_path != SCHEMA {
        return Err(StoreError::NotDirect { search_path });
    }

    // One advisory lock (sqlx's, per database) over the migrations and the functions, so two
    // hosts migrating at once take turns and never install functions over a schema in flux.
    conn.lock().await.map_err(StoreError::Migrate)?;
    conn.execute(CREATE_SCHEMA).await?;
    let (tracked,): (bool,) = sqlx::query_as(BOOKKEEPING_EXISTS).fetch_one(&mut conn).await?;
    if tracked && is_pre_release(&mut conn).await? {
        return Err(StoreError::PreRelease);
    }
    let before = applied_versions(&mut conn).await?;
    let migrator =
        Migrator { migrations: MIGRATOR.migrations.clone(), locking: false, ..Migrator::DEFAULT };
    migrator.run_direct(&mut conn).await.map_err(StoreError::Migrate)?;
    functions::install(&mut conn).await?;
    let after = applied_versions(&mut conn).await?;
    conn.unlock().await.map_err(StoreError::Migrate)?;
    conn.close().await?;
    Ok(after.into_iter().filter(|v| !before.contains(v)).collect())
}

/// A connection error, told apart when it is a pooler refusing a startup parameter (PgBouncer
/// answers "unsupported startup parameter: extra_float_digits", or `options`), so the message
/// can say what to do.
fn connect_error(e: sqlx::Error) -> StoreError {
    let refused = e
        .as_database_error()
        .is_some_and(|db| db.message().starts_with("unsupported startup parameter"));
    if refused {
        StoreError::Pooler(e)
    } else {
        StoreError::Connect(e)
    }
}

/// Whether the database holds a schema made by a Sweep from before v0.1.0, whose migrations
/// 0001-0023 the baseline replaced: its migration 1 is another file than this binary's.
async fn is_pre_release<'c, E: PgExecutor<'c>>(executor: E) -> Result<bool, StoreError> {
    let applied: Option<Vec<u8>> =
        sqlx::query_scalar(FIRST_CHECKSUM).fetch_optional(executor).await?;
    let ours = MIGRATOR.iter().find(|m| m.version == 1).map(|m| m.checksum.as_ref());
    Ok(applied.is_some_and(|applied| Some(applied.as_slice()) != ours))
}

async fn applied_versions(conn: &mut PgConnection) -> Result<Vec<i64>, StoreError> {
    let (exists,): (bool,) = sqlx::query_as(BOOKKEEPING_EXISTS).fetch_one(&mut *conn).await?;
    if !exists {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_scalar(APPLIED_VERSIONS).fetch_all(&mut *conn).await?)
}

/// Fails unless every embedded migration, and nothing newer, has been applied successfully,
/// and the functions installed are this binary's (`queue/functions.rs`). `executor` is a pool
/// or `&store`.
pub async fn check_schema<'c, E>(executor: E) -> Result<(), StoreError>
where
    E: PgExecutor<'c> + Copy,
{
    let (exists,): (bool,) = sqlx::query_as(BOOKKEEPING_EXISTS).fetch_one(executor).await?;
    if !exists {
        return Err(StoreError::SchemaMissing);
    }
    if is_pre_release(executor).await? {
        return Err(StoreError::PreRelease);
    }
    let rows: Vec<(i64, bool)> = sqlx::query_as(APPLIED).fetch_all(executor).await?;
    let known = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied = rows.iter().map(|&(v, _)| v).max().unwrap_or(0);
    if let Some(&(version, _)) = rows.iter().find(|(_, success)| !success) {
        return Err(StoreError::SchemaDirty { version });
    }
    if applied > known {
        return Err(StoreError::SchemaAhead { applied, known });
    }
    if MIGRATOR.iter().any(|m| !rows.iter().any(|&(v, _)| v == m.version)) {
        return Err(StoreError::SchemaBehind { applied, wanted: known });
    }
    functions::check(executor).await
}

const SEARCH_PATH: &str = "select current_setting('search_path')";
const CREATE_SCHEMA: &str = "create schema if not exists sweep";
const BOOKKEEPING_EXISTS: &str = "select to_regclass('sweep._sqlx_migrations') is not null";
/// Only where `BOOKKEEPING_EXISTS` said the table is there.
const FIRST_CHECKSUM: &str = "select checksum from sweep._sqlx_migrations where version = 1";
const APPLIED_VERSIONS: &str = "select version from sweep._sqlx_migrations order by version";
const APPLIED: &str = "select version, success from sweep._sqlx_migrations order by version";

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![
    SEARCH_PATH,
    CREATE_SCHEMA,
    BOOKKEEPING_EXISTS,
    FIRST_CHECKSUM,
    APPLIED_VERSIONS,
    APPLIED,
];
