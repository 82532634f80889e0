//! Operations routes: the dead-letter table, queue statistics, health, readiness and
//! Prometheus metrics.
//!
//! Invariants: `/healthz` answers without touching the database; `/readyz` is 200 only when
//! the database answers and every migration is applied; `/metrics` is the operator's (it
//! names every tenant) and refreshes the task gauges from the queue before rendering.

use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::{Reply, Response};

use super::{json, Answer};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::models::{DeadPage, Health, RunnerView, StatsResponse};
use crate::admin::openapi as doc;
use crate::admin::params::{DeadParams, Query, TaskIdPath, TenantParam};
use crate::admin::AdminState;
use crate::queue::{self, StoreError, TaskId, TaskView};

/// Page size of `GET /v1/dead` unless `limit` says otherwise.
pub const DEFAULT_DEAD_PAGE: u64 = 100;
/// Largest page of `GET /v1/dead`.
pub const MAX_DEAD_PAGE: u64 = 1000;

/// `GET /v1/dead?task_type=&after=&limit=`: dead tasks in id order, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/dead",
    operation_id = "list_dead",
    tag = "dead",
    security(("bearer" = [])),
    params(TenantParam, DeadParams),
    responses(
        (status = 200, description = "A page of dead tasks in id order", body = DeadPage),
    )
)]
pub async fn dead(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let mut q = Query::new(query)?;
    let scope = caller.read_scope(q.take("tenant").as_deref())?;
    let task_type = q.take("task_type");
    let after = q.take_id("after")?;
    let limit = q.take_positive("limit")?.unwrap_or(DEFAULT_DEAD_PAGE);
    q.finish()?;
    if let Some(t) = &task_type {
        queue::validate_task_type(t)
            .map_err(|e| ApiError::bad_request("invalid_task_type", e.to_string()))?;
    }
    if limit > MAX_DEAD_PAGE {
        return Err(ApiError::bad_request(
            "invalid_parameter",
            format!("parameter `limit` must be at most {MAX_DEAD_PAGE}"),
        ));
    }
    let limit = i64::try_from(limit).unwrap_or(1);
    let tasks =
        queue::list_dead(state.store(), scope.as_deref(), task_type.as_deref(), after, limit)
            .await?;
    let full = usize::try_from(limit).is_ok_and(|l| tasks.len() == l);
    let next_after = if full { tasks.last().map(|t| t.id) } else { None };
    Ok(json(StatusCode::OK, &DeadPage { tasks, next_after }))
}

/// `POST /v1/dead/{id}/requeue`: back to pending with attempts reset, history kept.
#[utoipa::path(
    post,
    path = "/v1/dead/{id}/requeue",
    operation_id = "requeue_dead",
    tag = "dead",
    security(("bearer" = [])),
    params(TaskIdPath),
    responses(
        (status = 200, description = "The task, pending again", body = TaskView),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
    )
)]
pub async fn requeue(state: AdminState, caller: Caller, id: TaskId) -> Answer {
    queue::requeue(state.store(), caller.scope(), id).await?;
    let task = queue::get_task(state.store(), caller.scope(), id).await?;
    Ok(json(StatusCode::OK, &task))
}

/// `GET /v1/stats`: per task type counts and rates, and the runners with heartbeat ages.
#[utoipa::path(
    get,
    path = "/v1/stats",
    operation_id = "stats",
    tag = "ops",
    security(("bearer" = [])),
    params(TenantParam),
    responses(
        (status = 200, description = "Per tenant and task type, and the runners", body = StatsResponse),
    )
)]
pub async fn stats(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let mut q = Query::new(query)?;
    let scope = caller.read_scope(q.take("tenant").as_deref())?;
    q.finish()?;
    let types = queue::queue_stats(state.store(), scope.as_deref()).await?;
    let now = chrono::Utc::now();
    let operator = matches!(caller, Caller::Operator);
    let runners = queue::list_runners(state.store())
        .await?
        .into_iter()
        .map(|r| RunnerView::new(r, operator, now))
        .collect();
    let schedules = queue::list_schedules(state.store(), scope.as_deref()).await?;
    let queues = queue::list_queue_controls(state.store(), scope.as_deref()).await?;
    let paused_tenants = queue::list_paused_tenants(state.store(), scope.as_deref()).await?;
    Ok(json(StatusCode::OK, &StatsResponse { types, runners, schedules, queues, paused_tenants }))
}

/// `GET /healthz`: the process serves requests.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "ops",
    responses((status = 200, description = "The process serves requests", body = Health))
)]
pub fn healthz() -> Response {
    json(StatusCode::OK, &Health { status: "ok" })
}

/// `GET /readyz`: the database answers and its schema is current.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "ops",
    responses(
        (status = 200, description = "The database answers and every migration is applied", body = Health),
        (status = 503, response = doc::Unavailable),
    )
)]
pub async fn readyz(state: AdminState) -> Answer {
    match queue::check_schema(state.store()).await {
        Ok(()) => Ok(json(StatusCode::OK, &Health { status: "ready" })),
        Err(e @ (StoreError::Database(_) | StoreError::Connect(_))) => {
            tracing::warn!(error = %e, "readiness check: database unreachable");
            Err(ApiError::unavailable("database unreachable"))
        }
        Err(e) => Err(ApiError::unavailable(e.to_string())),
    }
}

/// `GET /metrics` (operator): Prometheus text format.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "ops",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
        (status = 403, response = doc::Forbidden),
        (status = 503, response = doc::Unavailable),
    )
)]
pub async fn metrics(state: AdminState, caller: Caller) -> Answer {
    if !matches!(caller, Caller::Operator) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            "metrics cover every tenant; they need the operator token",
        ));
    }
    let Some(handle) = state.metrics() else {
        return Err(ApiError::unavailable("the metrics recorder is not installed"));
    };
    let stats = queue::queue_stats(state.store(), None).await?;
    let runners = queue::list_runners(state.store()).await?;
    crate::metrics::set_queue_gauges(&stats, runners.len());
    let sandbox = state.sandbox();
    crate::metrics::set_instance_metrics(sandbox.warm_stats(), sandbox.warm_idle());
    let mut response = handle.render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}
