//! Reads for the dashboard: task lists filtered by state, type and time across the live,
//! finished and dead tables, and per-minute throughput and failures over the last hour.
//!
//! Admin reads, not hot paths. Scoping as everywhere: `tenant = Some(t)` sees only tenant
//! `t`'s rows, `None` (the operator) sees all.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;

use super::{QueueError, TaskId, TaskState};

/// Which tasks a list shows. Every field narrows; `None` does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    pub tenant: Option<String>,
    pub state: Option<TaskState>,
    pub task_type: Option<String>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
    /// Page cursor: only ids below this one (lists run newest first).
    pub before: Option<TaskId>,
    /// Page size (clamped to 1..=500).
    pub limit: i64,
}

/// One line of a task list.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct TaskRow {
    pub id: TaskId,
    pub tenant: String,
    pub task_type: String,
    #[sqlx(try_from = "String")]
    pub state: TaskState,
    pub attempts: i32,
    pub max_attempts: i32,
    pub created_at: DateTime<Utc>,
    /// When it is due (live), finished (succeeded, cancelled) or died (dead).
    pub at: DateTime<Utc>,
    pub last_error: Option<String>,
}

/// Tasks matching `f`, newest (highest id) first.
pub async fn list_tasks<'c, E: PgExecutor<'c>>(
    executor: E,
    f: &TaskFilter,
) -> Result<Vec<TaskRow>, QueueError> {
    Ok(sqlx::query_as(LIST_TASKS)
        .bind(f.tenant.as_deref())
        .bind(f.state.map(TaskState::as_str))
        .bind(f.task_type.as_deref())
        .bind(f.since)
        .bind(f.until)
        .bind(f.before)
        .bind(f.limit.clamp(1, 500))
        .fetch_all(executor)
        .await?)
}

/// Tasks that succeeded and attempts that failed during one minute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct MinuteCounts {
    pub minute: DateTime<Utc>,
    pub succeeded: i64,
    pub failed: i64,
}

/// The last 60 minutes (the current one included), oldest first, one entry per minute even
/// when nothing happened. Failed attempts are read from the error histories, so a task that
/// failed twice counts twice.
pub async fn throughput_last_hour<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
) -> Result<Vec<MinuteCounts>, QueueError> {
    Ok(sqlx::query_as(THROUGHPUT_LAST_HOUR).bind(tenant).fetch_all(executor).await?)
}

const LIST_TASKS: &str = concat!(
    r#"
    select * from (
        (select id, tenant, task_type, state, attempts, max_attempts, created_at,
                run_at as at, last_error
         from sweep.tasks
         where ($1::text is null or tenant = $1) and ($2::text is null or state = $2)
           and ($3::text is null or task_type = $3)
           and ($4::timestamptz is null or created_at >= $4)
           and ($5::timestamptz is null or created_at < $5)
           and ($6::int8 is null or id < $6)
         order by id desc limit $7)
        union all
        (select id, tenant, task_type, state, attempts, max_attempts, created_at,
                finished_at, last_error
         from sweep.finished_tasks
         where ($1::text is null or tenant = $1) and ($2::text is null or state = $2)
           and ($3::text is null or task_type = $3)
           and ($4::timestamptz is null or created_at >= $4)
           and ($5::timestamptz is null or created_at < $5)
           and ($6::int8 is null or id < $6)
         order by id desc limit $7)
        union all
        (select id, tenant, task_type, "#,
    state!(dead),
    r#", attempts, max_attempts, created_at,
                died_at, last_error
         from sweep.dead_tasks
         where ($1::text is null or tenant = $1) and ($2::text is null or $2 = "#,
    state!(dead),
    r#")
           and ($3::text is null or task_type = $3)
           and ($4::timestamptz is null or created_at >= $4)
           and ($5::timestamptz is null or created_at < $5)
           and ($6::int8 is null or id < $6)
         order by id desc limit $7)
    ) every
    order by id desc
    limit $7
    "#
);
const THROUGHPUT_LAST_HOUR: &str = concat!(
    r#"
    with bounds as (select date_trunc('minute', now()) - interval '59 minutes' as start),
    minutes as (
        select generate_series((select start from bounds), date_trunc('minute', now()),
                               interval '1 minute') as minute
    ),
    done as (
        select date_trunc('minute', finished_at) as minute, count(*) as n
        from sweep.finished_tasks
        where state = "#,
    state!(succeeded),
    r#" and finished_at >= (select start from bounds)
          and ($1::text is null or tenant = $1)
        group by 1
    ),
    histories as (
        select errors from sweep.tasks
        where updated_at >= (select start from bounds) and ($1::text is null or tenant = $1)
        union all
        select errors from sweep.finished_tasks
        where finished_at >= (select start from bounds) and ($1::text is null or tenant = $1)
        union all
        select errors from sweep.dead_tasks
        where died_at >= (select start from bounds) and ($1::text is null or tenant = $1)
    ),
    failed as (
        select date_trunc('minute', (e ->> 'at')::timestamptz) as minute, count(*) as n
        from histories h, jsonb_array_elements(h.errors) e
        where (e ->> 'at')::timestamptz >= (select start from bounds)
        group by 1
    )
    select m.minute, coalesce(d.n, 0)::int8 as succeeded, coalesce(f.n, 0)::int8 as failed
    from minutes m
    left join done d on d.minute = m.minute
    left join failed f on f.minute = m.minute
    order by m.minute
    "#
);
#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![LIST_TASKS, THROUGHPUT_LAST_HOUR];
