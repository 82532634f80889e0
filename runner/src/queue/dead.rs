//! Operator actions and reads on single tasks: cancel (one, or all of a task type), requeue
//! from the dead-letter table, show one task, list dead tasks.
//!
//! Scoping: every function takes `tenant: Option<&str>`; `Some(t)` sees only tenant `t`'s rows
//! (others answer "not found", as if absent), `None` is the operator and sees everything.
//!
//! Cancel and the race with completion: a waiting task is cancelled in the statement; a
//! running one gets `cancel_requested_at` and its runner a NOTIFY (`sweep_cancel`, payload
//! `<runner> <task> <attempt>`), in the same statement. The row lock decides the race: a report
//! that committed first ended the attempt (the cancel then answers `NotCancellable` with the
//! state it finished in), and every report that comes later reads the request and ends the
//! task `cancelled`. So once [`Cancel::Requested`] is returned, the task ends `cancelled`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{error::is_unique_violation, sql_count, Connects, QueueError, TaskId, TaskState};

/// How often a cancel looks again when the task changed state under it (claimed, reported)
/// between its snapshot and its lock. Each look is a fresh statement, so a second one almost
/// always settles it.
const CANCEL_LOOKS: usize = 4;

/// What a cancel of one task did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// The task was pending or retrying: it is `cancelled` now, in `finished_tasks`.
    Cancelled,
    /// The task is running: the request is recorded for `attempt` and `runner` (the lease
    /// owner) was notified. The attempt can only end `cancelled` from here.
    Requested { attempt: i32, runner: Uuid },
}

/// Cancels a task. A pending or retrying task is cancelled at once; for a running one the
/// request is recorded and its runner told to stop it (see the module doc: it then ends
/// `cancelled`; asking again notifies again). A finished or dead task is `NotCancellable`
/// with the state it ended in.
pub async fn cancel<'c, A: Connects<'c>>(
    conn: A,
    tenant: Option<&str>,
    id: TaskId,
) -> Result<Cancel, QueueError> {
    let mut conn = conn.connect().await?;
    let mut seen = None;
    for _ in 0..CANCEL_LOOKS {
        // The last column reads the row as this statement's snapshot saw it.
        let (cancelled, attempt, runner, before): (
            Option<TaskId>,
            Option<i32>,
            Option<Uuid>,
            Option<String>,
        ) = sqlx::query_as(CANCEL).bind(id).bind(tenant).fetch_one(&mut conn).await?;
        match (cancelled, attempt.zip(runner), before) {
            (Some(_), _, _) => return Ok(Cancel::Cancelled),
            (None, Some((attempt, runner)), _) => return Ok(Cancel::Requested { attempt, runner }),
            (None, None, None) => return Err(QueueError::TaskNotFound(id)),
            (None, None, Some(state)) => {
                let state = parse_state(&state)?;
                if !state.is_live() {
                    return Err(QueueError::NotCancellable { id, state });
                }
                // Live in the snapshot, but it moved before the lock was had (a claim made it
                // running, a report ended it): look again with a fresh snapshot.
                seen = Some(state);
            }
        }
    }
    Err(QueueError::NotCancellable { id, state: seen.unwrap_or(TaskState::Running) })
}

/// What a bulk cancel did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct BulkCancel {
    /// Pending or retrying tasks now `cancelled`.
    pub cancelled: u64,
    /// Running tasks whose cancel was requested now (their runners were notified; each ends
    /// `cancelled`). Tasks already asked to stop are not counted again.
    pub cancel_requested: u64,
}

/// Rows a bulk cancel moves per statement.
const BULK_BATCH: usize = 5000;

