//! The admin API's OpenAPI 3.1 document, served at `GET /v1/openapi.json` without
//! authentication (it describes the API, never a tenant's data).
//!
//! Owns: [`document`] and the document's shared parts: the bearer security scheme, the error
//! responses every route refers to (`#/components/responses/...`, all the
//! `{"error": {"code", "message"}}` envelope) and the component schemas.
//!
//! Invariants: the paths are exactly [`Route::ALL`], each operation taken from its handler's
//! `#[utoipa::path]`; every schema a path refers to is a component here (the tests resolve
//! every `$ref` and validate live answers against it).

use std::sync::OnceLock;

use utoipa::openapi::path::{HttpMethod, Operation, ParameterIn, PathItem, PathsBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{Modify, OpenApi, ToResponse};
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::{Reply, Response};

use super::capability_models::{
    EgressRequest, EgressResponse, HttpLimitsView, SecretRequest, SecretsResponse, UsageResponse,
    UsageTotal,
};
use super::error::ErrorResponse;
use super::filters::Route;
use super::models::{
    ActivateRequest, BatchResponse, CancelTasksRequest, CapsRequest, CreateScheduleRequest,
    CreateWorkflowRequest, DeadPage, EnqueueRequest, Health, ModulesResponse, RateLimitRequest,
    SchedulesResponse, StatsResponse, TaskPage, TenantsResponse, TokenResponse, UploadResponse,
    WasmModule, WeightRequest, WorkflowStepRequest, WorkflowsResponse,
};
use crate::queue::{
    BulkCancel, CatchUp, CompileState, CreatedStep, CreatedWorkflow, CronSchedule, ModuleVersion,
    OnParentFailure, Overlap, QueueControl, StepView, TaskState, TaskView, Tenant, TenantPause,
    WorkflowCancel, WorkflowState, WorkflowSummary, WorkflowView,
};

/// Name of the security scheme every authenticated operation requires.
pub const BEARER: &str = "bearer";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sweep admin API",
        description = "Upload WebAssembly handler modules, enqueue and inspect tasks, read queue \
            statistics. Every route except the probes and this document needs \
            `Authorization: Bearer <token>`: a tenant's token (that tenant's rows only; other \
            tenants' rows answer 404) or the operator's (every tenant; names one with \
            `?tenant=`). Errors are `{\"error\": {\"code\": \"...\", \"message\": \"...\"}}`."
    ),
    components(
        schemas(
            ErrorResponse,
            Health,
            WasmModule,
            UploadResponse,
            ModulesResponse,
            ModuleVersion,
            CompileState,
            ActivateRequest,
            EnqueueRequest,
            BatchResponse,
            TaskView,
            TaskPage,
            crate::queue::TaskRow,
            DeadPage,
            StatsResponse,
            TenantsResponse,
            Tenant,
            WeightRequest,
            CapsRequest,
            TokenResponse,
            CreateScheduleRequest,
            CronSchedule,
            SchedulesResponse,
            Overlap,
            CatchUp,
            QueueControl,
            TenantPause,
            RateLimitRequest,
            CancelTasksRequest,
            BulkCancel,
            OnParentFailure,
            TaskState,
            CreateWorkflowRequest,
            WorkflowStepRequest,
            CreatedWorkflow,
            CreatedStep,
            WorkflowView,
            WorkflowState,
            StepView,
            WorkflowsResponse,
            WorkflowSummary,
            WorkflowCancel,
            EgressRequest,
            EgressResponse,
            HttpLimitsView,
            SecretRequest,
            SecretsResponse,
            crate::queue::SecretInfo,
            UsageResponse,
            crate::queue::UsageDay,
            UsageTotal,
            crate::queue::AttemptUsage,
        ),
        responses(
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            Conflict,
            TooLarge,
            UnsupportedMediaType,
            Unprocessable,
            Internal,
            Unavailable
        )
    ),
    modifiers(&BearerScheme),
    tags(
        (name = "modules", description = "Handler modules: upload, versions, rollback"),
        (name = "tasks", description = "Enqueue, show and cancel tasks"),
        (name = "dead", description = "The dead-letter table"),
        (name = "tenants", description = "Tenants, weights, caps, tokens and egress policies"),
        (name = "secrets", description = "Tenant secrets: set, list (names only), delete"),
        (name = "schedules", description = "Cron schedules: a task per tick"),
        (name = "queues", description = "Flow control of a task type: pause, resume, rate limit"),
        (name = "workflows", description = "Named steps with dependencies, created together"),
        (name = "ops", description = "Statistics, metrics, probes and this document")
    )
)]
struct ApiDoc;

struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "A tenant token (`swp_...`, from `sweep tenant create`) or the operator token \
                 (`SWEEP_OPERATOR_TOKEN`).",
            ))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(BEARER, SecurityScheme::Http(scheme));
    }
}

/// The whole document: shared parts from [`ApiDoc`], one operation per [`Route`].
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    let paths = Route::ALL.into_iter().fold(PathsBuilder::new(), |paths, route| {
        let (path, methods, operation) = route.doc();
        paths.path(path, PathItem::from_http_methods(methods, operation))
    });
    doc.paths = paths.build();
    doc
}

