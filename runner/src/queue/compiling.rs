//! Compile state: a module version registered before its compile ended (an upload answered
//! 202), and how that compile's end is recorded.
//!
//! Invariants:
//! - only a `ready` version is ever made active (here, by `INSERT_VERSION` in modules.rs after
//!   a compile that ended in the request, and by `activate_version`, which refuses the others);
//!   a `ready` version is never demoted: a later interrupted or failed compile of the same
//!   bytes leaves it as it is;
//! - while a task type has no active version and one is compiling, its queue is held
//!   (`queues.module_compiling`, part of `paused`, which the claim reads): its tasks wait and
//!   enqueues of it are accepted; the hold ends when that compile ends either way, and the
//!   runners are woken when it ends in `ready`;
//! - a compile that finished makes its version active unless someone activated a version of
//!   the type after the upload (an explicit activation is newer than the upload's intent);
//! - a version left `compiling` by a process that stopped is rejected by the maintenance
//!   ([`reject_interrupted_compiles`]) once it is older than any compile can last, so nothing
//!   waits on it for ever.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgExecutor;

use super::modules::{register, UploadOptions};
use super::{sql_millis, Connects, ModuleSettings, QueueError, Registered};

/// Where a version's compile stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, sqlx::Type, utoipa::ToSchema, Default)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum CompileState {
    /// Registered; its compile is still running. Tasks of a type with no other version wait.
    Compiling,
    /// Compiled and accepted: it can be (and, after its upload, is) the active version.
    #[default]
    Ready,
    /// The compile refused it or was interrupted; `compile_error` says why. Never active.
    Rejected,
}

impl CompileState {
    pub fn as_str(self) -> &'static str {
        match self {
            CompileState::Compiling => "compiling",
            CompileState::Ready => "ready",
            CompileState::Rejected => "rejected",
        }
    }
}

/// What the maintenance writes as the reason of a compile that never ended.
pub const INTERRUPTED: &str = "the compile was interrupted (the process compiling it stopped); \
                               upload the module again";

/// Registers `bytes` (within the structural limits; their compile still running) as the next
/// version of `(tenant, task_type)` in state `compiling`, without activating it, and holds
/// the type's queue when it has no active version. Identical bytes and settings already
/// registered: that version, made `compiling` again if it was `rejected` (a `ready` one stays
/// ready, and is re-activated as an upload that compiled in time would).
pub async fn register_compiling<'c, A>(
    conn: A,
    tenant: &str,
    task_type: &str,
    (sha256, bytes): (&str, &[u8]),
    settings: &ModuleSettings,
    options: &UploadOptions,
) -> Result<Registered, QueueError>
where
    A: Connects<'c>,
{
    register(conn, (tenant, task_type, sha256, bytes), settings, options, true).await
}

/// Records the end of `version`'s compile: `Ok` makes it `ready` and (unless a version was
/// activated since it was uploaded) active; `Err(reason)` makes a `compiling` version
/// `rejected` (a `ready` one stays ready). Either way the type's queue is no longer held for
/// it.
pub async fn finish_compile<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    task_type: &str,
    version: i32,
    outcome: Result<(), &str>,
) -> Result<(), QueueError> {
    let statement = match outcome {
        Ok(()) => sqlx::query(COMPILED).bind(tenant).bind(task_type).bind(version),
        Err(reason) => {
            sqlx::query(REJECTED).bind(tenant).bind(task_type).bind(version).bind(reason)
        }
    };
    statement.execute(executor).await?;
    Ok(())
}

/// Rejects (with [`INTERRUPTED`]) every version still `compiling` that was registered more
/// than `older_than` ago, and ends the holds they kept; how many.
pub async fn reject_interrupted_compiles<'c, E: PgExecutor<'c>>(
    executor: E,
    older_than: Duration,
) -> Result<u64, QueueError> {
    let rejected: i64 = sqlx::query_scalar(REJECT_INTERRUPTED)
        .bind(sql_millis(older_than))
        .bind(INTERRUPTED)
        .fetch_one(executor)
        .await?;
    Ok(u64::try_from(rejected).unwrap_or(0))
}

/// Holds or releases the queue of a type when version `$3` of it (`$1`/`$2`) stopped
/// compiling: held while the type has no active version and another of its versions is
/// compiling. The statement's CTE `activated` holds the version it made active, if any (its
/// snapshot does not see that row yet); that version's running limit is copied (as ACTIVATE
/// does).
macro_rules! settle_hold {
    () => {
        r#"
        settled as (
            update sweep.queues q
            set module_compiling = not exists (select 1 from activated)
                                   and not exists (select 1 from sweep.active_modules a
                                                   where a.tenant = $1 and a.task_type = $2)
                                   and exists (select 1 from sweep.modules m
                                               where m.tenant = $1 and m.task_type = $2
                                                 and m.compile_state = 'compiling'
                                                 and m.version <> $3),
                max_running = coalesce((select m.max_running from sweep.modules m
                                        where m.tenant = $1 and m.task_type = $2
                                          and m.version = (select version from activated)),
                                       q.max_running)
            where q.tenant = $1 and q.task_type = $2
            returning q.module_compiling
        )"#
    };
}

// The version is ready; it becomes active unless a version was activated after its upload.
// The hold is settled in the same statement, then runners are woken (the queue's tasks may
// all be due).
const COMPILED: &str = concat!(
    r#"
    with readied as (
        update sweep.modules
        set compile_state = 'ready', compile_error = null
        where tenant = $1 and task_type = $2 and version = $3
        returning tenant, task_type, version, created_at
    ),
    activated as (
        insert into sweep.active_modules as a (tenant, task_type, version)
        select tenant, task_type, version from readied
        on conflict (tenant, task_type) do update
            set version = excluded.version, activated_at = now()
            where a.activated_at < (select created_at from readied)
        returning version
    ),
    "#,
    settle_hold!(),
    r#"
    select "#,
    notify_tasks!(),
    r#" from readied
    "#
);

// A compiling version is rejected (a ready one is left alone); the hold ends unless another
// version of the type is compiling. `activated` is empty: nothing becomes active.
const REJECTED: &str = concat!(
    r#"
    with rejected as (
        update sweep.modules
        set compile_state = 'rejected', compile_error = $4
        where tenant = $1 and task_type = $2 and version = $3 and compile_state = 'compiling'
        returning version
    ),
    activated as (select null::integer as version where false),
    "#,
    settle_hold!(),
    r#"
    select count(*) from rejected
    "#
);

// Interrupted compiles of any tenant; their queues' holds end with them (another version of
// the type may still be compiling: then the hold stays).
const REJECT_INTERRUPTED: &str = r#"
    with rejected as (
        update sweep.modules
        set compile_state = 'rejected', compile_error = $2
        where compile_state = 'compiling'
          and created_at < now() - $1 * interval '1 millisecond'
        returning tenant, task_type
    ),
    released as (
        update sweep.queues q
        set module_compiling = false
        from (select distinct tenant, task_type from rejected) r
        where q.tenant = r.tenant and q.task_type = r.task_type and q.module_compiling
          and not exists (select 1 from sweep.modules m
                          where m.tenant = r.tenant and m.task_type = r.task_type
                            and m.compile_state = 'compiling'
                            and m.created_at >= now() - $1 * interval '1 millisecond')
    )
    select count(*) from rejected
    "#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![COMPILED, REJECTED, REJECT_INTERRUPTED];
