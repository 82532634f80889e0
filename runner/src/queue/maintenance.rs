//! Maintenance statements every runner runs periodically: the reaper (rescues tasks whose
//! runner stopped heartbeating), retention (creates the day partitions of finished tasks and
//! drops the old ones), vacuuming the live table and pruning of dead runner rows.
//!
//! Invariant: all of these are safe when every runner runs them at the same moment: rows are
//! picked with `FOR UPDATE SKIP LOCKED` and re-checked, and work is bounded per statement so no
//! long locks are held.

use std::time::Duration;

use sqlx::PgExecutor;
use uuid::Uuid;

use super::{
    fail_batch, sql_count, sql_millis, Connects, Failure, FailureKind, FailureReport,
    ModuleSettings, QueueError, RetryPolicy, TaskId,
};

/// A running task whose lease expired, now taken over by the reaper.
#[derive(Debug, Clone, PartialEq)]
pub struct RescuedTask {
    pub id: TaskId,
    pub task_type: String,
    pub attempt: i32,
    pub previous_owner: Uuid,
    /// The backoff settings of its type's active module (only the backoff fields are read).
    pub backoff: ModuleSettings,
    /// A cancel was requested for the attempt: it ends `cancelled`, not retried.
    pub cancel_requested: bool,
}

/// Rescues up to `limit` tasks whose lease expired: each becomes a failed attempt of kind
/// [`FailureKind::LeaseExpired`], retrying after its task type's backoff (its active module's
/// settings over `default_policy`, exactly as the worker retries a failed attempt) or dead when
/// out of attempts. A task a cancel was requested for (its runner died before it could stop
/// it) ends `cancelled` instead, its attempt recorded with kind [`FailureKind::Cancelled`].
///
/// Two steps, each fenced: the reaper first takes the expired lease over (so two reapers
/// never rescue the same task, and a crash between the steps only leaves a lease that expires
/// again), then fails the task through the ordinary [`fail_batch`] path.
///
/// Nothing is rescued until the server has been up for `settle`: right after a restart every
/// lease looks expired, although the runners holding them are alive and about to renew them
/// and write their reports (the caller also holds off after it regained the database itself,
/// which covers outages without a restart; see `worker::liveness`).
pub async fn reap_expired<'c, A>(
    conn: A,
    reaper: Uuid,
    limit: usize,
    default_policy: RetryPolicy,
    settle: Duration,
) -> Result<FailureReport, QueueError>
where
    A: Connects<'c>,
{
    let mut conn = conn.connect().await?;
    let rescued = take_over_expired(&mut conn, reaper, limit, settle).await?;
    if rescued.is_empty() {
        return Ok(FailureReport::default());
    }
    let failures = rescued_failures(&rescued, default_policy);
    fail_batch(&mut conn, reaper, &failures).await
}

/// The failed attempt each rescued task is charged with (the thread-local rng must not live
/// across an await, hence a plain function).
fn rescued_failures(rescued: &[RescuedTask], default_policy: RetryPolicy) -> Vec<Failure> {
    let mut rng = rand::rng();
    rescued
        .iter()
        .map(|t| Failure {
            id: t.id,
            attempt: t.attempt,
            kind: if t.cancel_requested {
                FailureKind::Cancelled
            } else {
                FailureKind::LeaseExpired
            },
            message: if t.cancel_requested {
                format!(
                    "cancelled when the lease was reaped: runner {} stopped heartbeating during \
                     attempt {} before it could stop it",
                    t.previous_owner, t.attempt
                )
            } else {
                format!(
                    "lease expired: runner {} stopped heartbeating during attempt {}",
                    t.previous_owner, t.attempt
                )
            },
            permanent: t.cancel_requested,
            retry_delay: default_policy
                .for_module(Some(&t.backoff))
                .delay(u32::try_from(t.attempt).unwrap_or(0), &mut rng),
            detail: serde_json::json!({ "runner": t.previous_owner }),
            module_sha256: None,
            usage: None,
        })
        .collect()
}

