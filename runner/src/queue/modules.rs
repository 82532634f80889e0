//! The module registry: every uploaded version of the handler for a (tenant, task_type), and
//! which one is active.
//!
//! Invariants: versions count up from 1 per (tenant, task_type); uploading the same bytes with
//! the same limits returns the existing version instead of creating one; an upload whose
//! compile ended makes its version active (one still compiling: compiling.rs); the active
//! version always exists (foreign key) and is `ready`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;

use std::fmt::Debug;
use std::ops::DerefMut;

use sqlx::PgConnection;

use super::{error::is_unique_violation, CompileState, Conn, Connects, QueueError};

/// Per-module overrides of the runner's defaults. `None` means "use the default".
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema,
)]
pub struct ModuleSettings {
    #[schema(required)]
    pub fuel: Option<i64>,
    #[schema(required)]
    pub timeout_ms: Option<i64>,
    #[schema(required)]
    pub memory_bytes: Option<i64>,
    #[schema(required)]
    pub max_attempts: Option<i32>,
    #[schema(required)]
    pub backoff_base_ms: Option<i64>,
    #[schema(required)]
    pub backoff_cap_ms: Option<i64>,
    /// Most tasks of this type running at once across all runners (the claim enforces it).
    #[schema(required)]
    pub max_running: Option<i32>,
}

/// One registered version, without its bytes.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ModuleVersion {
    pub tenant: String,
    pub task_type: String,
    pub version: i32,
    pub sha256: String,
    pub size: i64,
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub settings: ModuleSettings,
    /// The tenant secrets this version receives as environment variables (named at upload).
    pub secrets: Vec<String>,
    /// Most tasks one kept instance of this component runs (`null`: a fresh instance for
    /// every task). Named at upload.
    #[schema(required)]
    pub reuse: Option<i32>,
    pub active: bool,
    pub created_at: DateTime<Utc>,
    /// Where its compile stands: only a `ready` version runs.
    pub compile_state: CompileState,
    /// Why it was rejected (`null` unless `compile_state` is `rejected`).
    #[schema(required)]
    pub compile_error: Option<String>,
}

/// What an upload did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Registered {
    #[serde(flatten)]
    pub module: ModuleVersion,
    /// False when identical bytes and settings were already registered.
    pub created: bool,
}

/// Registers `bytes` (already validated by the sandbox) as the next version of the handler
/// for `(tenant, task_type)` and activates it, or re-activates the identical existing version.
/// The version receives no secrets and keeps no instance; see [`register_module_with`].
pub async fn register_module<'c, A>(
    conn: A,
    tenant: &str,
    task_type: &str,
    sha256: &str,
    bytes: &[u8],
    settings: &ModuleSettings,
) -> Result<Registered, QueueError>
where
    A: Connects<'c>,
{
    let options = UploadOptions::default();
    register_module_with(conn, tenant, task_type, sha256, bytes, settings, &options).await
}

/// What an upload names beside the bytes and limits, part of the version's identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UploadOptions {
    /// The tenant's secrets the version receives (checked to exist by the caller; sorted and
    /// deduplicated when stored, so the same set is the same version whatever its order).
    pub secrets: Vec<String>,
    /// Most tasks one kept instance runs; `None` or 1: a fresh instance for every task. An
    /// upload of a component that names none stores [`DEFAULT_REUSE`].
    pub reuse: Option<i32>,
}

/// A component's `reuse` when its upload names none. A fresh Python or JavaScript instance
/// spends most of a task starting its runtime (98% and 83% of it in criterion
/// `components/big`), and their users expect module state to outlive a job, as in a Celery or
/// Node worker. The bound renews an instance that slowly leaks. `reuse=1` asks for a fresh
/// instance per task.
pub const DEFAULT_REUSE: i32 = 1_000;

