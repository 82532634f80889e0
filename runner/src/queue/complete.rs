//! Reporting outcomes: completions and failed attempts, a whole batch per statement.
//!
//! Invariant (the fence): a report applies only while the task is `running` under this
//! runner's lease at the reported attempt. Anything else (the reaper took the task over, it
//! was retried elsewhere) comes back in `lost` and the row is left untouched.
//!
//! Usage: a report's [`AttemptUsage`] is kept with the attempt (`finished_tasks.usage` for a
//! success, the history entry for a failure) and added to the day's totals by the same
//! statement (`usage_cte!`, see `usage.rs`).
//!
//! Cancels: a report of an attempt a cancel was requested for (`cancel_requested_at`, see
//! `dead.rs`) ends the task `cancelled` whatever the attempt did, in the same statement: the
//! history gets an entry of kind `cancelled` (with `ended_as`, what the attempt did on its own,
//! when that was not the stop), a success's result is discarded. A guest has no effect outside
//! its result, so nothing of a cancelled attempt is left behind.

use std::{collections::HashSet, time::Duration};

use serde::{ser::SerializeMap, Serialize, Serializer};
use serde_json::Value;
use sqlx::{types::Json, PgExecutor};
use uuid::Uuid;

use super::{sql_millis, AttemptUsage, FailureKind, QueueError, TaskId, TaskState};

/// The message of a cancelled attempt that succeeded before the stop reached it.
macro_rules! cancelled_after_success {
    () => {
        "'cancelled while running: the attempt succeeded before it was stopped; its result was \
         discarded'"
    };
}

/// Longest error message kept per history entry.
pub const MAX_ERROR_MESSAGE: usize = 4096;

/// A successful attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub id: TaskId,
    pub attempt: i32,
    pub result: Value,
    pub module_sha256: Option<String>,
    /// The handler's stderr tail, if it wrote any.
    pub logs: Option<String>,
    /// What the attempt used (`None`: not measured): kept as `finished_tasks.usage` and
    /// added to the day's totals.
    pub usage: Option<AttemptUsage>,
}

/// A failed attempt. Build the retry delay with [`super::RetryPolicy`]; the queue decides
/// retry versus dead-letter from `permanent` and the task's attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub id: TaskId,
    pub attempt: i32,
    pub kind: FailureKind,
    pub message: String,
    pub permanent: bool,
    pub retry_delay: Duration,
    /// Extra fields merged into the history entry (duration_ms, fuel_used, ...). An object.
    pub detail: Value,
    pub module_sha256: Option<String>,
    /// What the attempt used (`None`: not measured, as for a reaped lease): written into the
    /// history entry and added to the day's totals.
    pub usage: Option<AttemptUsage>,
}

/// What became of a batch of failures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailureReport {
    pub retrying: Vec<TaskId>,
    pub dead: Vec<TaskId>,
    /// A cancel was requested for these attempts: they ended `cancelled`.
    pub cancelled: Vec<TaskId>,
    /// Fenced out: the lease was lost, nothing was written for these.
    pub lost: Vec<TaskId>,
}

/// Marks the tasks succeeded, moving them with their results to `finished_tasks` (those a
/// cancel was requested for move there `cancelled`, their results discarded). Returns the ids
/// whose lease was lost.
pub async fn complete_batch<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    completions: &[Completion],
) -> Result<Vec<TaskId>, QueueError> {
    let ids = sorted_ids(completions.iter().map(|c| c.id));
    let reports = ReportsById(completions);
    // Each fenced row moves to `finished_tasks` (DELETE ... RETURNING feeding an INSERT):
    // `tasks` keeps only live work. The commit stays synchronous: a lost completion would
    // come back as an expired lease, i.e. a failed attempt, dead-lettered if it was the last
    // (see benches/results/journal.md). On the shape of the statement, see `ReportsById`.
    let applied: Vec<(TaskId,)> = sqlx::query_as(COMPLETE)
        .bind(runner)
        .bind(&ids)
        .bind(Json(&reports))
        .fetch_all(executor)
        .await?;
    Ok(lost(&ids, applied.into_iter().map(|(id,)| id)))
}

