//! Query and path parameters and module limits: parsing with errors that name the
//! parameter, and the check of the limits an upload asks for against the runner's maxima and
//! the tenant's caps.
//!
//! Invariants:
//! - a path segment that names something (a task type, a tenant) is percent-decoded first:
//!   `hs%3Ak` is the task type `hs:k`, as clients encode it;
//! - a malformed, zero or negative number, a repeated or an unknown parameter is a 400;
//! - a well-formed limit above the runner maximum or the tenant's cap is a 422 that says
//!   which bound it broke;
//! - the settings stored with a module never exceed the tenant's caps: when the runner
//!   default is above a cap and the upload does not ask for less, the cap itself is stored.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Serialize;
use utoipa::{IntoParams, ToSchema};

use super::error::ApiError;
use crate::queue::{
    ModuleSettings, TaskFilter, TaskId, TaskState, TenantCaps, DEFAULT_MAX_ATTEMPTS,
    MAX_MAX_ATTEMPTS,
};
use crate::sandbox::{LimitOverrides, Limits, SandboxConfig};
use crate::secrets::MAX_MODULE_SECRETS;

const MIB: u64 = 1024 * 1024;
/// Longest backoff a module may ask for.
pub const MAX_BACKOFF_MS: u64 = 30 * 24 * 3600 * 1000;

/// A path segment as text, percent-decoded (a route takes it with `warp::path!`). Bytes that
/// are not UTF-8 become U+FFFD, which no name allows: the route's check refuses it by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathText(pub String);

impl std::str::FromStr for PathText {
    type Err = std::convert::Infallible;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let decoded = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
        Ok(PathText(decoded.into_owned()))
    }
}

/// A query string as `(name, value)` pairs, consumed parameter by parameter.
#[derive(Debug)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    pub fn new(pairs: Vec<(String, String)>) -> Result<Self, ApiError> {
        for (i, (name, _)) in pairs.iter().enumerate() {
            if pairs[..i].iter().any(|(n, _)| n == name) {
                return Err(ApiError::bad_request(
                    "invalid_parameter",
                    format!("parameter `{name}` is given more than once"),
                ));
            }
        }
        Ok(Query { pairs })
    }

    pub fn take(&mut self, name: &str) -> Option<String> {
        let i = self.pairs.iter().position(|(n, _)| n == name)?;
        Some(self.pairs.swap_remove(i).1)
    }

    /// A whole number greater than zero.
    pub fn take_positive(&mut self, name: &str) -> Result<Option<u64>, ApiError> {
        let Some(raw) = self.take(name) else { return Ok(None) };
        match raw.trim().parse::<u64>() {
            Ok(v) if v > 0 => Ok(Some(v)),
            _ => Err(ApiError::bad_request(
                "invalid_parameter",
                format!("parameter `{name}` must be a whole number greater than zero, got {raw:?}"),
            )),
        }
    }

    /// A row id: a whole number from 1 to `i64::MAX` (ids are Postgres `bigint`s).
    pub fn take_id(&mut self, name: &str) -> Result<Option<TaskId>, ApiError> {
        match self.take_positive(name)? {
            None => Ok(None),
            Some(v) => TaskId::try_from(v).map(Some).map_err(|_| {
                ApiError::bad_request(
                    "invalid_parameter",
                    format!("parameter `{name}` must be at most {}, got {v}", TaskId::MAX),
                )
            }),
        }
    }

    /// `true`, `false`, `1` or `0`; an empty value (`?all=`, `?all`) is no boolean.
    pub fn take_bool(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        let Some(raw) = self.take(name) else { return Ok(None) };
        match raw.as_str() {
            "true" | "1" => Ok(Some(true)),
            "false" | "0" => Ok(Some(false)),
            _ => Err(ApiError::bad_request(
                "invalid_parameter",
                format!("parameter `{name}` must be true or false, got {raw:?}"),
            )),
        }
    }

    /// Rejects whatever parameters were not taken.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.pairs.first() {
            None => Ok(()),
            Some((name, _)) => Err(ApiError::bad_request(
                "unknown_parameter",
                format!("unknown query parameter `{name}`"),
            )),
        }
    }
}