async fn take_over_expired<'c, E: PgExecutor<'c>>(
    executor: E,
    reaper: Uuid,
    limit: usize,
    settle: Duration,
) -> Result<Vec<RescuedTask>, QueueError> {
    type Row = (TaskId, String, i32, Uuid, Option<i64>, Option<i64>, bool);
    let rows: Vec<Row> = sqlx::query_as(TAKE_OVER_EXPIRED)
        .bind(reaper)
        .bind(sql_count(limit))
        .bind(sql_millis(settle))
        .fetch_all(executor)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, task_type, attempt, previous_owner, backoff_base_ms, backoff_cap_ms, cancel)| {
            RescuedTask {
                id,
                task_type,
                attempt,
                previous_owner,
                backoff: ModuleSettings { backoff_base_ms, backoff_cap_ms, ..Default::default() },
                cancel_requested: cancel,
            }
        })
        .collect())
}

/// Day partitions of `finished_tasks` created this far ahead of today, so the partition a
/// completion needs exists days before it is needed even when retention cannot run for a while
/// (until then the default partition catches the rows).
pub const PARTITIONS_AHEAD_DAYS: i32 = 3;

/// What one retention step did (see [`retain_finished`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Day partitions created.
    pub created: i32,
    /// Partitions dropped whole, every row in them older than the TTL.
    pub dropped: i32,
    /// Rows deleted one by one: those older than the TTL in the default partition (see
    /// runner/sql/retention.sql).
    pub deleted: i64,
}

/// One retention step over finished (succeeded and cancelled) tasks, which are partitioned by
/// UTC day of `finished_at`: creates the day partitions up to [`PARTITIONS_AHEAD_DAYS`] ahead,
/// drops every partition wholly older than `older_than`, and deletes at most `batch` rows older
/// than that outside the day partitions. A day partition is never deleted from row by row, so
/// a finished task is kept at least `older_than` and at most one day longer. Call again while
/// `deleted` is `batch`. When another runner is running a step, does nothing.
pub async fn retain_finished<'c, E: PgExecutor<'c>>(
    executor: E,
    older_than: Duration,
    batch: usize,
) -> Result<Retention, QueueError> {
    let (created, dropped, deleted): (i32, i32, i64) = sqlx::query_as(RETAIN_FINISHED)
        .bind(sql_millis(older_than))
        .bind(PARTITIONS_AHEAD_DAYS)
        .bind(i32::try_from(batch).unwrap_or(i32::MAX))
        .fetch_one(executor)
        .await?;
    Ok(Retention { created, dropped, deleted })
}

/// Vacuums the live table, skipping it when another vacuum holds it (every runner calls this
/// on its own timer). `tasks` holds only live work, so this is quick, and it reclaims the
/// index entries of tasks that already ran, which every claim would otherwise walk past at
/// the head of `tasks_claim`.
///
/// Sent as a plain string (the simple protocol: one message, nothing prepared): `VACUUM` cannot
/// run inside a transaction block, which is how a pooled store runs prepared statements.
pub async fn vacuum_live<'c, E: PgExecutor<'c>>(executor: E) -> Result<(), QueueError> {
    executor.execute(VACUUM_LIVE).await?;
    Ok(())
}

/// Deletes `runners` rows that have not heartbeated for `silent_for`.
pub async fn prune_runners<'c, E: PgExecutor<'c>>(
    executor: E,
    silent_for: Duration,
) -> Result<u64, QueueError> {
    let done = sqlx::query(PRUNE_RUNNERS).bind(sql_millis(silent_for)).execute(executor).await?;
    Ok(done.rows_affected())
}

/// Recomputes the hint of every queue with waiting tasks whose hint says nothing is due yet,
/// and corrects those that are wrong. The backstop for the one case the hint protocol lets slip
/// (two writers lowering one hint at the same moment, the second skipped), for tasks written by
/// hand, and for anything else that leaves a hint late. Queues whose hint is already due are
/// left to the claims, which correct them when they come up short; queues with nothing waiting
/// are not read at all (a hint left early there costs one claim's probe), so a pass costs one
/// index descent per queue with waiting tasks, not one hint computation per queue. Returns how
/// many were corrected.
pub async fn repair_queue_hints<'c, E: PgExecutor<'c>>(executor: E) -> Result<u64, QueueError> {
    // Found without locks, then corrected under FOR UPDATE SKIP LOCKED with a fresh look taken
    // after the lock, the same protocol as the claim's (see runner/sql/wake_queues.sql).
    let done = sqlx::query(REPAIR_HINTS).execute(executor).await?;
    Ok(done.rows_affected())
}

