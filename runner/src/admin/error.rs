//! Errors as the API shows them: an HTTP status, a stable machine-readable `code` and a
//! human message, rendered as `{"error": {"code": "...", "message": "..."}}`.
//!
//! Owns: [`ApiError`] (what handlers reject with), the mapping from queue, tenant and sandbox
//! errors, and [`recover`], the one place rejections become responses.
//!
//! Invariants:
//! - bad input is a 4xx with a message that says what to fix; only our own failures are 5xx;
//! - database errors are logged here with their cause and shown to clients as
//!   "internal error", never raw (they may name tables, constraints or other tenants' data).

use std::convert::Infallible;

use serde::Serialize;
use utoipa::ToSchema;
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::{Reply, Response};
use warp::Rejection;

use crate::errors::error_chain;
use crate::queue::{InvalidTask, InvalidWorkflow, QueueError, TenantError};
use crate::sandbox::ValidationError;

/// A request that failed, as the client will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl warp::reject::Reject for ApiError {}

/// Every error: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ErrorResponse {
    #[schema(inline)]
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable and machine-readable, e.g. `invalid_parameter`, `not_found`, `limit_too_high`.
    pub code: String,
    /// For people: says what is wrong and what to change.
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", message)
    }
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }
    /// Our failure; the cause goes to the log, the client learns nothing more.
    pub fn internal(context: &str, cause: &dyn std::error::Error) -> Self {
        tracing::error!(error = %error_chain(cause), "admin API: {context}");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error")
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    pub fn reject(self) -> Rejection {
        warp::reject::custom(self)
    }

    pub fn into_response(self) -> Response {
        let body = ErrorResponse {
            error: ErrorDetail { code: self.code.to_owned(), message: self.message },
        };
        let mut response =
            warp::reply::with_status(warp::reply::json(&body), self.status).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Invalid(invalid) => match invalid.innermost() {
                InvalidTask::PayloadTooLarge { .. } => Self::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    invalid.to_string(),
                ),
                _ => Self::unprocessable("invalid_task", invalid.to_string()),
            },
            QueueError::InvalidWorkflow(invalid) => match &invalid {
                InvalidWorkflow::Task { source: InvalidTask::PayloadTooLarge { .. }, .. } => {
                    Self::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "payload_too_large",
                        invalid.to_string(),
                    )
                }
                _ => Self::unprocessable("invalid_workflow", invalid.to_string()),
            },
            e @ (QueueError::TaskNotFound(_)
            | QueueError::ModuleVersionNotFound { .. }
            | QueueError::WorkflowNotFound(_)) => Self::not_found(e.to_string()),
            e @ QueueError::ModuleNotReady { .. } => {
                Self::conflict("module_not_ready", e.to_string())
            }
            e @ QueueError::NotCancellable { .. } => {
                Self::conflict("not_cancellable", e.to_string())
            }
            e @ QueueError::DedupKeyTaken { .. } => {
                Self::conflict("dedup_key_taken", e.to_string())
            }
            other => Self::internal("queue", &other),
        }
    }
}

impl From<TenantError> for ApiError {
    fn from(e: TenantError) -> Self {
        match e {
            TenantError::Queue(q) => q.into(),
            e @ TenantError::NotFound(_) => Self::not_found(e.to_string()),
            e @ TenantError::Exists(_) => Self::conflict("tenant_exists", e.to_string()),
            e => Self::unprocessable("invalid_tenant", e.to_string()),
        }
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        if let ValidationError::CompilerFailed { .. } = &e {
            return Self::internal("compiling a module", &e);
        }
        let code = match &e {
            ValidationError::NotWasm => "not_wasm",
            ValidationError::NotCoreModule => "not_core_module",
            ValidationError::Compile(_) => "invalid_wasm",
            ValidationError::MissingStart => "missing_start",
            ValidationError::BadStartSignature { .. } => "bad_start_signature",
            ValidationError::MissingMemoryExport => "missing_memory_export",
            ValidationError::ForbiddenImport { .. } => "forbidden_import",
            ValidationError::UnknownImport { .. } => "unknown_import",
            ValidationError::MissingRunExport { .. } => "missing_run_export",
            ValidationError::ComponentLink(_) => "component_link",
            ValidationError::MemoryTooLarge { .. } => "memory_too_large",
            ValidationError::LimitExceeded(_) => "module_limit_exceeded",
            _ => "invalid_module",
        };
        // The source (e.g. wasmtime's "unexpected end of section") says what is wrong with
        // the client's own bytes; it is safe and useful to show, shortened.
        let mut message = error_chain(&e);
        if message.len() > 1024 {
            let mut end = 1024;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str(" ...");
        }
        Self::unprocessable(code, message)
    }
}

/// The one `recover`: every rejection, ours or warp's, becomes a JSON error.
pub async fn recover(rejection: Rejection) -> Result<Response, Infallible> {
    Ok(from_rejection(&rejection).into_response())
}

fn from_rejection(r: &Rejection) -> ApiError {
    use warp::reject::{
        InvalidHeader, InvalidQuery, LengthRequired, MethodNotAllowed, MissingHeader,
        PayloadTooLarge, UnsupportedMediaType,
    };
    if let Some(e) = r.find::<ApiError>() {
        return e.clone();
    }
    if r.is_not_found() {
        return ApiError::not_found("no such route");
    }
    if r.find::<MethodNotAllowed>().is_some() {
        return ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this route",
        );
    }
    if let Some(e) = r.find::<InvalidHeader>() {
        return ApiError::bad_request("invalid_header", e.to_string());
    }
    if let Some(e) = r.find::<MissingHeader>() {
        return ApiError::bad_request("missing_header", e.to_string());
    }
    if r.find::<InvalidQuery>().is_some() {
        return ApiError::bad_request("invalid_query", "invalid query string");
    }
    if r.find::<PayloadTooLarge>().is_some() {
        return ApiError::too_large("request body too large");
    }
    if r.find::<LengthRequired>().is_some() {
        return ApiError::new(StatusCode::LENGTH_REQUIRED, "length_required", "length required");
    }
    if r.find::<UnsupportedMediaType>().is_some() {
        return ApiError::unsupported_media_type("unsupported content type");
    }
    tracing::error!(rejection = ?r, "admin API: unhandled rejection");
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error")
}