/// The `reuse` an upload of `bytes` stores: what it `asked` for, else [`DEFAULT_REUSE`] for a
/// component and none for a preview-1 module (whose `_start` runs once per instance; the API
/// refuses a module upload that asks).
pub fn upload_reuse(bytes: &[u8], asked: Option<i32>) -> Option<i32> {
    match asked {
        None if wasmparser::Parser::is_component(bytes) => Some(DEFAULT_REUSE),
        asked => asked,
    }
}

/// [`register_module`] for a version with `options`: secrets it receives, instances it
/// keeps.
pub async fn register_module_with<'c, A>(
    conn: A,
    tenant: &str,
    task_type: &str,
    sha256: &str,
    bytes: &[u8],
    settings: &ModuleSettings,
    options: &UploadOptions,
) -> Result<Registered, QueueError>
where
    A: Connects<'c>,
{
    register(conn, (tenant, task_type, sha256, bytes), settings, options, false).await
}

/// Registers the version (`compiling`: in that state, not activated, its queue held while the
/// type has no active version, see compiling.rs; else `ready` and active), or finds the
/// identical one.
pub(super) async fn register<'c, A>(
    conn: A,
    version: (&str, &str, &str, &[u8]),
    settings: &ModuleSettings,
    options: &UploadOptions,
    compiling: bool,
) -> Result<Registered, QueueError>
where
    A: Connects<'c>,
{
    let (tenant, task_type, ..) = version;
    let mut conn = conn.connect().await?;
    let (version, created) =
        insert_version(&mut conn, version, settings, options, compiling).await?;
    let module = get_version(&mut conn, tenant, task_type, version).await?;
    Ok(Registered { module, created })
}

/// Inserts the version, or finds the identical one (see `register`). Secrets are sorted and
/// deduplicated here. Returns (version, created).
async fn insert_version<C>(
    conn: &mut Conn<C>,
    version: (&str, &str, &str, &[u8]),
    settings: &ModuleSettings,
    options: &UploadOptions,
    compiling: bool,
) -> Result<(i32, bool), QueueError>
where
    C: DerefMut<Target = PgConnection> + Send + Debug,
{
    let mut options = options.clone();
    options.secrets.sort_unstable();
    options.secrets.dedup();
    // Two concurrent uploads can pick the same next version number; the loser retries.
    for _ in 0..5 {
        match insert_version_once(&mut *conn, version, settings, &options, compiling).await {
            Ok(inserted) => return Ok(inserted),
            Err(e) if is_unique_violation(&e, "modules_pkey") => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(QueueError::Corrupt("module version kept colliding with concurrent uploads".into()))
}

async fn insert_version_once<'c, E: PgExecutor<'c>>(
    executor: E,
    (tenant, task_type, sha256, bytes): (&str, &str, &str, &[u8]),
    s: &ModuleSettings,
    options: &UploadOptions,
    compiling: bool,
) -> Result<(i32, bool), sqlx::Error> {
    sqlx::query_as(INSERT_VERSION)
        .bind(tenant)
        .bind(task_type)
        .bind(sha256)
        .bind(bytes)
        .bind(s.fuel)
        .bind(s.timeout_ms)
        .bind(s.memory_bytes)
        .bind(s.max_attempts)
        .bind(s.backoff_base_ms)
        .bind(s.backoff_cap_ms)
        .bind(s.max_running)
        .bind(&options.secrets)
        .bind(compiling)
        .bind(options.reuse)
        .fetch_one(executor)
        .await
}

/// Makes `version` the active handler. `ModuleVersionNotFound` when no such version exists,
/// `ModuleNotReady` when its compile is still running or rejected it.
pub async fn activate_version<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    task_type: &str,
    version: i32,
) -> Result<(), QueueError> {
    let (activated, state): (Option<i32>, Option<CompileState>) = sqlx::query_as(ACTIVATE)
        .bind(tenant)
        .bind(task_type)
        .bind(version)
        .fetch_one(executor)
        .await?;
    match (activated, state) {
        (Some(_), _) => Ok(()),
        (None, Some(state)) => {
            Err(QueueError::ModuleNotReady { task_type: task_type.to_owned(), version, state })
        }
        (None, None) => {
            Err(QueueError::ModuleVersionNotFound { task_type: task_type.to_owned(), version })
        }
    }
}

/// Versions, newest first, of one task type (`Some`) or of all (`None`), for one tenant or
/// (operator, `tenant` = `None`) for all.
pub async fn list_versions<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
    task_type: Option<&str>,
    active_only: bool,
) -> Result<Vec<ModuleVersion>, QueueError> {
    Ok(sqlx::query_as(LIST_VERSIONS)
        .bind(tenant)
        .bind(task_type)
        .bind(active_only)
        .fetch_all(executor)
        .await?)
}

