//! Per-minute counters for the dashboard's charts (`task_minutes`, migration 0003): what the
//! runners ran, per tenant, task type and minute: successes, failed attempts by kind, starts,
//! and a histogram of the time from due to start.
//!
//! Written by the runners: each keeps its own counts in memory (`worker/minutes.rs`) and adds
//! them here every few seconds with one statement, so the claim and the reports run exactly as
//! before. Read by the charts over bounded ranges of minutes (the primary key and the minute
//! index), summed into buckets by Postgres; never by scanning task history.
//!
//! Invariants: a row only ever grows (deltas are added, never set), so runners flushing at once
//! add up; a flush sends each key once, in key order (no two flushes wait on each other in
//! opposite orders); rows older than the charts' longest range are pruned by maintenance.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{types::Json, PgExecutor};

use super::{sql_millis, QueueError};

/// Upper bounds (milliseconds) of the due-to-start histogram's buckets; one more bucket holds
/// everything above the last. Roughly 1-2-5 steps: a quantile read from it is within its
/// bucket (about a factor of 2.5 at worst, linear within the bucket).
pub const MINUTE_LAG_BUCKETS_MS: [i64; 20] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 120_000,
    300_000, 600_000, 1_800_000, 3_600_000,
];
/// Buckets in a histogram: one per bound and the overflow.
pub const MINUTE_LAG_BUCKETS: usize = MINUTE_LAG_BUCKETS_MS.len() + 1;

/// The bucket a due-to-start time falls in.
pub fn lag_bucket(ms: i64) -> usize {
    MINUTE_LAG_BUCKETS_MS
        .iter()
        .position(|&bound| ms <= bound)
        .unwrap_or(MINUTE_LAG_BUCKETS_MS.len())
}

/// The `q` quantile (0..=1) of a histogram in milliseconds, interpolated within its bucket;
/// `None` for an empty histogram. The overflow bucket reads as its lower bound.
pub fn lag_quantile(histogram: &[i64], q: f64) -> Option<f64> {
    let total: i64 = histogram.iter().sum();
    if total <= 0 {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
    let mut seen = 0i64;
    for (i, &n) in histogram.iter().enumerate() {
        if n <= 0 {
            continue;
        }
        if (seen + n) as f64 >= rank {
            let low = if i == 0 { 0 } else { MINUTE_LAG_BUCKETS_MS[i - 1] } as f64;
            let Some(&high) = MINUTE_LAG_BUCKETS_MS.get(i) else { return Some(low) };
            let within = (rank - seen as f64) / n as f64;
            return Some(low + (high as f64 - low) * within);
        }
        seen += n;
    }
    None
}

/// What one runner counted for one (tenant, task type, minute) since its last flush.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MinuteDelta {
    pub tenant: String,
    pub task_type: String,
    pub minute: DateTime<Utc>,
    pub succeeded: i64,
    pub failed: i64,
    /// Failed attempts by kind (`cancelled` included).
    pub failures: BTreeMap<String, i64>,
    pub started: i64,
    /// [`MINUTE_LAG_BUCKETS`] counts.
    pub lag_ms: Vec<i64>,
}

/// Adds `deltas` (one per key, sorted by key) to the counters, in one statement.
pub async fn add_minutes<'c, E: PgExecutor<'c>>(
    executor: E,
    deltas: &[MinuteDelta],
) -> Result<(), QueueError> {
    if deltas.is_empty() {
        return Ok(());
    }
    sqlx::query(ADD_MINUTES).bind(Json(deltas)).execute(executor).await?;
    Ok(())
}

/// Removes counters older than `keep`, at most `batch` rows; returns how many went.
pub async fn prune_minutes<'c, E: PgExecutor<'c>>(
    executor: E,
    keep: std::time::Duration,
    batch: usize,
) -> Result<u64, QueueError> {
    let done = sqlx::query(PRUNE_MINUTES)
        .bind(sql_millis(keep))
        .bind(super::sql_count(batch))
        .execute(executor)
        .await?;
    Ok(done.rows_affected())
}

/// The counters of one bucket of minutes (or of one task type over a whole range).
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct MinuteTotals {
    /// The bucket's first minute (per type: the range's start).
    pub at: DateTime<Utc>,
    /// The task type (in a series: `""`, every type together).
    pub task_type: String,
    pub succeeded: i64,
    pub failed: i64,
    pub failures: Json<BTreeMap<String, i64>>,
    pub started: i64,
    pub lag_ms: Vec<i64>,
}

/// Which counters a chart reads: the minutes in `[from, to)`, summed per `step`.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteRange {
    pub tenant: Option<String>,
    pub task_type: Option<String>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub step: std::time::Duration,
}

/// The counters of `range` summed per step, oldest first; steps without counts are absent.
pub async fn minute_series<'c, E: PgExecutor<'c>>(
    executor: E,
    range: &MinuteRange,
) -> Result<Vec<MinuteTotals>, QueueError> {
    Ok(sqlx::query_as(MINUTE_SERIES)
        .bind(range.tenant.as_deref())
        .bind(range.task_type.as_deref())
        .bind(range.from)
        .bind(range.to)
        .bind(sql_millis(range.step))
        .fetch_all(executor)
        .await?)
}

