//! Task routes: enqueue one or a batch, show one, cancel one.
//!
//! Invariant: a task is only enqueued for a task type its tenant has an active module for
//! (anything else could only end in the dead-letter table); a batch is checked whole before
//! any of it is written.

use std::collections::HashSet;

use warp::http::StatusCode;

use super::{created_or_ok, json, Answer};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::models::{BatchResponse, EnqueueRequest};
use crate::admin::params::Query;
use crate::admin::AdminState;
use crate::queue::{self, NewTask, TaskId};

fn tenant_param(query: Vec<(String, String)>) -> Result<Option<String>, ApiError> {
    let mut q = Query::new(query)?;
    let tenant = q.take("tenant");
    q.finish()?;
    Ok(tenant)
}

/// Refuses task types `tenant` has no module for, naming them.
async fn check_modules(
    state: &AdminState,
    tenant: &str,
    tasks: &[NewTask],
) -> Result<(), ApiError> {
    let mut seen = HashSet::new();
    let types: Vec<String> =
        tasks.iter().map(|t| t.task_type.clone()).filter(|t| seen.insert(t.clone())).collect();
    let missing = queue::missing_modules(state.pool(), tenant, &types).await?;
    match missing.as_slice() {
        [] => Ok(()),
        [one] => Err(ApiError::unprocessable(
            "unknown_task_type",
            format!("no module is registered for task_type {one:?}; upload one with PUT /v1/modules/{one}"),
        )),
        many => Err(ApiError::unprocessable(
            "unknown_task_type",
            format!("no module is registered for task types {}", many.join(", ")),
        )),
    }
}

/// `POST /v1/tasks`: 201 with `{id, created: true}`, or 200 with the id of the live task that
/// already holds the `dedup_key` (`created: false`).
pub async fn enqueue(
    state: AdminState,
    caller: Caller,
    query: Vec<(String, String)>,
    request: EnqueueRequest,
) -> Answer {
    let requested = tenant_param(query)?;
    let (tenant, _) = caller.write_target(state.pool(), requested.as_deref()).await?;
    let task = request.into_task(&tenant)?;
    task.validate().map_err(|e| ApiError::from(queue::QueueError::from(e)))?;
    check_modules(&state, &tenant, std::slice::from_ref(&task)).await?;
    let enqueued = queue::enqueue(state.pool(), task).await?;
    Ok(created_or_ok(enqueued.created, &enqueued))
}

/// `POST /v1/tasks/batch` with an array of tasks: 201 with their ids in input order.
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
    let (tenant, _) = caller.write_target(state.pool(), requested.as_deref()).await?;
    let mut tasks = Vec::with_capacity(requests.len());
    for (index, request) in requests.into_iter().enumerate() {
        let in_batch =
            |e: ApiError| ApiError { message: format!("task {index}: {}", e.message), ..e };
        let task = request.into_task(&tenant).map_err(in_batch)?;
        task.validate().map_err(|e| in_batch(queue::QueueError::from(e).into()))?;
        tasks.push(task);
    }
    check_modules(&state, &tenant, &tasks).await?;
    let enqueued = queue::enqueue_many(state.pool(), &tasks).await?;
    Ok(json(StatusCode::CREATED, &BatchResponse { tasks: enqueued }))
}

/// `GET /v1/tasks/{id}`: state, attempts, error history, result and module of one task.
pub async fn show(state: AdminState, caller: Caller, id: TaskId) -> Answer {
    let task = queue::get_task(state.pool(), caller.scope(), id).await?;
    Ok(json(StatusCode::OK, &task))
}

/// `POST /v1/tasks/{id}/cancel`: a pending or retrying task becomes cancelled (409 once it
/// runs or has finished).
pub async fn cancel(state: AdminState, caller: Caller, id: TaskId) -> Answer {
    queue::cancel(state.pool(), caller.scope(), id).await?;
    let task = queue::get_task(state.pool(), caller.scope(), id).await?;
    Ok(json(StatusCode::OK, &task))
}
