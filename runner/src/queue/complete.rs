//! Reporting outcomes: completions and failed attempts, a whole batch per statement.
//!
//! Invariant (the fence): a report applies only while the task is `running` under this
//! runner's lease at the reported attempt. Anything else (the reaper took the task over, it
//! was retried elsewhere) comes back in `lost` and the row is left untouched.
//!
//! Dependencies: every task a report ends is handed, in the same statement, to
//! `sweep_parents_ended` (runner/sql/dependencies.sql), which decides the children waiting for
//! it (the `children` CTE): one index probe per task when it has none.
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

use super::{
    sql_millis, types::Schedule, AttemptUsage, Connects, FailureKind, NewTask, QueueError, TaskId,
    TaskState, COPY_MIN_BATCH, DEFAULT_MAX_ATTEMPTS,
};
use chrono::{DateTime, Utc};

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
    /// Tasks to enqueue with the success (the handler's `$enqueue`, taken out of `result` and
    /// checked: `follow_ups.rs`), as tasks of this task's tenant; none for a cancelled one.
    pub follow_ups: Vec<NewTask>,
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
/// cancel was requested for move there `cancelled`, their results discarded), and enqueues
/// the follow-ups of the successes with them. Returns the ids whose lease was lost.
pub async fn complete_batch<'c, A: Connects<'c>>(
    conn: A,
    runner: Uuid,
    completions: &[Completion],
) -> Result<Vec<TaskId>, QueueError> {
    let follow_ups: usize = completions.iter().map(|c| c.follow_ups.len()).sum();
    if follow_ups >= COPY_MIN_BATCH {
        return super::follow_ups::complete_copying(conn, runner, completions).await;
    }
    let mut conn = conn.connect().await?;
    complete_inserting(&mut conn, runner, completions).await
}

/// [`complete_batch`] in one statement, follow-ups (if any) inserted by it.
pub(super) async fn complete_inserting<'e, E: PgExecutor<'e>>(
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
    // A batch with follow-ups takes the statement that also enqueues them; the usual one
    // stays as it was.
    let applied: Vec<(TaskId,)> = if completions.iter().any(|c| !c.follow_ups.is_empty()) {
        sqlx::query_as(COMPLETE_SPAWNING)
            .bind(runner)
            .bind(&ids)
            .bind(Json(&reports))
            .bind(DEFAULT_MAX_ATTEMPTS)
            .fetch_all(executor)
            .await?
    } else {
        sqlx::query_as(COMPLETE)
            .bind(runner)
            .bind(&ids)
            .bind(Json(&reports))
            .fetch_all(executor)
            .await?
    };
    Ok(lost(&ids, applied.into_iter().map(|(id,)| id)))
}

/// A completion applied by [`complete_recording_ids`].
pub(super) struct Applied {
    pub id: TaskId,
    /// A cancel was requested: it ended `cancelled`, its follow-ups are not to be written.
    pub cancelled: bool,
    pub tenant: String,
}

/// Applies the completions without their follow-ups, each success's result recording the ids
/// `enqueued[i]` for completion `i`'s follow-ups, which the caller writes in the same
/// transaction. Answers what applied and the ids whose lease was lost.
pub(super) async fn complete_recording_ids<'e, E: PgExecutor<'e>>(
    executor: E,
    runner: Uuid,
    completions: &[Completion],
    enqueued: &[&[TaskId]],
) -> Result<(Vec<Applied>, Vec<TaskId>), QueueError> {
    let ids = sorted_ids(completions.iter().map(|c| c.id));
    let reports = RecordingIds(completions, enqueued);
    let applied: Vec<(TaskId, bool, String)> = sqlx::query_as(COMPLETE_COPYING)
        .bind(runner)
        .bind(&ids)
        .bind(Json(&reports))
        .fetch_all(executor)
        .await?;
    let lost = lost(&ids, applied.iter().map(|(id, ..)| *id));
    let applied = applied
        .into_iter()
        .map(|(id, cancelled, tenant)| Applied { id, cancelled, tenant })
        .collect();
    Ok((applied, lost))
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

/// [`ReportsById`] of completions whose follow-ups go apart: each with the ids they get
/// (`enqueued`) instead of the tasks.
struct RecordingIds<'a>(&'a [Completion], &'a [&'a [TaskId]]);

