//! Request and response bodies of the admin API, and the checks that turn a request body
//! into queue input.
//!
//! Invariants: request bodies reject unknown fields (a misspelt `delay_ms` is an error, not a
//! task that runs now); integer fields read integers as JSON Schema counts them (`5.0` too,
//! see `json_input`); strings Postgres cannot store (NUL characters) are refused here as
//! bad input instead of failing in the database.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::error::ApiError;
use super::json_input::{integer, optional_integer, present_integer};
use super::params::EffectiveLimits;
use crate::queue::{
    CapsChange, CatchUp, CompileState, CronSchedule, DeadTask, Enqueued, ModuleVersion,
    NewSchedule, NewStep, NewTask, OnParentFailure, Overlap, QueueControl, RunnerInfo, TaskId,
    TaskRow, Tenant, TenantPause, TypeStats, WorkflowSummary, MAX_DEDUP_KEY_LEN, MAX_MAX_ATTEMPTS,
    MAX_WEIGHT,
};

/// `POST /v1/tasks` (and each element of `POST /v1/tasks/batch`). Read by the hand-written
/// `Deserialize` in `enqueue_input.rs` (which names the field of an error); the serde
/// attributes here describe it to the OpenAPI document (and to `Serialize`, for clients).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnqueueRequest {
    /// Names the module that runs the task; the tenant must have one registered (else 422).
    #[schema(pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub task_type: String,
    /// A JSON object; `{}` when absent.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub payload: Value,
    /// Higher runs first, within the task type; negative: only when nothing else is due.
    #[serde(default)]
    pub priority: i32,
    /// When the task becomes due (2000-01-01 to ten years ahead); not with `delay_ms`.
    pub run_at: Option<DateTime<Utc>>,
    /// Due this many milliseconds from now (at most ten years); not with `run_at`.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Default: the module's setting, else 5.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub max_attempts: Option<i32>,
    /// While a live task of the tenant holds this key, enqueueing it again answers that task.
    /// Not with `after`.
    #[schema(min_length = 1, max_length = 512)]
    pub dedup_key: Option<String>,
    /// Ids of tasks of the tenant this task waits for: it is `blocked` until every one has
    /// ended, then due with their ids, states and results in its payload's `$parents`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<i64>, max_items = 10000)]
    pub after: Vec<TaskId>,
    /// What a parent that ends dead or cancelled does: `cancel` (default) cancels this task,
    /// naming the parent; `run` runs it anyway once every parent has ended.
    #[serde(default)]
    pub on_parent_failure: OnParentFailure,
}

const _: () = assert!(MAX_MAX_ATTEMPTS == 1000 && MAX_DEDUP_KEY_LEN == 512 && MAX_WEIGHT == 10_000);

impl EnqueueRequest {
    /// The task to enqueue for `tenant`; the queue validates the rest.
    pub fn into_task(self, tenant: &str) -> Result<NewTask, ApiError> {
        let invalid = |m: &str| ApiError::unprocessable("invalid_task", m.to_owned());
        if has_nul(&self.payload) {
            return Err(invalid("payload must not contain NUL (\\u0000) characters"));
        }
        if self.dedup_key.as_deref().is_some_and(|k| k.contains('\0')) {
            return Err(invalid("dedup_key must not contain NUL (\\u0000) characters"));
        }
        let mut task = NewTask::new(self.task_type, self.payload).tenant(tenant);
        task.priority = self.priority;
        task.max_attempts = self.max_attempts;
        task.dedup_key = self.dedup_key;
        task.after = self.after;
        task.on_parent_failure = self.on_parent_failure;
        match (self.run_at, self.delay_ms) {
            (Some(_), Some(_)) => return Err(invalid("give run_at or delay_ms, not both")),
            (Some(at), None) => task = task.run_at(at),
            (None, Some(ms)) => task = task.delay(std::time::Duration::from_millis(ms)),
            (None, None) => {}
        }
        Ok(task)
    }
}

