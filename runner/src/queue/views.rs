//! Reads for the dashboard and `GET /v1/tasks`: task lists filtered by state, type (exact or
//! prefix), id, payload content and creation time across the live, finished and dead tables,
//! per-state counts of such a filter, the queues with their flow control, and per-minute
//! throughput and failures over the last hour (from the runners' counters, `minutes.rs`).
//!
//! Admin reads, not hot paths. Scoping as everywhere: `tenant = Some(t)` sees only tenant
//! `t`'s rows, `None` (the operator) sees all.
//!
//! At scale (millions of finished or dead tasks), every filter of a search has an index in
//! the history and the dead letters (migrations/0003_console.sql): ids the primary keys, a type
//! prefix a `text_pattern_ops` range, payload content a `jsonb_path_ops` GIN (containment; a
//! path = value search is turned into one by [`payload_match`]). The live table keeps only the
//! indexes the claim needs; its filters read the rows of its tenant and type. Counts stop at
//! [`COUNT_CAP`] per state, so a tab over a huge history costs a bounded read.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{types::Json, PgExecutor};

use super::minutes::{minute_series, MinuteRange};
use super::{QueueError, TaskId, TaskState};

/// Which tasks a list shows. Every field narrows; `None` does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    pub tenant: Option<String>,
    pub state: Option<TaskState>,
    pub task_type: Option<String>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
    /// Page cursor: only ids below this one (lists run newest first).
    pub before: Option<TaskId>,
    /// Only this task.
    pub id: Option<TaskId>,
    /// Only task types starting with this (letters, digits, `.`, `-`, `_`, `:`).
    pub type_prefix: Option<String>,
    /// Only tasks whose payload contains this JSON object (see [`payload_match`]).
    pub payload: Option<Value>,
    /// Page size (clamped to 1..=500).
    pub limit: i64,
}

/// Most tasks a per-state count reads; a count at the cap means "at least this many".
pub const COUNT_CAP: i64 = 10_000;

/// The exclusive upper end of the range of task types starting with `prefix` in bytewise order
/// (`mail.` to `mail/`): the prefix with its last character one higher. Task types are ASCII
/// below `~`, so the next character exists.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut bytes = prefix.as_bytes().to_vec();
    let last = bytes.pop()?;
    bytes.push(last.checked_add(1).filter(u8::is_ascii)?);
    String::from_utf8(bytes).ok()
}

/// What a payload search asks for, as a JSON object the payload must contain: the object
/// itself (`{"to": "a@example.com"}`), or `path=value` with a dotted path (`user.id=42`,
/// `to=a@example.com`), the value read as JSON when it is JSON (`42`, `true`, `"42"`) and as
/// a string otherwise. One index (containment) serves both.
pub fn payload_match(raw: &str) -> Result<Value, String> {
    let raw = raw.trim();
    if raw.starts_with('{') {
        return match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(o)) if o.is_empty() => {
                Err("an empty object matches every task: name a field".to_owned())
            }
            Ok(v @ Value::Object(_)) if !has_nul(&v) => Ok(v),
            Ok(Value::Object(_)) => {
                Err("a payload search cannot contain NUL (\\u0000) characters".to_owned())
            }
            Ok(_) => Err("a payload search in braces must be a JSON object".to_owned()),
            Err(e) => Err(format!("not a JSON object: {e}")),
        };
    }
    let Some((path, value)) = raw.split_once('=') else {
        return Err("expected a JSON object, or path=value (e.g. user.id=42)".to_owned());
    };
    let path: Vec<&str> = path.trim().split('.').collect();
    let value = value.trim();
    let mut found = serde_json::from_str::<Value>(value).unwrap_or_else(|_| Value::from(value));
    if raw.contains('\0') || has_nul(&found) {
        // Postgres cannot hold NUL in JSON text: nothing stored can contain it.
        return Err("a payload search cannot contain NUL (\\u0000) characters".to_owned());
    }
    for key in path.iter().rev() {
        let mut object = serde_json::Map::new();
        object.insert((*key).to_owned(), found);
        found = Value::Object(object);
    }
    Ok(found)
}

fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// One line of a task list.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct TaskRow {
    #[schema(value_type = i64)]
    pub id: TaskId,
    pub tenant: String,
    pub task_type: String,
    #[sqlx(try_from = "String")]
    pub state: TaskState,
    pub attempts: i32,
    pub max_attempts: i32,
    pub created_at: DateTime<Utc>,
    /// When it is due (live), finished (succeeded, cancelled) or died (dead).
    pub at: DateTime<Utc>,
    #[schema(required)]
    pub last_error: Option<String>,
}

/// How many tasks of a filter are in each state (its `state` ignored), each at most
/// [`COUNT_CAP`].
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema,
)]
pub struct StateCounts {
    pub blocked: i64,
    pub pending: i64,
    pub running: i64,
    pub retrying: i64,
    pub succeeded: i64,
    pub cancelled: i64,
    pub dead: i64,
}

impl StateCounts {
    pub fn of(&self, state: TaskState) -> i64 {
        match state {
            TaskState::Blocked => self.blocked,
            TaskState::Pending => self.pending,
            TaskState::Running => self.running,
            TaskState::Retrying => self.retrying,
            TaskState::Succeeded => self.succeeded,
            TaskState::Cancelled => self.cancelled,
            TaskState::Dead => self.dead,
        }
    }
}

/// Per-state counts of the tasks matching `f` (its `state`, `before` and `limit` ignored).
pub async fn count_tasks<'c, E: PgExecutor<'c>>(
    executor: E,
    f: &TaskFilter,
) -> Result<StateCounts, QueueError> {
    let end = f.type_prefix.as_deref().and_then(prefix_end);
    Ok(sqlx::query_as(COUNT_TASKS)
        .bind(f.tenant.as_deref())
        .bind(f.task_type.as_deref())
        .bind(f.since)
        .bind(f.until)
        .bind(f.type_prefix.as_deref())
        .bind(end)
        .bind(f.payload.as_ref().map(Json))
        .bind(f.id)
        .bind(COUNT_CAP)
        .fetch_one(executor)
        .await?)
}

/// Tasks matching `f`, newest (highest id) first.
pub async fn list_tasks<'c, E: PgExecutor<'c>>(
    executor: E,
    f: &TaskFilter,
) -> Result<Vec<TaskRow>, QueueError> {
    let end = f.type_prefix.as_deref().and_then(prefix_end);
    Ok(sqlx::query_as(LIST_TASKS)
        .bind(f.tenant.as_deref())
        .bind(f.state.map(TaskState::as_str))
        .bind(f.task_type.as_deref())
        .bind(f.since)
        .bind(f.until)
        .bind(f.before)
        .bind(f.limit.clamp(1, 500))
        .bind(f.type_prefix.as_deref())
        .bind(end)
        .bind(f.payload.as_ref().map(Json))
        .bind(f.id)
        .fetch_all(executor)
        .await?)
}

/// A queue (tenant, task type) as the queues page shows it: its flow control, its tenant's
/// pause and the active module's running limit.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct QueueRow {
    pub tenant: String,
    pub task_type: String,
    /// Whether claims skip it now (its own pause, its tenant's, or its first module version
    /// still compiling).
    pub paused: bool,
    pub paused_at: Option<DateTime<Utc>>,
    pub paused_by: Option<String>,
    pub tenant_paused_at: Option<DateTime<Utc>>,
    pub tenant_paused_by: Option<String>,
    /// Its tasks wait for the type's first module version to compile.
    pub module_compiling: bool,
    pub rate_per_sec: Option<f64>,
    pub burst: Option<i32>,
    /// The active module's limit on tasks of this type running at once.
    pub max_running: Option<i32>,
}

/// Every queue of `tenant` (all for `None`), by tenant and task type.
pub async fn list_queues<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
) -> Result<Vec<QueueRow>, QueueError> {
    Ok(sqlx::query_as(LIST_QUEUES).bind(tenant).fetch_all(executor).await?)
}

/// Tasks that succeeded and attempts that failed during one minute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MinuteCounts {
    pub minute: DateTime<Utc>,
    pub succeeded: i64,
    pub failed: i64,
}