/// `?tenant=NAME`, as the OpenAPI document describes it (routes take it with [`Query::take`]).
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TenantParam {
    /// (Operator) the tenant to act on: writes default to `default`, reads to every tenant.
    /// A tenant token may only name its own tenant.
    #[param(nullable = false, pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub tenant: Option<String>,
}

/// `{id}` in a path, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TaskIdPath {
    /// The task's id (ids are global: no tenant needed).
    #[param(value_type = i64)]
    pub id: TaskId,
}

/// `{id}` of a workflow in a path, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WorkflowIdPath {
    /// The workflow's id.
    pub id: i64,
}

/// `GET /v1/workflows` query, as documented.
#[allow(dead_code)] // only describes the parameters; the route parses them
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WorkflowListParams {
    /// (Operator) only this tenant's workflows (default: every tenant's).
    #[param(nullable = false, pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub tenant: Option<String>,
    /// Page cursor: workflows with ids below this (the previous page's `next_before`).
    #[param(nullable = false, minimum = 1, maximum = 9223372036854775807_i64)]
    pub before: Option<i64>,
    /// Page size, 1 to 100 (default 20).
    #[param(nullable = false, minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
}

/// `{task_type}` in a path, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TaskTypePath {
    /// 1 to 128 letters, digits, `.`, `-`, `_` and `:`.
    #[param(pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub task_type: String,
}

/// `{name}` in a tenant path, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TenantPath {
    /// The tenant's name: 1 to 64 letters, digits, `.`, `-` and `_`.
    #[param(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub name: String,
}

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

/// `{name}` in a secret's path, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SecretNamePath {
    /// The secret's name, the environment variable the guest sees: a letter or `_`, then up to
    /// 127 letters, digits and `_`. Names starting with `SWEEP_` are the runner's own (422).
    #[param(pattern = "^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
    pub name: String,
}

/// `GET /v1/usage` query, as documented.
#[allow(dead_code)] // only describes the parameters; the route parses them
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// First day, UTC (default: the first of `to`'s month).
    #[param(nullable = false, value_type = Option<String>, format = Date)]
    pub from: Option<String>,
    /// Last day, UTC, included (default: today). At most 366 days after `from`.
    #[param(nullable = false, value_type = Option<String>, format = Date)]
    pub to: Option<String>,
    /// Only this task type.
    #[param(nullable = false, pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub task_type: Option<String>,
}

/// `PUT /v1/modules/{task_type}?secrets=...`, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SecretsParam {
    /// The tenant's secrets this version receives as environment variables, comma-separated
    /// (at most 32; each must exist, else 422).
    #[param(
        nullable = false,
        pattern = "^[A-Za-z_][A-Za-z0-9_]{0,127}(,[A-Za-z_][A-Za-z0-9_]{0,127}){0,31}$"
    )]
    pub secrets: Option<String>,
}

/// `PUT /v1/modules/{task_type}?reuse=...`, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReuseParam {
    /// Keep a component's instance after a task that returned cleanly and run up to this
    /// many tasks of this version on it (a task then sees what earlier ones left in the
    /// guest's memory; docs/guests.md). Absent: 1000 for a component. 1: a fresh instance for
    /// every task. Components only (a preview-1 module: 422).
    #[param(nullable = false, minimum = 1, maximum = 1000000)]
    pub reuse: Option<i32>,
}

/// A secret name from a path or a query: malformed is 400, `SWEEP_...` (well-formed but the
/// runner's own) 422.
pub fn check_secret_name(name: &str) -> Result<(), ApiError> {
    crate::queue::validate_secret_name(name).map_err(|e| {
        if e.is_reserved() {
            ApiError::unprocessable("reserved_secret_name", e.to_string())
        } else {
            ApiError::bad_request("invalid_secret_name", e.to_string())
        }
    })
}

