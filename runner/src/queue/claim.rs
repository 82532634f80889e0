//! Leases: claiming due tasks, keeping their leases alive, and handing unstarted ones back.
//!
//! Invariant: a task is `running` only while some runner holds an unexpired lease on it
//! (`lease_owner`, `lease_expires_at`); every statement here that touches a running task is
//! fenced by its lease owner.

use std::{
    cmp::Reverse,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{sql_count, sql_millis, ActiveModule, ClaimedTask, ModuleSettings, QueueError, TaskId};

/// Which slots a claim fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// The runner's ordinary slots, shared fairly among every queue with due work.
    Fair,
    /// The runner's spare instances: one task each for queues (tenant, task type) that have
    /// nothing running on any runner or whose tenant holds less than its share, so newly due
    /// work gets in while every slot is busy.
    Starved,
}

/// Claims up to `limit` due tasks for `runner` in one round trip (`FOR UPDATE SKIP LOCKED`, so
/// concurrent claimers never wait on each other or take the same task), shared fairly among
/// tenants (by weight) and their task types, counting what every runner holds: see
/// runner/sql/claim.sql for the policy and its cost. `task_types`
/// empty means any type. Each claimed task is `running` at attempt `attempts + 1`, leased for
/// `lease`. Tenant running caps and task type running limits hold across all runners (run this
/// in READ COMMITTED, the default, for them to see other claims).
pub async fn claim_batch<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    limit: usize,
    task_types: &[String],
    lease: Duration,
) -> Result<Vec<ClaimedTask>, QueueError> {
    claim(executor, runner, limit, task_types, lease, ClaimMode::Fair).await
}

/// [`claim_batch`] with an explicit [`ClaimMode`], starting at the head of the queue.
pub async fn claim<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    limit: usize,
    task_types: &[String],
    lease: Duration,
    mode: ClaimMode,
) -> Result<Vec<ClaimedTask>, QueueError> {
    claim_from(executor, runner, limit, task_types, lease, mode, &mut ClaimCursor::default()).await
}

/// [`claim`] for a claimer that claims again and again: a fair claim from a single due queue
/// starts its index scan where `cursor` says this claimer's last one ended, instead of walking
/// past every task claimed since the last vacuum (see `sweep_claim_from` in runner/sql/claim.sql;
/// no due task is skipped, whatever the cursor says). The cursor is moved on to the last task
/// claimed; a spare-slot claim ([`ClaimMode::Starved`]) neither uses nor moves it.
pub async fn claim_from<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    limit: usize,
    task_types: &[String],
    lease: Duration,
    mode: ClaimMode,
    cursor: &mut ClaimCursor,
) -> Result<Vec<ClaimedTask>, QueueError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    // The active module of each task's type is resolved in the same statement, so a newly
    // activated version applies to every task claimed after the activation committed.
    //
    // The claim commits asynchronously (`synchronous_commit = off` for this transaction only):
    // if Postgres crashes within ~3 x wal_writer_delay of the commit, the claim is lost and
    // the task is simply pending again, to be claimed (and run) once more: at-least-once
    // holds, and the runner that lost it is fenced out when it reports (measured: see
    // benches/results/journal.md).
    let ring_start: i32 = rand::random_range(0..i32::MAX);
    let rows: Vec<ClaimRow> = match mode {
        ClaimMode::Starved => {
            sqlx::query_as(CLAIM)
                .bind(runner)
                .bind(sql_count(limit))
                .bind(task_types)
                .bind(sql_millis(lease))
                .bind(true)
                .bind(ring_start)
                .fetch_all(executor)
                .await?
        }
        ClaimMode::Fair => {
            let at = cursor.current();
            let from_head = at.is_none();
            let rows = sqlx::query_as(CLAIM_FROM)
                .bind(runner)
                .bind(sql_count(limit))
                .bind(task_types)
                .bind(sql_millis(lease))
                .bind(ring_start)
                .bind(at.map(|k| k.tenant.as_str()))
                .bind(at.map(|k| k.task_type.as_str()))
                .bind(at.map(|k| k.priority))
                .bind(at.map(|k| k.run_at))
                .bind(at.map(|k| k.id))
                .fetch_all(executor)
                .await?;
            cursor.advance(&rows, from_head);
            rows
        }
    };
    Ok(rows.into_iter().map(ClaimRow::into_task).collect())
}

