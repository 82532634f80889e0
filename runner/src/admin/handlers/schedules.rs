//! Cron schedule routes: create, list, show, pause, resume and delete a tenant's schedules.
//!
//! Invariants: a schedule is created only when everything its ticks need is valid now: the
//! expression parses and fires, the time zone is an IANA name, the tenant has a module for the
//! task type, and the payload is a JSON object within the tenant's payload limit; otherwise a
//! 4xx whose message names the field, and nothing is written. A schedule is named within its
//! tenant: a tenant token reaches only its own (another tenant's answers 404), the operator
//! names the tenant with `?tenant=` (default `default`) as for writes.

use warp::http::StatusCode;

use super::{check_modules, json, payload_limit, tenant_param, Answer};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::models::{CreateScheduleRequest, SchedulesResponse};
use crate::admin::openapi as doc;
use crate::admin::params::{ScheduleNamePath, TenantParam};
use crate::admin::AdminState;
use crate::queue::{
    self, CronSchedule, InvalidSchedule, InvalidTask, ScheduleError, DEFAULT_TENANT,
};

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
        (status = 404, response = doc::NotFound),
        (status = 409, response = doc::Conflict),
        (status = 422, response = doc::Unprocessable),
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
        (status = 404, response = doc::NotFound),
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
        (status = 404, response = doc::NotFound),
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
        (status = 404, response = doc::NotFound),
        (status = 422, response = doc::Unprocessable),
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
        (status = 404, response = doc::NotFound),
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
