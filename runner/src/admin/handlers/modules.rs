//! Module routes: upload (validate, then register), list, show versions, activate.
//!
//! Invariants: an upload is checked in the order cheapest first (task type, parameters,
//! content type, limits against caps, the secrets it names, size, structural limits) before
//! the module is compiled;
//! compiling goes through the sandbox's compiler (a budgeted child process in `sweep`) from
//! the blocking pool, at most `max_concurrent_validations` at once and one per tenant, and is
//! abandoned after `validation_timeout`; only a module the sandbox accepted is stored, and
//! next to a runner the compiled module goes to the runner's cache once it is stored.

use std::sync::Arc;

use bytes::{Buf, Bytes};
use futures::Stream;
use warp::http::StatusCode;

use super::{created_or_ok, json, Answer};
use crate::admin::auth::Caller;
use crate::admin::body::{check_content_type, read_limited, OCTET_STREAM, WASM};
use crate::admin::error::ApiError;
use crate::admin::models::{ActivateRequest, ModulesResponse, UploadResponse, WasmModule};
use crate::admin::openapi as doc;
use crate::admin::params::{
    resolve_limits, secret_names, ModuleListParams, Query, RequestedLimits, SecretsParam,
    TaskTypePath, TenantParam,
};
use crate::admin::AdminState;
use crate::queue::{self, ModuleVersion};
use crate::sandbox::{
    check_initial_memory, check_structure, sha256_hex, CompiledModule, ValidationError,
};

fn check_task_type(task_type: &str) -> Result<(), ApiError> {
    queue::validate_task_type(task_type)
        .map_err(|e| ApiError::bad_request("invalid_task_type", e.to_string()))
}

/// `PUT /v1/modules/{task_type}` with the module as an `application/wasm` (or
/// `application/octet-stream`) body.
#[utoipa::path(
    put,
    path = "/v1/modules/{task_type}",
    operation_id = "upload_module",
    tag = "modules",
    security(("bearer" = [])),
    params(TaskTypePath, TenantParam, RequestedLimits, SecretsParam),
    // Described as `application/octet-stream` only, which generated clients send a file as
    // (openapi-python-client skips an operation whose only body type is one it does not know,
    // and warns about any); `application/wasm` is accepted the same and is what the CLI sends.
    request_body(
        description = "The handler, as raw bytes: a WASI preview-1 command module (wasm32-wasip1) or a WASI 0.2 component exporting `wasi:cli/run` (wasm32-wasip2); which one is told from the bytes. `Content-Type: application/wasm` is accepted as well.",
        content = WasmModule,
        content_type = "application/octet-stream",
    ),
    responses(
        (status = 201, description = "Stored as a new version and activated", body = UploadResponse),
        (status = 200, description = "Identical bytes and limits were registered: that version is active again", body = UploadResponse),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 422, response = doc::Unprocessable),
        (status = 503, response = doc::Unavailable),
    )
)]
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
    let secrets = q.take("secrets").map(|raw| secret_names(&raw)).transpose()?.unwrap_or_default();
    q.finish()?;
    check_content_type(content_type.as_deref(), WASM)
        .or_else(|_| check_content_type(content_type.as_deref(), OCTET_STREAM))
        .map_err(|_| {
            ApiError::unsupported_media_type(format!(
                "expected Content-Type: {WASM} or {OCTET_STREAM}, got {:?}",
                content_type.as_deref().unwrap_or("none")
            ))
        })?;
    let (tenant, caps) = caller.write_target(state.store(), tenant.as_deref()).await?;
    let (settings, limits) = resolve_limits(&requested, &caps, state.sandbox().config())?;
    check_secrets_exist(&state, &tenant, &secrets).await?;

    let tenant_limit = caps.max_module_bytes.and_then(|b| usize::try_from(b).ok());
    let limit = state.config().max_module_bytes.min(tenant_limit.unwrap_or(usize::MAX));
    let bytes = read_limited(content_length, body, limit).await?;
    let compiled = validate(&state, &tenant, bytes.clone(), limits.memory_bytes).await?;
    let info = compiled.info().clone();

    let registered = queue::register_module_with_secrets(
        state.store(),
        &tenant,
        &task_type,
        &info.sha256,
        &bytes,
        &settings,
        &secrets,
    )
    .await?;
    if let Some(cache) = state.modules() {
        cache.insert_compiled(compiled).await;
    }
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
        kind: info.kind.as_str().to_owned(),
        wasi_imports: info.wasi_imports,
        limits,
        secrets: m.secrets,
    };
    Ok(created_or_ok(registered.created, &answer))
}

/// Refuses (422 `unknown_secret`) a module that names secrets its tenant does not hold.
async fn check_secrets_exist(
    state: &AdminState,
    tenant: &str,
    secrets: &[String],
) -> Result<(), ApiError> {
    if secrets.is_empty() {
        return Ok(());
    }
    let missing = queue::missing_secrets(state.store(), tenant, secrets).await?;
    match missing.as_slice() {
        [] => Ok(()),
        [one] => Err(ApiError::unprocessable(
            "unknown_secret",
            format!(
                "tenant {tenant:?} has no secret {one:?}; set it first with PUT /v1/secrets/{one}"
            ),
        )),
        many => Err(ApiError::unprocessable(
            "unknown_secret",
            format!("tenant {tenant:?} has no secrets {}; set them first", many.join(", ")),
        )),
    }
}