/// What a claimer that found nothing due learns from the queue hints ([`next_due_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NextDue {
    /// How long until the earliest hint in the future of an unpaused queue a claim of the
    /// claimer's task types could take; `None` when there is none.
    pub due_in: Option<Duration>,
    /// Some such queue's hint has passed although the claim found nothing: either the hint is
    /// early (a claim that emptied the queue could not raise it, its row being held by an
    /// enqueue in flight; the next claim that probes the queue raises it) or the queue is held
    /// back by a cap or a rate. The claimer looks again soon, backing off, rather than sleep
    /// past a task the early hint hides.
    pub early: bool,
}

/// How long until the earliest waiting task that a claim of `task_types` (empty: any type)
/// could take becomes due, from the queue hints, and whether a hint has passed with nothing
/// claimed ([`NextDue`]). Measured on the database's clock (`clock_timestamp()`), so the
/// caller sleeps a relative duration and runners' clocks never enter. A claimer that found
/// nothing due sleeps until then (or until a wake-up) instead of its whole poll interval, so
/// a delayed task starts at its `run_at`, not up to a poll interval later.
///
/// A hint is never later than the queue's earliest waiting task but for a lowering in
/// flight, which its enqueue's notification covers; it may be early (see [`NextDue::early`]).
pub async fn next_due_in<'c, E: PgExecutor<'c>>(
    executor: E,
    task_types: &[String],
) -> Result<NextDue, QueueError> {
    let (secs, early): (Option<f64>, bool) =
        sqlx::query_as(NEXT_DUE).bind(task_types).fetch_one(executor).await?;
    Ok(NextDue {
        due_in: secs.map(|s| Duration::try_from_secs_f64(s).unwrap_or(Duration::ZERO)),
        early,
    })
}

/// How long a claimer goes on from its cursor before it claims from the head of the queue
/// again. A task that became due behind the cursor (enqueued by a transaction that started
/// earlier, released or rescued with its old `run_at`) waits at most this long while the
/// queue has a backlog ahead of the cursor; with an empty queue it is claimed at once. About
/// the runner's vacuum interval: the claim from the head walks the entries claimed since the
/// last vacuum, which a vacuum removes.
const CURSOR_SPAN: Duration = Duration::from_secs(1);

/// Where a claimer's last fair claim from a single queue ended: the key, in claim order
/// (priority descending, then `run_at`, then id), of the last task it took. Owned by one
/// claimer (one claim lane, one bench claimer); nothing of it is stored in the database.
#[derive(Debug, Default)]
pub struct ClaimCursor {
    at: Option<CursorKey>,
    /// When this run of claims from the cursor began, with a claim from the head.
    since: Option<Instant>,
}

#[derive(Debug)]
struct CursorKey {
    tenant: String,
    task_type: String,
    priority: i32,
    run_at: DateTime<Utc>,
    id: TaskId,
}

impl ClaimCursor {
    /// The key to claim from, unless the span since the last claim from the head ran out.
    fn current(&self) -> Option<&CursorKey> {
        let fresh = self.since.is_some_and(|since| since.elapsed() < CURSOR_SPAN);
        self.at.as_ref().filter(|_| fresh)
    }

