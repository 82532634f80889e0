//! Tenant secrets: `PUT /v1/secrets/{name}`, `GET /v1/secrets`, `DELETE /v1/secrets/{name}`.
//!
//! Invariants: a value is sealed under the deployment key before it is stored and no answer,
//! log line or error message ever carries it (answers hold names and times only); every call
//! is scoped to the caller's tenant (the operator names one with `?tenant=`, writes default to
//! `default`); read-only tokens never get here with a write (403 at authentication).

use warp::http::StatusCode;

use super::{created_or_ok, json, tenant_param, Answer};
use crate::admin::auth::Caller;
use crate::admin::capability_models::{SecretRequest, SecretsResponse};
use crate::admin::error::ApiError;
use crate::admin::openapi as doc;
use crate::admin::params::{check_secret_name, SecretNamePath, TenantParam};
use crate::admin::AdminState;
use crate::queue::{self, PutSecret, SecretInfo};
use crate::secrets::{KEY_ENV, MAX_SECRETS_PER_TENANT, MAX_SECRET_BYTES};

/// `PUT /v1/secrets/{name}`: stores or replaces the value.
#[utoipa::path(
    put,
    path = "/v1/secrets/{name}",
    operation_id = "put_secret",
    tag = "secrets",
    security(("bearer" = [])),
    params(SecretNamePath, TenantParam),
    request_body(content = SecretRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Stored (a new secret); the value is never shown again", body = SecretInfo),
        (status = 200, description = "Replaced the secret's value", body = SecretInfo),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
        (status = 503, response = doc::Unavailable),
    )
)]
pub async fn put(
    state: AdminState,
    caller: Caller,
    name: String,
    query: Vec<(String, String)>,
    request: SecretRequest,
) -> Answer {
    check_secret_name(&name)?;
    let requested = tenant_param(query)?;
    let (tenant, _) = caller.write_target(state.store(), requested.as_deref()).await?;
    let value = request.value;
    if value.len() > MAX_SECRET_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "secret_too_large",
            format!("a secret's value is at most {MAX_SECRET_BYTES} bytes, got {}", value.len()),
        ));
    }
    if value.is_empty() {
        return Err(ApiError::unprocessable("invalid_secret", "the value is empty"));
    }
    if value.contains('\0') {
        return Err(ApiError::unprocessable(
            "invalid_secret",
            "the value must not contain NUL (\\u0000): it becomes an environment variable",
        ));
    }
    let key = state.config().secrets_key.as_ref().ok_or_else(|| {
        ApiError::unavailable(format!(
            "this deployment has no secrets key: the operator sets {KEY_ENV} for the API and \
             the runners"
        ))
    })?;
    let sealed = key.seal(&tenant, &name, &value);
    match queue::put_secret(state.store(), &tenant, &name, &sealed).await? {
        PutSecret::Stored { info, created } => {
            tracing::info!(tenant = %info.tenant, secret = %info.name, created, "secret set");
            Ok(created_or_ok(created, &info))
        }
        PutSecret::TooMany => Err(ApiError::unprocessable(
            "too_many_secrets",
            format!("a tenant holds at most {MAX_SECRETS_PER_TENANT} secrets; delete one first"),
        )),
    }
}

/// `GET /v1/secrets`: the tenant's secrets (operator: every tenant's, or `?tenant=`), names
/// and times only.
#[utoipa::path(
    get,
    path = "/v1/secrets",
    operation_id = "list_secrets",
    tag = "secrets",
    security(("bearer" = [])),
    params(TenantParam),
    responses(
        (status = 200, description = "Names and times, never values", body = SecretsResponse),
    )
)]
pub async fn list(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let requested = tenant_param(query)?;
    let scope = caller.read_scope(requested.as_deref())?;
    let secrets = queue::list_secrets(state.store(), scope.as_deref()).await?;
    Ok(json(StatusCode::OK, &SecretsResponse { secrets }))
}

/// `DELETE /v1/secrets/{name}`: gone. Tasks of modules that name it then fail as
/// `secrets_unavailable` until it is set again.
#[utoipa::path(
    delete,
    path = "/v1/secrets/{name}",
    operation_id = "delete_secret",
    tag = "secrets",
    security(("bearer" = [])),
    params(SecretNamePath, TenantParam),
    responses(
        (status = 200, description = "The secret as it was (without its value)", body = SecretInfo),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
    )
)]
pub async fn delete(
    state: AdminState,
    caller: Caller,
    name: String,
    query: Vec<(String, String)>,
) -> Answer {
    check_secret_name(&name)?;
    let requested = tenant_param(query)?;
    let (tenant, _) = caller.write_target(state.store(), requested.as_deref()).await?;
    match queue::delete_secret(state.store(), &tenant, &name).await? {
        Some(info) => {
            tracing::info!(tenant = %info.tenant, secret = %info.name, "secret deleted");
            Ok(json(StatusCode::OK, &info))
        }
        None => Err(ApiError::not_found(format!("no secret {name:?}"))),
    }
}
