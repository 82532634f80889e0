//! Plain data the queue takes and gives: new tasks (validated before any write) and claimed
//! tasks.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;

use super::{InvalidTask, ModuleSettings};

pub type TaskId = i64;

pub const DEFAULT_TENANT: &str = "default";
pub const DEFAULT_MAX_ATTEMPTS: i32 = 5;
pub const MAX_MAX_ATTEMPTS: i32 = 1000;
pub const MAX_TASK_TYPE_LEN: usize = 128;
pub const MAX_TENANT_LEN: usize = 64;
pub const MAX_DEDUP_KEY_LEN: usize = 512;
/// Most parents one task may wait for (`after`).
pub const MAX_PARENTS: usize = 10_000;
/// How far ahead a task may be scheduled.
pub const MAX_SCHEDULE_AHEAD: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// When a new task becomes due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    #[default]
    Now,
    At(DateTime<Utc>),
    /// Relative to the database clock at enqueue time.
    After(Duration),
}

/// A task to enqueue. Build with [`NewTask::new`] and the chained setters.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    pub tenant: String,
    pub task_type: String,
    pub payload: Value,
    /// Higher runs first. Negative priorities are deferred work: it runs only when nothing of
    /// priority zero or above is due.
    pub priority: i32,
    pub schedule: Schedule,
    /// `None`: the active module's default for this task type, else [`DEFAULT_MAX_ATTEMPTS`].
    pub max_attempts: Option<i32>,
    /// While a task with this key is pending, running or retrying, enqueueing the same key
    /// (for the same tenant) returns that task's id and creates nothing.
    pub dedup_key: Option<String>,
    /// Parents: tasks of the same tenant this one waits for (`blocked`) until each has ended.
    /// It then becomes due with their ids, states and results in its payload's `$parents`.
    pub after: Vec<TaskId>,
    /// What a parent that ended dead or cancelled does to this task.
    pub on_parent_failure: OnParentFailure,
}

/// What a task enqueued `after` others does when one of them ends dead or cancelled.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnParentFailure {
    /// The task ends `cancelled`, its last error naming the parent.
    #[default]
    Cancel,
    /// The task runs anyway once every parent has ended; the failed parent is in `$parents`
    /// with its state and no result.
    Run,
}

impl NewTask {
    pub fn new(task_type: impl Into<String>, payload: Value) -> Self {
        NewTask {
            tenant: DEFAULT_TENANT.to_owned(),
            task_type: task_type.into(),
            payload,
            priority: 0,
            schedule: Schedule::Now,
            max_attempts: None,
            dedup_key: None,
            after: Vec::new(),
            on_parent_failure: OnParentFailure::Cancel,
        }
    }

    /// Waits for `parents` (see [`NewTask::after`](NewTask#structfield.after)).
    pub fn after(mut self, parents: impl IntoIterator<Item = TaskId>) -> Self {
        self.after = parents.into_iter().collect();
        self
    }
    pub fn on_parent_failure(mut self, policy: OnParentFailure) -> Self {
        self.on_parent_failure = policy;
        self
    }

    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = tenant.into();
        self
    }
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.schedule = Schedule::At(at);
        self
    }
    pub fn delay(mut self, delay: Duration) -> Self {
        self.schedule = Schedule::After(delay);
        self
    }
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }
    pub fn dedup_key(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = Some(key.into());
        self
    }

    /// Checks everything the database would otherwise reject (or silently accept).
    pub fn validate(&self) -> Result<(), InvalidTask> {
        validate_task_type(&self.task_type)?;
        validate_tenant(&self.tenant)?;
        if !self.payload.is_object() {
            return Err(InvalidTask::PayloadNotObject(json_kind(&self.payload)));
        }
        if let Some(max_attempts) = self.max_attempts {
            if !(1..=MAX_MAX_ATTEMPTS).contains(&max_attempts) {
                return Err(InvalidTask::MaxAttemptsOutOfRange {
                    got: max_attempts.into(),
                    max: MAX_MAX_ATTEMPTS,
                });
            }
        }
        match self.schedule {
            Schedule::Now => {}
            Schedule::At(at) => {
                let earliest = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single();
                let latest = chrono::Duration::from_std(MAX_SCHEDULE_AHEAD)
                    .ok()
                    .and_then(|ahead| Utc::now().checked_add_signed(ahead));
                let in_range = earliest.is_some_and(|e| at >= e) && latest.is_some_and(|l| at <= l);
                if !in_range {
                    return Err(InvalidTask::RunAtOutOfRange(at.to_rfc3339()));
                }
            }
            Schedule::After(delay) => {
                if delay > MAX_SCHEDULE_AHEAD {
                    return Err(InvalidTask::DelayOutOfRange(delay));
                }
            }
        }
        if let Some(key) = &self.dedup_key {
            if key.is_empty() || key.len() > MAX_DEDUP_KEY_LEN {
                return Err(InvalidTask::BadDedupKey { max: MAX_DEDUP_KEY_LEN });
            }
        }
        if self.after.len() > MAX_PARENTS {
            return Err(InvalidTask::TooManyParents { got: self.after.len(), max: MAX_PARENTS });
        }
        if !self.after.is_empty() && self.dedup_key.is_some() {
            return Err(InvalidTask::DedupKeyWithParents);
        }
        Ok(())
    }

    /// The payload's size as compact JSON, in bytes (what payload limits are measured in).
    pub fn payload_bytes(&self) -> usize {
        let mut counter = ByteCounter(0);
        // Writing a `Value` to a sink that never fails cannot fail.
        let _ = serde_json::to_writer(&mut counter, &self.payload);
        counter.0
    }

    /// Refuses a payload larger than `max_bytes` of compact JSON.
    pub fn check_payload(&self, max_bytes: usize) -> Result<(), InvalidTask> {
        let size = self.payload_bytes();
        if size > max_bytes {
            return Err(InvalidTask::PayloadTooLarge { size, limit: max_bytes });
        }
        Ok(())
    }
}