impl Serialize for RecordingIds<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (c, enqueued) in self.0.iter().zip(self.1) {
            let fields = CompletionFields {
                follow_ups: Vec::new(),
                enqueued: (!enqueued.is_empty()).then_some(*enqueued),
                ..c.fields_alone()
            };
            map.serialize_entry(&c.id.to_string(), &fields)?;
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
    #[serde(skip_serializing_if = "<[FollowUpFields]>::is_empty")]
    follow_ups: Vec<FollowUpFields<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<AttemptUsage>,
    /// The ids of the follow-ups `COPY` writes after the statement ([`COMPLETE_COPYING`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    enqueued: Option<&'a [TaskId]>,
}

/// A follow-up as the spawning statement reads it (every field present).
#[derive(Serialize)]
struct FollowUpFields<'a> {
    task_type: &'a str,
    payload: &'a Value,
    priority: i32,
    run_at: Option<DateTime<Utc>>,
    delay_ms: i64,
    max_attempts: Option<i32>,
}

impl<'a> From<&'a NewTask> for FollowUpFields<'a> {
    fn from(t: &'a NewTask) -> Self {
        let (run_at, delay) = match t.schedule {
            Schedule::Now => (None, Duration::ZERO),
            Schedule::At(at) => (Some(at), Duration::ZERO),
            Schedule::After(d) => (None, d),
        };
        FollowUpFields {
            task_type: &t.task_type,
            payload: &t.payload,
            priority: t.priority,
            run_at,
            delay_ms: sql_millis(delay),
            max_attempts: t.max_attempts,
        }
    }
}

impl KeyedReport for Completion {
    type Fields<'a> = CompletionFields<'a>;
    fn id(&self) -> TaskId {
        self.id
    }
    fn fields(&self) -> CompletionFields<'_> {
        CompletionFields {
            follow_ups: self.follow_ups.iter().map(FollowUpFields::from).collect(),
            ..self.fields_alone()
        }
    }
}

