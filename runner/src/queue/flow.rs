//! Flow control: pausing a task type of a tenant, or a whole tenant; rate limits of a task
//! type.
//!
//! Invariants:
//! - a pause is state in Postgres (`queues.paused_at`/`paused_by` for a task type,
//!   `tenants.paused_at`/`paused_by` for a tenant, copied onto its queues as `tenant_paused`),
//!   so every runner, and a runner started later, sees it at its next claim;
//! - the claim skips paused queues (`sweep_claim_window` in runner/sql/claim.sql); running
//!   tasks finish; enqueues are accepted and wait;
//! - pausing what is already paused keeps the first pause's time and author (resuming what is
//!   not paused changes nothing): both are idempotent;
//! - a task type can be paused or rate-limited only when the tenant has a module for it (else
//!   [`FlowError::NoModule`], nothing written);
//! - a rate limit is `rate_per_sec` in (0, [`MAX_RATE`]] and `burst` in 1..=[`MAX_BURST`]
//!   ([`RateLimit::validate`], and a table constraint); the claim enforces it across runners
//!   (a token bucket on the queue row, see runner/sql/flow_tokens.sql).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;

use super::{validate_task_type, validate_tenant, InvalidTask, QueueError};

/// Who paused something, as stored in `paused_by`: `operator` or `tenant:NAME`.
pub fn paused_by_operator() -> String {
    "operator".to_owned()
}

/// `paused_by` for a tenant's own pause.
pub fn paused_by_tenant(tenant: &str) -> String {
    format!("tenant:{tenant}")
}

/// The flow-control state of one queue (tenant, task type).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct QueueControl {
    pub tenant: String,
    pub task_type: String,
    /// Whether claims skip this queue now (its own pause, its tenant's, or its first module
    /// version still compiling).
    pub paused: bool,
    /// When the task type itself was paused (`null`: it is not).
    #[schema(required)]
    pub paused_at: Option<DateTime<Utc>>,
    /// Who paused the task type: `operator` or `tenant:NAME`.
    #[schema(required)]
    pub paused_by: Option<String>,
    /// Whether the whole tenant is paused (see `GET /v1/stats`' `paused_tenants`).
    pub tenant_paused: bool,
    /// Whether its tasks wait for the type's first module version to compile.
    pub module_compiling: bool,
    /// Most starts per second on average, across all runners (`null`: no rate limit).
    #[schema(required)]
    pub rate_per_sec: Option<f64>,
    /// Most starts at once after an idle spell (`null`: no rate limit).
    #[schema(required)]
    pub burst: Option<i32>,
}

/// Highest `rate_per_sec` (`queues_rate_limit`).
pub const MAX_RATE: f64 = 1_000_000.0;
/// Highest `burst` (`queues_rate_limit`).
pub const MAX_BURST: i32 = 1_000_000;

/// A task type's rate limit: at most `burst` starts at once, and `rate_per_sec` on average.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub rate_per_sec: f64,
    pub burst: i32,
}

impl RateLimit {
    /// Refuses a rate that is not a number in (0, [`MAX_RATE`]] or a burst outside
    /// 1..=[`MAX_BURST`], naming the field.
    pub fn validate(&self) -> Result<(), FlowError> {
        if !(self.rate_per_sec.is_finite()
            && self.rate_per_sec > 0.0
            && self.rate_per_sec <= MAX_RATE)
        {
            return Err(FlowError::BadRateLimit {
                field: "rate_per_sec",
                requirement: "greater than 0 and at most 1000000",
            });
        }
        if !(1..=MAX_BURST).contains(&self.burst) {
            return Err(FlowError::BadRateLimit {
                field: "burst",
                requirement: "between 1 and 1000000",
            });
        }
        Ok(())
    }
}

/// A paused tenant: since when and by whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct TenantPause {
    pub tenant: String,
    /// Whether claims skip every task type of the tenant now.
    pub paused: bool,
    #[schema(required)]
    pub paused_at: Option<DateTime<Utc>>,
    #[schema(required)]
    pub paused_by: Option<String>,
}