/// The counters of `range` summed per task type (its `step` is not used), by task type.
pub async fn minute_types<'c, E: PgExecutor<'c>>(
    executor: E,
    range: &MinuteRange,
) -> Result<Vec<MinuteTotals>, QueueError> {
    Ok(sqlx::query_as(MINUTE_TYPES)
        .bind(range.tenant.as_deref())
        .bind(range.task_type.as_deref())
        .bind(range.from)
        .bind(range.to)
        .bind(sql_millis(range.step))
        .fetch_all(executor)
        .await?)
}

/// Adds a JSON array of [`MinuteDelta`]s: counts add up, kinds merge, histograms add bucket by
/// bucket.
const ADD_MINUTES: &str = r#"
    insert into sweep.task_minutes as m (tenant, task_type, minute, succeeded, failed, failures,
                                         started, lag_ms)
    select d.tenant, d.task_type, d.minute, d.succeeded, d.failed, d.failures, d.started,
           d.lag_ms
    from jsonb_to_recordset($1::jsonb) as d(tenant text, task_type text, minute timestamptz,
                                            succeeded int8, failed int8, failures jsonb,
                                            started int8, lag_ms int8[])
    on conflict (tenant, task_type, minute) do update set
        succeeded = m.succeeded + excluded.succeeded,
        failed = m.failed + excluded.failed,
        failures = (select coalesce(jsonb_object_agg(k, n), '{}'::jsonb)
                    from (select k, sum(v::int8) as n
                          from (select * from jsonb_each_text(m.failures)
                                union all
                                select * from jsonb_each_text(excluded.failures)) e(k, v)
                          group by k) s),
        started = m.started + excluded.started,
        lag_ms = array(select coalesce(m.lag_ms[i], 0) + coalesce(excluded.lag_ms[i], 0)
                       from generate_series(1, greatest(cardinality(m.lag_ms),
                                                        cardinality(excluded.lag_ms))) i)
    "#;

const PRUNE_MINUTES: &str = r#"
    delete from sweep.task_minutes
    where (tenant, task_type, minute) in (
        select tenant, task_type, minute from sweep.task_minutes
        where minute < now() - $1 * interval '1 millisecond'
        limit $2)
    "#;

/// Shared by the two reads: the rows of the range with their bucket's start (`at`) and
/// their group's task type, summed per (at, task type).
macro_rules! minutes_in_range {
    ($bucket:literal, $task_type:literal) => {
        concat!(
            "with rows as (
                select ",
            $bucket,
            " as at, ",
            $task_type,
            " as task_type, succeeded, failed, failures, started, lag_ms
                from sweep.task_minutes
                where ($1::text is null or tenant = $1)
                  and ($2::text is null or task_type = $2)
                  and minute >= $3 and minute < $4
            ),
            totals as (
                select at, task_type, sum(succeeded)::int8 as succeeded,
                       sum(failed)::int8 as failed, sum(started)::int8 as started
                from rows group by at, task_type
            ),
            kinds as (
                select at, task_type, k, sum(v::int8) as n
                from rows, jsonb_each_text(failures) e(k, v)
                group by at, task_type, k
            ),
            lags as (
                select at, task_type, i, sum(n)::int8 as n
                from rows, unnest(lag_ms) with ordinality u(n, i)
                group by at, task_type, i
            )
            select t.at, t.task_type, t.succeeded, t.failed, t.started,
                   (select coalesce(jsonb_object_agg(k.k, k.n), '{}'::jsonb) from kinds k
                    where k.at = t.at and k.task_type = t.task_type) as failures,
                   coalesce((select array_agg(l.n order by l.i) from lags l
                             where l.at = t.at and l.task_type = t.task_type),
                            '{}'::int8[]) as lag_ms
            from totals t
            order by t.at, t.task_type
            "
        )
    };
}

/// Per step, every task type of the scope together (`task_type` is `''`).
const MINUTE_SERIES: &str =
    minutes_in_range!("date_bin($5 * interval '1 millisecond', minute, $3)", "''::text");
/// Per task type over the whole range (`at` is the range's start; `$5` unused).
const MINUTE_TYPES: &str =
    minutes_in_range!("($3::timestamptz + $5 * interval '0 millisecond')", "task_type");

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] =
    statements![ADD_MINUTES, PRUNE_MINUTES, MINUTE_SERIES, MINUTE_TYPES];

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_quantiles() {
        assert_eq!(lag_bucket(0), 0);
        assert_eq!(lag_bucket(1), 0);
        assert_eq!(lag_bucket(3), 2);
        assert_eq!(lag_bucket(i64::MAX), MINUTE_LAG_BUCKETS - 1);
        let mut h = vec![0; MINUTE_LAG_BUCKETS];
        assert_eq!(lag_quantile(&h, 0.5), None);
        // 98 tasks at 10..20 ms, 2 at 1..2 s.
        h[lag_bucket(15)] = 98;
        h[lag_bucket(1500)] = 2;
        let p50 = lag_quantile(&h, 0.5).unwrap();
        assert!((10.0..=20.0).contains(&p50), "{p50}");
        let p99 = lag_quantile(&h, 0.99).unwrap();
        assert!((1000.0..=2000.0).contains(&p99), "{p99}");
        h[MINUTE_LAG_BUCKETS - 1] = 1000;
        assert_eq!(lag_quantile(&h, 0.99), Some(3_600_000.0));
    }
}