/// Cancels every live task of `tenant`'s `task_type`, or only those in `only` (`pending`,
/// `retrying` or `running`; any other state matches nothing), as [`cancel`] does one: waiting
/// ones at once, running ones by request. Works in statements of a bounded batch until one
/// finds nothing left; a task enqueued meanwhile may or may not be caught.
pub async fn cancel_matching<'c, A: Connects<'c>>(
    conn: A,
    tenant: &str,
    task_type: &str,
    only: Option<TaskState>,
) -> Result<BulkCancel, QueueError> {
    let waiting_state =
        only.filter(|s| matches!(s, TaskState::Blocked | TaskState::Pending | TaskState::Retrying));
    let waiting = only.is_none() || waiting_state.is_some();
    let running = only.is_none() || only == Some(TaskState::Running);
    let mut done = BulkCancel::default();
    if !(waiting || running) {
        return Ok(done);
    }
    let mut conn = conn.connect().await?;
    loop {
        let (cancelled, requested): (i64, i64) = sqlx::query_as(BULK_CANCEL)
            .bind(tenant)
            .bind(task_type)
            .bind(waiting_state.map(TaskState::as_str))
            .bind(waiting)
            .bind(running)
            .bind(sql_count(BULK_BATCH))
            .fetch_one(&mut conn)
            .await?;
        done.cancelled += u64::try_from(cancelled).unwrap_or(0);
        done.cancel_requested += u64::try_from(requested).unwrap_or(0);
        if cancelled == 0 && requested == 0 {
            return Ok(done);
        }
    }
}

/// Moves a dead task back to `pending` with its attempts reset and its error history kept.
pub async fn requeue<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
    id: TaskId,
) -> Result<TaskId, QueueError> {
    let row: Result<Option<(TaskId,)>, sqlx::Error> =
        sqlx::query_as(REQUEUE).bind(id).bind(tenant).fetch_optional(executor).await;
    match row {
        Ok(Some((id,))) => Ok(id),
        Ok(None) => Err(QueueError::TaskNotFound(id)),
        Err(e) if is_unique_violation(&e, "tasks_dedup") => Err(QueueError::DedupKeyTaken { id }),
        Err(e) => Err(e.into()),
    }
}

/// Marks a live task as waited for: the statement that ends it will `NOTIFY sweep_done` with
/// its id ([`DONE_CHANNEL`]). `false` when the task is not live (it ended, or is not the
/// tenant's): read it instead.
pub async fn watch_task<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
    id: TaskId,
) -> Result<bool, QueueError> {
    let marked = sqlx::query(WATCH_TASK).bind(id).bind(tenant).execute(executor).await?;
    Ok(marked.rows_affected() > 0)
}

/// The channel of [`watch_task`]'s notifications; the payload is the task's id.
pub const DONE_CHANNEL: &str = done_channel!();

