//! Route handlers: each takes the state, the authenticated caller and the parsed request,
//! calls the queue or the sandbox, and answers JSON (or an [`ApiError`]).
//!
//! Invariant: every queue call passes the caller's tenant scope, so another tenant's rows
//! are never read or written and answer 404 as if absent.

pub mod modules;
pub mod ops;
pub mod queues;
pub mod schedules;
pub mod tasks;
pub mod tenants;

use serde::Serialize;
use warp::http::StatusCode;
use warp::reply::{Reply, Response};

use super::error::ApiError;

pub type Answer = Result<Response, ApiError>;

pub fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    warp::reply::with_status(warp::reply::json(body), status).into_response()
}

/// 201 when something was created, 200 when an identical thing already existed.
pub fn created_or_ok<T: Serialize>(created: bool, body: &T) -> Response {
    json(if created { StatusCode::CREATED } else { StatusCode::OK }, body)
}