    /// Moves the cursor to the last of `rows` in claim order; `from_head`: the claim had no
    /// cursor. No rows, or rows of the general claim (no priority: many queues), end the run:
    /// the next claim starts at the head.
    fn advance(&mut self, rows: &[ClaimRow], from_head: bool) {
        let general = rows.iter().any(|r| r.priority.is_none());
        let last =
            rows.iter().filter(|_| !general).max_by_key(|r| (Reverse(r.priority), r.run_at, r.id));
        let Some((row, Some(priority))) = last.map(|r| (r, r.priority)) else {
            *self = Self::default();
            return;
        };
        if from_head {
            self.since = Some(Instant::now());
        }
        self.at = Some(CursorKey {
            tenant: row.tenant.clone(),
            task_type: row.task_type.clone(),
            priority,
            run_at: row.run_at,
            id: row.id,
        });
    }
}

#[derive(sqlx::FromRow)]
struct ClaimRow {
    id: TaskId,
    tenant: String,
    task_type: String,
    payload: String,
    attempt: i32,
    max_attempts: i32,
    run_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    version: Option<i32>,
    sha256: Option<String>,
    fuel: Option<i64>,
    timeout_ms: Option<i64>,
    memory_bytes: Option<i64>,
    module_max_attempts: Option<i32>,
    backoff_base_ms: Option<i64>,
    backoff_cap_ms: Option<i64>,
    max_running: Option<i32>,
    max_result_bytes: Option<i64>,
    /// The task's priority, for the claimer's cursor: only the single-queue path of
    /// `sweep_claim_from` returns it (null from the general claim, absent from `sweep_claim`).
    #[sqlx(default)]
    priority: Option<i32>,
}

impl ClaimRow {
    fn into_task(self) -> ClaimedTask {
        let module = match (self.version, self.sha256) {
            (Some(version), Some(sha256)) => Some(ActiveModule {
                version,
                sha256,
                settings: ModuleSettings {
                    fuel: self.fuel,
                    timeout_ms: self.timeout_ms,
                    memory_bytes: self.memory_bytes,
                    max_attempts: self.module_max_attempts,
                    backoff_base_ms: self.backoff_base_ms,
                    backoff_cap_ms: self.backoff_cap_ms,
                    max_running: self.max_running,
                },
            }),
            _ => None,
        };
        ClaimedTask {
            id: self.id,
            tenant: self.tenant,
            task_type: self.task_type,
            payload: self.payload,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            run_at: self.run_at,
            created_at: self.created_at,
            module,
            max_result_bytes: self.max_result_bytes,
        }
    }
}

/// Extends the leases of `held` (task id and attempt) that `runner` still owns to `now() +
/// lease` and refreshes its `runners` row, in one statement. Returns how many task leases were
/// extended.
///
/// Only the tasks named are renewed, never every row the runner owns: a task whose report the
/// runner gave up on must be let lapse so the reaper rescues it. A lease that expired but was
/// not taken over yet (a Postgres outage longer than the lease) is renewed like any other: the
/// runner is still working on it.
pub async fn heartbeat_leases<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    lease: Duration,
    held: &[(TaskId, i32)],
) -> Result<u64, QueueError> {
    let (ids, attempts): (Vec<TaskId>, Vec<i32>) = held.iter().copied().unzip();
    let (extended,): (i64,) = sqlx::query_as(HEARTBEAT)
        .bind(runner)
        .bind(sql_millis(lease))
        .bind(&ids)
        .bind(&attempts)
        .fetch_one(executor)
        .await?;
    Ok(u64::try_from(extended).unwrap_or(0))
}

/// Hands tasks that `runner` claimed but never started back to the queue, as if never claimed
/// (the attempt is not counted). Fenced by owner and attempt; returns the ids released.
pub async fn release_batch<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    tasks: &[(TaskId, i32)],
) -> Result<Vec<TaskId>, QueueError> {
    let (ids, attempts): (Vec<TaskId>, Vec<i32>) = tasks.iter().copied().unzip();
    let released: Vec<(TaskId,)> =
        sqlx::query_as(RELEASE).bind(runner).bind(&ids).bind(&attempts).fetch_all(executor).await?;
    Ok(released.into_iter().map(|(id,)| id).collect())
}