pub(crate) fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
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
    pub fn into_schedule(self, tenant: &str) -> Result<NewSchedule, ApiError> {
        let invalid = |m: String| ApiError::unprocessable("invalid_schedule", m);
        let nul =
            |field: &str| invalid(format!("{field} must not contain NUL (\\u0000) characters"));
        if has_nul(&self.payload) {
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

/// `POST /v1/workflows`: the steps, each a task of the caller's tenant named within the
/// workflow; `after` names the steps it waits for.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkflowRequest {
    /// 1 to 10,000 steps, in any order.
    #[schema(min_items = 1, max_items = 10000)]
    pub steps: Vec<WorkflowStepRequest>,
}

/// One step of `POST /v1/workflows`.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowStepRequest {
    /// Unique within the workflow.
    #[schema(pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub name: String,
    /// The tenant must have a module for it (else 422).
    #[schema(pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub task_type: String,
    /// A JSON object; `{}` when absent. The step's parents' results come in `$parents`.
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    pub payload: Value,
    #[serde(default, deserialize_with = "integer")]
    pub priority: i32,
    /// Default: the module's setting, else 5.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 1, maximum = 1000)]
    pub max_attempts: Option<i32>,
    /// Names of the steps this one waits for (it runs once they all ended).
    #[serde(default)]
    #[schema(max_items = 10000)]
    pub after: Vec<String>,
    /// What a parent that ends dead or cancelled does: `cancel` (default) or `run` anyway.
    #[serde(default)]
    pub on_parent_failure: OnParentFailure,
}

impl CreateWorkflowRequest {
    /// The steps as the queue takes them; NUL characters refused, naming the step.
    pub fn into_steps(self) -> Result<Vec<NewStep>, ApiError> {
        self.steps
            .into_iter()
            .map(|s| {
                if has_nul(&s.payload) {
                    return Err(ApiError::unprocessable(
                        "invalid_workflow",
                        format!(
                            "step {:?}: payload must not contain NUL (\\u0000) characters",
                            s.name
                        ),
                    ));
                }
                let mut task = NewTask::new(s.task_type, s.payload);
                task.priority = s.priority;
                task.max_attempts = s.max_attempts;
                task.on_parent_failure = s.on_parent_failure;
                Ok(NewStep { name: s.name, task, after: s.after })
            })
            .collect()
    }
}

/// `GET /v1/workflows`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct WorkflowsResponse {
    pub workflows: Vec<WorkflowSummary>,
    /// Pass as `before` for the next page; null on the last.
    #[schema(value_type = Option<i64>)]
    pub next_before: Option<i64>,
}

/// `GET /v1/schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SchedulesResponse {
    pub schedules: Vec<CronSchedule>,
}

/// An `application/wasm` body, as documented: raw bytes.
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // only describes the body; the route streams it
pub struct WasmModule(Vec<u8>);

/// `POST /v1/tasks/cancel` body: which of the tenant's live tasks to cancel.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelTasksRequest {
    /// Every live task of this task type (of the caller's tenant, or `?tenant=` for the
    /// operator).
    #[schema(pattern = "^[A-Za-z0-9.:_-]{1,128}$")]
    pub task_type: String,
    /// Only tasks in this state: `blocked`, `pending`, `retrying` or `running` (default: all
    /// four).
    #[schema(nullable = false, pattern = "^(blocked|pending|retrying|running)$")]
    pub state: Option<String>,
}

/// `POST /v1/modules/{task_type}/activate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivateRequest {
    #[serde(deserialize_with = "integer")]
    pub version: i32,
}

/// `PUT /v1/tenants/{name}/weight` body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WeightRequest {
    #[serde(deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 10000)]
    pub weight: i32,
}