/// Deletes finished (succeeded, cancelled) and dead tasks among `ids` (of `tenant`, or any for
/// the operator) for good; live ones are left alone (cancel them first). Returns the ids
/// deleted.
pub async fn delete_tasks<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
    ids: &[TaskId],
) -> Result<Vec<TaskId>, QueueError> {
    let rows: Vec<(TaskId,)> =
        sqlx::query_as(DELETE_TASKS).bind(ids).bind(tenant).fetch_all(executor).await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// One entry of a task's `errors` history, as the failure reports write it (see
/// `complete::HistoryEntry`). Never built in Rust: the history is JSON from the database;
/// this type only describes it in the admin API's OpenAPI document.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)]
pub struct AttemptError {
    /// When the attempt failed (database clock).
    pub at: DateTime<Utc>,
    /// The attempt that failed, 1-based.
    pub attempt: i32,
    /// `handler_error`, `out_of_fuel`, `timeout`, `memory_limit`, `stack_overflow`, `trap`,
    /// `output_too_large`, `invalid_output`, `module_missing`, `lease_expired`, `runner_error`,
    /// `cancelled`, `secrets_unavailable`.
    pub kind: String,
    pub message: String,
    #[schema(nullable = false)]
    pub duration_ms: Option<i64>,
    #[schema(nullable = false)]
    pub fuel_used: Option<i64>,
    /// The tail of the handler's stderr.
    #[schema(nullable = false)]
    pub stderr: Option<String>,
    #[schema(nullable = false)]
    pub stderr_truncated: Option<bool>,
    /// The handler's exit code (`handler_error`).
    #[schema(nullable = false)]
    pub exit_code: Option<i32>,
    /// Largest linear memory the attempt held, in bytes.
    #[schema(nullable = false)]
    pub peak_memory_bytes: Option<i64>,
    /// Outbound HTTP requests the attempt sent, and those refused (egress policy, limits).
    #[schema(nullable = false)]
    pub http_requests: Option<i64>,
    #[schema(nullable = false)]
    pub http_refused: Option<i64>,
    /// HTTP body bytes the attempt sent and received.
    #[schema(nullable = false)]
    pub bytes_sent: Option<i64>,
    #[schema(nullable = false)]
    pub bytes_received: Option<i64>,
    /// The runner whose lease expired (`lease_expired`, and `cancelled` when the cancel took
    /// effect as the lease was reaped).
    #[schema(nullable = false)]
    pub runner: Option<String>,
    /// When the cancel that ended this attempt was requested (`cancelled`).
    #[schema(nullable = false)]
    pub requested_at: Option<DateTime<Utc>>,
    /// How the attempt ended on its own when that came first and the cancel then applied
    /// (`cancelled`): `succeeded` (its result was discarded) or a failure kind.
    #[schema(nullable = false)]
    pub ended_as: Option<String>,
    /// From the runner receiving the cancel to the instance stopped, in milliseconds
    /// (`cancelled`, when the runner stopped it).
    #[schema(nullable = false)]
    pub stop_ms: Option<f64>,
}

/// One task as an operator sees it: live, finished or dead.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct TaskView {
    #[schema(value_type = i64)]
    pub id: TaskId,
    pub tenant: String,
    pub task_type: String,
    #[sqlx(try_from = "String")]
    pub state: TaskState,
    /// The task's input, a JSON object.
    #[schema(value_type = Object)]
    pub payload: Value,
    pub priority: i32,
    pub attempts: i32,
    pub max_attempts: i32,
    #[schema(required)]
    pub run_at: Option<DateTime<Utc>>,
    #[schema(required)]
    pub dedup_key: Option<String>,
    #[schema(required)]
    pub last_error: Option<String>,
    /// Every failed attempt, oldest first.
    #[schema(value_type = Vec<AttemptError>)]
    pub errors: Value,
    /// The handler's output (any JSON) once succeeded; `null` otherwise.
    #[schema(required)]
    pub result: Option<Value>,
    #[schema(required)]
    pub module_sha256: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When the last attempt started.
    #[schema(required)]
    pub started_at: Option<DateTime<Utc>>,
    /// The stderr tail of the successful attempt (failed attempts keep theirs in `errors`).
    #[schema(required)]
    pub logs: Option<String>,
    /// What the successful attempt used (failed attempts keep theirs in `errors`); `null`
    /// while the task is live, for a dead task, or when it was not measured.
    #[schema(required, value_type = Option<crate::queue::AttemptUsage>)]
    pub usage: Option<Value>,
    #[schema(required)]
    pub finished_at: Option<DateTime<Utc>>,
    /// Set while a cancel of the running attempt is under way: the task will end
    /// `cancelled` (the attempt's history entry then holds it as `requested_at`).
    #[schema(required)]
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// While `blocked`: how many of its parents (`after`) have not ended yet.
    #[schema(required)]
    pub blocked_on: Option<i32>,
}

pub async fn get_task<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
    id: TaskId,
) -> Result<TaskView, QueueError> {
    let row: Option<TaskView> =
        sqlx::query_as(GET_TASK).bind(id).bind(tenant).fetch_optional(executor).await?;
    row.ok_or(QueueError::TaskNotFound(id))
}

/// A row of the dead-letter table.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct DeadTask {
    #[schema(value_type = i64)]
    pub id: TaskId,
    pub tenant: String,
    pub task_type: String,
    /// The task's input, a JSON object.
    #[schema(value_type = Object)]
    pub payload: Value,
    pub attempts: i32,
    pub max_attempts: i32,
    pub reason: String,
    #[schema(required)]
    pub last_error: Option<String>,
    /// Every failed attempt, oldest first.
    #[schema(value_type = Vec<AttemptError>)]
    pub errors: Value,
    #[schema(required)]
    pub module_sha256: Option<String>,
    pub created_at: DateTime<Utc>,
    pub died_at: DateTime<Utc>,
}

