//! The queue: every SQL statement Sweep runs lives under this module.
//!
//! Tasks move through the state machine drawn in docs/architecture.md ("The state machine").
//! Callers never
//! assemble a transition themselves: they call one of the named functions here
//! (`claim_batch`, `complete_batch`, `fail_batch`, `cancel`, `requeue`, ...), each one
//! statement, each taking an executor so it can run inside the caller's transaction, or `&store`
//! (a [`Store`], which runs them as a transaction pooler in between needs, see `pooler.rs`).
//!
//! Invariants every function keeps:
//! - every transition out of `running` is fenced by the lease owner (a lease exists only while
//!   `running`, a table constraint) and the attempt number; a fenced-out row is reported back
//!   as lost, never overwritten;
//! - `tasks` holds only live work: a task that finishes moves to `finished_tasks`, one that
//!   dies to `dead_tasks`, in the statement that ends it. `finished_tasks` is partitioned by
//!   UTC day of `finished_at` (runner/sql/retention.sql): statements write and
//!   read it through the parent only, never naming a partition;
//! - every table and function is named with its schema (`sweep.`, see [`Store`]), every
//!   state and failure kind comes from the vocabulary ([`TaskState`], [`FailureKind`]), and every statement is a named
//!   const listed in its module's `STATEMENTS`, which a test prepares against the schema;
//! - runner statements are written to leave the planner one sane plan however the tables
//!   looked when it was made: index or TID lookups, no joins against `tasks`;
//! - bad input is rejected before anything is written ([`InvalidTask`]).

/// The name of a list of statement consts with the statements: `(name, sql)` pairs, which the
/// statement check (`statements_tests.rs`) prepares against the schema.
#[cfg(test)]
macro_rules! statements {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), $name)),*]
    };
}

/// The channel that wakes runners, as a string literal.
macro_rules! notify_channel {
    () => {
        "sweep_tasks"
    };
}

/// The SQL call that wakes runners: one per statement that makes tasks due.
macro_rules! notify_tasks {
    () => {
        concat!("pg_notify('", notify_channel!(), "', '')")
    };
}

/// The channel that tells a runner to stop a task it holds, as a string literal.
macro_rules! cancel_channel {
    () => {
        "sweep_cancel"
    };
}

/// The SQL call that tells the runner holding row `$r` (a CTE or alias with `id`, `attempts`
/// and `lease_owner`) to stop it: payload `<runner> <task id> <attempt>` (see
/// [`notify::CancelRequest`]).
macro_rules! notify_cancel {
    ($r:literal) => {
        concat!(
            "pg_notify('",
            cancel_channel!(),
            "', ",
            $r,
            ".lease_owner::text || ' ' || ",
            $r,
            ".id::text || ' ' || ",
            $r,
            ".attempts::text)"
        )
    };
}

/// The channel that tells waiters (`GET /v1/tasks/{id}?wait=`) a task they marked ended, as a
/// string literal.
macro_rules! done_channel {
    () => {
        "sweep_done"
    };
}

/// A `RETURNING` column for a statement that ends tasks (deletes them from `tasks`): notifies
/// `sweep_done` with the task's id when a waiter marked it (`watched_at`), nothing otherwise.
macro_rules! notify_done {
    () => {
        concat!(
            "case when watched_at is not null then pg_notify('",
            done_channel!(),
            "', id::text) end as woke"
        )
    };
}

