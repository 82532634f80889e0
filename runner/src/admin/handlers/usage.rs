//! `GET /v1/usage`: what a tenant's tasks used, per task type and UTC day.
//!
//! Invariants: a tenant reads only its own totals; the operator reads every tenant's or
//! names one; a range is at most [`MAX_USAGE_DAYS`] days, `from` not after `to`.

use chrono::{Datelike, NaiveDate, Utc};
use warp::http::StatusCode;

use super::{json, Answer};
use crate::admin::auth::Caller;
use crate::admin::capability_models::UsageResponse;
use crate::admin::error::ApiError;
use crate::admin::openapi as doc;
use crate::admin::params::{Query, TenantParam, UsageParams};
use crate::admin::AdminState;
use crate::queue::{self, MAX_USAGE_DAYS};

/// `GET /v1/usage?from=YYYY-MM-DD&to=YYYY-MM-DD`: totals per tenant, task type and day, and
/// per tenant and task type over the range. Default range: the month of `to` (default
/// today, UTC) up to `to`.
#[utoipa::path(
    get,
    path = "/v1/usage",
    operation_id = "get_usage",
    tag = "ops",
    security(("bearer" = [])),
    params(TenantParam, UsageParams),
    responses(
        (status = 200, description = "Usage per tenant, task type and day, and totals over the range", body = UsageResponse),
        (status = 422, response = doc::Unprocessable),
    )
)]
pub async fn usage(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let mut q = Query::new(query)?;
    let scope = caller.read_scope(q.take("tenant").as_deref())?;
    let task_type = q.take("task_type");
    let from = q.take("from").map(|v| day("from", &v)).transpose()?;
    let to = q.take("to").map(|v| day("to", &v)).transpose()?;
    q.finish()?;
    if let Some(t) = &task_type {
        queue::validate_task_type(t)
            .map_err(|e| ApiError::bad_request("invalid_task_type", e.to_string()))?;
    }
    let to = to.unwrap_or_else(|| Utc::now().date_naive());
    let from = from.unwrap_or_else(|| to.with_day(1).unwrap_or(to));
    if from > to {
        return Err(ApiError::unprocessable(
            "invalid_range",
            format!("from ({from}) is after to ({to})"),
        ));
    }
    if (to - from).num_days() >= MAX_USAGE_DAYS {
        return Err(ApiError::unprocessable(
            "invalid_range",
            format!("a range is at most {MAX_USAGE_DAYS} days"),
        ));
    }
    let days =
        queue::usage_days(state.store(), scope.as_deref(), task_type.as_deref(), from, to).await?;
    Ok(json(StatusCode::OK, &UsageResponse::new(from, to, days)))
}

fn day(name: &str, raw: &str) -> Result<NaiveDate, ApiError> {
    let parsed = match raw.len() {
        10 => NaiveDate::parse_from_str(raw, "%Y-%m-%d").ok(),
        _ => None,
    };
    parsed.ok_or_else(|| {
        ApiError::bad_request(
            "invalid_parameter",
            format!("`{name}` must be a date, YYYY-MM-DD (UTC), got {raw:?}"),
        )
    })
}