/// The last 60 minutes (the current one included, by this process's clock), oldest first,
/// one entry per minute even when nothing happened, from the runners' per-minute counters
/// (`minutes.rs`): failed attempts are attempts, so a task that failed twice counts twice.
pub async fn throughput_last_hour<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
) -> Result<Vec<MinuteCounts>, QueueError> {
    let minute = TimeDelta::minutes(1);
    let now = Utc::now();
    let to = now.duration_trunc(minute).unwrap_or(now) + minute;
    let from = to - TimeDelta::minutes(60);
    let range = MinuteRange {
        tenant: tenant.map(str::to_owned),
        task_type: None,
        from,
        to,
        step: std::time::Duration::from_secs(60),
    };
    let counted = minute_series(executor, &range).await?;
    Ok((0..60)
        .map(|i| {
            let at = from + minute * i;
            let m = counted.iter().find(|m| m.at == at);
            MinuteCounts {
                minute: at,
                succeeded: m.map_or(0, |m| m.succeeded),
                failed: m.map_or(0, |m| m.failed),
            }
        })
        .collect())
}

/// The filter every table of a list or count shares (`$1` tenant, `$3` task type, `$4`/`$5`
/// creation time, `$8`/`$9` type prefix range, `$10` payload containment, `$11` id). Each
/// `$n is null or ...` is decided once per execution: Postgres plans the statement for the
/// values given, so an index serves what is asked.
macro_rules! task_filter {
    () => {
        "($1::text is null or tenant = $1)
           and ($3::text is null or task_type = $3)
           and ($4::timestamptz is null or created_at >= $4)
           and ($5::timestamptz is null or created_at < $5)
           and ($8::text is null or (task_type ~>=~ $8 and task_type ~<~ $9))
           and ($10::jsonb is null or payload @> $10)
           and ($11::int8 is null or id = $11)"
    };
}

/// The queues (tenant, task type) a type prefix matches: every task ever enqueued has one
/// (`sweep_wake_queues` makes it), and there are few, so a prefix search reads each matching
/// type newest first from the `(tenant, task_type, id)` indexes and merges them. One range
/// scan over the prefix with `ORDER BY id` instead leaves the planner two bad choices at scale:
/// sort every match, or walk the primary key backwards hoping matches are near the top (8.6 s
/// for a prefix of a tenant with none, over 10 M finished tasks).
macro_rules! prefix_queues {
    () => {
        "(select q.tenant as q_tenant, q.task_type as q_type from sweep.queues q
          where $8::text is not null and ($1::text is null or q.tenant = $1)
            and q.task_type ~>=~ $8 and q.task_type ~<~ $9) q"
    };
}

