//! Flow-control routes: pausing and resuming a task type (its tenant, or the operator with
//! `?tenant=`) and a whole tenant (the operator); setting and clearing a task type's rate
//! limit.
//!
//! Invariants: a tenant acts on its own task types only (another tenant's answers 404 as if
//! absent, since the queue functions filter by tenant); a task type with no module answers
//! 404 naming `task_type`, and nothing is written; pausing and resuming are idempotent; a
//! rate or burst out of range is 422 naming the field, nothing written.

use warp::http::StatusCode;

use super::{json, Answer};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::models::RateLimitRequest;
use crate::admin::openapi as doc;
use crate::admin::params::{Query, TaskTypePath, TenantParam, TenantPath};
use crate::admin::AdminState;
use crate::queue::{self, FlowError, QueueControl, RateLimit, TenantPause};

impl From<FlowError> for ApiError {
    fn from(e: FlowError) -> Self {
        match e {
            FlowError::Queue(q) => q.into(),
            e @ (FlowError::NoModule { .. } | FlowError::TenantNotFound(_)) => {
                ApiError::not_found(e.to_string())
            }
            e @ FlowError::BadName(_) => ApiError::bad_request("invalid_parameter", e.to_string()),
            e @ FlowError::BadRateLimit { .. } => {
                ApiError::unprocessable("invalid_rate_limit", e.to_string())
            }
        }
    }
}

fn by(caller: &Caller) -> String {
    match caller {
        Caller::Operator => queue::paused_by_operator(),
        Caller::Tenant(t) => queue::paused_by_tenant(&t.name),
    }
}

/// The tenant a queue route acts on (`?tenant=`, operator only) and the checked task type.
async fn target(
    state: &AdminState,
    caller: &Caller,
    task_type: &str,
    query: Vec<(String, String)>,
) -> Result<String, ApiError> {
    queue::validate_task_type(task_type)
        .map_err(|e| ApiError::bad_request("invalid_task_type", e.to_string()))?;
    let mut q = Query::new(query)?;
    let tenant = q.take("tenant");
    q.finish()?;
    let (tenant, _) = caller.write_target(state.store(), tenant.as_deref()).await?;
    Ok(tenant)
}

/// `POST /v1/queues/{task_type}/pause`: claims skip this task type from now on; enqueues are
/// still accepted, running tasks finish.
#[utoipa::path(
    post,
    path = "/v1/queues/{task_type}/pause",
    operation_id = "pause_queue",
    tag = "queues",
    security(("bearer" = [])),
    params(TaskTypePath, TenantParam),
    responses(
        (status = 200, description = "The queue, paused (a pause already in place is kept, with its time and author)", body = QueueControl),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn pause(
    state: AdminState,
    caller: Caller,
    task_type: String,
    query: Vec<(String, String)>,
) -> Answer {
    let tenant = target(&state, &caller, &task_type, query).await?;
    let control = queue::pause_queue(state.store(), &tenant, &task_type, &by(&caller)).await?;
    tracing::info!(%tenant, %task_type, by = ?control.paused_by, "queue paused");
    Ok(json(StatusCode::OK, &control))
}

/// `POST /v1/queues/{task_type}/resume`: lifts the task type's own pause (a pause of the whole
/// tenant stays).
#[utoipa::path(
    post,
    path = "/v1/queues/{task_type}/resume",
    operation_id = "resume_queue",
    tag = "queues",
    security(("bearer" = [])),
    params(TaskTypePath, TenantParam),
    responses(
        (status = 200, description = "The queue as it now is (`paused` stays true while its tenant is paused)", body = QueueControl),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn resume(
    state: AdminState,
    caller: Caller,
    task_type: String,
    query: Vec<(String, String)>,
) -> Answer {
    let tenant = target(&state, &caller, &task_type, query).await?;
    let control = queue::resume_queue(state.store(), &tenant, &task_type).await?;
    tracing::info!(%tenant, %task_type, "queue resumed");
    Ok(json(StatusCode::OK, &control))
}

/// `PUT /v1/queues/{task_type}/rate-limit`: at most `burst` starts at once and `rate_per_sec`
/// on average, across all runners.
#[utoipa::path(
    put,
    path = "/v1/queues/{task_type}/rate-limit",
    operation_id = "set_rate_limit",
    tag = "queues",
    security(("bearer" = [])),
    params(TaskTypePath, TenantParam),
    request_body(content = RateLimitRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The queue with its rate limit", body = QueueControl),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
    )
)]
pub async fn set_rate_limit(
    state: AdminState,
    caller: Caller,
    task_type: String,
    query: Vec<(String, String)>,
    request: RateLimitRequest,
) -> Answer {
    let limit = RateLimit { rate_per_sec: request.rate_per_sec, burst: request.burst };
    // Checked before anything is read, as the queue checks it again before writing.
    limit.validate()?;
    let tenant = target(&state, &caller, &task_type, query).await?;
    let control = queue::set_rate_limit(state.store(), &tenant, &task_type, Some(limit)).await?;
    tracing::info!(%tenant, %task_type, rate = limit.rate_per_sec, burst = limit.burst, "rate limit set");
    Ok(json(StatusCode::OK, &control))
}

