//! Operator actions and reads on single tasks: cancel, requeue from the dead-letter table,
//! show one task, list dead tasks.
//!
//! Scoping: every function takes `tenant: Option<&str>`; `Some(t)` sees only tenant `t`'s rows
//! (others answer "not found", as if absent), `None` is the operator and sees everything.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgExecutor;

use super::{error::is_unique_violation, QueueError, TaskId, TaskState};

/// Cancels a pending or retrying task, moving it to `finished_tasks`. A running, finished or
/// dead task is `NotCancellable`.
pub async fn cancel<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
    id: TaskId,
) -> Result<(), QueueError> {
    // The second column reads the row as it was before this statement's update.
    let (cancelled, before): (Option<TaskId>, Option<String>) =
        sqlx::query_as(CANCEL).bind(id).bind(tenant).fetch_one(executor).await?;
    match (cancelled, before) {
        (Some(_), _) => Ok(()),
        (None, None) => Err(QueueError::TaskNotFound(id)),
        (None, Some(state)) => Err(QueueError::NotCancellable { id, state: parse_state(&state)? }),
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
    /// `output_too_large`, `invalid_output`, `module_missing`, `lease_expired`, `runner_error`.
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
    /// The runner whose lease expired (`lease_expired`).
    #[schema(nullable = false)]
    pub runner: Option<String>,
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
    #[schema(required)]
    pub finished_at: Option<DateTime<Utc>>,
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

fn parse_state(s: &str) -> Result<TaskState, QueueError> {
    s.parse().map_err(QueueError::Corrupt)
}

const CANCEL: &str = concat!(
    r#"
    with cancelled as (
        delete from sweep.tasks
        where id = $1 and ($2::text is null or tenant = $2)
          and state in "#,
    state!(waiting),
    r#"
        returning *
    ),
    moved as (
        insert into sweep.finished_tasks (id, tenant, task_type, payload, state, priority,
                                    attempts, max_attempts, run_at, dedup_key, last_error,
                                    errors, module_sha256, created_at, started_at)
        select id, tenant, task_type, payload, "#,
    state!(cancelled),
    r#", priority, attempts,
               max_attempts, run_at, dedup_key, last_error, errors, module_sha256,
               created_at, started_at
        from cancelled
        returning id
    )
    select (select id from moved),
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
           started_at, null as logs, null as finished_at
    from sweep.tasks where id = $1 and ($2::text is null or tenant = $2)
    union all
    select id, tenant, task_type, state, payload, priority, attempts, max_attempts, run_at,
           dedup_key, last_error, errors, result, module_sha256, created_at, started_at,
           logs, finished_at
    from sweep.finished_tasks where id = $1 and ($2::text is null or tenant = $2)
    union all
    select id, tenant, task_type, "#,
    state!(dead),
    r#" as state, payload, priority, attempts,
           max_attempts, null as run_at, dedup_key, last_error, errors, null as result,
           module_sha256, created_at, started_at, null as logs, died_at as finished_at
    from sweep.dead_tasks where id = $1 and ($2::text is null or tenant = $2)
    "#
);
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
pub(super) const STATEMENTS: &[(&str, &str)] = statements![CANCEL, REQUEUE, GET_TASK, LIST_DEAD];