const TAKE_OVER_EXPIRED: &str = concat!(
    r#"
    with expired as (
        select ctid, lease_owner from sweep.tasks
        where state = "#,
    state!(running),
    r#" and lease_expires_at < now()
          -- both sides of the comparison are the server's clock: runners' clocks never enter
          and pg_postmaster_start_time() < now() - $3 * interval '1 millisecond'
        order by lease_expires_at
        limit $2
        for update skip locked
    )
    update sweep.tasks t
    set lease_owner = $1, lease_expires_at = now() + interval '1 minute', updated_at = now()
    from expired
    -- A TID scan: a version newer than this statement's snapshot (renewed or reported
    -- meanwhile, so no longer expired anyway) is not found and simply not taken over.
    where t.ctid = expired.ctid
    returning t.id, t.task_type, t.attempts, expired.lease_owner,
              -- the backoff of the type's active module, as the worker applies to failures
              (select m.backoff_base_ms from sweep.active_modules a
               join sweep.modules m using (tenant, task_type, version)
               where a.tenant = t.tenant and a.task_type = t.task_type),
              (select m.backoff_cap_ms from sweep.active_modules a
               join sweep.modules m using (tenant, task_type, version)
               where a.tenant = t.tenant and a.task_type = t.task_type),
              t.cancel_requested_at is not null
    "#
);
// One statement, so it holds on a transaction pooler: the DDL, its locks and the advisory
// lock that keeps runners from doing it at once all live in the function's transaction.
const RETAIN_FINISHED: &str = r#"
    select created, dropped, deleted from sweep.sweep_finished_retention($1, $2, $3)
    "#;

const VACUUM_LIVE: &str = r#"vacuum (skip_locked) sweep.tasks"#;

const PRUNE_RUNNERS: &str =
    r#"delete from sweep.runners where last_heartbeat_at < now() - $1 * interval '1 millisecond'"#;

// The queues that have waiting tasks, by a loose index scan of `tasks_queue` (one descent per
// queue, skipping each queue's tasks), so idle queues cost nothing however many there are;
// each queue row and its lock by key.
const REPAIR_HINTS: &str = concat!(
    r#"
    with recursive waiting (tenant, task_type) as (
        (select t.tenant, t.task_type from sweep.tasks t
         where t.state in "#,
    state!(waiting),
    r#"
         order by t.tenant, t.task_type
         limit 1)
        union all
        select n.tenant, n.task_type
        from waiting w
        cross join lateral (
            select t.tenant, t.task_type from sweep.tasks t
            where t.state in "#,
    state!(waiting),
    r#"
              and (t.tenant, t.task_type) > (w.tenant, w.task_type)
            order by t.tenant, t.task_type
            limit 1
        ) n
    ),
    wrong as (
        select q.tenant, q.task_type
        from waiting w
        cross join lateral (
            select q.tenant, q.task_type, q.next_run_at from sweep.queues q
            where q.tenant = w.tenant and q.task_type = w.task_type
        ) q
        where (q.next_run_at is null or q.next_run_at > now())
          and q.next_run_at is distinct from
              sweep.sweep_queue_next_run_at(q.tenant, q.task_type, '{}')
    ),
    locked as (
        select l.ctid, w.tenant, w.task_type
        from (select tenant, task_type from wrong order by tenant, task_type) w
        cross join lateral (
            select q.ctid from sweep.queues q
            where q.tenant = w.tenant and q.task_type = w.task_type
            for update skip locked
        ) l
    )
    update sweep.queues q set next_run_at = fresh.next_run_at
    from locked l
    cross join lateral (
        select sweep.sweep_queue_next_run_at(l.tenant, l.task_type, '{}') as next_run_at
    ) fresh
    where q.ctid = l.ctid
    "#
);

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] =
    statements![TAKE_OVER_EXPIRED, RETAIN_FINISHED, VACUUM_LIVE, PRUNE_RUNNERS, REPAIR_HINTS];