/// `?secrets=A,B` of an upload: the names, each checked, without repeats; more than
/// [`MAX_MODULE_SECRETS`] is a 422.
pub fn secret_names(raw: &str) -> Result<Vec<String>, ApiError> {
    let mut names: Vec<String> = Vec::new();
    for name in raw.split(',') {
        check_secret_name(name)?;
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    if names.len() > MAX_MODULE_SECRETS {
        return Err(ApiError::unprocessable(
            "too_many_secrets",
            format!("a module names at most {MAX_MODULE_SECRETS} secrets, got {}", names.len()),
        ));
    }
    Ok(names)
}

/// `GET /v1/tasks/{id}` query, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitParam {
    /// Answer once the task has ended (succeeded, cancelled or dead), or after this long,
    /// whichever is first: `30s`, `500ms`, `2m` or seconds (longer asks wait 60 s). The answer is the
    /// task as it then is; a live state means the wait ran out. Woken by Postgres (LISTEN),
    /// not by polling.
    #[param(nullable = false, pattern = "^[0-9]+(\\.[0-9]+)?(ms|s|m)?$")]
    pub wait: Option<String>,
}

/// `GET /v1/modules` query, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ModuleListParams {
    /// Every version, not only the active ones (`true`, `false`, `1`, `0`).
    #[param(nullable = false)]
    pub all: Option<bool>,
}

/// `GET /v1/dead` query, as documented.
#[allow(dead_code)] // only describes the parameter; the route parses it
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeadParams {
    /// Only this task type.
    #[param(nullable = false, pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub task_type: Option<String>,
    /// Ids after this one (the previous page's `next_after`).
    #[param(nullable = false, minimum = 1, maximum = 9223372036854775807_i64)]
    pub after: Option<i64>,
    /// Page size, 1 to 1000 (default 100).
    #[param(nullable = false, minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

/// `GET /v1/tasks` query (the dashboard's task list reads the same), as documented.
#[allow(dead_code)] // only describes the parameters; `TaskQuery::take` parses them
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TaskListParams {
    /// Only tasks in this state.
    #[param(
        nullable = false,
        pattern = "^(blocked|pending|running|retrying|succeeded|cancelled|dead)$"
    )]
    pub state: Option<String>,
    /// Only this task type.
    #[param(nullable = false, pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub task_type: Option<String>,
    /// Only task types starting with this (`mail.` finds `mail.send` and `mail.bounce`).
    #[param(nullable = false, pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub type_prefix: Option<String>,
    /// Only tasks whose payload contains this: `path=value` with a dotted path (`user.id=42`,
    /// `to=a@example.com`; the value is JSON when it parses as JSON, else a string), or a JSON
    /// object (`{"to": "a@example.com"}`), which the payload must contain.
    #[param(
        nullable = false,
        min_length = 1,
        max_length = 4096,
        pattern = "^[^=\\u0000]*=[^\\u0000]*$"
    )]
    pub payload: Option<String>,
    /// Only the task with this id.
    #[param(nullable = false, minimum = 1, maximum = 9223372036854775807_i64)]
    pub id: Option<i64>,
    /// Created at or after (RFC 3339; the dashboard also sends `2026-12-01T10:00`, read as UTC).
    #[param(nullable = false, value_type = Option<String>, format = DateTime)]
    pub since: Option<String>,
    /// Created before (RFC 3339; the dashboard also sends `2026-12-01T10:00`, read as UTC).
    #[param(nullable = false, value_type = Option<String>, format = DateTime)]
    pub until: Option<String>,
    /// Page cursor: tasks with ids below this (the previous page's `next_before`).
    #[param(nullable = false, minimum = 1, maximum = 9223372036854775807_i64)]
    pub before: Option<i64>,
    /// Page size, 1 to 500 (default 50).
    #[param(nullable = false, minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

