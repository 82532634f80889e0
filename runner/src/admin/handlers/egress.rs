//! A tenant's egress policy: `GET` and `PUT /v1/tenants/{name}/egress`.
//!
//! Invariants: only the operator sets a policy (a tenant token gets 403 before anything is
//! read); a tenant reads its own, and another tenant's name answers 404 as if absent; an
//! allow list is stored only as `EgressPolicy::parse` gives it back (canonical entries), and a
//! bad entry is a 422 naming its index, the entry and what is wrong with it.

use warp::http::StatusCode;

use super::{json, Answer};
use crate::admin::auth::Caller;
use crate::admin::capability_models::{
    EgressRequest, EgressResponse, MAX_HTTP_REQUESTS, MAX_HTTP_REQUEST_TIMEOUT_MS,
    MAX_HTTP_RESPONSE_BYTES,
};
use crate::admin::error::ApiError;
use crate::admin::openapi as doc;
use crate::admin::params::TenantPath;
use crate::admin::AdminState;
use crate::queue::{self, TenantEgress, DEFAULT_TENANT};
use crate::sandbox::{EgressPolicy, HttpLimits};

/// 404 unless `name` is a tenant (or `default`, which needs no row).
async fn check_tenant(state: &AdminState, name: &str) -> Result<(), ApiError> {
    queue::validate_tenant(name)
        .map_err(|e| ApiError::bad_request("invalid_tenant", e.to_string()))?;
    if name == DEFAULT_TENANT || queue::get_tenant(state.store(), name).await?.is_some() {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("tenant {name:?} not found")))
    }
}

/// `GET /v1/tenants/{name}/egress`: the operator reads any tenant's, a tenant its own.
#[utoipa::path(
    get,
    path = "/v1/tenants/{name}/egress",
    operation_id = "get_tenant_egress",
    tag = "tenants",
    security(("bearer" = [])),
    params(TenantPath),
    responses(
        (status = 200, description = "The tenant's egress policy and the HTTP limits its tasks run under", body = EgressResponse),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn show(state: AdminState, caller: Caller, name: String) -> Answer {
    if caller.scope().is_some_and(|own| own != name) {
        return Err(ApiError::not_found(format!("tenant {name:?} not found")));
    }
    check_tenant(&state, &name).await?;
    let egress = queue::get_egress(state.store(), &name).await?;
    Ok(json(StatusCode::OK, &EgressResponse::new(egress, HttpLimits::DEFAULT)))
}

/// `PUT /v1/tenants/{name}/egress` (operator): replaces the tenant's allow list and HTTP limit
/// overrides. Applies to tasks started after the runners' capability caches (5 s) turn over.
#[utoipa::path(
    put,
    path = "/v1/tenants/{name}/egress",
    operation_id = "set_tenant_egress",
    tag = "tenants",
    security(("bearer" = [])),
    params(TenantPath),
    request_body(content = EgressRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The policy as stored (entries in canonical form)", body = EgressResponse),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
    )
)]
pub async fn set(
    state: AdminState,
    caller: Caller,
    name: String,
    request: EgressRequest,
) -> Answer {
    if !matches!(caller, Caller::Operator) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            "egress policies are set by the operator",
        ));
    }
    check_tenant(&state, &name).await?;
    let policy = EgressPolicy::parse(&request.allow)
        .map_err(|e| ApiError::unprocessable("invalid_egress", format!("allow: {e}")))?;
    let egress = TenantEgress {
        tenant: name,
        allow: policy.entries(),
        max_requests: bounded("max_requests", request.max_requests, 0, MAX_HTTP_REQUESTS)?
            .map(|v| i32::try_from(v).unwrap_or(i32::MAX)),
        max_response_bytes: bounded(
            "max_response_bytes",
            request.max_response_bytes,
            0,
            MAX_HTTP_RESPONSE_BYTES,
        )?
        .map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
        request_timeout_ms: bounded(
            "request_timeout_ms",
            request.request_timeout_ms,
            1,
            MAX_HTTP_REQUEST_TIMEOUT_MS,
        )?
        .map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
        updated_at: None,
    };
    let stored = queue::set_egress(state.store(), &egress).await?;
    tracing::info!(tenant = %stored.tenant, entries = stored.allow.len(), "egress policy set");
    Ok(json(StatusCode::OK, &EgressResponse::new(stored, HttpLimits::DEFAULT)))
}

fn bounded<T>(field: &str, value: Option<T>, min: T, max: T) -> Result<Option<T>, ApiError>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    match value {
        Some(v) if v < min || v > max => Err(ApiError::unprocessable(
            "invalid_http_limit",
            format!("{field} must be from {min} to {max}, got {v}"),
        )),
        v => Ok(v),
    }
}
