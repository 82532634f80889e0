//! Tenant routes: list, and the operator's changes to a tenant: fair-share weight, caps and
//! token.
//!
//! Invariants: only the operator changes a tenant (a tenant token gets 403 before anything
//! is read); a rotated token is drawn here, shown once in the answer and stored only as its
//! SHA-256, and the old token stops authenticating when the update commits.

use warp::http::StatusCode;

use super::{json, Answer};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::models::{CapsRequest, TenantsResponse, TokenResponse, WeightRequest};
use crate::admin::openapi as doc;
use crate::admin::params::TenantPath;
use crate::admin::AdminState;
use crate::queue::{self, Tenant};

fn operator_only(caller: &Caller, what: &str) -> Result<(), ApiError> {
    match caller {
        Caller::Operator => Ok(()),
        Caller::Tenant(_) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            format!("{what} are set by the operator"),
        )),
    }
}

/// `GET /v1/tenants`: every tenant for the operator; a tenant sees itself.
#[utoipa::path(
    get,
    path = "/v1/tenants",
    operation_id = "list_tenants",
    tag = "tenants",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every tenant (operator); a tenant sees itself", body = TenantsResponse),
    )
)]
pub async fn list(state: AdminState, caller: Caller) -> Answer {
    let tenants = match caller {
        Caller::Operator => queue::list_tenants(state.store()).await?,
        Caller::Tenant(t) => vec![t],
    };
    Ok(json(StatusCode::OK, &TenantsResponse { tenants }))
}

/// `PUT /v1/tenants/{name}/weight` (operator): the tenant's fair-share weight.
#[utoipa::path(
    put,
    path = "/v1/tenants/{name}/weight",
    operation_id = "set_tenant_weight",
    tag = "tenants",
    security(("bearer" = [])),
    params(TenantPath),
    request_body(content = WeightRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The tenant with its new weight", body = Tenant),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
    )
)]
pub async fn set_weight(
    state: AdminState,
    caller: Caller,
    name: String,
    request: WeightRequest,
) -> Answer {
    operator_only(&caller, "tenant weights")?;
    let tenant = queue::set_tenant_weight(state.store(), &name, request.weight).await?;
    tracing::info!(tenant = %tenant.name, weight = tenant.weight, "tenant weight set");
    Ok(json(StatusCode::OK, &tenant))
}

/// `PATCH /v1/tenants/{name}/caps` (operator): sets or clears some of the tenant's caps.
#[utoipa::path(
    patch,
    path = "/v1/tenants/{name}/caps",
    operation_id = "change_tenant_caps",
    tag = "tenants",
    security(("bearer" = [])),
    params(TenantPath),
    request_body(content = CapsRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The tenant with its caps as they now are", body = Tenant),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
    )
)]
pub async fn change_caps(
    state: AdminState,
    caller: Caller,
    name: String,
    request: CapsRequest,
) -> Answer {
    operator_only(&caller, "tenant caps")?;
    let tenant = queue::change_tenant_caps(state.store(), &name, &request.into()).await?;
    tracing::info!(tenant = %tenant.name, caps = ?tenant.caps, "tenant caps changed");
    Ok(json(StatusCode::OK, &tenant))
}

/// `POST /v1/tenants/{name}/token` (operator): a new token for the tenant; the old one stops
/// working at once.
#[utoipa::path(
    post,
    path = "/v1/tenants/{name}/token",
    operation_id = "rotate_tenant_token",
    tag = "tenants",
    security(("bearer" = [])),
    params(TenantPath),
    responses(
        (status = 200, description = "The new token, shown this once (only its SHA-256 is stored)", body = TokenResponse),
        (status = 404, response = doc::NotFound),
    )
)]
pub async fn rotate_token(state: AdminState, caller: Caller, name: String) -> Answer {
    operator_only(&caller, "tenant tokens")?;
    let (tenant, token) = crate::admin::rotate_token(state.store(), &name).await?;
    tracing::info!(tenant = %tenant.name, "tenant token rotated");
    Ok(json(StatusCode::OK, &TokenResponse { tenant, token }))
}