async fn get_version<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    task_type: &str,
    version: i32,
) -> Result<ModuleVersion, QueueError> {
    list_versions(executor, Some(tenant), Some(task_type), false)
        .await?
        .into_iter()
        .find(|m| m.version == version)
        .ok_or_else(|| QueueError::ModuleVersionNotFound {
            task_type: task_type.to_owned(),
            version,
        })
}

/// The bytes of the module with this sha256 (any tenant's copy: equal hashes, equal bytes).
pub async fn module_bytes<'c, E: PgExecutor<'c>>(
    executor: E,
    sha256: &str,
) -> Result<Option<Vec<u8>>, QueueError> {
    Ok(sqlx::query_scalar(MODULE_BYTES).bind(sha256).fetch_optional(executor).await?)
}

/// The sha256 of up to `limit` active modules (of `task_types`, empty: any), most recently
/// activated first: what a starting runner compiles ahead, so its first tasks do not wait for
/// a compile.
pub async fn active_module_shas<'c, E: PgExecutor<'c>>(
    executor: E,
    task_types: &[String],
    limit: usize,
) -> Result<Vec<String>, QueueError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    Ok(sqlx::query_scalar(ACTIVE_SHAS).bind(task_types).bind(limit).fetch_all(executor).await?)
}

// $13: the compile is still running (the upload answers 202). Then the version is
// registered `compiling`, not activated, and the queue is held while the type has no active
// version (compiling.rs); else it is `ready` and active. An identical version found instead
// is made ready (its compile ended now) or compiling again (it was rejected before); a ready
// one stays ready and is activated, as an upload that compiled in time would.
const INSERT_VERSION: &str = r#"
    with existing as (
        select version, compile_state from sweep.modules
        where tenant = $1 and task_type = $2 and sha256 = $3
          and fuel is not distinct from $5 and timeout_ms is not distinct from $6
          and memory_bytes is not distinct from $7 and max_attempts is not distinct from $8
          and backoff_base_ms is not distinct from $9 and backoff_cap_ms is not distinct from $10
          and max_running is not distinct from $11 and secrets = $12::text[]
          and reuse is not distinct from $14
    ),
    created as (
        insert into sweep.modules (tenant, task_type, version, sha256, bytes, fuel, timeout_ms,
                             memory_bytes, max_attempts, backoff_base_ms, backoff_cap_ms,
                             max_running, secrets, compile_state, reuse)
        select $1, $2,
               coalesce((select max(version) from sweep.modules where tenant = $1 and task_type = $2), 0) + 1,
               $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
               case when $13 then 'compiling' else 'ready' end, $14
        where not exists (select 1 from existing)
        returning version
    ),
    restated as (
        update sweep.modules m
        set compile_state = case when $13 then 'compiling' else 'ready' end, compile_error = null
        from existing e
        where m.tenant = $1 and m.task_type = $2 and m.version = e.version
          and e.compile_state <> 'ready'
    ),
    chosen as (
        select version, true as created, $13 as compiling from created
        union all
        select version, false, $13 and compile_state <> 'ready' from existing
    ),
    activated as (
        insert into sweep.active_modules (tenant, task_type, version)
        select $1, $2, version from chosen where not compiling
        on conflict (tenant, task_type)
            do update set version = excluded.version, activated_at = now()
    ),
    -- The claim reads the active version's running limit from the queue row; a new row
    -- copies its tenant's pause under the tenant's lock (see runner/sql/wake_queues.sql). A
    -- version still compiling leaves the running limit to the active one.
    queued as (
        insert into sweep.queues (tenant, task_type, weight, max_running, tenant_paused,
                                  module_compiling)
        select $1, $2, coalesce((select weight from sweep.tenants where name = $1), 1),
               case when c.compiling
                    then (select m.max_running from sweep.active_modules a
                          join sweep.modules m using (tenant, task_type, version)
                          where a.tenant = $1 and a.task_type = $2)
                    else $11 end,
               coalesce((select paused_at is not null from sweep.tenants
                         where name = $1 for share), false),
               c.compiling and not exists (select 1 from sweep.active_modules a
                                           where a.tenant = $1 and a.task_type = $2)
        from chosen c
        on conflict (tenant, task_type) do update
            set max_running = excluded.max_running, module_compiling = excluded.module_compiling
    )
    select version, created from chosen
    "#;

