//! Queue statistics per tenant and task type, in one statement: counts by state, the age of
//! the oldest due task, failed attempts in the last hour and completions in the last minute.
//!
//! Its cost follows the live work and the number of task types, not the history: live counts
//! come from `tasks`; succeeded, cancelled and dead ones from the kept counts
//! (`history_counts` and the deltas not folded into it yet, runner/sql/history_counts.sql), a
//! few rows per task type and day and what changed in the last few seconds; the
//! two rates from the runners' per-minute counters (`task_minutes`), so they are what the
//! runners last flushed (every few seconds) and count the attempts runners reported, as the
//! charts do: the last minute's successes from its two minutes of counters, the last hour's
//! failures from a kept total per task type (`hour_failures`) and the minutes at its edge. A
//! window's oldest minute counts for the share of it inside the window.

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
    /// Ended succeeded, among those retention still keeps.
    pub succeeded: i64,
    /// Ended cancelled, among those retention still keeps.
    pub cancelled: i64,
    /// Dead letters (kept until requeued or deleted).
    pub dead: i64,
    /// Milliseconds since the oldest pending or retrying task became due; 0 when none is due.
    pub oldest_due_ms: i64,
    /// Failed attempts the runners reported in the last hour (as of their last flush, a few
    /// seconds ago at most).
    pub failures_last_hour: i64,
    /// Successes the runners reported in the last minute (as of their last flush).
    pub completed_last_minute: i64,
}

/// Moves the kept counts' deltas into their totals (runner/sql/history_counts.sql,
/// hour_failures.sql, usage_fold.sql) and the minutes that left the hour out of them; returns
/// how many deltas it moved (0 when other runners are folding). Every runner's maintenance
/// calls it every few seconds; the stats read the same before and after.
pub async fn fold_kept_counts<'c, E: PgExecutor<'c>>(executor: E) -> Result<i64, QueueError> {
    Ok(sqlx::query_scalar(FOLD_KEPT_COUNTS).fetch_one(executor).await?)
}

pub async fn queue_stats<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
) -> Result<Vec<TypeStats>, QueueError> {
    // Planned for its tenant on every call (an unnamed statement): the plan made once for any
    // `$1` reads every tenant's per-minute counters and live tasks to keep one tenant's
    // (11-13 ms where the planned one takes 3 ms, 1,000 task types); planning costs less.
    Ok(sqlx::query_as(QUEUE_STATS).bind(tenant).persistent(false).fetch_all(executor).await?)
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
               0 as failures, 0 as completed
        from sweep.tasks
        where $1::text is null or tenant = $1
        group by tenant, task_type
    ),
    history as (
        select tenant, task_type, 0, 0, 0, 0, sum(succeeded), sum(cancelled), sum(dead),
               null::timestamptz, 0, 0
        from (select tenant, task_type, succeeded, cancelled, dead from sweep.history_counts
              union all
              select tenant, task_type, succeeded, cancelled, dead from sweep.history_deltas) h
        where $1::text is null or tenant = $1
        group by tenant, task_type
    ),
    -- Failed attempts in the last hour: the kept total (runner/sql/hour_failures.sql), the
    -- deltas not folded into it, less what it covers outside the window: the minutes before
    -- it, and the share of its oldest minute that is. A key with no total covers from 61
    -- minutes ago. The first condition on `m.minute` only bounds the index range.
    failed_hour as (
        select tenant, task_type, failed::float8 as failures
        from sweep.hour_failures
        where $1::text is null or tenant = $1
        union all
        select d.tenant, d.task_type, d.failed
        from sweep.hour_failure_deltas d left join sweep.hour_failures k using (tenant, task_type)
        where d.minute > coalesce(k.since, now() - interval '61 minutes')
          and ($1::text is null or d.tenant = $1)
        union all
        select m.tenant, m.task_type,
               -m.failed * least(1, date_part('epoch', now() - interval '60 minutes' - m.minute)
                                    / 60)
        from sweep.task_minutes m left join sweep.hour_failures k using (tenant, task_type)
        where m.minute > least((select min(since) from sweep.hour_failures),
                               now() - interval '61 minutes')
          and m.minute < now() - interval '60 minutes'
          and m.minute > coalesce(k.since, now() - interval '61 minutes')
          and ($1::text is null or m.tenant = $1)
    ),
    -- Successes in the last minute, its oldest minute counting for its share inside.
    recent as (
        select tenant, task_type, 0, 0, 0, 0, 0, 0, 0, null::timestamptz, 0,
               coalesce(sum(succeeded) filter (where minute >= now() - interval '1 minute'), 0)
               + coalesce(sum(succeeded * date_part('epoch', minute + interval '2 minutes' - now())
                                 / 60)
                            filter (where minute < now() - interval '1 minute'), 0)
        from sweep.task_minutes
        where minute > now() - interval '2 minutes' and ($1::text is null or tenant = $1)
        group by tenant, task_type
        union all
        select tenant, task_type, 0, 0, 0, 0, 0, 0, 0, null::timestamptz, failures, 0
        from failed_hour
    ),
    every as (
        select * from live
        union all select * from history
        union all select * from recent
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
           round(sum(failures))::int8 as failures_last_hour,
           round(sum(completed))::int8 as completed_last_minute
    from every
    group by tenant, task_type
    order by 1, 2
    "#
);
const FOLD_KEPT_COUNTS: &str = "select sweep.sweep_history_fold() + \
                                sweep.sweep_hour_failures_fold() + sweep.sweep_usage_fold()";
#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![QUEUE_STATS, FOLD_KEPT_COUNTS];