/// Of the leases `runner` holds (`held`, task and attempt), those a cancel was requested for:
/// the polling side of `sweep_cancel`, for a runner that cannot LISTEN or missed a
/// notification. Primary-key lookups of the held ids only.
pub async fn cancel_requests<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    held: &[(TaskId, i32)],
) -> Result<Vec<(TaskId, i32)>, QueueError> {
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<TaskId> = held.iter().map(|&(id, _)| id).collect();
    let rows: Vec<(TaskId, i32)> =
        sqlx::query_as(CANCEL_REQUESTS).bind(runner).bind(&ids).fetch_all(executor).await?;
    Ok(rows.into_iter().filter(|row| held.contains(row)).collect())
}

/// The columns of a claimed task, as `ClaimRow` reads them. The payload comes as JSON text:
/// it goes to the guest's stdin as it is, never through a `serde_json::Value`.
macro_rules! claimed_columns {
    () => {
        "c.id, c.tenant, c.task_type, c.payload::text as payload, c.attempt, c.max_attempts,
         c.run_at, c.created_at, c.version, c.sha256, c.fuel, c.timeout_ms, c.memory_bytes,
         c.module_max_attempts, c.backoff_base_ms, c.backoff_cap_ms, c.max_running"
    };
}

// The tenant's result limit is read with the claim: one index probe per claimed task (a tenant
// without a row, such as `default`, has none). A subquery, not a join: a join was planned as a
// hash join that read every tenant row per claim (5-8 ms a claim with 10,000 tenants).
macro_rules! tenant_result_limit {
    () => {
        "(select t.max_result_bytes from sweep.tenants t where t.name = c.tenant) \
         as max_result_bytes"
    };
}

const CLAIM: &str = concat!(
    "select ",
    claimed_columns!(),
    ", ",
    tenant_result_limit!(),
    " from sweep.sweep_claim($1, $2, $3, $4, $5, $6) c"
);

const CLAIM_FROM: &str = concat!(
    "select ",
    claimed_columns!(),
    ", c.priority, ",
    tenant_result_limit!(),
    " from sweep.sweep_claim_from($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) c"
);

// Both through `queues_next_due` (migrations/0005_fair_scale.sql): the first hint after now(),
// and whether any hint at or before now() is left.
const NEXT_DUE: &str = r#"
    select (select greatest(extract(epoch from q.next_run_at - clock_timestamp()), 0)::float8
            from sweep.queues q
            where q.next_run_at is not null and not q.paused and q.next_run_at > now()
              and (cardinality($1::text[]) = 0 or q.task_type = any($1::text[]))
            order by q.next_run_at
            limit 1),
           exists (select 1 from sweep.queues q
                   where q.next_run_at is not null and not q.paused and q.next_run_at <= now()
                     and (cardinality($1::text[]) = 0 or q.task_type = any($1::text[])))
    "#;