impl Completion {
    /// Its report's fields without follow-ups.
    fn fields_alone(&self) -> CompletionFields<'_> {
        CompletionFields {
            attempt: self.attempt,
            result: &self.result,
            sha: self.module_sha256.as_deref(),
            logs: self.logs.as_deref(),
            follow_ups: Vec::new(),
            usage: self.usage,
            enqueued: None,
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

/// The completion statement: `done` (the fenced rows, deleted), `children` (see the module
/// doc), then `$ctes` (more CTEs, each ending with a comma, reading `done`), the rows moved to
/// `finished_tasks` with `$result` as their result (the success's, or null when a cancel
/// was requested), read `from done cross join children $from`; it answers each moved row's
/// `id` and `$answer` (more columns of `moved`: `id`, `state`, `tenant`).
macro_rules! complete_statement {
    ([$($ctes:tt)*], [$($result:tt)*], [$($from:tt)*]) => {
        complete_statement!([$($ctes)*], [$($result)*], [$($from)*], ["",])
    };
    ([$($ctes:tt)*], [$($result:tt)*], [$($from:tt)*], [$($answer:tt)*]) => {
        concat!(
            r#"
    with done as (
        delete from sweep.tasks t
        where t.id = any($2::int8[]) and t.lease_owner = $1
          and t.attempts = ($3::jsonb #>> array[t.id::text, 'attempt'])::int4
        returning t.*, $3::jsonb -> t.id::text as report, "#,
            notify_done!(),
            r#"
    ),
    -- The children waiting for these tasks (see the module doc). Read in a join with `done`,
    -- so it runs whenever a task ended, after all of them did.
    children as (
        select sweep.sweep_parents_ended(
                   array_agg(id),
                   array_agg(case when cancel_requested_at is null then "#,
            state!(succeeded),
            r#" else "#,
            state!(cancelled),
            r#" end),
                   $3::jsonb) as changed
        from done
    ),"#,
            usage_cte!("done", succeeded),
            ",",
            $($ctes)*
            r#"
    moved as (
        insert into sweep.finished_tasks (id, tenant, task_type, payload, state, priority,
                                    attempts, max_attempts, run_at, dedup_key, last_error,
                                    errors, result, module_sha256, logs, created_at, started_at,
                                    usage)
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
               case when cancel_requested_at is null then "#,
            $($result)*
            r#" end,
               coalesce(report ->> 'sha', module_sha256), report ->> 'logs', created_at,
               started_at, report -> 'usage'
        from done cross join children "#,
            $($from)*
            r#"
        returning id, state, tenant
    )
    select id"#,
            $($answer)*
            r#" from moved
    "#
        )
    };
}

const COMPLETE: &str = complete_statement!([], ["report -> 'result'",], ["",]);

/// [`COMPLETE`] for a batch in which some success asks for follow-up tasks (the reports'
/// `follow_ups`, see `follow_ups.rs`): they are inserted with the rows that record the
/// successes, as tasks of the same tenant (a cancelled success enqueues none), and each
/// result gets the ids they got (`$enqueued`, in request order). `$4` is the default
/// `max_attempts`.
const COMPLETE_SPAWNING: &str = complete_statement!(
    [
        r#"
    spawn as materialized (
        select nextval((select pg_get_serial_sequence('sweep.tasks', 'id')::regclass)) as id,
               s.parent, s.tenant, s.task ->> 'task_type' as task_type, s.task, s.ord
        from (select d.id as parent, d.tenant, f.task, f.ord
              from done d
              cross join lateral jsonb_array_elements(d.report -> 'follow_ups')
                   with ordinality as f(task, ord)
              where d.cancel_requested_at is null
              order by d.id, f.ord) s
    ),
    "#,
        module_defaults_cte!("select tenant, task_type from spawn"),
        r#",
    spawned as (
        insert into sweep.tasks (id, tenant, task_type, payload, priority, run_at, max_attempts)
        select s.id, s.tenant, s.task_type, s.task -> 'payload',
               (s.task ->> 'priority')::int4,
               coalesce((s.task ->> 'run_at')::timestamptz,
                        now() + (s.task ->> 'delay_ms')::int8 * interval '1 millisecond'),
               coalesce((s.task ->> 'max_attempts')::int4,
                        (d.by_type ->> (s.tenant || '/' || s.task_type))::int4, $4)
        -- In id order already: `spawn` is materialized in the order its ids were drawn.
        from spawn s
        cross join module_defaults d
        returning id, tenant, task_type, run_at
    ),
    spawned_notify as (
        select count(*) as n from (select "#,
        notify_tasks!(),
        r#" from spawned limit 1) n
    ),
    "#,
        wake_queues_cte!("spawned"),
        r#",
    spawn_ids as (
        select parent, to_jsonb(array_agg(id order by ord)) as ids from spawn group by parent
    ),"#,
    ],
    [r#"(case when e.ids is null then report -> 'result'
                 else (report -> 'result') || jsonb_build_object('$enqueued', e.ids) end)"#,],
    [r#"
        cross join (select count(*) from spawned) sp
        cross join spawned_notify
        cross join (select count(*) from woken_queues) w
        left join spawn_ids e on e.parent = done.id"#,]
);
/// [`COMPLETE`] for a batch whose follow-ups go by `COPY` after it (`follow_ups.rs`): a
/// report carries the ids its follow-ups are to get (`enqueued`), which a success keeps in its
/// result (`$enqueued`, as [`COMPLETE_SPAWNING`] does; a cancelled one keeps no result). Each
/// moved row answers whether it ended cancelled and its tenant.
const COMPLETE_COPYING: &str = complete_statement!(
    [],
    [r#"(case when report ? 'enqueued'
                 then (report -> 'result') || jsonb_build_object('$enqueued', report -> 'enqueued')
                 else report -> 'result' end)"#,],
    ["",],
    [", state = ", state!(cancelled), ", tenant",]
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
        -- A cancel was requested: the attempt ends the task cancelled, whatever it failed of
        -- (kept as `ended_as` when it was not the stop itself).
        stopped as (
            delete from sweep.tasks t
            where t.id = any(array(select id from fenced where stops))
            returning t.*, $3::jsonb -> t.id::text as report, "#,
    notify_done!(),
    r#"
        ),
        -- The children waiting for the tasks that ended here, read in a join with both
        -- `killed` and `stopped`: it runs when either has rows, after both deleted theirs.
        children as (
            select sweep.sweep_parents_ended(array_agg(e.id), array_agg(e.state), null)
                       as changed
            from (select id, "#,
    state!(dead),
    r#" as state from killed
                  union all
                  select id, "#,
    state!(cancelled),
    r#" from stopped) e
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
            from killed cross join children
            returning id
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
            from stopped cross join children
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
pub(super) const STATEMENTS: &[(&str, &str)] =
    statements![COMPLETE, COMPLETE_SPAWNING, COMPLETE_COPYING, FAIL];

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