/// Records failed attempts: each task either goes back to `retrying` after its delay or, when
/// the failure is permanent or this was its last attempt, moves to `dead_tasks`, in one
/// statement.
pub async fn fail_batch<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    failures: &[Failure],
) -> Result<FailureReport, QueueError> {
    let ids = sorted_ids(failures.iter().map(|f| f.id));
    let reports = ReportsById(failures);
    // `fenced` locks the rows still under this runner's lease at the reported attempt; the
    // update and the delete then find them again by id. Not by ctid: when a heartbeat
    // renewed the lease after this statement's snapshot, `fenced` locks the renewed row
    // version, which the statement cannot see, and a TID scan for it finds nothing (the
    // report was lost). By id, the scan finds the visible version and follows it to the
    // locked one. History entries get their time from the database clock.
    let rows: Vec<(TaskId, String)> = sqlx::query_as(FAIL)
        .bind(runner)
        .bind(&ids)
        .bind(Json(&reports))
        .fetch_all(executor)
        .await?;

    let mut report = FailureReport::default();
    for (id, state) in rows {
        match state.parse::<TaskState>().map_err(QueueError::Corrupt)? {
            TaskState::Dead => report.dead.push(id),
            TaskState::Cancelled => report.cancelled.push(id),
            _ => report.retrying.push(id),
        }
    }
    let applied = report.retrying.iter().chain(&report.dead).chain(&report.cancelled);
    report.lost = lost(&ids, applied.copied());
    Ok(report)
}

/// The ids of a batch in ascending order: the primary-key scan then visits and locks rows in
/// id order, as every batch statement does, so two batches never deadlock.
fn sorted_ids(ids: impl Iterator<Item = TaskId>) -> Vec<TaskId> {
    let mut ids: Vec<TaskId> = ids.collect();
    ids.sort_unstable();
    ids
}

/// A batch of reports sent as one JSON object keyed by task id, `{"<id>": {...}, ...}`.
///
/// Why this shape: each row the statement touches finds its own report with `$3 -> id`, a
/// binary search among the object's keys, and the statement needs no join at all. A join
/// against `unnest()` of parallel arrays is planned once per connection (generic plans) with
/// no idea of the arrays' length, and came out as a nested loop comparing every row with
/// every report (22 ms for 200 reports); looking ids up with `array_position` was quadratic
/// too (33 us per task at 500 per batch).
struct ReportsById<'a, R>(&'a [R]);

impl<R: KeyedReport> Serialize for ReportsById<'_, R> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for report in self.0 {
            map.serialize_entry(&report.id().to_string(), &report.fields())?;
        }
        map.end()
    }
}

trait KeyedReport {
    type Fields<'a>: Serialize
    where
        Self: 'a;
    fn id(&self) -> TaskId;
    fn fields(&self) -> Self::Fields<'_>;
}

#[derive(Serialize)]
struct CompletionFields<'a> {
    attempt: i32,
    result: &'a Value,
    sha: Option<&'a str>,
    logs: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<AttemptUsage>,
}

impl KeyedReport for Completion {
    type Fields<'a> = CompletionFields<'a>;
    fn id(&self) -> TaskId {
        self.id
    }
    fn fields(&self) -> CompletionFields<'_> {
        CompletionFields {
            attempt: self.attempt,
            result: &self.result,
            sha: self.module_sha256.as_deref(),
            logs: self.logs.as_deref(),
            usage: self.usage,
        }
    }
}

#[derive(Serialize)]
struct FailureFields<'a> {
    attempt: i32,
    permanent: bool,
    delay_ms: i64,
    sha: Option<&'a str>,
    /// The history entry, without its time (the statement adds `at` from the database clock).
    entry: HistoryEntry<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<AttemptUsage>,
}

