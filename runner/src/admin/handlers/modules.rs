//! Module routes: upload (validate, then register), list, show versions, activate.
//!
//! Invariants: an upload is checked in the order cheapest first (task type, parameters,
//! content type, limits against caps, size) before the module is compiled; compiling runs on
//! the blocking pool, at most `max_concurrent_validations` at once, and is abandoned after
//! `validation_timeout`; only a module the sandbox accepted is stored.

use bytes::{Buf, Bytes};
use futures::Stream;
use warp::http::StatusCode;

use super::{created_or_ok, json, Answer};
use crate::admin::auth::Caller;
use crate::admin::body::{check_content_type, read_limited, WASM};
use crate::admin::error::ApiError;
use crate::admin::models::{ActivateRequest, ModulesResponse, UploadResponse};
use crate::admin::params::{resolve_limits, Query, RequestedLimits};
use crate::admin::AdminState;
use crate::queue;
use crate::sandbox::ModuleInfo;

fn check_task_type(task_type: &str) -> Result<(), ApiError> {
    queue::validate_task_type(task_type)
        .map_err(|e| ApiError::bad_request("invalid_task_type", e.to_string()))
}

/// `PUT /v1/modules/{task_type}` with the module as an `application/wasm` body.
#[allow(clippy::too_many_arguments)]
pub async fn upload<S, B>(
    state: AdminState,
    caller: Caller,
    task_type: String,
    query: Vec<(String, String)>,
    content_type: Option<String>,
    content_length: Option<u64>,
    body: S,
) -> Answer
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    check_task_type(&task_type)?;
    let mut q = Query::new(query)?;
    let tenant = q.take("tenant");
    let requested = RequestedLimits::from_query(&mut q)?;
    q.finish()?;
    check_content_type(content_type.as_deref(), WASM)?;
    let (tenant, caps) = caller.write_target(state.pool(), tenant.as_deref()).await?;
    let (settings, limits) = resolve_limits(&requested, &caps, state.sandbox().config())?;

    let tenant_limit = caps.max_module_bytes.and_then(|b| usize::try_from(b).ok());
    let limit = state.config().max_module_bytes.min(tenant_limit.unwrap_or(usize::MAX));
    let bytes = read_limited(content_length, body, limit).await?;
    let info = validate(&state, bytes.clone()).await?;

    let registered =
        queue::register_module(state.pool(), &tenant, &task_type, &info.sha256, &bytes, &settings)
            .await?;
    let m = registered.module;
    tracing::info!(%tenant, %task_type, version = m.version, sha256 = %m.sha256,
        created = registered.created, "module uploaded");
    let answer = UploadResponse {
        tenant: m.tenant,
        task_type: m.task_type,
        version: m.version,
        sha256: m.sha256,
        size: m.size,
        created: registered.created,
        wasi_imports: info.wasi_imports,
        limits,
    };
    Ok(created_or_ok(registered.created, &answer))
}

/// Compiles `bytes` on the blocking pool, bounded in concurrency and time.
async fn validate(state: &AdminState, bytes: Bytes) -> Result<ModuleInfo, ApiError> {
    let permit = state
        .validation_slots()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("the admin API is shutting down"))?;
    let sandbox = state.sandbox().clone();
    let job = tokio::task::spawn_blocking(move || {
        // Held until the compile really ends, even when the request stopped waiting for it.
        let _permit = permit;
        sandbox.validate_module(&bytes)
    });
    let timeout = state.config().validation_timeout;
    match tokio::time::timeout(timeout, job).await {
        Ok(Ok(Ok(info))) => Ok(info),
        Ok(Ok(Err(invalid))) => Err(invalid.into()),
        Ok(Err(join)) => Err(ApiError::internal("module validation task failed", &join)),
        Err(_elapsed) => Err(ApiError::unprocessable(
            "validation_timeout",
            format!("the module took longer than {timeout:?} to validate"),
        )),
    }
}

/// `GET /v1/modules`: the active version of every task type (`?all=true`: every version).
pub async fn list(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let mut q = Query::new(query)?;
    let scope = caller.read_scope(q.take("tenant").as_deref())?;
    let all = q.take_bool("all")?.unwrap_or(false);
    q.finish()?;
    let modules = queue::list_versions(state.pool(), scope.as_deref(), None, !all).await?;
    Ok(json(StatusCode::OK, &ModulesResponse { modules }))
}

/// `GET /v1/modules/{task_type}`: every version, newest first.
pub async fn versions(
    state: AdminState,
    caller: Caller,
    task_type: String,
    query: Vec<(String, String)>,
) -> Answer {
    check_task_type(&task_type)?;
    let mut q = Query::new(query)?;
    let scope = caller.read_scope(q.take("tenant").as_deref())?;
    q.finish()?;
    let modules =
        queue::list_versions(state.pool(), scope.as_deref(), Some(&task_type), false).await?;
    if modules.is_empty() {
        return Err(no_module(&task_type));
    }
    Ok(json(StatusCode::OK, &ModulesResponse { modules }))
}

fn no_module(task_type: &str) -> ApiError {
    ApiError::not_found(format!("no module is registered for task_type {task_type:?}"))
}

/// `POST /v1/modules/{task_type}/activate` with `{"version": N}`: makes that version the one
/// new claims run (rollback or roll forward).
pub async fn activate(
    state: AdminState,
    caller: Caller,
    task_type: String,
    query: Vec<(String, String)>,
    request: ActivateRequest,
) -> Answer {
    check_task_type(&task_type)?;
    let mut q = Query::new(query)?;
    let tenant = q.take("tenant");
    q.finish()?;
    let (tenant, _) = caller.write_target(state.pool(), tenant.as_deref()).await?;
    let version = request.version;
    queue::activate_version(state.pool(), &tenant, &task_type, version).await?;
    tracing::info!(%tenant, %task_type, version, "module version activated");
    let modules =
        queue::list_versions(state.pool(), Some(&tenant), Some(&task_type), false).await?;
    let active =
        modules.into_iter().find(|m| m.version == version).ok_or_else(|| no_module(&task_type))?;
    Ok(json(StatusCode::OK, &active))
}