/// An `io::Write` that only counts.
struct ByteCounter(usize);

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A task type names the module that runs it: short, printable, no surprises in URLs or logs.
pub fn validate_task_type(task_type: &str) -> Result<(), InvalidTask> {
    if task_type.is_empty() {
        return Err(InvalidTask::EmptyTaskType);
    }
    if task_type.len() > MAX_TASK_TYPE_LEN {
        return Err(InvalidTask::TaskTypeTooLong { len: task_type.len(), max: MAX_TASK_TYPE_LEN });
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
    if !task_type.chars().all(allowed) {
        return Err(InvalidTask::TaskTypeCharacters(task_type.to_owned()));
    }
    Ok(())
}

pub fn validate_tenant(tenant: &str) -> Result<(), InvalidTask> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if tenant.is_empty() || tenant.len() > MAX_TENANT_LEN || !tenant.chars().all(allowed) {
        return Err(InvalidTask::BadTenant { max: MAX_TENANT_LEN });
    }
    Ok(())
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The id a task got, and whether this call created it (false: its dedup key was taken by a
/// live task, whose id this is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Enqueued {
    #[schema(value_type = i64)]
    pub id: TaskId,
    pub created: bool,
}

/// A task this runner now holds the lease on, at attempt `attempt` (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedTask {
    pub id: TaskId,
    pub tenant: String,
    pub task_type: String,
    /// The payload as JSON text, as Postgres renders the stored `jsonb` (what the guest reads
    /// on stdin); [`ClaimedTask::payload_value`] parses it.
    pub payload: String,
    pub attempt: i32,
    pub max_attempts: i32,
    /// When the task became due: enqueue-to-start latency is measured from here.
    pub run_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    /// The active module for this task's (tenant, task_type) at claim time; `None` when no
    /// module is registered.
    pub module: Option<ActiveModule>,
    /// The tenant's limit on the task's result (stdout) in bytes; `None`: the runner's
    /// default (`--output-bytes`).
    pub max_result_bytes: Option<i64>,
}

/// The module version a claimed task runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveModule {
    pub version: i32,
    pub sha256: String,
    pub settings: ModuleSettings,
}

impl ClaimedTask {
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }

    /// The payload as a JSON value.
    pub fn payload_value(&self) -> serde_json::Result<Value> {
        serde_json::from_str(&self.payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn valid_task_passes() {
        let t = NewTask::new("email.send", json!({"to": "a@b"})).priority(-3).dedup_key("k");
        assert_eq!(t.validate(), Ok(()));
    }

    #[test]
    fn bad_inputs_are_named() {
        let ok = || NewTask::new("t", json!({}));
        assert_eq!(NewTask::new("", json!({})).validate(), Err(InvalidTask::EmptyTaskType));
        assert!(matches!(
            NewTask::new("x".repeat(129), json!({})).validate(),
            Err(InvalidTask::TaskTypeTooLong { len: 129, .. })
        ));
        assert!(matches!(
            NewTask::new("a b", json!({})).validate(),
            Err(InvalidTask::TaskTypeCharacters(_))
        ));
        assert_eq!(
            NewTask::new("t", json!([1])).validate(),
            Err(InvalidTask::PayloadNotObject("an array"))
        );
        assert!(matches!(
            ok().max_attempts(0).validate(),
            Err(InvalidTask::MaxAttemptsOutOfRange { got: 0, .. })
        ));
        let ancient = Utc.with_ymd_and_hms(1970, 1, 1, 0, 0, 0).unwrap();
        assert!(matches!(ok().run_at(ancient).validate(), Err(InvalidTask::RunAtOutOfRange(_))));
        let far = Utc::now() + chrono::Duration::days(365 * 20);
        assert!(matches!(ok().run_at(far).validate(), Err(InvalidTask::RunAtOutOfRange(_))));
        assert!(matches!(
            ok().delay(Duration::from_secs(u64::MAX / 4)).validate(),
            Err(InvalidTask::DelayOutOfRange(_))
        ));
        assert!(matches!(ok().dedup_key("").validate(), Err(InvalidTask::BadDedupKey { .. })));
        let big = NewTask::new("t", json!({"s": "x".repeat(100)}));
        assert_eq!(big.payload_bytes(), 108, "compact JSON: {{\"s\":\"x...x\"}}");
        assert_eq!(big.check_payload(108), Ok(()));
        assert_eq!(
            big.check_payload(107),
            Err(InvalidTask::PayloadTooLarge { size: 108, limit: 107 })
        );
        assert!(matches!(ok().tenant("").validate(), Err(InvalidTask::BadTenant { .. })));
    }
}