/// The fields of the failure's `detail` object, then its usage's (`duration_ms`, `fuel_used`,
/// ...), then `{"attempt", "kind", "message"}`.
struct HistoryEntry<'a>(&'a Failure);

impl Serialize for HistoryEntry<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let f = self.0;
        let detail = f.detail.as_object();
        let mut map = serializer.serialize_map(None)?;
        let usage = f.usage.map(|u| serde_json::to_value(u).unwrap_or_default());
        let usage = usage.as_ref().and_then(Value::as_object);
        for (key, value) in detail.into_iter().flatten() {
            let reserved = matches!(key.as_str(), "attempt" | "kind" | "message" | "at");
            if !reserved && !usage.is_some_and(|u| u.contains_key(key)) {
                map.serialize_entry(key, value)?;
            }
        }
        for (key, value) in usage.into_iter().flatten() {
            map.serialize_entry(key, value)?;
        }
        map.serialize_entry("attempt", &f.attempt)?;
        map.serialize_entry("kind", &f.kind)?;
        map.serialize_entry("message", truncate(&f.message, MAX_ERROR_MESSAGE))?;
        map.end()
    }
}

impl KeyedReport for Failure {
    type Fields<'a> = FailureFields<'a>;
    fn id(&self) -> TaskId {
        self.id
    }
    fn fields(&self) -> FailureFields<'_> {
        FailureFields {
            attempt: self.attempt,
            permanent: self.permanent,
            delay_ms: sql_millis(self.retry_delay),
            sha: self.module_sha256.as_deref(),
            entry: HistoryEntry(self),
            usage: self.usage,
        }
    }
}

