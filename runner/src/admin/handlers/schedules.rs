//! Cron schedule routes: create, list, show, pause, resume and delete a tenant's schedules.
//!
//! Invariants: a schedule is created only when everything its ticks need is valid now: the
//! expression parses and fires, the time zone is an IANA name, the tenant has a module for the
//! task type, and the payload is a JSON object within the tenant's payload limit; otherwise a
//! 4xx whose message names the field, and nothing is written. A schedule is named within its
//! tenant: a tenant token reaches only its own (another tenant's answers 404), the operator
//! names the tenant with `?tenant=` (default `default`) as for writes.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use warp::http::StatusCode;

use super::tasks::{check_modules, payload_limit, tenant_param};
use super::{json, Answer};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::json_input::{integer, optional_integer};
use crate::admin::openapi as doc;
use crate::admin::params::TenantParam;
use crate::admin::AdminState;
use crate::queue::{
    self, CatchUp, CronSchedule, InvalidSchedule, InvalidTask, NewSchedule, Overlap, ScheduleError,
    DEFAULT_TENANT,
};

/// `{name}` in a path, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ScheduleNamePath {
    /// The schedule's name (unique within its tenant): 1 to 128 letters, digits, `.`, `-`, `_`
    /// and `:`.
    #[param(pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub name: String,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

fn utc() -> String {
    "UTC".to_owned()
}

/// `POST /v1/schedules`.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateScheduleRequest {
    /// Unique within the tenant.
    #[schema(pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub name: String,
    /// Five fields (`minute hour day-of-month month day-of-week`) or six (seconds first), e.g.
    /// `*/15 * * * *` or `*/5 * * * * *`.
    #[schema(min_length = 1, max_length = 256)]
    pub cron: String,
    /// IANA time zone the expression is read in (default `UTC`), e.g. `Europe/Berlin`.
    #[serde(default = "utc")]
    pub timezone: String,
    /// The tenant must have a module for it (else 422).
    #[schema(pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub task_type: String,
    /// Every tick's task gets this JSON object; `{}` when absent.
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    pub payload: Value,
    #[serde(default, deserialize_with = "integer")]
    pub priority: i32,
    /// Default: the module's setting, else 5.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 1, maximum = 1000)]
    pub max_attempts: Option<i32>,
    /// `skip` (default): no task for a tick while the previous one is pending, running or
    /// retrying; `allow`: a task every tick.
    #[schema(value_type = Option<Overlap>, nullable = false)]
    pub overlap: Option<String>,
    /// Ticks the scheduler reaches late (every runner was down): `latest` (default) runs the
    /// latest one once; `skip` runs none more than 10 s late.
    #[schema(value_type = Option<CatchUp>, nullable = false)]
    pub catch_up: Option<String>,
}

impl CreateScheduleRequest {
    fn into_schedule(self, tenant: &str) -> Result<NewSchedule, ApiError> {
        let invalid = |m: String| ApiError::unprocessable("invalid_schedule", m);
        let nul =
            |field: &str| invalid(format!("{field} must not contain NUL (\\u0000) characters"));
        if crate::admin::models::has_nul(&self.payload) {
            return Err(nul("payload"));
        }
        let mut s = NewSchedule::new(self.name, self.cron, self.task_type)
            .tenant(tenant)
            .timezone(self.timezone)
            .payload(self.payload)
            .priority(self.priority);
        s.max_attempts = self.max_attempts;
        if let Some(o) = self.overlap {
            s.overlap = o.parse().map_err(invalid)?;
        }
        if let Some(c) = self.catch_up {
            s.catch_up = c.parse().map_err(invalid)?;
        }
        Ok(s)
    }
}

/// `GET /v1/schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SchedulesResponse {
    pub schedules: Vec<CronSchedule>,
}

impl From<ScheduleError> for ApiError {
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::Invalid(InvalidSchedule::Task(InvalidTask::PayloadTooLarge {
                size,
                limit,
            })) => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                InvalidTask::PayloadTooLarge { size, limit }.to_string(),
            ),
            ScheduleError::Invalid(invalid) => {
                ApiError::unprocessable("invalid_schedule", invalid.to_string())
            }
            e @ ScheduleError::Exists(_) => ApiError::conflict("schedule_exists", e.to_string()),
            e @ ScheduleError::NotFound(_) => ApiError::not_found(e.to_string()),
            ScheduleError::Queue(q) => q.into(),
        }
    }
}

/// The tenant a named schedule is looked up in, and the name checked.
fn named(caller: &Caller, query: Vec<(String, String)>, name: &str) -> Result<String, ApiError> {
    let requested = tenant_param(query)?;
    let tenant = caller.read_scope(requested.as_deref())?.unwrap_or_else(|| DEFAULT_TENANT.into());
    queue::validate_schedule_name(name)
        .map_err(|e| ApiError::bad_request("invalid_schedule_name", e.to_string()))?;
    Ok(tenant)
}