/// A task list's filter, read from a query string, with the values as given (to build the
/// URLs of the same view: the next page, the state tabs).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskQuery {
    pub filter: TaskFilter,
    /// The filter's parameters as given, in a fixed order, without `before` and `limit`.
    pub given: Vec<(&'static str, String)>,
}

/// Default page size of task lists.
pub const DEFAULT_TASK_PAGE: i64 = 50;
/// Largest page of task lists.
pub const MAX_TASK_PAGE: u64 = 500;

fn bad_param(name: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request("invalid_parameter", format!("parameter `{name}`: {message}"))
}

/// `2026-12-01T10:00` (what `<input type="datetime-local">` sends, read as UTC) or RFC 3339.
pub fn parse_time(name: &str, raw: &str) -> Result<DateTime<Utc>, ApiError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(t.with_timezone(&Utc));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(raw, f).ok())
        .map(|n| n.and_utc())
        .ok_or_else(|| {
            bad_param(name, format!("expected a time like 2026-12-01T10:00, got {raw:?}"))
        })
}

impl TaskQuery {
    /// Takes the list parameters of [`TaskListParams`] from `q`, for a caller whose reads are
    /// limited to `tenant` (`None`: all tenants).
    pub fn take(q: &mut Query, tenant: Option<String>) -> Result<TaskQuery, ApiError> {
        let mut given = Vec::new();
        let state = match q.take("state") {
            Some(raw) => {
                let state = raw.parse::<TaskState>().map_err(|e| bad_param("state", e))?;
                given.push(("state", raw));
                Some(state)
            }
            None => None,
        };
        let mut task_type_like = |name: &'static str| -> Result<Option<String>, ApiError> {
            let Some(raw) = q.take(name) else { return Ok(None) };
            crate::queue::validate_task_type(&raw).map_err(|e| {
                ApiError::bad_request("invalid_task_type", format!("parameter `{name}`: {e}"))
            })?;
            given.push((name, raw.clone()));
            Ok(Some(raw))
        };
        let task_type = task_type_like("task_type")?;
        let type_prefix = task_type_like("type_prefix")?;
        let payload = match q.take("payload") {
            Some(raw) => {
                if raw.len() > 4096 {
                    return Err(bad_param("payload", "at most 4096 bytes"));
                }
                let wanted =
                    crate::queue::payload_match(&raw).map_err(|e| bad_param("payload", e))?;
                given.push(("payload", raw));
                Some(wanted)
            }
            None => None,
        };
        let id = q.take_id("id")?;
        if let Some(id) = id {
            given.push(("id", id.to_string()));
        }
        let mut time = |name: &'static str| -> Result<Option<DateTime<Utc>>, ApiError> {
            let Some(raw) = q.take(name) else { return Ok(None) };
            let at = parse_time(name, &raw)?;
            given.push((name, raw));
            Ok(Some(at))
        };
        let since = time("since")?;
        let until = time("until")?;
        let before = q.take_id("before")?;
        let limit = q.take_positive("limit")?.unwrap_or(DEFAULT_TASK_PAGE as u64);
        if limit > MAX_TASK_PAGE {
            return Err(bad_param("limit", format!("must be at most {MAX_TASK_PAGE}")));
        }
        let filter = TaskFilter {
            tenant,
            state,
            task_type,
            since,
            until,
            before,
            id,
            type_prefix,
            payload,
            limit: i64::try_from(limit).unwrap_or(DEFAULT_TASK_PAGE),
        };
        Ok(TaskQuery { filter, given })
    }
}

