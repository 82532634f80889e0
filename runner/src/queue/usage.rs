//! Usage: what each attempt used, and the totals per tenant, task type and UTC day that a
//! platform bills on (`sweep.usage_days`).
//!
//! Invariants:
//! - attempts are counted by the statements that record them (`complete_batch`,
//!   `fail_batch`, see [`usage_cte!`]), in the same statement: no extra round trip, and an
//!   attempt is counted exactly when its report is applied (a fenced-out report counts
//!   nothing);
//! - those statements append to `usage_deltas` (one row per tenant, task type and runner they
//!   counted), which every runner's maintenance folds into the totals every few seconds
//!   (runner/sql/usage_fold.sql); a total is its row plus its deltas, and reads sum both. An
//!   upsert of the totals from each statement cost one index probe and row update per tenant
//!   (about 3 ms for a statement of 250 tasks of 250 tenants);
//! - totals are per runner (the runner is part of the key); reads sum over runners;
//! - retention of finished tasks never deletes totals: the table is not partitioned with
//!   `finished_tasks` and nothing prunes it (one row per tenant, type, day and runner).

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;

use super::QueueError;

/// What one attempt used, as recorded in its history entry (a failed attempt) or in
/// `finished_tasks.usage` (the successful one), and added to the day's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AttemptUsage {
    /// Wall-clock time of the run.
    pub duration_ms: i64,
    pub fuel_used: i64,
    /// The largest linear memory the guest held.
    pub peak_memory_bytes: i64,
    /// Outbound HTTP requests sent.
    pub http_requests: i64,
    /// Outbound HTTP requests refused (off the allow list, a non-public address, over the
    /// limit).
    pub http_refused: i64,
    /// Request body bytes sent.
    pub bytes_sent: i64,
    /// Response body bytes received.
    pub bytes_received: i64,
}

/// Totals of one tenant's task type on one UTC day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct UsageDay {
    pub tenant: String,
    pub task_type: String,
    pub day: NaiveDate,
    /// Attempts that ran and were reported (succeeded + failed).
    pub attempts: i64,
    pub succeeded: i64,
    pub failed: i64,
    /// Wall-clock time of all attempts.
    pub wall_ms: i64,
    pub fuel: i64,
    /// The largest memory any one attempt held.
    pub peak_memory_bytes: i64,
    pub http_requests: i64,
    pub http_refused: i64,
    pub bytes_sent: i64,
    pub bytes_received: i64,
}

/// Longest range [`usage_days`] reads, in days.
pub const MAX_USAGE_DAYS: i64 = 366;

/// Totals by tenant (`tenant`: one, `None`: all), task type (`task_type`: one, `None`: all)
/// and day, for the days `from..=to`, by day, tenant, type.
pub async fn usage_days<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
    task_type: Option<&str>,
    from: NaiveDate,
    to: NaiveDate,
) -> Result<Vec<UsageDay>, QueueError> {
    Ok(sqlx::query_as(USAGE_DAYS)
        .bind(tenant)
        .bind(task_type)
        .bind(from)
        .bind(to)
        .fetch_all(executor)
        .await?)
}

/// A data-modifying CTE named `used` that appends the attempts of CTE `$rows` (columns
/// `tenant`, `task_type`, `report`, where `report -> 'usage'` is an [`AttemptUsage`] or absent)
/// to the usage deltas of runner `$1`, one row per tenant and task type, counting them as
/// `succeeded` or `failed` (`$outcome`). Reports without usage (the reaper's) count nothing.
macro_rules! usage_cte {
    ($rows:literal, succeeded) => {
        usage_cte!(@ $rows, "count(*)", "0")
    };
    ($rows:literal, failed) => {
        usage_cte!(@ $rows, "0", "count(*)")
    };
    (@ $rows:literal, $succeeded:literal, $failed:literal) => {
        concat!(
            "used as (
                insert into sweep.usage_deltas (tenant, day, task_type, runner, attempts,
                    succeeded, failed, wall_ms, fuel, peak_memory_bytes, http_requests,
                    http_refused, bytes_sent, bytes_received)
                select tenant, (now() at time zone 'UTC')::date, task_type, $1, count(*), ",
            $succeeded,
            ", ",
            $failed,
            ",
                       sum((u ->> 'duration_ms')::int8), sum((u ->> 'fuel_used')::numeric),
                       max((u ->> 'peak_memory_bytes')::int8),
                       sum((u ->> 'http_requests')::int8), sum((u ->> 'http_refused')::int8),
                       sum((u ->> 'bytes_sent')::int8), sum((u ->> 'bytes_received')::int8)
                from (select tenant, task_type, report -> 'usage' as u from ",
            $rows,
            ") r
                where u is not null
                group by tenant, task_type
            )"
        )
    };
}

const USAGE_DAYS: &str = r#"
    select tenant, task_type, day,
           sum(attempts)::int8 as attempts, sum(succeeded)::int8 as succeeded,
           sum(failed)::int8 as failed, sum(wall_ms)::int8 as wall_ms,
           least(sum(fuel), 9223372036854775807)::int8 as fuel,
           max(peak_memory_bytes) as peak_memory_bytes,
           sum(http_requests)::int8 as http_requests, sum(http_refused)::int8 as http_refused,
           sum(bytes_sent)::int8 as bytes_sent, sum(bytes_received)::int8 as bytes_received
    from (select tenant, task_type, day, attempts, succeeded, failed, wall_ms, fuel,
                 peak_memory_bytes, http_requests, http_refused, bytes_sent, bytes_received
          from sweep.usage_days
          union all
          select tenant, task_type, day, attempts, succeeded, failed, wall_ms, fuel,
                 peak_memory_bytes, http_requests, http_refused, bytes_sent, bytes_received
          from sweep.usage_deltas) u
    where ($1::text is null or tenant = $1) and ($2::text is null or task_type = $2)
      and day between $3 and $4
    group by tenant, task_type, day
    order by day, tenant, task_type
    "#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![USAGE_DAYS];