/// A CTE, `woken_queues`, that makes every queue of the rows in CTE `$rows` (which returns
/// `tenant, task_type, run_at`) findable by claims: see `sweep_wake_queues` in
/// runner/sql/wake_queues.sql. Every statement that makes tasks wait includes it and
/// references it from its final select (a plain CTE that is not referenced does not run).
macro_rules! wake_queues_cte {
    ($rows:literal) => {
        concat!(
            "woken_queues as (
                select sweep.sweep_wake_queues(w.tenants, w.task_types, w.run_ats)
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

/// The `module_defaults` CTE of the statements that insert tasks (enqueue.rs, copy.rs's prelude,
/// and the completion that spawns follow-ups): one row, `{"<tenant>/<task_type>": max_attempts}` for
/// the active module of each queue `$keys` names (a query returning `tenant, task_type`, the
/// statement's own input), where that module sets one (tenant names have no '/'). Each input
/// row looks its type up by key; a join here was planned (generic plan, input size unknown) as
/// two index probes per enqueued task. Each of the statement's queues is looked up once, by a
/// scalar subquery (index probes: a join of the queues with `active_modules` was planned as a
/// hash join over all of it); an aggregate over every active module cost each enqueue a scan
/// of all tenants' modules (1.5 ms per statement with 1,000 tenants, 4-5 ms when their modules
/// set a default).
macro_rules! module_defaults_cte {
    ($keys:literal) => {
        concat!(
            r#"
        module_defaults as (
            select coalesce(jsonb_object_agg(d.key, d.max_attempts)
                                filter (where d.max_attempts is not null),
                            '{}') as by_type
            from (
                select q.tenant || '/' || q.task_type as key,
                       (select m.max_attempts from sweep.modules m
                        where m.tenant = q.tenant and m.task_type = q.task_type
                          and m.version = (select a.version from sweep.active_modules a
                                           where a.tenant = q.tenant
                                             and a.task_type = q.task_type)) as max_attempts
                from (select distinct k.tenant, k.task_type from ("#,
            $keys,
            r#") as k(tenant, task_type)) q
                -- Kept a subquery of its own, so the lookup runs once per queue (pulled up,
                -- it ran twice: once for the filter, once for the value).
                offset 0
            ) d
        )"#
        )
    };
}

#[macro_use]
mod vocab;
#[macro_use]
mod usage;

mod artifacts;
mod batch;
mod claim;
mod compiling;
mod complete;
mod copy;
mod cron;
mod dead;
mod egress;
mod enqueue;
mod error;
mod flow;
mod follow_ups;
mod functions;
mod maintenance;
mod minutes;
mod modules;
mod notify;
mod pooler;
mod retry;
mod runners;
mod schedules;
mod secrets;
mod sessions;
#[cfg(test)]
mod statements_tests;
mod stats;
mod store;
mod tenants;
mod tokens;
mod types;
mod views;
mod workflows;

pub use artifacts::{discard_artifact, load_artifact, prune_artifacts, save_artifact, PgArtifacts};
pub use batch::{CheckedTasks, MAX_BATCH};
pub use claim::{
    cancel_requests, claim, claim_batch, claim_from, heartbeat_leases, next_due_in, release_batch,
    ClaimCursor, ClaimMode, NextDue,
};
pub use compiling::{
    finish_compile, register_compiling, reject_interrupted_compiles, CompileState, INTERRUPTED,
};
pub use complete::{complete_batch, fail_batch, Completion, Failure, FailureReport};
pub use copy::COPY_MIN_BATCH;
pub use cron::{plan_tick, CatchUp, CronSpec, InvalidCron, Overlap, TickPlan, LATE_AFTER};
pub use dead::{
    cancel, cancel_matching, delete_tasks, get_task, list_dead, requeue, watch_task, AttemptError,
    BulkCancel, Cancel, DeadTask, TaskView, DONE_CHANNEL,
};
pub use egress::{get_egress, set_egress, TenantEgress};
pub use enqueue::{
    enqueue, enqueue_checked, enqueue_many, enqueue_many_using, enqueue_many_within,
    enqueue_within, EnqueueMethod,
};
pub use error::{is_unreachable, while_unreachable, InvalidTask, QueueError};
pub use flow::{
    list_paused_tenants, list_queue_controls, pause_queue, pause_tenant, paused_by_operator,
    paused_by_tenant, resume_queue, resume_tenant, set_rate_limit, FlowError, QueueControl,
    RateLimit, TenantPause, MAX_BURST, MAX_RATE,
};
pub use follow_ups::{
    check_follow_ups, follow_up_limits, take_follow_ups, ENQUEUED_KEY, FOLLOW_UPS_KEY,
    MAX_FOLLOW_UPS,
};
pub use functions::{installed as installed_functions, sha256 as functions_sha256, Installed};
pub use maintenance::{
    prune_runners, reap_expired, repair_queue_hints, retain_finished, vacuum_live, RescuedTask,
    Retention, PARTITIONS_AHEAD_DAYS,
};
pub use minutes::{
    add_minutes, lag_bucket, lag_quantile, minute_series, minute_types, prune_minutes, MinuteDelta,
    MinuteRange, MinuteTotals, MINUTE_LAG_BUCKETS, MINUTE_LAG_BUCKETS_MS,
};
pub use modules::{
    activate_version, active_module_shas, list_versions, module_bytes, register_module,
    register_module_with, upload_reuse, ModuleSettings, ModuleVersion, Registered, UploadOptions,
    DEFAULT_REUSE,
};
pub use notify::{CancelRequest, Wakeups, CANCEL_CHANNEL, NOTIFY_CHANNEL};
pub use pooler::{Conn, Connects};
pub use retry::{RetryPolicy, RetryPolicyError};
pub use runners::{deregister_runner, list_runners, register_runner, RunnerInfo};
pub use schedules::{
    create_schedule, delete_schedule, get_schedule, list_schedules, pause_schedule,
    resume_schedule, run_due_schedules, tick_key, validate_schedule_name, CronSchedule,
    InvalidSchedule, NewSchedule, ScheduleError, TickReport, MAX_SCHEDULE_NAME_LEN,
};
pub use secrets::{
    delete_secret, list_secrets, missing_secrets, put_secret, task_capabilities,
    task_capabilities_many, validate_secret_name, InvalidSecretName, PutSecret, SecretInfo,
    TaskCapabilityRows,
};
pub use sessions::{close_ui_session, find_ui_session, open_ui_session, UiSession};
pub use stats::{fold_kept_counts, queue_stats, TypeStats};
pub use store::{
    check_schema, close_pool, migrate, migrate_with, Migrated, Role, Store, StoreError,
    StoreOptions, SCHEMA,
};
pub use tenants::{
    change_tenant_caps, create_tenant, get_tenant, list_tenants, missing_modules, set_tenant_caps,
    set_tenant_token, set_tenant_weight, CapsChange, Tenant, TenantCaps, TenantError, MAX_WEIGHT,
};
pub use tokens::{add_read_only_token, token_tenant, TokenTenant};
pub use types::{
    validate_task_type, validate_tenant, ActiveModule, ClaimedTask, Enqueued, NewTask,
    OnParentFailure, Schedule, TaskId, DEFAULT_MAX_ATTEMPTS, DEFAULT_TENANT, MAX_DEDUP_KEY_LEN,
    MAX_MAX_ATTEMPTS, MAX_PARENTS,
};
pub use usage::{usage_days, AttemptUsage, UsageDay, MAX_USAGE_DAYS};
pub use views::{
    count_tasks, list_queues, list_tasks, payload_match, throughput_last_hour, MinuteCounts,
    QueueRow, StateCounts, TaskFilter, TaskRow, COUNT_CAP,
};
pub use vocab::{FailureKind, TaskState};
pub use workflows::{
    cancel_workflow, create_workflow, get_workflow, list_workflows, plan_workflow, CreatedStep,
    CreatedWorkflow, InvalidWorkflow, MaybeState, NewStep, StepView, WorkflowCancel, WorkflowState,
    WorkflowSummary, WorkflowView, MAX_STEPS, MAX_STEP_NAME_LEN,
};

/// The migrations in `migrations/`, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Every statement of the store, by module, for the statement check.
#[cfg(test)]
pub(crate) fn statements() -> impl Iterator<Item = (&'static str, &'static str)> {
    [
        artifacts::STATEMENTS,
        claim::STATEMENTS,
        compiling::STATEMENTS,
        complete::STATEMENTS,
        copy::STATEMENTS,
        dead::STATEMENTS,
        egress::STATEMENTS,
        enqueue::STATEMENTS,
        flow::STATEMENTS,
        follow_ups::STATEMENTS,
        functions::STATEMENTS,
        maintenance::STATEMENTS,
        minutes::STATEMENTS,
        modules::STATEMENTS,
        runners::STATEMENTS,
        schedules::STATEMENTS,
        secrets::STATEMENTS,
        sessions::STATEMENTS,
        stats::STATEMENTS,
        store::STATEMENTS,
        tenants::STATEMENTS,
        tokens::STATEMENTS,
        usage::STATEMENTS,
        views::STATEMENTS,
        workflows::STATEMENTS,
    ]
    .into_iter()
    .flatten()
    .copied()
}

/// A duration as whole milliseconds for SQL (`$n * interval '1 millisecond'`), saturating.
pub(crate) fn sql_millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A count or limit for SQL, saturating.
pub(crate) fn sql_count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