const ACTIVATE: &str = r#"
    with activated as (
        insert into sweep.active_modules (tenant, task_type, version)
        select tenant, task_type, version from sweep.modules
        where tenant = $1 and task_type = $2 and version = $3 and compile_state = 'ready'
        on conflict (tenant, task_type)
            do update set version = excluded.version, activated_at = now()
        returning version
    ),
    -- The claim reads the active version's running limit from the queue row (a new row
    -- copies its tenant's pause, as in INSERT_VERSION).
    queued as (
        insert into sweep.queues (tenant, task_type, weight, max_running, tenant_paused)
        select m.tenant, m.task_type,
               coalesce((select weight from sweep.tenants where name = $1), 1), m.max_running,
               coalesce((select paused_at is not null from sweep.tenants
                         where name = $1 for share), false)
        from sweep.modules m
        where m.tenant = $1 and m.task_type = $2 and m.version = (select version from activated)
        on conflict (tenant, task_type)
            do update set max_running = excluded.max_running, module_compiling = false
    )
    -- The version's state tells a version that is not ready from one that does not exist.
    select (select version from activated),
           (select compile_state from sweep.modules
            where tenant = $1 and task_type = $2 and version = $3)
    "#;

const LIST_VERSIONS: &str = r#"
    select m.tenant, m.task_type, m.version, m.sha256, length(m.bytes)::int8 as size,
           m.fuel, m.timeout_ms, m.memory_bytes, m.max_attempts, m.backoff_base_ms,
           m.backoff_cap_ms, m.max_running, m.secrets, m.reuse, a.version is not null as active,
           m.created_at, m.compile_state, m.compile_error
    from sweep.modules m
    left join sweep.active_modules a
           on a.tenant = m.tenant and a.task_type = m.task_type and a.version = m.version
    where ($1::text is null or m.tenant = $1)
      and ($2::text is null or m.task_type = $2)
      and (not $3 or a.version is not null)
    order by m.tenant, m.task_type, m.version desc
    "#;

const MODULE_BYTES: &str = r#"select bytes from sweep.modules where sha256 = $1 limit 1"#;

const ACTIVE_SHAS: &str = r#"
    select m.sha256
    from sweep.active_modules a
    join sweep.modules m
      on m.tenant = a.tenant and m.task_type = a.task_type and m.version = a.version
    where cardinality($1::text[]) = 0 or a.task_type = any($1::text[])
    group by m.sha256
    order by max(a.activated_at) desc
    limit $2
"#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] =
    statements![INSERT_VERSION, ACTIVATE, LIST_VERSIONS, MODULE_BYTES, ACTIVE_SHAS];
