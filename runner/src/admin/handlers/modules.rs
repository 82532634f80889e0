//! Module routes: upload (validate, then register), list, show versions, activate.
//!
//! Invariants: an upload is checked in the order cheapest first (task type, parameters,
//! content type, limits against caps, the secrets it names, size, structural limits) before
//! the module is compiled;
//! compiling goes through the sandbox's compiler (a budgeted child process in `sweep`) from
//! the blocking pool, at most `max_concurrent_validations` at once and one per tenant;
//! a compile that ends within `validation_timeout` is answered 201/200 with its version
//! `ready` and active; one that does not is answered 202 with its version registered
//! `compiling`, and its end (ready and active, or rejected with the reason) is recorded by a
//! task that outlives the request (queue/compiling.rs says what waits meanwhile);
//! next to a runner the compiled module goes to the runner's cache before it is ready.

use std::sync::Arc;

use bytes::{Buf, Bytes};
use futures::Stream;
use warp::http::StatusCode;

use super::{json, Answer};
use crate::admin::auth::Caller;
use crate::admin::body::{check_content_type, read_limited, OCTET_STREAM, WASM};
use crate::admin::error::ApiError;
use crate::admin::models::{ActivateRequest, ModulesResponse, UploadResponse, WasmModule};
use crate::admin::openapi as doc;
use crate::admin::params::{
    resolve_limits, secret_names, ModuleListParams, Query, RequestedLimits, ReuseParam,
    SecretsParam, TaskTypePath, TenantParam,
};
use crate::admin::AdminState;
use crate::queue::{self, CompileState, ModuleVersion, UploadOptions};
use crate::sandbox::{
    check_initial_memory, check_structure, sha256_hex, CompiledModule, HandlerKind, ValidationError,
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
    params(TaskTypePath, TenantParam, RequestedLimits, SecretsParam, ReuseParam),
    // Described as `application/octet-stream` only, which generated clients send a file as
    // (openapi-python-client skips an operation whose only body type is one it does not know,
    // and warns about any); `application/wasm` is accepted the same and is what the CLI sends.
    request_body(
        description = "The handler, as raw bytes: a WASI preview-1 command module (wasm32-wasip1) or a WASI 0.2 component exporting `wasi:cli/run` (wasm32-wasip2); which one is told from the bytes. `Content-Type: application/wasm` is accepted as well.",
        content = WasmModule,
        content_type = "application/octet-stream",
    ),
    responses(
        (status = 201, description = "Compiled, stored as a new version and activated", body = UploadResponse),
        (status = 200, description = "Identical bytes and limits were registered: that version is active again", body = UploadResponse),
        (status = 202, description = "Stored as a new version whose compile outlasted the request (`compile_state`: `compiling`); it becomes active when the compile ends, or `rejected` with the reason (`GET /v1/modules/{task_type}`). Meanwhile the previous version keeps running; a type with none holds its tasks until then", body = UploadResponse),
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
    let reuse = reuse_tasks(&mut q)?;
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
    let kind = if wasmparser::Parser::is_component(&bytes) {
        HandlerKind::Component
    } else {
        HandlerKind::Module
    };
    if reuse.is_some() && kind == HandlerKind::Module {
        return Err(ApiError::unprocessable(
            "reuse_needs_component",
            "`reuse` keeps a component's instance between tasks; a preview-1 module's `_start` \
             runs once per instance, so it gets a fresh one for every task: upload it without \
             `reuse`",
        ));
    }
    let options = UploadOptions { secrets, reuse: queue::upload_reuse(&bytes, reuse) };
    let sha256 = sha256_hex(&bytes);
    let (registered, imports) =
        match validate(&state, &tenant, &sha256, bytes.clone(), limits.memory_bytes).await? {
            Validated::Compiled(compiled) => {
                let registered = queue::register_module_with(
                    state.store(),
                    &tenant,
                    &task_type,
                    &sha256,
                    &bytes,
                    &settings,
                    &options,
                )
                .await?;
                if let Some(cache) = state.modules() {
                    cache.insert_compiled(compiled.clone()).await;
                }
                (registered, Some(compiled.info().wasi_imports.clone()))
            }
            Validated::Compiling(job) => {
                let registered = queue::register_compiling(
                    state.store(),
                    &tenant,
                    &task_type,
                    (&sha256, &bytes),
                    &settings,
                    &options,
                )
                .await?;
                let m = &registered.module;
                finish_in_background(&state, m.tenant.clone(), task_type.clone(), m.version, job);
                (registered, None)
            }
        };
    let m = registered.module;
    tracing::info!(%tenant, %task_type, version = m.version, sha256 = %m.sha256,
        created = registered.created, compile_state = m.compile_state.as_str(), "module uploaded");
    let status = match m.compile_state {
        CompileState::Ready if registered.created => StatusCode::CREATED,
        CompileState::Ready => StatusCode::OK,
        CompileState::Compiling | CompileState::Rejected => StatusCode::ACCEPTED,
    };
    let answer = UploadResponse {
        tenant: m.tenant,
        task_type: m.task_type,
        version: m.version,
        sha256: m.sha256,
        size: m.size,
        created: registered.created,
        compile_state: m.compile_state,
        kind: kind.as_str().to_owned(),
        wasi_imports: imports,
        limits,
        secrets: m.secrets,
        reuse: m.reuse,
    };
    Ok(json(status, &answer))
}

/// Records the end of a compile the upload stopped waiting for: the compiled module goes to
/// the runner's cache, then its version is made ready and active, or rejected with the reason.
/// Runs to its end whatever the request does; if it cannot record the end, the runners'
/// maintenance rejects the version as interrupted later (queue::reject_interrupted_compiles).
fn finish_in_background(
    state: &AdminState,
    tenant: String,
    task_type: String,
    version: i32,
    job: CompileJob,
) {
    let state = state.clone();
    tokio::spawn(async move {
        let outcome = match job.await {
            Ok(Ok(compiled)) => {
                if let Some(cache) = state.modules() {
                    cache.insert_compiled(Arc::new(compiled)).await;
                }
                Ok(())
            }
            Ok(Err(invalid)) => Err(invalid.to_string()),
            Err(join) => Err(format!("the compile stopped unexpectedly: {join}")),
        };
        let store = state.store();
        let ended = outcome.as_ref().map(|()| ()).map_err(String::as_str);
        match queue::finish_compile(store, &tenant, &task_type, version, ended).await {
            Ok(()) => match &outcome {
                Ok(()) => tracing::info!(%tenant, %task_type, version, "module compiled: ready"),
                Err(reason) => {
                    tracing::info!(%tenant, %task_type, version, %reason, "module rejected")
                }
            },
            Err(e) => tracing::warn!(%tenant, %task_type, version, error = %e,
                "recording the end of a module's compile failed; it stays `compiling` until \
                 the runners' maintenance rejects it as interrupted"),
        }
    });
}

/// `?reuse=N` of an upload: at most N tasks per kept instance, from 1 to [`MAX_REUSE`].
fn reuse_tasks(q: &mut Query) -> Result<Option<i32>, ApiError> {
    match q.take_positive("reuse")? {
        None => Ok(None),
        Some(n) => i32::try_from(n).ok().filter(|&n| n <= MAX_REUSE).map(Some).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_parameter",
                format!("parameter `reuse` must be at most {MAX_REUSE}, got {n}"),
            )
        }),
    }
}

