//! Workflow routes: create a workflow (named steps and their dependencies, one transaction),
//! show one with each step's state and result, list a tenant's, cancel one.
//!
//! Invariants: a workflow is written only when all of it is valid (names, dependencies, no
//! cycle, every task valid, within the tenant's payload limit, of a task type it has a module
//! for); otherwise a 4xx naming the step, and nothing is written. Another tenant's workflow
//! answers 404, as if absent.

use warp::http::StatusCode;

use super::{check_modules, json, payload_limit, tenant_param, Answer};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::models::{CreateWorkflowRequest, WorkflowsResponse};
use crate::admin::openapi as doc;
use crate::admin::params::{Query, TenantParam, WorkflowIdPath, WorkflowListParams};
use crate::admin::AdminState;
use crate::queue::{self, CreatedWorkflow, NewTask, WorkflowCancel, WorkflowView};

/// `POST /v1/workflows`: 201 with the workflow's id and each step's task id.
#[utoipa::path(
    post,
    path = "/v1/workflows",
    operation_id = "create_workflow",
    tag = "workflows",
    security(("bearer" = [])),
    params(TenantParam),
    request_body(content = CreateWorkflowRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Created: the workflow's id and each step's task, in request order", body = CreatedWorkflow),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
    )
)]
pub async fn create(
    state: AdminState,
    caller: Caller,
    query: Vec<(String, String)>,
    request: CreateWorkflowRequest,
) -> Answer {
    let requested = tenant_param(query)?;
    let (tenant, caps) = caller.write_target(state.store(), requested.as_deref()).await?;
    let steps = request.into_steps()?;
    queue::plan_workflow(&steps).map_err(queue::QueueError::from)?;
    let tasks: Vec<NewTask> = steps.iter().map(|s| s.task.clone()).collect();
    check_modules(&state, &tenant, &tasks).await?;
    let limit = payload_limit(&state, &caps);
    let created = queue::create_workflow(state.store(), &tenant, &steps, limit).await?;
    Ok(json(StatusCode::CREATED, &created))
}

/// `GET /v1/workflows/{id}`: the workflow and each step's state and result.
#[utoipa::path(
    get,
    path = "/v1/workflows/{id}",
    operation_id = "show_workflow",
    tag = "workflows",
    security(("bearer" = [])),
    params(WorkflowIdPath),
    responses(
        (status = 200, description = "The workflow, its steps in dependency order", body = WorkflowView),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn show(state: AdminState, caller: Caller, id: i64) -> Answer {
    let workflow = queue::get_workflow(state.store(), caller.scope(), id).await?;
    Ok(json(StatusCode::OK, &workflow))
}

/// `GET /v1/workflows`: the tenant's workflows, newest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/workflows",
    operation_id = "list_workflows",
    tag = "workflows",
    security(("bearer" = [])),
    params(WorkflowListParams),
    responses(
        (status = 200, description = "Newest first, each with its steps counted by state", body = WorkflowsResponse),
    )
)]
pub async fn list(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let mut q = Query::new(query)?;
    let requested = q.take("tenant");
    let before = q.take_id("before")?;
    let limit = match q.take_positive("limit")? {
        None => 20,
        Some(n) if n <= 100 => n as i64,
        Some(n) => {
            return Err(ApiError::bad_request(
                "invalid_parameter",
                format!("parameter `limit` must be at most 100, got {n}"),
            ))
        }
    };
    q.finish()?;
    let scope = caller.read_scope(requested.as_deref())?;
    let workflows =
        queue::list_workflows(state.store(), scope.as_deref(), before, limit + 1).await?;
    let more = workflows.len() as i64 > limit;
    let mut workflows = workflows;
    workflows.truncate(limit as usize);
    let next_before = if more { workflows.last().map(|w| w.id) } else { None };
    Ok(json(StatusCode::OK, &WorkflowsResponse { workflows, next_before }))
}

/// `POST /v1/workflows/{id}/cancel`: cancels every step that has not ended (running ones by
/// request, as `POST /v1/tasks/{id}/cancel` does); answers the counts.
#[utoipa::path(
    post,
    path = "/v1/workflows/{id}/cancel",
    operation_id = "cancel_workflow",
    tag = "workflows",
    security(("bearer" = [])),
    params(WorkflowIdPath),
    responses(
        (status = 200, description = "Steps cancelled (`cancelled`) and running steps asked to stop (`cancel_requested`; each ends `cancelled`)", body = WorkflowCancel),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn cancel(state: AdminState, caller: Caller, id: i64) -> Answer {
    let done = queue::cancel_workflow(state.store(), caller.scope(), id).await?;
    Ok(json(StatusCode::OK, &done))
}

impl From<queue::InvalidWorkflow> for ApiError {
    fn from(e: queue::InvalidWorkflow) -> Self {
        queue::QueueError::from(e).into()
    }
}