/// The compiled module for `bytes`, for a module that runs with at most `memory_limit_bytes`:
/// the runner's cached one when it already has these bytes; else the fleet's stored artifact
/// when a runner compiled these bytes before and they are within the structural limits (only
/// with `SWEEP_SECRETS_KEY`, see `sandbox::SharedArtifacts`); else compiled through the
/// sandbox's compiler (structural limits, then the budgeted child) on the blocking pool, at
/// most `max_concurrent_validations` uploads and one per tenant at once, and its artifact
/// stored for the fleet (with the key). The request stops waiting after `validation_timeout`;
/// the compile holds its turn and slot until it ends (the compiler kills its child at the
/// compile wall bound).
async fn validate(
    state: &AdminState,
    tenant: &str,
    bytes: Bytes,
    memory_limit_bytes: u64,
) -> Result<Arc<CompiledModule>, ApiError> {
    let sha256 = sha256_hex(&bytes);
    let cached = match state.modules() {
        Some(cache) => cache.get(&sha256).await,
        None => None,
    };
    if let Some(cached) = cached {
        // Compiled and checked against the contract before; only the limit is new.
        check_initial_memory(&bytes, memory_limit_bytes)?;
        return Ok(cached);
    }
    let sandbox = state.sandbox().clone();
    let shared = state.artifacts().cloned();
    if let Some(shared) = &shared {
        if let Some(stored) = shared.load(&sandbox, &sha256).await {
            // The structural limits hold for a module compiled before, too (they may have
            // been tightened since); a compile below checks them itself.
            check_structure(&bytes, sandbox.compile_limits()).map_err(ValidationError::from)?;
            check_initial_memory(&bytes, memory_limit_bytes)?;
            return Ok(Arc::new(stored));
        }
    }
    let turn = state.compile_turns().take(tenant).ok_or_else(|| {
        ApiError::conflict(
            "compile_in_progress",
            format!(
                "another module of tenant {tenant:?} is being compiled; upload again once that \
                 upload has answered"
            ),
        )
    })?;
    let permit = state
        .validation_slots()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("the admin API is shutting down"))?;
    let runtime = tokio::runtime::Handle::current();
    let job = tokio::task::spawn_blocking(move || {
        // Held until the compile really ends, even when the request stopped waiting for it.
        let (_permit, _turn) = (permit, turn);
        let key = shared.as_ref().map(|shared| shared.key());
        let (compiled, artifact) =
            sandbox.compile_sharing(&bytes, Some(memory_limit_bytes), key)?;
        // Stored here, not by the request: a request that stopped waiting leaves the
        // artifact for the next upload of these bytes (and for the runners).
        if let (Some(shared), Some(artifact)) = (&shared, artifact) {
            runtime.block_on(shared.save(artifact));
        }
        Ok::<_, ValidationError>(compiled)
    });
    let timeout = state.config().validation_timeout;
    match tokio::time::timeout(timeout, job).await {
        Ok(Ok(Ok(compiled))) => Ok(Arc::new(compiled)),
        Ok(Ok(Err(invalid))) => Err(invalid.into()),
        Ok(Err(join)) => Err(ApiError::internal("module validation task failed", &join)),
        Err(_elapsed) => Err(ApiError::unprocessable(
            "validation_timeout",
            format!(
                "the module took longer than {timeout:?} to validate; its compile goes on, and \
                 an upload of the same bytes once it ended uses what it compiled"
            ),
        )),
    }
}

/// `GET /v1/modules`: the active version of every task type (`?all=true`: every version).
#[utoipa::path(
    get,
    path = "/v1/modules",
    operation_id = "list_modules",
    tag = "modules",
    security(("bearer" = [])),
    params(TenantParam, ModuleListParams),
    responses(
        (status = 200, description = "The active version of each task type (every version with `all`)", body = ModulesResponse),
    )
)]
pub async fn list(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let mut q = Query::new(query)?;
    let scope = caller.read_scope(q.take("tenant").as_deref())?;
    let all = q.take_bool("all")?.unwrap_or(false);
    q.finish()?;
    let modules = queue::list_versions(state.store(), scope.as_deref(), None, !all).await?;
    Ok(json(StatusCode::OK, &ModulesResponse { modules }))
}

/// `GET /v1/modules/{task_type}`: every version, newest first.
#[utoipa::path(
    get,
    path = "/v1/modules/{task_type}",
    operation_id = "list_module_versions",
    tag = "modules",
    security(("bearer" = [])),
    params(TaskTypePath, TenantParam),
    responses(
        (status = 200, description = "Every version, newest first", body = ModulesResponse),
        (status = 404, response = doc::NotFound),
    )
)]
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
        queue::list_versions(state.store(), scope.as_deref(), Some(&task_type), false).await?;
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
#[utoipa::path(
    post,
    path = "/v1/modules/{task_type}/activate",
    operation_id = "activate_module",
    tag = "modules",
    security(("bearer" = [])),
    params(TaskTypePath, TenantParam),
    request_body(content = ActivateRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "That version, now active", body = ModuleVersion),
        (status = 404, response = doc::NotFound),
    )
)]
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
    let (tenant, _) = caller.write_target(state.store(), tenant.as_deref()).await?;
    let version = request.version;
    queue::activate_version(state.store(), &tenant, &task_type, version).await?;
    tracing::info!(%tenant, %task_type, version, "module version activated");
    let modules =
        queue::list_versions(state.store(), Some(&tenant), Some(&task_type), false).await?;
    let active =
        modules.into_iter().find(|m| m.version == version).ok_or_else(|| no_module(&task_type))?;
    Ok(json(StatusCode::OK, &active))
}
