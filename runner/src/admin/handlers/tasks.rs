//! Task routes: enqueue one or a batch, show one, cancel one or all of a task type.
//!
//! Invariants: a task is only enqueued for a task type its tenant has an active module for
//! (anything else could only end in the dead-letter table); a payload larger than the
//! tenant's limit (`max_payload_bytes`, else the deployment's) is refused with 413
//! `payload_too_large`; a batch is checked whole before any of it is written.

use warp::http::StatusCode;

use super::{check_modules, created_or_ok, json, payload_limit, tenant_param, Answer};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::models::{BatchResponse, CancelTasksRequest, EnqueueRequest, TaskPage};
use crate::admin::openapi as doc;
use crate::admin::params::{Query, TaskIdPath, TaskListParams, TaskQuery, TenantParam, WaitParam};
use crate::admin::wait;
use crate::admin::AdminState;
use crate::queue::{
    self, BulkCancel, Cancel, CheckedTasks, Enqueued, InvalidTask, QueueError, TaskId, TaskState,
    TaskView,
};

/// `POST /v1/tasks`: 201 with `{id, created: true}`, or 200 with the id of the live task that
/// already holds the `dedup_key` (`created: false`).
#[utoipa::path(
    post,
    path = "/v1/tasks",
    operation_id = "enqueue",
    tag = "tasks",
    security(("bearer" = [])),
    params(TenantParam),
    request_body(content = EnqueueRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Enqueued", body = Enqueued),
        (status = 200, description = "A live task holds the `dedup_key`: its id, nothing created", body = Enqueued),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
    )
)]
pub async fn enqueue(
    state: AdminState,
    caller: Caller,
    query: Vec<(String, String)>,
    request: EnqueueRequest,
) -> Answer {
    let requested = tenant_param(query)?;
    let (tenant, caps) = caller.write_target(state.store(), requested.as_deref()).await?;
    let limit = payload_limit(&state, &caps);
    let task = [request.into_task(&tenant)?];
    let checked = CheckedTasks::check(&task, limit)
        .map_err(|e| ApiError::from(QueueError::from(e.into_innermost())))?;
    check_modules(&state, &tenant, checked.tasks()).await?;
    let enqueued = queue::enqueue_checked(state.store(), &checked).await.map_err(|e| match e {
        // One task: its error is the task's own (an `after` entry it names), not the batch's.
        QueueError::Invalid(invalid) => QueueError::Invalid(invalid.into_innermost()),
        other => other,
    })?;
    let enqueued =
        enqueued.first().ok_or_else(|| QueueError::Corrupt("enqueue returned no id".into()))?;
    Ok(created_or_ok(enqueued.created, enqueued))
}

/// `POST /v1/tasks/batch` with an array of tasks: 201 with their ids in input order. The body
/// was read by `enqueue_input::parse_batch` (at most `max_batch` elements); a large batch is
/// written by `COPY` (`queue/copy.rs`).
#[utoipa::path(
    post,
    path = "/v1/tasks/batch",
    operation_id = "enqueue_batch",
    tag = "tasks",
    security(("bearer" = [])),
    params(TenantParam),
    request_body(
        description = "At most `max_batch` tasks (default 10 000) in at most `max_json_bytes` (default 8 MiB); all are enqueued or none, and an error names the task's index (and the field)",
        content = Vec<EnqueueRequest>,
        content_type = "application/json",
    ),
    responses(
        (status = 201, description = "One entry per task, in input order (`created: false` where a live task held the `dedup_key`)", body = BatchResponse),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
    )
)]
pub async fn enqueue_batch(
    state: AdminState,
    caller: Caller,
    query: Vec<(String, String)>,
    requests: Vec<EnqueueRequest>,
) -> Answer {
    let requested = tenant_param(query)?;
    let max = state.config().max_batch;
    if requests.len() > max {
        return Err(ApiError::unprocessable(
            "batch_too_large",
            format!("a batch holds at most {max} tasks, got {}", requests.len()),
        ));
    }
    let (tenant, caps) = caller.write_target(state.store(), requested.as_deref()).await?;
    let limit = payload_limit(&state, &caps);
    let in_batch = |index: usize, e: ApiError| ApiError {
        message: format!("task {index}: {}", e.message),
        ..e
    };
    // The first bad element's error wins, whichever check finds it: the tasks before an
    // element that is not a task are checked first.
    let mut tasks = Vec::with_capacity(requests.len());
    let mut not_a_task = None;
    for (index, request) in requests.into_iter().enumerate() {
        match request.into_task(&tenant) {
            Ok(task) => tasks.push(task),
            Err(e) => {
                not_a_task = Some(in_batch(index, e));
                break;
            }
        }
    }
    let checked = CheckedTasks::check(&tasks, limit).map_err(|e| match e {
        InvalidTask::InBatch { index, source } => in_batch(index, QueueError::from(*source).into()),
        other => QueueError::from(other).into(),
    })?;
    if let Some(e) = not_a_task {
        return Err(e);
    }
    check_modules(&state, &tenant, checked.tasks()).await?;
    let enqueued = queue::enqueue_checked(state.store(), &checked).await.map_err(|e| match e {
        // An `after` entry the database refused, named as the checks above name an error.
        QueueError::Invalid(InvalidTask::InBatch { index, source }) => {
            in_batch(index, QueueError::from(*source).into())
        }
        other => other.into(),
    })?;
    Ok(json(StatusCode::CREATED, &BatchResponse { tasks: enqueued }))
}