/// The ids of `sent` that are not in `applied`.
fn lost(sent: &[TaskId], applied: impl IntoIterator<Item = TaskId>) -> Vec<TaskId> {
    let applied: HashSet<TaskId> = applied.into_iter().collect();
    sent.iter().copied().filter(|id| !applied.contains(id)).collect()
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

const COMPLETE: &str = concat!(
    r#"
    with done as (
        delete from sweep.tasks t
        where t.id = any($2::int8[]) and t.lease_owner = $1
          and t.attempts = ($3::jsonb #>> array[t.id::text, 'attempt'])::int4
        returning t.*, $3::jsonb -> t.id::text as report, "#,
    notify_done!(),
    r#"
    ),
    "#,
    usage_cte!("done", succeeded),
    r#"
    insert into sweep.finished_tasks (id, tenant, task_type, payload, state, priority, attempts,
                                max_attempts, run_at, dedup_key, last_error, errors,
                                result, module_sha256, logs, created_at, started_at, usage)
    select id, tenant, task_type, payload,
           case when cancel_requested_at is null then "#,
    state!(succeeded),
    r#" else "#,
    state!(cancelled),
    r#" end,
           priority, attempts, max_attempts, run_at, dedup_key,
           case when cancel_requested_at is null then last_error else "#,
    cancelled_after_success!(),
    r#" end,
           case when cancel_requested_at is null then errors
                else errors || jsonb_build_array(jsonb_build_object(
                    'at', now(), 'attempt', attempts, 'kind', "#,
    kind!(cancelled),
    r#",
                    'message', "#,
    cancelled_after_success!(),
    r#",
                    'requested_at', cancel_requested_at, 'ended_as', "#,
    state!(succeeded),
    r#"))
           end,
           case when cancel_requested_at is null then report -> 'result' end,
           coalesce(report ->> 'sha', module_sha256), report ->> 'logs', created_at,
           started_at, report -> 'usage'
    from done
    returning id
    "#
);
const FAIL: &str = concat!(
    r#"
        with fenced as (
            select t.id,
                   t.cancel_requested_at is not null as stops,
                   (($3::jsonb #>> array[t.id::text, 'permanent'])::bool
                    or t.attempts >= t.max_attempts) as dies
            from sweep.tasks t
            where t.id = any($2::int8[]) and t.lease_owner = $1
              and t.attempts = ($3::jsonb #>> array[t.id::text, 'attempt'])::int4
            for update of t
        ),
        retried as (
            update sweep.tasks t
            set state = "#,
    state!(retrying),
    r#",
                run_at = now() + ($3::jsonb #>> array[t.id::text, 'delay_ms'])::int8
                                 * interval '1 millisecond',
                last_error = $3::jsonb #>> array[t.id::text, 'entry', 'message'],
                errors = t.errors || jsonb_build_array(jsonb_build_object('at', now())
                                       || ($3::jsonb #> array[t.id::text, 'entry'])),
                module_sha256 = coalesce($3::jsonb #>> array[t.id::text, 'sha'],
                                         t.module_sha256),
                lease_owner = null,
                lease_expires_at = null,
                updated_at = now()
            where t.id = any(array(select id from fenced where not dies and not stops))
            returning t.id, t.tenant, t.task_type, t.run_at, $3::jsonb -> t.id::text as report
        ),
        killed as (
            delete from sweep.tasks t
            where t.id = any(array(select id from fenced where dies and not stops))
            returning t.*, $3::jsonb -> t.id::text as report, "#,
    notify_done!(),
    r#"
        ),
        buried as (
            insert into sweep.dead_tasks (id, tenant, task_type, payload, priority, attempts,
                                    max_attempts, dedup_key, last_error, errors, module_sha256,
                                    reason, created_at, started_at)
            select id, tenant, task_type, payload, priority, attempts, max_attempts, dedup_key,
                   report #>> '{entry,message}',
                   errors || jsonb_build_array(jsonb_build_object('at', now())
                                               || (report -> 'entry')),
                   coalesce(report ->> 'sha', module_sha256), report #>> '{entry,kind}',
                   created_at, started_at
            from killed
            returning id
        ),
        -- A cancel was requested: the attempt ends the task cancelled, whatever it failed of
        -- (kept as `ended_as` when it was not the stop itself).
        stopped as (
            delete from sweep.tasks t
            where t.id = any(array(select id from fenced where stops))
            returning t.*, $3::jsonb -> t.id::text as report, "#,
    notify_done!(),
    r#"
        ),
        ended as (
            insert into sweep.finished_tasks (id, tenant, task_type, payload, state, priority,
                                        attempts, max_attempts, run_at, dedup_key, last_error,
                                        errors, module_sha256, created_at, started_at)
            select id, tenant, task_type, payload, "#,
    state!(cancelled),
    r#", priority, attempts,
                   max_attempts, run_at, dedup_key, report #>> '{entry,message}',
                   errors || jsonb_build_array(
                       jsonb_build_object('at', now()) || (report -> 'entry')
                       || jsonb_build_object('kind', "#,
    kind!(cancelled),
    r#", 'requested_at', cancel_requested_at)
                       || case when report #>> '{entry,kind}' = "#,
    kind!(cancelled),
    r#" then '{}'::jsonb
                               else jsonb_build_object('ended_as', report #> '{entry,kind}')
                          end),
                   coalesce(report ->> 'sha', module_sha256), created_at, started_at
            from stopped
            returning id
        ),
        "#,
    usage_cte!(
        "(select tenant, task_type, report from retried
          union all select tenant, task_type, report from killed
          union all select tenant, task_type, report from stopped) failed_attempts",
        failed
    ),
    r#",
        "#,
    wake_queues_cte!("retried"),
    r#"
        select id, "#,
    state!(retrying),
    r#" from retried cross join woken_queues
        union all
        select id, "#,
    state!(dead),
    r#" from buried
        union all
        select id, "#,
    state!(cancelled),
    r#" from ended
        "#
);
#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![COMPLETE, FAIL];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }

    #[test]
    fn lost_is_what_was_not_applied() {
        assert_eq!(lost(&[1, 2, 3], [3, 1]), vec![2]);
        assert!(lost(&[1], [1]).is_empty());
    }
}