/// `DELETE /v1/queues/{task_type}/rate-limit`: no rate limit from the next claim on.
#[utoipa::path(
    delete,
    path = "/v1/queues/{task_type}/rate-limit",
    operation_id = "clear_rate_limit",
    tag = "queues",
    security(("bearer" = [])),
    params(TaskTypePath, TenantParam),
    responses(
        (status = 200, description = "The queue, without a rate limit", body = QueueControl),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn clear_rate_limit(
    state: AdminState,
    caller: Caller,
    task_type: String,
    query: Vec<(String, String)>,
) -> Answer {
    let tenant = target(&state, &caller, &task_type, query).await?;
    let control = queue::set_rate_limit(state.store(), &tenant, &task_type, None).await?;
    tracing::info!(%tenant, %task_type, "rate limit cleared");
    Ok(json(StatusCode::OK, &control))
}

fn operator_only(caller: &Caller) -> Result<(), ApiError> {
    match caller {
        Caller::Operator => Ok(()),
        Caller::Tenant(_) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            "a whole tenant is paused and resumed by the operator (pause a task type with \
             POST /v1/queues/{task_type}/pause)",
        )),
    }
}

/// `POST /v1/tenants/{name}/pause` (operator): claims skip every task type of the tenant.
#[utoipa::path(
    post,
    path = "/v1/tenants/{name}/pause",
    operation_id = "pause_tenant",
    tag = "tenants",
    security(("bearer" = [])),
    params(TenantPath),
    responses(
        (status = 200, description = "The tenant, paused (a pause already in place is kept)", body = TenantPause),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn pause_tenant(state: AdminState, caller: Caller, name: String) -> Answer {
    operator_only(&caller)?;
    let paused = queue::pause_tenant(state.store(), &name, &by(&caller)).await?;
    tracing::info!(tenant = %name, "tenant paused");
    Ok(json(StatusCode::OK, &paused))
}

/// `POST /v1/tenants/{name}/resume` (operator): lifts the tenant's pause (task types it paused
/// itself stay paused).
#[utoipa::path(
    post,
    path = "/v1/tenants/{name}/resume",
    operation_id = "resume_tenant",
    tag = "tenants",
    security(("bearer" = [])),
    params(TenantPath),
    responses(
        (status = 200, description = "The tenant, not paused", body = TenantPause),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn resume_tenant(state: AdminState, caller: Caller, name: String) -> Answer {
    operator_only(&caller)?;
    let resumed = queue::resume_tenant(state.store(), &name).await?;
    tracing::info!(tenant = %name, "tenant resumed");
    Ok(json(StatusCode::OK, &resumed))
}
