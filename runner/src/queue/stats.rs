//! Queue statistics per tenant and task type, in one statement: counts by state, the age of
//! the oldest due task, failed attempts in the last hour and completions in the last minute.
//!
//! This is an admin read, not a hot path: it scans the live, finished and dead tables once
//! each (the finished history is as large as retention lets it grow). Failed attempts are
//! counted from the per-task error histories, restricted to rows touched in the last hour.

use serde::Serialize;
use sqlx::PgExecutor;

use super::QueueError;

#[derive(Debug, Clone, Default, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct TypeStats {
    pub tenant: String,
    pub task_type: String,
    /// Waiting for parents (enqueued `after` tasks that have not all ended).
    pub blocked: i64,
    pub pending: i64,
    pub running: i64,
    pub retrying: i64,
    pub succeeded: i64,
    pub cancelled: i64,
    pub dead: i64,
    /// Milliseconds since the oldest pending or retrying task became due; 0 when none is due.
    pub oldest_due_ms: i64,
    pub failures_last_hour: i64,
    pub completed_last_minute: i64,
}

pub async fn queue_stats<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
) -> Result<Vec<TypeStats>, QueueError> {
    Ok(sqlx::query_as(QUEUE_STATS).bind(tenant).fetch_all(executor).await?)
}

const QUEUE_STATS: &str = concat!(
    r#"
    with live as (
        select tenant, task_type,
               count(*) filter (where state = "#,
    state!(blocked),
    r#") as blocked,
               count(*) filter (where state = "#,
    state!(pending),
    r#") as pending,
               count(*) filter (where state = "#,
    state!(running),
    r#") as running,
               count(*) filter (where state = "#,
    state!(retrying),
    r#") as retrying,
               0 as succeeded, 0 as cancelled, 0 as dead,
               min(run_at) filter (where state in "#,
    state!(waiting),
    r#" and run_at <= now())
                   as oldest_due,
               coalesce(sum((select count(*) from jsonb_array_elements(errors) e
                             where (e->>'at')::timestamptz > now() - interval '1 hour'))
                        filter (where updated_at > now() - interval '1 hour'), 0)
                   as failures,
               0 as completed_last_minute
        from sweep.tasks
        where $1::text is null or tenant = $1
        group by tenant, task_type
    ),
    finished as (
        select tenant, task_type, 0, 0, 0, 0,
               count(*) filter (where state = "#,
    state!(succeeded),
    r#"),
               count(*) filter (where state = "#,
    state!(cancelled),
    r#"),
               0, null::timestamptz,
               coalesce(sum((select count(*) from jsonb_array_elements(errors) e
                             where (e->>'at')::timestamptz > now() - interval '1 hour'))
                        filter (where finished_at > now() - interval '1 hour'), 0),
               count(*) filter (where state = "#,
    state!(succeeded),
    r#"
                                  and finished_at > now() - interval '1 minute')
        from sweep.finished_tasks
        where $1::text is null or tenant = $1
        group by tenant, task_type
    ),
    dead as (
        select tenant, task_type, 0, 0, 0, 0, 0, 0, count(*), null::timestamptz,
               coalesce(sum((select count(*) from jsonb_array_elements(errors) e
                             where (e->>'at')::timestamptz > now() - interval '1 hour'))
                        filter (where died_at > now() - interval '1 hour'), 0),
               0
        from sweep.dead_tasks
        where $1::text is null or tenant = $1
        group by tenant, task_type
    ),
    every as (
        select * from live
        union all select * from finished
        union all select * from dead
    )
    select tenant, task_type,
           sum(blocked)::int8 as blocked,
           sum(pending)::int8 as pending,
           sum(running)::int8 as running,
           sum(retrying)::int8 as retrying,
           sum(succeeded)::int8 as succeeded,
           sum(cancelled)::int8 as cancelled,
           sum(dead)::int8 as dead,
           coalesce((extract(epoch from now() - min(oldest_due)) * 1000)::int8, 0)
               as oldest_due_ms,
           sum(failures)::int8 as failures_last_hour,
           sum(completed_last_minute)::int8 as completed_last_minute
    from every
    group by tenant, task_type
    order by 1, 2
    "#
);
#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![QUEUE_STATS];