/// Adds the error answers that follow from an operation's shape, so that no handler lists
/// them: every authenticated operation can answer 401 and 500; one that writes, or takes
/// `?tenant=`, 403 (a read-only token, another tenant named); one with a parameter (other
/// than a task id, which the route itself parses: a bad one is no route, 404) or a body, 400;
/// one with a body, 413 and 415. Handlers list their successes and the errors that depend on
/// what they do (404, 409, 422, 503).
pub fn add_common_errors(operation: &mut Operation, method: &HttpMethod) {
    let authenticated = operation.security.as_ref().is_some_and(|s| !s.is_empty());
    let params = operation.parameters.as_deref().unwrap_or_default();
    let names_tenant =
        params.iter().any(|p| p.parameter_in == ParameterIn::Query && p.name == "tenant");
    let takes_input = operation.request_body.is_some()
        || params.iter().any(|p| !(p.parameter_in == ParameterIn::Path && p.name == "id"));
    let mut add = |status: u16, response: &str| {
        operation
            .responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| RefOr::Ref(Ref::from_response_name(response)));
    };
    if authenticated {
        add(401, "Unauthorized");
        add(500, "Internal");
        if *method != HttpMethod::Get || names_tenant {
            add(403, "Forbidden");
        }
    }
    if takes_input {
        add(400, "BadRequest");
    }
    if operation.request_body.is_some() {
        add(413, "TooLarge");
        add(415, "UnsupportedMediaType");
    }
}

/// [`document`] as JSON, built once.
pub fn document_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        // Serialising plain maps and strings cannot fail; an empty object would still be JSON.
        document().to_pretty_json().unwrap_or_else(|_| "{}".to_owned())
    })
}

/// `GET /v1/openapi.json`: this document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    tag = "ops",
    responses((status = 200, description = "This OpenAPI 3.1 document", body = Object))
)]
pub fn serve() -> Response {
    let mut response = warp::reply::with_status(document_json(), StatusCode::OK).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// 400: malformed input (a body that does not parse or has unknown fields; a bad, zero,
/// negative, repeated or unknown query parameter; a bad task type or tenant name). Codes:
/// `invalid_json`, `invalid_parameter`, `unknown_parameter`, `invalid_task_type`,
/// `invalid_tenant`, `invalid_query`, `invalid_header`, `invalid_body`, `invalid_state`,
/// `invalid_schedule_name`.
#[derive(ToResponse)]
#[allow(dead_code)] // describes answers; never built
pub struct BadRequest(ErrorResponse);

/// 401: no token, not a bearer token, or an unknown token (`unauthorized`).
#[derive(ToResponse)]
#[allow(dead_code)] // describes answers; never built
pub struct Unauthorized(ErrorResponse);

/// 403: the token may not do this: a tenant token on an operator route (`operator_only`) or
/// naming another tenant (`tenant_not_allowed`); a read-only token on any route but `GET`
/// (`read_only`).
#[derive(ToResponse)]
#[allow(dead_code)] // describes answers; never built
pub struct Forbidden(ErrorResponse);

/// 404: no such task, module, version or tenant, or it belongs to another tenant
/// (`not_found`).
#[derive(ToResponse)]
#[allow(dead_code)] // describes answers; never built
pub struct NotFound(ErrorResponse);

/// 409: the task's state does not allow this (`not_cancellable`: a cancel of a task that
/// already finished or died; the message names the state it ended in), its dedup key is held by
/// a live task (`dedup_key_taken`), a schedule of that name exists (`schedule_exists`), or
/// another module of the tenant is being compiled
/// (`compile_in_progress`: upload again once that upload has answered).
#[derive(ToResponse)]
#[allow(dead_code)] // describes answers; never built
pub struct Conflict(ErrorResponse);

/// 413: the body is over the limit (module: 64 MiB or the tenant's cap; JSON: 8 MiB)
/// (`too_large`), or a task's payload is over the tenant's payload limit (1 MiB unless set)
/// (`payload_too_large`).
#[derive(ToResponse)]
#[allow(dead_code)] // describes answers; never built
pub struct TooLarge(ErrorResponse);

/// 415: the body's `Content-Type` is not the one the route takes (`unsupported_media_type`).
#[derive(ToResponse)]
#[allow(dead_code)] // describes answers; never built
pub struct UnsupportedMediaType(ErrorResponse);

/// 422: well-formed but refused: a module that breaks the guest contract or cannot fit its
/// memory limit, limits above the runner maxima or tenant caps, an invalid task, a task type
/// without a module, an out-of-range value. Codes: `not_wasm`, `invalid_wasm`,
/// `not_core_module`, `missing_start`, `bad_start_signature`, `missing_memory_export`,
/// `forbidden_import`, `unknown_import`, `missing_run_export` (a component without
/// `wasi:cli/run`; the message lists what it exports), `component_link` (a component import
/// the runner does not provide, named), `memory_too_large`, `module_limit_exceeded` (over a
/// structural limit or the compile budget; the message names the limit and the value),
/// `validation_timeout`,
/// `limit_too_high`, `invalid_backoff`, `invalid_task`, `unknown_task_type`,
/// `batch_too_large`, `invalid_tenant`, `invalid_schedule` (a cron expression, time zone,
/// overlap or catch-up policy, or a schedule's task that is invalid; the message names the
/// field).
#[derive(ToResponse)]
#[allow(dead_code)] // describes answers; never built
pub struct Unprocessable(ErrorResponse);

/// 500: our failure; the cause is logged, the message is `internal error` (`internal`).
#[derive(ToResponse)]
#[allow(dead_code)] // describes answers; never built
pub struct Internal(ErrorResponse);

/// 503: not available right now: the database (`/readyz`), the metrics recorder, or the
/// server is shutting down (`unavailable`).
#[derive(ToResponse)]
#[allow(dead_code)] // describes answers; never built
pub struct Unavailable(ErrorResponse);