/// Why a flow-control change was refused. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlowError {
    #[error("no module is registered for task_type {task_type:?}")]
    NoModule { task_type: String },
    #[error("tenant {0:?} not found")]
    TenantNotFound(String),
    #[error(transparent)]
    BadName(InvalidTask),
    #[error("{field} must be {requirement}")]
    BadRateLimit { field: &'static str, requirement: &'static str },
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl From<sqlx::Error> for FlowError {
    fn from(e: sqlx::Error) -> Self {
        FlowError::Queue(QueueError::Database(e))
    }
}

/// Pauses task type `task_type` of `tenant`: claims skip it from the next claim on. `by` is
/// stored as the author ([`paused_by_operator`], [`paused_by_tenant`]).
pub async fn pause_queue<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    task_type: &str,
    by: &str,
) -> Result<QueueControl, FlowError> {
    set_queue_pause(executor, tenant, task_type, Some(by)).await
}

/// Lifts the pause of task type `task_type` of `tenant` (its tenant's pause, if any, stays).
pub async fn resume_queue<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    task_type: &str,
) -> Result<QueueControl, FlowError> {
    set_queue_pause(executor, tenant, task_type, None).await
}

async fn set_queue_pause<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    task_type: &str,
    by: Option<&str>,
) -> Result<QueueControl, FlowError> {
    validate_tenant(tenant).map_err(FlowError::BadName)?;
    validate_task_type(task_type).map_err(FlowError::BadName)?;
    let row: Option<QueueControl> = sqlx::query_as(SET_QUEUE_PAUSE)
        .bind(tenant)
        .bind(task_type)
        .bind(by)
        .fetch_optional(executor)
        .await?;
    row.ok_or_else(|| FlowError::NoModule { task_type: task_type.to_owned() })
}

/// Sets (`Some`) or clears (`None`) the rate limit of task type `task_type` of `tenant`, from
/// the next claim on. A changed limit keeps the bucket's level (at most the new burst); a new
/// one starts full.
pub async fn set_rate_limit<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    task_type: &str,
    limit: Option<RateLimit>,
) -> Result<QueueControl, FlowError> {
    validate_tenant(tenant).map_err(FlowError::BadName)?;
    validate_task_type(task_type).map_err(FlowError::BadName)?;
    if let Some(l) = &limit {
        l.validate()?;
    }
    let row: Option<QueueControl> = sqlx::query_as(SET_RATE_LIMIT)
        .bind(tenant)
        .bind(task_type)
        .bind(limit.map(|l| l.rate_per_sec))
        .bind(limit.map(|l| l.burst))
        .fetch_optional(executor)
        .await?;
    row.ok_or_else(|| FlowError::NoModule { task_type: task_type.to_owned() })
}

/// Pauses every task type of tenant `name` (the operator's). Its queues' own pauses are kept
/// apart: resuming the tenant leaves a task type its tenant paused paused.
pub async fn pause_tenant<'c, E: PgExecutor<'c>>(
    executor: E,
    name: &str,
    by: &str,
) -> Result<TenantPause, FlowError> {
    set_tenant_pause(executor, name, Some(by)).await
}

/// Lifts tenant `name`'s pause.
pub async fn resume_tenant<'c, E: PgExecutor<'c>>(
    executor: E,
    name: &str,
) -> Result<TenantPause, FlowError> {
    set_tenant_pause(executor, name, None).await
}

async fn set_tenant_pause<'c, E: PgExecutor<'c>>(
    executor: E,
    name: &str,
    by: Option<&str>,
) -> Result<TenantPause, FlowError> {
    validate_tenant(name).map_err(FlowError::BadName)?;
    let row: Option<TenantPause> =
        sqlx::query_as(SET_TENANT_PAUSE).bind(name).bind(by).fetch_optional(executor).await?;
    row.ok_or_else(|| FlowError::TenantNotFound(name.to_owned()))
}

/// Queues with a pause (their own or their tenant's) or a rate limit, of one tenant or (`None`) all, by tenant
/// and task type.
pub async fn list_queue_controls<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
) -> Result<Vec<QueueControl>, QueueError> {
    Ok(sqlx::query_as(LIST_QUEUE_CONTROLS).bind(tenant).fetch_all(executor).await?)
}