/// `PATCH /v1/tenants/{name}/caps` body: a field left out keeps its cap, `null` clears it
/// (no cap beyond the runner's maxima), a number sets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CapsRequest {
    /// Largest module the tenant may upload, in bytes.
    #[serde(default, deserialize_with = "present_integer")]
    #[schema(value_type = Option<i64>, minimum = 1)]
    pub max_module_bytes: Option<Option<i64>>,
    /// Most fuel a module of this tenant may ask for.
    #[serde(default, deserialize_with = "present_integer")]
    #[schema(value_type = Option<i64>, minimum = 1)]
    pub max_fuel: Option<Option<i64>>,
    /// Longest timeout a module of this tenant may ask for, in milliseconds.
    #[serde(default, deserialize_with = "present_integer")]
    #[schema(value_type = Option<i64>, minimum = 1)]
    pub max_timeout_ms: Option<Option<i64>>,
    /// Most linear memory a module of this tenant may ask for, in bytes.
    #[serde(default, deserialize_with = "present_integer")]
    #[schema(value_type = Option<i64>, minimum = 1)]
    pub max_memory_bytes: Option<Option<i64>>,
    /// Most tasks of this tenant running at once across all runners (0 pauses it).
    #[serde(default, deserialize_with = "present_integer")]
    #[schema(value_type = Option<i32>, minimum = 0)]
    pub max_running: Option<Option<i32>>,
    /// Largest task payload the tenant may enqueue, in bytes of compact JSON (`null`: the
    /// deployment's default).
    #[serde(default, deserialize_with = "present_integer")]
    #[schema(value_type = Option<i64>, minimum = 1)]
    pub max_payload_bytes: Option<Option<i64>>,
    /// Largest result (stdout) a task of the tenant may write, in bytes (`null`: the runner's
    /// default).
    #[serde(default, deserialize_with = "present_integer")]
    #[schema(value_type = Option<i64>, minimum = 1)]
    pub max_result_bytes: Option<Option<i64>>,
}

impl From<CapsRequest> for CapsChange {
    fn from(r: CapsRequest) -> Self {
        CapsChange {
            max_module_bytes: r.max_module_bytes,
            max_fuel: r.max_fuel,
            max_timeout_ms: r.max_timeout_ms,
            max_memory_bytes: r.max_memory_bytes,
            max_running: r.max_running,
            max_payload_bytes: r.max_payload_bytes,
            max_result_bytes: r.max_result_bytes,
        }
    }
}

/// `PUT /v1/queues/{task_type}/rate-limit` body.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitRequest {
    /// Most starts per second on average, across all runners (may be fractional: 0.5 is one
    /// every two seconds).
    #[schema(exclusive_minimum = 0, maximum = 1000000)]
    pub rate_per_sec: f64,
    /// Most starts at once (the bucket's size).
    #[serde(deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 1000000)]
    pub burst: i32,
}

/// `POST /v1/tenants/{name}/token` answer: the tenant and its new token, shown this once.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TokenResponse {
    pub tenant: Tenant,
    pub token: String,
}

/// `POST /v1/tasks/batch` answer: one entry per input task, in input order.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct BatchResponse {
    pub tasks: Vec<Enqueued>,
}

/// `PUT /v1/modules/{task_type}` answer.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct UploadResponse {
    pub tenant: String,
    pub task_type: String,
    pub version: i32,
    pub sha256: String,
    pub size: i64,
    /// False when identical bytes and limits were already registered (that version is
    /// active again, or compiling again if it was rejected).
    pub created: bool,
    /// `ready` (compiled and active) or `compiling` (answered 202: see the version's
    /// `compile_state` in `GET /v1/modules/{task_type}`).
    pub compile_state: CompileState,
    /// `module` (WASI preview 1, `wasm32-wasip1`) or `component` (WASI 0.2, `wasm32-wasip2`),
    /// told from the binary.
    pub kind: String,
    /// A module's WASI functions (`fd_write`) or a component's interfaces
    /// (`wasi:http/outgoing-handler@0.2.6`), in import order; `null` when the answer came
    /// before the compile ended.
    #[schema(required)]
    pub wasi_imports: Option<Vec<String>>,
    pub limits: EffectiveLimits,
    /// The tenant secrets this version receives as environment variables.
    pub secrets: Vec<String>,
    /// Most tasks one kept instance runs (`1` or `null`: a fresh instance for every task;
    /// `null` for preview-1 modules and components stored before kept instances existed).
    #[schema(required)]
    pub reuse: Option<i32>,
}