/// The limits an upload asks for, as given (`PUT /v1/modules/{task_type}?fuel=...`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RequestedLimits {
    /// Fuel per task (default and maximum: the runner's; at most the tenant's cap).
    #[param(nullable = false, minimum = 1)]
    pub fuel: Option<u64>,
    /// Wall-clock limit per task in milliseconds.
    #[param(nullable = false, minimum = 1)]
    pub timeout_ms: Option<u64>,
    /// Linear-memory limit per task in MiB (the module's initial memory must fit in it).
    #[param(nullable = false, minimum = 1)]
    pub memory_mb: Option<u64>,
    /// Attempts before a task dies, for tasks that do not set their own (at most 1000).
    #[param(nullable = false, minimum = 1)]
    pub max_attempts: Option<u64>,
    /// First retry delay in milliseconds (at most 30 days).
    #[param(nullable = false, minimum = 1)]
    pub backoff_base_ms: Option<u64>,
    /// Longest retry delay in milliseconds (at most 30 days, not below the base).
    #[param(nullable = false, minimum = 1)]
    pub backoff_cap_ms: Option<u64>,
    /// Most tasks of this type running at once across all runners.
    #[param(nullable = false, minimum = 1)]
    pub max_running: Option<u64>,
}

impl RequestedLimits {
    pub fn from_query(q: &mut Query) -> Result<Self, ApiError> {
        Ok(RequestedLimits {
            fuel: q.take_positive("fuel")?,
            timeout_ms: q.take_positive("timeout_ms")?,
            memory_mb: q.take_positive("memory_mb")?,
            max_attempts: q.take_positive("max_attempts")?,
            backoff_base_ms: q.take_positive("backoff_base_ms")?,
            backoff_cap_ms: q.take_positive("backoff_cap_ms")?,
            max_running: q.take_positive("max_running")?,
        })
    }
}

/// What a module will run with: the runner's view at upload time (each runner applies its
/// own defaults and maxima when the task runs; `null` backoff means the runner's default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct EffectiveLimits {
    pub fuel: u64,
    pub timeout_ms: u64,
    pub memory_bytes: u64,
    pub output_bytes: usize,
    pub max_attempts: i32,
    #[schema(required)]
    pub backoff_base_ms: Option<i64>,
    #[schema(required)]
    pub backoff_cap_ms: Option<i64>,
    #[schema(required)]
    pub max_running: Option<i32>,
}

/// Highest per-type running limit an upload may set.
const MAX_RUNNING_LIMIT: u64 = 1_000_000;

fn over(what: &str, value: u64, unit: &str, bound: &str, limit: u64) -> ApiError {
    ApiError::unprocessable(
        "limit_too_high",
        format!("{what} = {value}{unit} exceeds {bound} of {limit}{unit}"),
    )
}

