//! Route handlers: each takes the state, the authenticated caller and the parsed request,
//! calls the queue or the sandbox, and answers JSON (or an [`ApiError`]).
//!
//! Invariant: every queue call passes the caller's tenant scope, so another tenant's rows
//! are never read or written and answer 404 as if absent.

pub mod egress;
pub mod modules;
pub mod ops;
pub mod queues;
pub mod schedules;
pub mod secrets;
pub mod tasks;
pub mod tenants;
pub mod usage;
pub mod workflows;

use serde::Serialize;
use warp::http::StatusCode;
use warp::reply::{Reply, Response};

use std::collections::HashSet;

use super::error::ApiError;
use super::params::Query;
use super::AdminState;
use crate::queue::{self, NewTask, TenantCaps};

pub type Answer = Result<Response, ApiError>;

pub fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    warp::reply::with_status(warp::reply::json(body), status).into_response()
}

/// 201 when something was created, 200 when an identical thing already existed.
pub fn created_or_ok<T: Serialize>(created: bool, body: &T) -> Response {
    json(if created { StatusCode::CREATED } else { StatusCode::OK }, body)
}

/// The payload limit of a tenant with these caps: its own, else the deployment's.
pub fn payload_limit(state: &AdminState, caps: &TenantCaps) -> usize {
    caps.max_payload_bytes
        .and_then(|v| usize::try_from(v).ok())
        .unwrap_or(state.config().max_payload_bytes)
}

pub fn tenant_param(query: Vec<(String, String)>) -> Result<Option<String>, ApiError> {
    let mut q = Query::new(query)?;
    let tenant = q.take("tenant");
    q.finish()?;
    Ok(tenant)
}

/// Refuses task types `tenant` has no module for, naming them.
pub async fn check_modules(
    state: &AdminState,
    tenant: &str,
    tasks: &[NewTask],
) -> Result<(), ApiError> {
    let mut seen = HashSet::new();
    let types: Vec<String> = tasks
        .iter()
        .map(|t| t.task_type.as_str())
        .filter(|t| seen.insert(*t))
        .map(str::to_owned)
        .collect();
    let missing = queue::missing_modules(state.store(), tenant, &types).await?;
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
