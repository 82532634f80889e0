//! Queue statistics per tenant and task type, in one statement: counts by state, the age of
//! the oldest due task, failed attempts in the last hour and completions in the last minute.
//!
//! This is an admin read, not a hot path: it scans the live table once. Failed attempts are
//! counted from the per-task error histories (live and dead), restricted to rows touched in
//! the last hour.

use serde::Serialize;
use sqlx::PgExecutor;

use super::QueueError;

#[derive(Debug, Clone, Default, PartialEq, Serialize, sqlx::FromRow)]
pub struct TypeStats {
    pub tenant: String,
    pub task_type: String,
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
    Ok(sqlx::query_as(
        r#"
        with live as (
            select tenant, task_type,
                   count(*) filter (where state = 'pending') as pending,
                   count(*) filter (where state = 'running') as running,
                   count(*) filter (where state = 'retrying') as retrying,
                   count(*) filter (where state = 'succeeded') as succeeded,
                   count(*) filter (where state = 'cancelled') as cancelled,
                   min(run_at) filter (where state in ('pending', 'retrying') and run_at <= now())
                       as oldest_due,
                   count(*) filter (where state = 'succeeded'
                                      and finished_at > now() - interval '1 minute')
                       as completed_last_minute,
                   coalesce(sum((select count(*) from jsonb_array_elements(errors) e
                                 where (e->>'at')::timestamptz > now() - interval '1 hour'))
                            filter (where updated_at > now() - interval '1 hour'), 0)
                       as failures
            from tasks
            where $1::text is null or tenant = $1
            group by tenant, task_type
        ),
        dead as (
            select tenant, task_type, count(*) as dead,
                   coalesce(sum((select count(*) from jsonb_array_elements(errors) e
                                 where (e->>'at')::timestamptz > now() - interval '1 hour'))
                            filter (where died_at > now() - interval '1 hour'), 0)
                       as failures
            from dead_tasks
            where $1::text is null or tenant = $1
            group by tenant, task_type
        )
        select coalesce(l.tenant, d.tenant) as tenant,
               coalesce(l.task_type, d.task_type) as task_type,
               coalesce(l.pending, 0) as pending,
               coalesce(l.running, 0) as running,
               coalesce(l.retrying, 0) as retrying,
               coalesce(l.succeeded, 0) as succeeded,
               coalesce(l.cancelled, 0) as cancelled,
               coalesce(d.dead, 0) as dead,
               coalesce((extract(epoch from now() - l.oldest_due) * 1000)::int8, 0) as oldest_due_ms,
               (coalesce(l.failures, 0) + coalesce(d.failures, 0))::int8 as failures_last_hour,
               coalesce(l.completed_last_minute, 0) as completed_last_minute
        from live l
        full join dead d on d.tenant = l.tenant and d.task_type = l.task_type
        order by 1, 2
        "#,
    )
    .bind(tenant)
    .fetch_all(executor)
    .await?)
}