/// `POST /v1/schedules`: 201 with the schedule and its first tick.
#[utoipa::path(
    post,
    path = "/v1/schedules",
    operation_id = "create_schedule",
    tag = "schedules",
    security(("bearer" = [])),
    params(TenantParam),
    request_body(content = CreateScheduleRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Created; `next_run_at` is its first tick", body = CronSchedule),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 413, response = doc::TooLarge),
        (status = 415, response = doc::UnsupportedMediaType),
        (status = 422, response = doc::Unprocessable),
        (status = 500, response = doc::Internal),
    )
)]
pub async fn create(
    state: AdminState,
    caller: Caller,
    query: Vec<(String, String)>,
    request: CreateScheduleRequest,
) -> Answer {
    let requested = tenant_param(query)?;
    let (tenant, caps) = caller.write_target(state.store(), requested.as_deref()).await?;
    let schedule = request.into_schedule(&tenant)?;
    schedule.validate().map_err(ScheduleError::from)?;
    let task = schedule.sample_task();
    task.check_payload(payload_limit(&state, &caps))
        .map_err(|e| ScheduleError::from(InvalidSchedule::Task(e)))?;
    check_modules(&state, &tenant, std::slice::from_ref(&task)).await?;
    let created = queue::create_schedule(state.store(), &schedule).await?;
    Ok(json(StatusCode::CREATED, &created))
}

/// `GET /v1/schedules`: the caller's schedules (the operator's: every tenant's, or `?tenant=`).
#[utoipa::path(
    get,
    path = "/v1/schedules",
    operation_id = "list_schedules",
    tag = "schedules",
    security(("bearer" = [])),
    params(TenantParam),
    responses(
        (status = 200, description = "By tenant and name", body = SchedulesResponse),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 500, response = doc::Internal),
    )
)]
pub async fn list(state: AdminState, caller: Caller, query: Vec<(String, String)>) -> Answer {
    let requested = tenant_param(query)?;
    let scope = caller.read_scope(requested.as_deref())?;
    let schedules = queue::list_schedules(state.store(), scope.as_deref()).await?;
    Ok(json(StatusCode::OK, &SchedulesResponse { schedules }))
}

/// `GET /v1/schedules/{name}`: one schedule with its next and last run.
#[utoipa::path(
    get,
    path = "/v1/schedules/{name}",
    operation_id = "show_schedule",
    tag = "schedules",
    security(("bearer" = [])),
    params(ScheduleNamePath, TenantParam),
    responses(
        (status = 200, description = "The schedule", body = CronSchedule),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 500, response = doc::Internal),
    )
)]
pub async fn show(
    state: AdminState,
    caller: Caller,
    name: String,
    query: Vec<(String, String)>,
) -> Answer {
    let tenant = named(&caller, query, &name)?;
    let schedule = queue::get_schedule(state.store(), &tenant, &name).await?;
    Ok(json(StatusCode::OK, &schedule))
}

/// `POST /v1/schedules/{name}/pause`: no ticks until resumed (pausing a paused one is a no-op).
#[utoipa::path(
    post,
    path = "/v1/schedules/{name}/pause",
    operation_id = "pause_schedule",
    tag = "schedules",
    security(("bearer" = [])),
    params(ScheduleNamePath, TenantParam),
    responses(
        (status = 200, description = "The schedule, paused", body = CronSchedule),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 500, response = doc::Internal),
    )
)]
pub async fn pause(
    state: AdminState,
    caller: Caller,
    name: String,
    query: Vec<(String, String)>,
) -> Answer {
    let tenant = named(&caller, query, &name)?;
    let schedule = queue::pause_schedule(state.store(), &tenant, &name).await?;
    Ok(json(StatusCode::OK, &schedule))
}

/// `POST /v1/schedules/{name}/resume`: ticks again from the first one after now (the ticks
/// during the pause do not run).
#[utoipa::path(
    post,
    path = "/v1/schedules/{name}/resume",
    operation_id = "resume_schedule",
    tag = "schedules",
    security(("bearer" = [])),
    params(ScheduleNamePath, TenantParam),
    responses(
        (status = 200, description = "The schedule, running, with its next tick", body = CronSchedule),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
        (status = 500, response = doc::Internal),
    )
)]
pub async fn resume(
    state: AdminState,
    caller: Caller,
    name: String,
    query: Vec<(String, String)>,
) -> Answer {
    let tenant = named(&caller, query, &name)?;
    let schedule = queue::resume_schedule(state.store(), &tenant, &name).await?;
    Ok(json(StatusCode::OK, &schedule))
}

/// `DELETE /v1/schedules/{name}`: gone; the tasks it already enqueued stay.
#[utoipa::path(
    delete,
    path = "/v1/schedules/{name}",
    operation_id = "delete_schedule",
    tag = "schedules",
    security(("bearer" = [])),
    params(ScheduleNamePath, TenantParam),
    responses(
        (status = 200, description = "The schedule as it was", body = CronSchedule),
        (status = 400, response = doc::BadRequest),
        (status = 401, response = doc::Unauthorized),
        (status = 403, response = doc::Forbidden),
        (status = 404, response = doc::NotFound),
        (status = 500, response = doc::Internal),
    )
)]
pub async fn delete(
    state: AdminState,
    caller: Caller,
    name: String,
    query: Vec<(String, String)>,
) -> Answer {
    let tenant = named(&caller, query, &name)?;
    let schedule = queue::delete_schedule(state.store(), &tenant, &name).await?;
    Ok(json(StatusCode::OK, &schedule))
}