/// Checks `req` against the runner maxima (`sandbox`) and the tenant's `caps`; returns the
/// settings to store and the limits they resolve to.
pub fn resolve_limits(
    req: &RequestedLimits,
    caps: &TenantCaps,
    sandbox: &SandboxConfig,
) -> Result<(ModuleSettings, EffectiveLimits), ApiError> {
    let (defaults, maxima) = (&sandbox.defaults, &sandbox.maxima);
    let cap = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    let runner_max = "the runner maximum";
    let tenant_cap = "the tenant's cap";

    // (requested, runner default, runner maximum, tenant cap) per sandbox limit.
    let max_timeout_ms = u64::try_from(maxima.timeout.as_millis()).unwrap_or(u64::MAX);
    let default_timeout_ms = u64::try_from(defaults.timeout.as_millis()).unwrap_or(u64::MAX);
    let memory_bytes =
        match req.memory_mb {
            Some(mb) => Some(mb.checked_mul(MIB).ok_or_else(|| {
                over("memory_mb", mb, " MiB", runner_max, maxima.memory_bytes / MIB)
            })?),
            None => None,
        };
    let checks = [
        ("fuel", req.fuel, "", 1, defaults.fuel, maxima.fuel, cap(caps.max_fuel)),
        (
            "timeout_ms",
            req.timeout_ms,
            " ms",
            1,
            default_timeout_ms,
            max_timeout_ms,
            cap(caps.max_timeout_ms),
        ),
        (
            "memory_mb",
            memory_bytes,
            " MiB",
            MIB,
            defaults.memory_bytes,
            maxima.memory_bytes,
            cap(caps.max_memory_bytes),
        ),
    ];
    let mut stored = [None; 3];
    for (slot, (name, asked, unit, scale, default, maximum, tenant)) in
        stored.iter_mut().zip(checks)
    {
        if let Some(v) = asked {
            if v > maximum {
                return Err(over(name, v / scale, unit, runner_max, maximum / scale));
            }
            if let Some(t) = tenant.filter(|&t| v > t) {
                return Err(over(name, v / scale, unit, tenant_cap, t / scale));
            }
        }
        // Without a request, a tenant cap below the runner default is what the module gets.
        *slot = asked.or(tenant.filter(|&t| t < default));
    }
    let [fuel, timeout_ms, memory_bytes] = stored;

    let max_attempts = match req.max_attempts {
        Some(n) if n > u64::try_from(MAX_MAX_ATTEMPTS).unwrap_or(u64::MAX) => {
            return Err(over("max_attempts", n, "", "the maximum", MAX_MAX_ATTEMPTS as u64));
        }
        n => n.and_then(|n| i32::try_from(n).ok()),
    };
    for (name, v) in
        [("backoff_base_ms", req.backoff_base_ms), ("backoff_cap_ms", req.backoff_cap_ms)]
    {
        if let Some(v) = v.filter(|&v| v > MAX_BACKOFF_MS) {
            return Err(over(name, v, " ms", "the maximum", MAX_BACKOFF_MS));
        }
    }
    if let (Some(base), Some(cap)) = (req.backoff_base_ms, req.backoff_cap_ms) {
        if cap < base {
            return Err(ApiError::unprocessable(
                "invalid_backoff",
                format!("backoff_cap_ms ({cap}) must not be below backoff_base_ms ({base})"),
            ));
        }
    }

    let max_running = match req.max_running {
        Some(n) if n > MAX_RUNNING_LIMIT => {
            return Err(over("max_running", n, "", "the maximum", MAX_RUNNING_LIMIT));
        }
        n => n.and_then(|n| i32::try_from(n).ok()),
    };
    let to_i64 = |v: Option<u64>| v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
    let settings = ModuleSettings {
        fuel: to_i64(fuel),
        timeout_ms: to_i64(timeout_ms),
        memory_bytes: to_i64(memory_bytes),
        max_attempts,
        backoff_base_ms: to_i64(req.backoff_base_ms),
        backoff_cap_ms: to_i64(req.backoff_cap_ms),
        max_running,
    };
    let overrides = LimitOverrides {
        fuel,
        timeout: timeout_ms.map(Duration::from_millis),
        memory_bytes,
        output_bytes: None,
    };
    let limits = Limits::resolve(defaults, &overrides, maxima);
    let effective = EffectiveLimits {
        fuel: limits.fuel,
        timeout_ms: u64::try_from(limits.timeout.as_millis()).unwrap_or(u64::MAX),
        memory_bytes: limits.memory_bytes,
        output_bytes: limits.output_bytes,
        max_attempts: max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
        backoff_base_ms: settings.backoff_base_ms,
        backoff_cap_ms: settings.backoff_cap_ms,
        max_running,
    };
    Ok((settings, effective))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn query(s: &[(&str, &str)]) -> Query {
        Query::new(s.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()).unwrap()
    }

    fn requested(s: &[(&str, &str)]) -> Result<RequestedLimits, ApiError> {
        let mut q = query(s);
        let r = RequestedLimits::from_query(&mut q)?;
        q.finish()?;
        Ok(r)
    }

    #[test]
    fn bad_numbers_and_unknown_or_repeated_parameters_are_400() {
        for bad in ["-1", "0", "1.5", "ten", "", "99999999999999999999999"] {
            let e = requested(&[("fuel", bad)]).unwrap_err();
            assert_eq!((e.status.as_u16(), e.code), (400, "invalid_parameter"), "{bad}");
            assert!(e.message.contains("fuel"));
        }
        let e = requested(&[("fule", "1")]).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (400, "unknown_parameter"));
        let pairs = vec![("fuel".to_string(), "1".to_string()), ("fuel".into(), "2".into())];
        assert_eq!(Query::new(pairs).unwrap_err().status.as_u16(), 400);
        assert_eq!(requested(&[("memory_mb", "16")]).unwrap().memory_mb, Some(16));
    }

    #[test]
    fn path_segments_are_percent_decoded() {
        let text = |raw: &str| raw.parse::<PathText>().unwrap().0;
        assert_eq!(text("hs%3Ak"), "hs:k");
        assert_eq!(text("plain.name-1_x"), "plain.name-1_x");
        assert_eq!(text("a%20b"), "a b");
        assert_eq!(text("%FF"), "\u{fffd}");
        assert_eq!(text("50%"), "50%", "a stray % stays as it is");
    }

    #[test]
    fn booleans_are_spelt_out() {
        for (raw, want) in [("true", true), ("1", true), ("false", false), ("0", false)] {
            assert_eq!(query(&[("all", raw)]).take_bool("all").unwrap(), Some(want));
        }
        for bad in ["", "yes", "TRUE"] {
            let e = query(&[("all", bad)]).take_bool("all").unwrap_err();
            assert_eq!((e.status.as_u16(), e.code), (400, "invalid_parameter"), "{bad:?}");
        }
    }

    #[test]
    fn limits_above_the_runner_maximum_or_the_tenant_cap_are_422() {
        let sandbox = SandboxConfig::default();
        let none = TenantCaps::default();
        let req = RequestedLimits { fuel: Some(u64::MAX), ..Default::default() };
        let e = resolve_limits(&req, &none, &sandbox).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (422, "limit_too_high"));
        assert!(e.message.contains("runner maximum"), "{}", e.message);

        let caps = TenantCaps { max_memory_bytes: Some(32 * MIB as i64), ..Default::default() };
        let req = RequestedLimits { memory_mb: Some(64), ..Default::default() };
        let e = resolve_limits(&req, &caps, &sandbox).unwrap_err();
        assert!(e.message.contains("tenant's cap of 32 MiB"), "{}", e.message);
        let req = RequestedLimits { memory_mb: Some(u64::MAX), ..Default::default() };
        assert_eq!(resolve_limits(&req, &none, &sandbox).unwrap_err().status.as_u16(), 422);

        let req = RequestedLimits { max_attempts: Some(5000), ..Default::default() };
        assert_eq!(resolve_limits(&req, &none, &sandbox).unwrap_err().status.as_u16(), 422);
        let req = RequestedLimits {
            backoff_base_ms: Some(100),
            backoff_cap_ms: Some(10),
            ..Default::default()
        };
        assert_eq!(resolve_limits(&req, &none, &sandbox).unwrap_err().code, "invalid_backoff");
    }

    #[test]
    fn tenant_caps_below_the_default_are_stored_and_effective() {
        let sandbox = SandboxConfig::default();
        let caps = TenantCaps { max_fuel: Some(1000), ..Default::default() };
        let (settings, limits) =
            resolve_limits(&RequestedLimits::default(), &caps, &sandbox).unwrap();
        assert_eq!(settings.fuel, Some(1000));
        assert_eq!(limits.fuel, 1000);
        assert_eq!(settings.timeout_ms, None, "no cap, no override");
        assert_eq!(limits.timeout_ms, sandbox.defaults.timeout.as_millis() as u64);
        assert_eq!(limits.max_attempts, DEFAULT_MAX_ATTEMPTS);

        let req = RequestedLimits { fuel: Some(10), memory_mb: Some(2), ..Default::default() };
        let (settings, limits) = resolve_limits(&req, &caps, &sandbox).unwrap();
        assert_eq!((settings.fuel, settings.memory_bytes), (Some(10), Some(2 * MIB as i64)));
        assert_eq!((limits.fuel, limits.memory_bytes), (10, 2 * MIB));
    }
}