/// `GET /v1/tasks/{id}`: state, attempts, error history, result and module of one task; with
/// `?wait=`, once it has ended or the wait ran out.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}",
    operation_id = "show_task",
    tag = "tasks",
    security(("bearer" = [])),
    params(TaskIdPath, WaitParam),
    responses(
        (status = 200, description = "The task: live, finished or dead (with `wait`: ended, or still live when the wait ran out)", body = TaskView),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn show(
    state: AdminState,
    caller: Caller,
    id: TaskId,
    query: Vec<(String, String)>,
) -> Answer {
    let mut q = Query::new(query)?;
    let wait = q.take("wait").map(|w| wait::parse_wait(&w)).transpose()?;
    q.finish()?;
    let task = match wait {
        Some(wait) => wait::until_ended(&state, caller.scope(), id, wait).await?,
        None => queue::get_task(state.store(), caller.scope(), id).await?,
    };
    Ok(json(StatusCode::OK, &task))
}

/// `GET /v1/tasks`: the tasks the filter matches (the dashboard's task list), newest first,
/// a page at a time.
#[utoipa::path(
    get,
    path = "/v1/tasks",
    operation_id = "list_tasks",
    tag = "tasks",
    security(("bearer" = [])),
    params(TenantParam, TaskListParams),
    responses(
        (status = 200, description = "A page of tasks, newest first, across live, finished and dead tasks", body = TaskPage),
    )
)]
pub async fn list(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let mut q = Query::new(query)?;
    let scope = caller.read_scope(q.take("tenant").as_deref())?;
    let TaskQuery { filter, .. } = TaskQuery::take(&mut q, scope)?;
    q.finish()?;
    let tasks = queue::list_tasks(state.store(), &filter).await?;
    let full = usize::try_from(filter.limit).is_ok_and(|l| tasks.len() == l);
    let next_before = if full { tasks.last().map(|t| t.id) } else { None };
    Ok(json(StatusCode::OK, &TaskPage { tasks, next_before }))
}

/// `POST /v1/tasks/{id}/cancel`: a pending or retrying task is cancelled (200); a running
/// one is asked to stop (202: its runner stops the instance and the task ends `cancelled`);
/// a task that already finished or died is 409 `not_cancellable`, naming the state it ended
/// in (a completion that committed before the cancel won the race).
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/cancel",
    operation_id = "cancel_task",
    tag = "tasks",
    security(("bearer" = [])),
    params(TaskIdPath),
    responses(
        (status = 200, description = "The task was pending or retrying: it is cancelled now", body = TaskView),
        (status = 202, description = "The task is running: the cancel is recorded (`cancel_requested_at`) and its runner is stopping the instance. The task will end `cancelled` (a report that comes now cannot win any more); read it again with GET /v1/tasks/{id}", body = TaskView),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
    )
)]
pub async fn cancel(state: AdminState, caller: Caller, id: TaskId) -> Answer {
    let done = queue::cancel(state.store(), caller.scope(), id).await?;
    let task = queue::get_task(state.store(), caller.scope(), id).await?;
    let status = match done {
        Cancel::Cancelled => StatusCode::OK,
        Cancel::Requested { .. } => StatusCode::ACCEPTED,
    };
    Ok(json(status, &task))
}

/// `POST /v1/tasks/cancel`: cancels every live task of one task type of the tenant (or only
/// those in one state), as the single cancel does each: waiting ones at once, running ones by
/// request. Answers the counts.
#[utoipa::path(
    post,
    path = "/v1/tasks/cancel",
    operation_id = "cancel_tasks",
    tag = "tasks",
    security(("bearer" = [])),
    params(TenantParam),
    request_body(content = CancelTasksRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "What was cancelled (`cancelled`) and which running tasks were asked to stop (`cancel_requested`; each ends `cancelled`)", body = BulkCancel),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn cancel_many(
    state: AdminState,
    caller: Caller,
    query: Vec<(String, String)>,
    request: CancelTasksRequest,
) -> Answer {
    let requested = tenant_param(query)?;
    queue::validate_task_type(&request.task_type)
        .map_err(|e| ApiError::bad_request("invalid_task_type", e.to_string()))?;
    let only = match request.state.as_deref() {
        None => None,
        Some(name) => match name.parse::<TaskState>() {
            Ok(s) if s.is_live() => Some(s),
            _ => {
                return Err(ApiError::bad_request(
                    "invalid_state",
                    format!(
                        "state must be one of {}, {}, {} or {} (a live state), got {name:?}",
                        TaskState::Blocked,
                        TaskState::Pending,
                        TaskState::Retrying,
                        TaskState::Running
                    ),
                ))
            }
        },
    };
    let (tenant, _) = caller.write_target(state.store(), requested.as_deref()).await?;
    let done = queue::cancel_matching(state.store(), &tenant, &request.task_type, only).await?;
    Ok(json(StatusCode::OK, &done))
}