// The cursor is `id < coalesce($6, max)`, not `$6 is null or id < $6`: a generic plan (what a
// prepared statement settles on) can use only the first as an index condition, and with the
// second walked every id above the cursor (1.2 s for a page deep in 2,000,000 finished rows).
pub(super) const LIST_TASKS: &str = concat!(
    r#"
    select * from (
        (select id, tenant, task_type, state, attempts, max_attempts, created_at,
                run_at as at, last_error
         from sweep.tasks
         where ($2::text is null or state = $2) and "#,
    task_filter!(),
    r#"
           and id < coalesce($6::int8, 9223372036854775807)
         order by id desc limit $7)
        union all
        (select id, tenant, task_type, state, attempts, max_attempts, created_at,
                finished_at, last_error
         from sweep.finished_tasks
         where $8::text is null and ($2::text is null or state = $2) and "#,
    task_filter!(),
    r#"
           and id < coalesce($6::int8, 9223372036854775807)
         order by id desc limit $7)
        union all
        (select f.* from "#,
    prefix_queues!(),
    r#"
         cross join lateral (
             select id, tenant, task_type, state, attempts, max_attempts, created_at,
                    finished_at, last_error
             from sweep.finished_tasks
             where tenant = q.q_tenant and task_type = q.q_type
               and ($2::text is null or state = $2) and "#,
    task_filter!(),
    r#"
               and id < coalesce($6::int8, 9223372036854775807)
             order by id desc limit $7) f)
        union all
        (select id, tenant, task_type, "#,
    state!(dead),
    r#", attempts, max_attempts, created_at,
                died_at, last_error
         from sweep.dead_tasks
         where $8::text is null and ($2::text is null or $2 = "#,
    state!(dead),
    r#") and "#,
    task_filter!(),
    r#"
           and id < coalesce($6::int8, 9223372036854775807)
         order by id desc limit $7)
        union all
        (select d.* from "#,
    prefix_queues!(),
    r#"
         cross join lateral (
             select id, tenant, task_type, "#,
    state!(dead),
    r#" as state, attempts, max_attempts, created_at, died_at, last_error
             from sweep.dead_tasks
             where tenant = q.q_tenant and task_type = q.q_type
               and ($2::text is null or $2 = "#,
    state!(dead),
    r#") and "#,
    task_filter!(),
    r#"
               and id < coalesce($6::int8, 9223372036854775807)
             order by id desc limit $7) d)
    ) every
    order by id desc
    limit $7
    "#
);
/// One state's capped count; the filter of [`task_filter`] with the binds of [`count_tasks`]
/// (tenant, type, since, until, prefix, prefix end, payload, id, cap).
macro_rules! count_in {
    ($table:literal, $($state:tt)+) => {
        concat!(
            "(select count(*) from (select 1 from sweep.",
            $table,
            " where ",
            $($state)+,
            " and ($1::text is null or tenant = $1)
               and ($2::text is null or task_type = $2)
               and ($3::timestamptz is null or created_at >= $3)
               and ($4::timestamptz is null or created_at < $4)
               and ($5::text is null or (task_type ~>=~ $5 and task_type ~<~ $6))
               and ($7::jsonb is null or payload @> $7)
               and ($8::int8 is null or id = $8)
             limit $9) c)"
        )
    };
}
const COUNT_TASKS: &str = concat!(
    "select ",
    count_in!("tasks", "state = ", state!(blocked)),
    " as blocked, ",
    count_in!("tasks", "state = ", state!(pending)),
    " as pending, ",
    count_in!("tasks", "state = ", state!(running)),
    " as running, ",
    count_in!("tasks", "state = ", state!(retrying)),
    " as retrying, ",
    count_in!("finished_tasks", "state = ", state!(succeeded)),
    " as succeeded, ",
    count_in!("finished_tasks", "state = ", state!(cancelled)),
    " as cancelled, ",
    count_in!("dead_tasks", "true"),
    " as dead"
);
const LIST_QUEUES: &str = r#"
    select q.tenant, q.task_type, q.paused, q.paused_at, q.paused_by,
           t.paused_at as tenant_paused_at, t.paused_by as tenant_paused_by,
           q.module_compiling, q.rate_per_sec, q.burst, q.max_running
    from sweep.queues q
    left join sweep.tenants t on t.name = q.tenant
    where $1::text is null or q.tenant = $1
    order by q.tenant, q.task_type
    "#;
#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![LIST_TASKS, COUNT_TASKS, LIST_QUEUES];

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn payload_searches_become_containment() {
        assert_eq!(payload_match(r#"{"to": "a@b"}"#).unwrap(), json!({"to": "a@b"}));
        assert_eq!(payload_match("to=a@b").unwrap(), json!({"to": "a@b"}));
        assert_eq!(payload_match("user.id=42").unwrap(), json!({"user": {"id": 42}}));
        assert_eq!(payload_match("user.id=\"42\"").unwrap(), json!({"user": {"id": "42"}}));
        assert_eq!(payload_match("ok = true").unwrap(), json!({"ok": true}));
        assert!(payload_match("[1]").is_err());
        assert!(payload_match("{nope").is_err());
        assert!(payload_match("no equals").is_err());
        assert_eq!(payload_match("a..b=1").unwrap(), json!({"a": {"": {"b": 1}}}));
        assert!(payload_match("a=\"\\u0000\"").is_err());
    }

    #[test]
    fn prefixes_end_one_past() {
        assert_eq!(prefix_end("mail.").as_deref(), Some("mail/"));
        assert_eq!(prefix_end("a").as_deref(), Some("b"));
        assert_eq!(prefix_end(""), None);
    }
}