/// Paused tenants, of one tenant or (`None`) all, by name.
pub async fn list_paused_tenants<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
) -> Result<Vec<TenantPause>, QueueError> {
    Ok(sqlx::query_as(LIST_PAUSED_TENANTS).bind(tenant).fetch_all(executor).await?)
}

// $3 null: resume. The queue row exists once a module does (the upload creates it); the
// module check is what makes an unknown task type a refusal with nothing written.
// A resume wakes the runners (NOTIFY at commit), as an enqueue does: the queue may have work.
const SET_QUEUE_PAUSE: &str = concat!(
    r#"
    with changed as (
        update sweep.queues q
        set paused_at = case when $3::text is null then null
                             else coalesce(q.paused_at, now()) end,
            paused_by = case when $3::text is null then null
                             else coalesce(q.paused_by, $3) end
        where q.tenant = $1 and q.task_type = $2
          and exists (select 1 from sweep.active_modules a
                      where a.tenant = $1 and a.task_type = $2)
        returning q.tenant, q.task_type, q.paused, q.paused_at, q.paused_by, q.tenant_paused, q.module_compiling,
                  q.rate_per_sec, q.burst
    ),
    woken as (select "#,
    notify_tasks!(),
    r#" where $3::text is null and exists (select 1 from changed))
    select c.* from changed c left join woken on true
    "#
);

// The tenant row first (its lock is what a new queue row's copy waits on, see
// `sweep_wake_queues_locking` in runner/sql/wake_queues.sql), then the
// copy on every queue of the tenant.
const SET_TENANT_PAUSE: &str = concat!(
    r#"
    with changed as (
        update sweep.tenants t
        set paused_at = case when $2::text is null then null else coalesce(t.paused_at, now()) end,
            paused_by = case when $2::text is null then null else coalesce(t.paused_by, $2) end
        where t.name = $1
        returning t.name, t.paused_at, t.paused_by
    ),
    copied as (
        update sweep.queues q set tenant_paused = $2::text is not null
        where q.tenant = (select name from changed)
          and q.tenant_paused is distinct from ($2::text is not null)
    ),
    woken as (select "#,
    notify_tasks!(),
    r#" where $2::text is null and exists (select 1 from changed))
    select name as tenant, paused_at is not null as paused, paused_at, paused_by
    from changed left join woken on true
    "#
);

// $3 and $4 both null: clear. The bucket is the claim's to write; a change only bounds it.
const SET_RATE_LIMIT: &str = r#"
    update sweep.queues q
    set rate_per_sec = $3, burst = $4,
        tokens = case when $3::float8 is null then null else least(q.tokens, $4::int4) end,
        refilled_at = case when $3::float8 is null then null else q.refilled_at end
    where q.tenant = $1 and q.task_type = $2
      and exists (select 1 from sweep.active_modules a
                  where a.tenant = $1 and a.task_type = $2)
    returning q.tenant, q.task_type, q.paused, q.paused_at, q.paused_by, q.tenant_paused, q.module_compiling,
              q.rate_per_sec, q.burst
    "#;

const LIST_QUEUE_CONTROLS: &str = r#"
    select q.tenant, q.task_type, q.paused, q.paused_at, q.paused_by, q.tenant_paused, q.module_compiling,
           q.rate_per_sec, q.burst
    from sweep.queues q
    where (q.paused or q.rate_per_sec is not null) and ($1::text is null or q.tenant = $1)
    order by q.tenant, q.task_type
    "#;

const LIST_PAUSED_TENANTS: &str = r#"
    select name as tenant, true as paused, paused_at, paused_by
    from sweep.tenants
    where paused_at is not null and ($1::text is null or name = $1)
    order by name
    "#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![
    SET_QUEUE_PAUSE,
    SET_RATE_LIMIT,
    SET_TENANT_PAUSE,
    LIST_QUEUE_CONTROLS,
    LIST_PAUSED_TENANTS
];