const HEARTBEAT: &str = concat!(
    r#"
    with beat as (
        -- data-modifying CTEs run whether or not they are referenced
        update sweep.runners set last_heartbeat_at = now() where id = $1
    ),
    extended as (
        -- Rows locked right now are being completed or failed by this runner's reporter:
        -- skip them rather than wait (and never deadlock with a batch update).
        -- By id (a primary-key scan however the table looked when this was planned),
        -- not ctid: a row version locked here may be newer than this statement's
        -- snapshot, and a TID scan would not find it.
        update sweep.tasks set lease_expires_at = now() + $2 * interval '1 millisecond'
        where id = any(array(
            select t.id from sweep.tasks t
            join unnest($3::int8[], $4::int4[]) as held(id, attempt) on held.id = t.id
            where t.state = "#,
    state!(running),
    r#" and t.lease_owner = $1 and t.attempts = held.attempt
            for update of t skip locked
        ))
        returning id
    )
    select count(*) from extended
    "#
);
const CANCEL_REQUESTS: &str = concat!(
    r#"
    select id, attempts from sweep.tasks
    where id = any($2::int8[]) and state = "#,
    state!(running),
    r#" and lease_owner = $1
      and cancel_requested_at is not null
    "#
);
const RELEASE: &str = concat!(
    r#"
        with released as (
        update sweep.tasks t
        set state = case when t.attempts > 1 then "#,
    state!(retrying),
    r#" else "#,
    state!(pending),
    r#" end,
            attempts = t.attempts - 1,
            lease_owner = null,
            lease_expires_at = null,
            updated_at = now()
        from unnest($2::int8[], $3::int4[]) as r(id, attempt)
        where t.id = any($2::int8[]) and t.lease_owner = $1
          and t.id = r.id and t.attempts = r.attempt
          -- A cancelled attempt never waits again: it stays running until its lease lapses
          -- and the reaper ends it cancelled.
          and t.cancel_requested_at is null
        returning t.id, t.tenant, t.task_type, t.run_at
        ),
        "#,
    wake_queues_cte!("released"),
    r#"
        select id from released cross join woken_queues
        "#
);
#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] =
    statements![CLAIM, CLAIM_FROM, NEXT_DUE, HEARTBEAT, CANCEL_REQUESTS, RELEASE];

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: TaskId, priority: Option<i32>, run_at_secs: i64) -> ClaimRow {
        let at = DateTime::from_timestamp(run_at_secs, 0).unwrap_or_default();
        ClaimRow {
            id,
            tenant: "t".into(),
            task_type: "q".into(),
            payload: "{}".into(),
            attempt: 1,
            max_attempts: 3,
            run_at: at,
            created_at: at,
            version: None,
            sha256: None,
            fuel: None,
            timeout_ms: None,
            memory_bytes: None,
            module_max_attempts: None,
            backoff_base_ms: None,
            backoff_cap_ms: None,
            max_running: None,
            max_result_bytes: None,
            priority,
        }
    }

    fn key(cursor: &ClaimCursor) -> Option<(i32, i64, TaskId)> {
        cursor.current().map(|k| (k.priority, k.run_at.timestamp(), k.id))
    }

    #[test]
    fn the_cursor_sits_at_the_last_task_in_claim_order() {
        let mut cursor = ClaimCursor::default();
        assert!(cursor.current().is_none(), "a new claimer claims from the head");
        // Claim order: priority descending, then run_at, then id; rows come back unordered.
        let rows = [row(7, Some(0), 100), row(3, Some(5), 900), row(9, Some(0), 50)];
        cursor.advance(&rows, true);
        assert_eq!(key(&cursor), Some((0, 100, 7)));
        cursor.advance(&[row(4, Some(0), 100), row(2, Some(0), 100)], false);
        assert_eq!(key(&cursor), Some((0, 100, 4)));
    }

    #[test]
    fn rows_of_the_general_claim_or_none_end_the_run() {
        let mut cursor = ClaimCursor::default();
        cursor.advance(&[row(1, Some(0), 1)], true);
        assert!(cursor.current().is_some());
        cursor.advance(&[row(2, Some(0), 1), row(3, None, 1)], false);
        assert!(cursor.current().is_none(), "many queues: no cursor");
        cursor.advance(&[row(4, Some(0), 1)], true);
        cursor.advance(&[], false);
        assert!(cursor.current().is_none(), "nothing due: back to the head");
    }

    #[test]
    fn a_run_from_the_cursor_ends_after_its_span() {
        let mut cursor = ClaimCursor::default();
        cursor.advance(&[row(1, Some(0), 1)], true);
        cursor.since = Instant::now().checked_sub(CURSOR_SPAN);
        assert!(cursor.current().is_none(), "the next claim goes back to the head");
        // A claim from the head starts a new run; one from the cursor does not extend it.
        cursor.advance(&[row(2, Some(0), 1)], false);
        assert!(cursor.current().is_none());
        cursor.advance(&[row(3, Some(0), 1)], true);
        assert_eq!(key(&cursor), Some((0, 1, 3)));
    }
}