/// The most tasks one kept instance may run (the schema's bound).
pub const MAX_REUSE: i32 = 1_000_000;

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
/// stored for the fleet (with the key). The request stops waiting after `validation_timeout`
/// and gets the running compile instead; the compile holds its turn and slot until it ends
/// (the compiler kills its child at the compile wall bound).
async fn validate(
    state: &AdminState,
    tenant: &str,
    sha256: &str,
    bytes: Bytes,
    memory_limit_bytes: u64,
) -> Result<Validated, ApiError> {
    let cached = match state.modules() {
        Some(cache) => cache.get(sha256).await,
        None => None,
    };
    if let Some(cached) = cached {
        // Compiled and checked against the contract before; only the limit is new.
        check_initial_memory(&bytes, memory_limit_bytes)?;
        return Ok(Validated::Compiled(cached));
    }
    let sandbox = state.sandbox().clone();
    let shared = state.artifacts().cloned();
    if let Some(shared) = &shared {
        if let Some(stored) = shared.load(&sandbox, sha256).await {
            // The structural limits hold for a module compiled before, too (they may have
            // been tightened since); a compile below checks them itself.
            check_structure(&bytes, sandbox.compile_limits()).map_err(ValidationError::from)?;
            check_initial_memory(&bytes, memory_limit_bytes)?;
            return Ok(Validated::Compiled(Arc::new(stored)));
        }
    }
    let turn = state.compile_turns().take(tenant).ok_or_else(|| {
        ApiError::conflict(
            "compile_in_progress",
            format!(
                "another module of tenant {tenant:?} is being compiled; upload again once its \
                 compile has ended (its version's compile_state in GET /v1/modules)"
            ),
        )
    })?;
    let permit = state
        .validation_slots()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("the admin API is shutting down"))?;
    let runtime = tokio::runtime::Handle::current();
    let mut job = tokio::task::spawn_blocking(move || {
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
    match tokio::time::timeout(state.config().validation_timeout, &mut job).await {
        Ok(Ok(Ok(compiled))) => Ok(Validated::Compiled(Arc::new(compiled))),
        Ok(Ok(Err(invalid))) => Err(invalid.into()),
        Ok(Err(join)) => Err(ApiError::internal("module validation task failed", &join)),
        Err(_elapsed) => Ok(Validated::Compiling(job)),
    }
}

/// A compile running on the blocking pool (it holds its tenant's turn and a slot until it ends).
type CompileJob = tokio::task::JoinHandle<Result<CompiledModule, ValidationError>>;

/// What `validate` found: the module compiled, or its compile still running when the request
/// stopped waiting.
enum Validated {
    Compiled(Arc<CompiledModule>),
    Compiling(CompileJob),
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