/// Dead tasks in id order, optionally of one task type, `limit` at a time after id `after`.
pub async fn list_dead<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
    task_type: Option<&str>,
    after: Option<TaskId>,
    limit: i64,
) -> Result<Vec<DeadTask>, QueueError> {
    Ok(sqlx::query_as(LIST_DEAD)
        .bind(tenant)
        .bind(task_type)
        .bind(after)
        .bind(limit.clamp(1, 1000))
        .fetch_all(executor)
        .await?)
}

/// The CTEs a cancel of waiting tasks (CTE `cancelled`, the deleted rows) adds for
/// dependencies: a blocked task's own edges go (its parents no longer count it), and
/// `children`, which the statement reads in a join with `cancelled`, decides the tasks waiting
/// for the cancelled ones (`sweep_parents_ended` in runner/sql/dependencies.sql).
macro_rules! cancel_dependencies {
    () => {
        concat!(
            "unlinked as (
                delete from sweep.task_deps
                where child = any(array(select id from cancelled where state = ",
            state!(blocked),
            "))
            ),
            children as (
                select sweep.sweep_parents_ended(array_agg(id), array_agg(",
            state!(cancelled),
            "::text), null) as changed
                from cancelled
            ),"
        )
    };
}

fn parse_state(s: &str) -> Result<TaskState, QueueError> {
    s.parse().map_err(QueueError::Corrupt)
}

const CANCEL: &str = concat!(
    r#"
    with cancelled as (
        delete from sweep.tasks
        where id = $1 and ($2::text is null or tenant = $2)
          and state in "#,
    state!(unclaimed),
    r#"
        returning *, "#,
    notify_done!(),
    r#"
    ),
    "#,
    cancel_dependencies!(),
    r#"
    moved as (
        insert into sweep.finished_tasks (id, tenant, task_type, payload, state, priority,
                                    attempts, max_attempts, run_at, dedup_key, last_error,
                                    errors, module_sha256, created_at, started_at)
        select id, tenant, task_type, payload, "#,
    state!(cancelled),
    r#", priority, attempts,
               max_attempts, run_at, dedup_key, last_error, errors, module_sha256,
               created_at, started_at
        from cancelled cross join children
        returning id
    ),
    -- A running row: record the request (the first one's time is kept) under the row lock,
    -- which orders it against the reports of the attempt (see the module doc).
    requested as (
        update sweep.tasks t
        set cancel_requested_at = coalesce(t.cancel_requested_at, now()), updated_at = now()
        where t.id = $1 and ($2::text is null or t.tenant = $2) and t.state = "#,
    state!(running),
    r#"
        returning t.id, t.attempts, t.lease_owner
    ),
    notified as (
        select r.attempts, r.lease_owner from requested r cross join lateral "#,
    notify_cancel!("r"),
    r#"
    )
    select (select id from moved),
           (select attempts from notified),
           (select lease_owner from notified),
           coalesce((select state from sweep.tasks
                     where id = $1 and ($2::text is null or tenant = $2)),
                    (select state from sweep.finished_tasks
                     where id = $1 and ($2::text is null or tenant = $2)),
                    (select "#,
    state!(dead),
    r#" from sweep.dead_tasks
                     where id = $1 and ($2::text is null or tenant = $2)))
    "#
);
/// One batch of a bulk cancel: waiting rows of the queue (`$3` one waiting state or all, `$4`
/// whether to take them) move to `finished_tasks`; running ones not asked yet (`$5`) get the
/// request and their runner a notification. Both lock in id order, as reports do.
const BULK_CANCEL: &str = concat!(
    r#"
    with doomed as (
        select id from sweep.tasks
        where tenant = $1 and task_type = $2 and state in "#,
    state!(unclaimed),
    r#"
          and ($3::text is null or state = $3) and $4
        order by id
        limit $6
        for update
    ),
    cancelled as (
        delete from sweep.tasks t where t.id = any(array(select id from doomed))
        returning t.*, "#,
    notify_done!(),
    r#"
    ),
    "#,
    cancel_dependencies!(),
    r#"
    moved as (
        insert into sweep.finished_tasks (id, tenant, task_type, payload, state, priority,
                                    attempts, max_attempts, run_at, dedup_key, last_error,
                                    errors, module_sha256, created_at, started_at)
        select id, tenant, task_type, payload, "#,
    state!(cancelled),
    r#", priority, attempts,
               max_attempts, run_at, dedup_key, last_error, errors, module_sha256,
               created_at, started_at
        from cancelled cross join children
        returning id
    ),
    asked as (
        select id from sweep.tasks
        where state = "#,
    state!(running),
    r#" and tenant = $1 and task_type = $2
          and cancel_requested_at is null and $5
        order by id
        limit $6
        for update
    ),
    requested as (
        update sweep.tasks t set cancel_requested_at = now(), updated_at = now()
        where t.id = any(array(select id from asked))
        returning t.id, t.attempts, t.lease_owner
    )
    select (select count(*) from moved),
           (select count(*) from requested r cross join lateral "#,
    notify_cancel!("r"),
    r#")
    "#
);
const REQUEUE: &str = concat!(
    r#"
        with revived as (
            delete from sweep.dead_tasks
            where id = $1 and ($2::text is null or tenant = $2)
            returning *
        ),
        inserted as (
            insert into sweep.tasks (id, tenant, task_type, payload, priority, max_attempts, dedup_key,
                               last_error, errors, module_sha256, created_at)
            select id, tenant, task_type, payload, priority, max_attempts, dedup_key,
                   last_error, errors, module_sha256, created_at
            from revived
            returning id, tenant, task_type, run_at
        ),
        "#,
    wake_queues_cte!("inserted"),
    r#"
        select id from inserted cross join woken_queues, lateral "#,
    notify_tasks!(),
    r#"
        "#
);

const GET_TASK: &str = concat!(
    r#"
    select id, tenant, task_type, state, payload, priority, attempts, max_attempts, run_at,
           dedup_key, last_error, errors, null as result, module_sha256, created_at,
           started_at, null as logs, null::jsonb as usage, null as finished_at,
           cancel_requested_at, blocked_on
    from sweep.tasks where id = $1 and ($2::text is null or tenant = $2)
    union all
    select id, tenant, task_type, state, payload, priority, attempts, max_attempts, run_at,
           dedup_key, last_error, errors, result, module_sha256, created_at, started_at,
           logs, usage, finished_at, null as cancel_requested_at, null::int4 as blocked_on
    from sweep.finished_tasks where id = $1 and ($2::text is null or tenant = $2)
    union all
    select id, tenant, task_type, "#,
    state!(dead),
    r#" as state, payload, priority, attempts,
           max_attempts, null as run_at, dedup_key, last_error, errors, null as result,
           module_sha256, created_at, started_at, null as logs, null::jsonb as usage,
           died_at as finished_at, null as cancel_requested_at, null::int4 as blocked_on
    from sweep.dead_tasks where id = $1 and ($2::text is null or tenant = $2)
    "#
);
const WATCH_TASK: &str = r#"
    update sweep.tasks set watched_at = now()
    where id = $1 and ($2::text is null or tenant = $2)
    "#;
const DELETE_TASKS: &str = r#"
    with finished as (
        delete from sweep.finished_tasks
        where id = any($1::int8[]) and ($2::text is null or tenant = $2)
        returning id
    ),
    dead as (
        delete from sweep.dead_tasks
        where id = any($1::int8[]) and ($2::text is null or tenant = $2)
        returning id
    )
    select id from finished union all select id from dead
    "#;
const LIST_DEAD: &str = r#"
    select id, tenant, task_type, payload, attempts, max_attempts, reason, last_error,
           errors, module_sha256, created_at, died_at
    from sweep.dead_tasks
    where ($1::text is null or tenant = $1)
      and ($2::text is null or task_type = $2)
      and id > coalesce($3, 0)
    order by id
    limit $4
    "#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] =
    statements![CANCEL, BULK_CANCEL, REQUEUE, GET_TASK, LIST_DEAD, DELETE_TASKS, WATCH_TASK];