/// `GET /v1/modules` and `GET /v1/modules/{task_type}`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ModulesResponse {
    pub modules: Vec<ModuleVersion>,
}

/// `GET /v1/tasks`: a page of tasks, newest first; pass `next_before` as `before` for the next.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TaskPage {
    pub tasks: Vec<TaskRow>,
    /// The last id of a full page, `null` on the last page.
    #[schema(required, value_type = Option<i64>)]
    pub next_before: Option<TaskId>,
}

/// `GET /v1/dead`: a page of dead tasks; pass `next_after` as `after` for the next page.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct DeadPage {
    pub tasks: Vec<DeadTask>,
    /// The last id of a full page, `null` on the last page.
    #[schema(required, value_type = Option<i64>)]
    pub next_after: Option<TaskId>,
}

/// A runner as `GET /v1/stats` shows it. Tenants see no host or pid.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RunnerView {
    pub id: Uuid,
    /// Operator only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub host: Option<String>,
    /// Operator only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub pid: Option<i32>,
    pub started_at: DateTime<Utc>,
    pub last_heartbeat_at: DateTime<Utc>,
    pub heartbeat_age_ms: i64,
}

impl RunnerView {
    pub fn new(r: RunnerInfo, operator: bool, now: DateTime<Utc>) -> Self {
        RunnerView {
            id: r.id,
            host: operator.then_some(r.host),
            pid: operator.then_some(r.pid),
            started_at: r.started_at,
            last_heartbeat_at: r.last_heartbeat_at,
            heartbeat_age_ms: (now - r.last_heartbeat_at).num_milliseconds().max(0),
        }
    }
}

/// `GET /v1/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct StatsResponse {
    /// Per tenant and task type: counts by state, oldest due age, failed attempts in the last
    /// hour, completions in the last minute.
    pub types: Vec<TypeStats>,
    pub runners: Vec<RunnerView>,
    /// The cron schedules in scope, with their next and last run.
    pub schedules: Vec<crate::queue::CronSchedule>,
    /// Queues under flow control (paused), by tenant and task type.
    pub queues: Vec<QueueControl>,
    /// Paused tenants: since when and by whom.
    pub paused_tenants: Vec<TenantPause>,
}

/// `GET /v1/tenants`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TenantsResponse {
    pub tenants: Vec<Tenant>,
}

/// `GET /healthz`, `GET /readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    #[schema(value_type = String)]
    pub status: &'static str,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<EnqueueRequest, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn requests_default_and_reject_unknown_fields() {
        let r = parse(json!({"task_type": "t"})).unwrap();
        assert_eq!((r.payload, r.priority), (json!({}), 0));
        assert!(parse(json!({"task_type": "t", "delay": 5})).is_err());
        assert!(parse(json!({"task_type": "t", "delay_ms": -5})).is_err());
        assert!(parse(json!({"payload": {}})).is_err());
    }

    #[test]
    fn into_task_refuses_nul_and_double_schedules() {
        let r = parse(json!({"task_type": "t", "payload": {"a": ["x\u{0}"]}})).unwrap();
        assert_eq!(r.into_task("default").unwrap_err().code, "invalid_task");
        let r = parse(json!({"task_type": "t", "run_at": "2030-01-01T00:00:00Z", "delay_ms": 1}))
            .unwrap();
        assert!(r.into_task("default").is_err());
        let r = parse(json!({"task_type": "t", "delay_ms": 1500, "dedup_key": "k"})).unwrap();
        let t = r.into_task("acme").unwrap();
        assert_eq!(t.tenant, "acme");
        assert_eq!(
            t.schedule,
            crate::queue::Schedule::After(std::time::Duration::from_millis(1500))
        );
    }
}
