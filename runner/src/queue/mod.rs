//! The queue: every SQL statement Sweep runs lives under this module.
//!
//! Tasks move through the state machine documented in `migrations/0001_queue.sql` and
//! `migrations/0008_finished_tasks.sql`. Callers never
//! assemble a transition themselves: they call one of the named functions here
//! (`claim_batch`, `complete_batch`, `fail_batch`, `cancel`, `requeue`, ...), each one
//! statement, each taking an executor so it can run inside the caller's transaction.
//!
//! Invariants every function keeps:
//! - every transition out of `running` is fenced by the lease owner (a lease exists only while
//!   `running`, a table constraint) and the attempt number; a fenced-out row is reported back
//!   as lost, never overwritten;
//! - `tasks` holds only live work: a task that finishes moves to `finished_tasks`, one that
//!   dies to `dead_tasks`, in the statement that ends it;
//! - runner statements are planned once per connection (see `connect`), so each is written
//!   to leave the planner one sane plan: index or TID lookups, no joins against `tasks`;
//! - bad input is rejected before anything is written ([`InvalidTask`]).

/// A CTE, `woken_queues`, that makes every queue of the rows in CTE `$rows` (which returns
/// `tenant, task_type, run_at`) findable by claims: see `sweep_wake_queues` in
/// migrations/0009_fair_share.sql. Every statement that makes tasks wait includes it and
/// references it from its final select (a plain CTE that is not referenced does not run).
macro_rules! wake_queues_cte {
    ($rows:literal) => {
        concat!(
            "woken_queues as (
                select sweep_wake_queues(w.tenants, w.task_types, w.run_ats)
                from (
                    select array_agg(tenant) as tenants, array_agg(task_type) as task_types,
                           array_agg(run_at) as run_ats
                    from (select tenant, task_type, min(run_at) as run_at from ",
            $rows,
            "         group by tenant, task_type) g
                ) w
            )"
        )
    };
}

pub mod bench_support;
mod claim;
mod complete;
mod connect;
mod dead;
mod enqueue;
mod error;
mod maintenance;
mod modules;
mod notify;
mod retry;
mod runners;
mod stats;
mod tenants;
mod tokens;
mod types;
mod views;

pub use claim::{claim, claim_batch, heartbeat_leases, release_batch, ClaimMode};
pub use complete::{complete_batch, fail_batch, Completion, Failure, FailureReport};
pub use connect::{connect, migrate, migrations_done, ConnectError};
pub use dead::{cancel, get_task, list_dead, requeue, DeadTask, TaskView};
pub use enqueue::{enqueue, enqueue_many, Enqueued};
pub use error::{InvalidTask, QueueError};
pub use maintenance::{
    delete_finished, prune_runners, reap_expired, repair_queue_hints, vacuum_live, RescuedTask,
};
pub use modules::{
    activate_version, list_versions, module_bytes, register_module, ModuleSettings, ModuleVersion,
    Registered,
};
pub use notify::{Wakeups, NOTIFY_CHANNEL};
pub use retry::{RetryPolicy, RetryPolicyError};
pub use runners::{deregister_runner, list_runners, register_runner, RunnerInfo};
pub use stats::{queue_stats, TypeStats};
pub use tenants::{
    create_tenant, get_tenant, list_tenants, missing_modules, set_tenant_caps, set_tenant_weight,
    tenant_by_token, Tenant, TenantCaps, TenantError, MAX_WEIGHT,
};
pub use tokens::{add_read_only_token, token_tenant, TokenTenant};
pub use types::{
    validate_task_type, validate_tenant, ActiveModule, ClaimedTask, NewTask, Schedule, TaskId,
    TaskState, DEFAULT_MAX_ATTEMPTS, DEFAULT_TENANT, MAX_MAX_ATTEMPTS,
};
pub use views::{list_tasks, throughput_last_hour, MinuteCounts, TaskFilter, TaskRow};

/// The migrations in `migrations/`, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// States from which a task can still run: `dedup_key` is unique among these.
pub const LIVE_STATES: [TaskState; 3] =
    [TaskState::Pending, TaskState::Running, TaskState::Retrying];

/// A duration as whole milliseconds for SQL (`$n * interval '1 millisecond'`), saturating.
pub(crate) fn sql_millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A count or limit for SQL, saturating.
pub(crate) fn sql_count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
