//! Operations routes: the dead-letter table, queue statistics, tenants, health, readiness
//! and Prometheus metrics.
//!
//! Invariants: `/healthz` answers without touching the database; `/readyz` is 200 only when
//! the database answers and every migration is applied; `/metrics` is the operator's (it
//! names every tenant) and refreshes the task gauges from the queue before rendering.

use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::{Reply, Response};

use super::{json, Answer};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::models::{
    DeadPage, Health, RunnerView, StatsResponse, TenantsResponse, WeightRequest,
};
use crate::admin::params::Query;
use crate::admin::AdminState;
use crate::queue::{self, StoreError, TaskId};

/// Page size of `GET /v1/dead` unless `limit` says otherwise.
pub const DEFAULT_DEAD_PAGE: u64 = 100;
/// Largest page of `GET /v1/dead`.
pub const MAX_DEAD_PAGE: u64 = 1000;

/// `GET /v1/dead?task_type=&after=&limit=`: dead tasks in id order, a page at a time.
pub async fn dead(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let mut q = Query::new(query)?;
    let scope = caller.read_scope(q.take("tenant").as_deref())?;
    let task_type = q.take("task_type");
    let after = q.take_positive("after")?;
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
    let after = after.map(|a| TaskId::try_from(a).unwrap_or(TaskId::MAX));
    let limit = i64::try_from(limit).unwrap_or(1);
    let tasks =
        queue::list_dead(state.pool(), scope.as_deref(), task_type.as_deref(), after, limit)
            .await?;
    let full = usize::try_from(limit).is_ok_and(|l| tasks.len() == l);
    let next_after = if full { tasks.last().map(|t| t.id) } else { None };
    Ok(json(StatusCode::OK, &DeadPage { tasks, next_after }))
}

/// `POST /v1/dead/{id}/requeue`: back to pending with attempts reset, history kept.
pub async fn requeue(state: AdminState, caller: Caller, id: TaskId) -> Answer {
    queue::requeue(state.pool(), caller.scope(), id).await?;
    let task = queue::get_task(state.pool(), caller.scope(), id).await?;
    Ok(json(StatusCode::OK, &task))
}

/// `GET /v1/stats`: per task type counts and rates, and the runners with heartbeat ages.
pub async fn stats(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let mut q = Query::new(query)?;
    let scope = caller.read_scope(q.take("tenant").as_deref())?;
    q.finish()?;
    let types = queue::queue_stats(state.pool(), scope.as_deref()).await?;
    let now = chrono::Utc::now();
    let operator = matches!(caller, Caller::Operator);
    let runners = queue::list_runners(state.pool())
        .await?
        .into_iter()
        .map(|r| RunnerView::new(r, operator, now))
        .collect();
    Ok(json(StatusCode::OK, &StatsResponse { types, runners }))
}

/// `GET /v1/tenants`: every tenant for the operator; a tenant sees itself.
pub async fn tenants(state: AdminState, caller: Caller) -> Answer {
    let tenants = match caller {
        Caller::Operator => queue::list_tenants(state.pool()).await?,
        Caller::Tenant(t) => vec![t],
    };
    Ok(json(StatusCode::OK, &TenantsResponse { tenants }))
}

/// `PUT /v1/tenants/{name}/weight` (operator): the tenant's fair-share weight.
pub async fn set_weight(
    state: AdminState,
    caller: Caller,
    name: String,
    request: WeightRequest,
) -> Answer {
    if !matches!(caller, Caller::Operator) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            "tenant weights are set by the operator",
        ));
    }
    let tenant = queue::set_tenant_weight(state.pool(), &name, request.weight).await?;
    tracing::info!(tenant = %tenant.name, weight = tenant.weight, "tenant weight set");
    Ok(json(StatusCode::OK, &tenant))
}

/// `GET /healthz`: the process serves requests.
pub fn healthz() -> Response {
    json(StatusCode::OK, &Health { status: "ok" })
}

/// `GET /readyz`: the database answers and its schema is current.
pub async fn readyz(state: AdminState) -> Answer {
    match queue::check_schema(state.pool()).await {
        Ok(()) => Ok(json(StatusCode::OK, &Health { status: "ready" })),
        Err(e @ (StoreError::Database(_) | StoreError::Connect(_))) => {
            tracing::warn!(error = %e, "readiness check: database unreachable");
            Err(ApiError::unavailable("database unreachable"))
        }
        Err(e) => Err(ApiError::unavailable(e.to_string())),
    }
}

/// `GET /metrics` (operator): Prometheus text format.
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
    let stats = queue::queue_stats(state.pool(), None).await?;
    let runners = queue::list_runners(state.pool()).await?;
    crate::metrics::set_queue_gauges(&stats, runners.len());
    let mut response = handle.render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}
