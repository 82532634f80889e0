//! Follow-up tasks: the tasks a handler asks for in its result (`"$enqueue": [...]`), enqueued
//! in the transaction that records its success, so an attempt that failed, timed out, was
//! cancelled or lost its lease enqueues none, and a retried attempt that succeeds enqueues
//! them once.
//!
//! A batch with fewer than [`COPY_MIN_BATCH`](super::COPY_MIN_BATCH) follow-ups has them
//! inserted by the completion statement itself (`complete.rs`); a larger one is written in
//! one transaction by [`complete_copying`]: ids drawn for every follow-up, the completions
//! applied (each success's result recording its follow-ups' ids), then the follow-ups of the
//! successes that applied sent by binary `COPY` (`copy.rs`, as a bulk enqueue) and their
//! queues woken. At 10,000 follow-ups the statement took 2.3-2.5x the time of an
//! `enqueue_many` of as many tasks, the `COPY` path 1.1x.
//!
//! Invariants: a follow-up is a task of the handler's own tenant (the request names no tenant);
//! each is checked as any enqueue is ([`NewTask::validate`], the tenant's payload limit, a
//! module for its type, at most [`MAX_FOLLOW_UPS`]) before the report is written, and one bad
//! follow-up fails the attempt (`follow_up_rejected`) instead of being dropped. Both paths
//! write the same rows: the follow-ups of a success that applied and was not cancelled, each
//! in its parent's tenant, nothing else.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use sqlx::{PgExecutor, Postgres};
use uuid::Uuid;

use super::{
    complete::{complete_inserting, complete_recording_ids},
    copy, CheckedTasks, Completion, Conn, Connects, NewTask, QueueError, TaskId,
};

/// The member of a handler's result object that lists its follow-up tasks.
pub const FOLLOW_UPS_KEY: &str = "$enqueue";
/// The member of a stored result that lists the ids the follow-ups got, in request order.
pub const ENQUEUED_KEY: &str = "$enqueued";
/// Most follow-ups one attempt may enqueue.
pub const MAX_FOLLOW_UPS: usize = 10_000;

/// One element of `$enqueue`, as a handler writes it: the fields of `POST /v1/tasks` that make
/// sense for a task of the same tenant enqueued now.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FollowUpSpec {
    task_type: String,
    #[serde(default = "empty_object")]
    payload: Value,
    #[serde(default)]
    priority: i32,
    run_at: Option<DateTime<Utc>>,
    delay_ms: Option<u64>,
    max_attempts: Option<i32>,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// Takes `$enqueue` out of a result object: the follow-ups as tasks of `tenant`, shape and
/// values checked, or why they are refused (the message names the element: `$enqueue[2]:
/// ...`). `Ok` and empty when the result asks for none.
pub fn take_follow_ups(result: &mut Value, tenant: &str) -> Result<Vec<NewTask>, String> {
    let Some(requested) = result.as_object_mut().and_then(|m| m.remove(FOLLOW_UPS_KEY)) else {
        return Ok(Vec::new());
    };
    let Value::Array(items) = requested else {
        return Err(format!("{FOLLOW_UPS_KEY} must be an array of task objects"));
    };
    if items.len() > MAX_FOLLOW_UPS {
        return Err(format!(
            "{FOLLOW_UPS_KEY} lists {} tasks; at most {MAX_FOLLOW_UPS} follow one attempt",
            items.len()
        ));
    }
    let mut tasks = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at = |e: &dyn std::fmt::Display| format!("{FOLLOW_UPS_KEY}[{i}]: {e}");
        let spec: FollowUpSpec = serde_json::from_value(item).map_err(|e| at(&e))?;
        let mut task = NewTask::new(spec.task_type, spec.payload).tenant(tenant);
        task.priority = spec.priority;
        task.max_attempts = spec.max_attempts;
        match (spec.run_at, spec.delay_ms) {
            (Some(_), Some(_)) => return Err(at(&"give run_at or delay_ms, not both")),
            (Some(when), None) => task = task.run_at(when),
            (None, Some(ms)) => task = task.delay(std::time::Duration::from_millis(ms)),
            (None, None) => {}
        }
        task.validate().map_err(|e| at(&e))?;
        tasks.push(task);
    }
    Ok(tasks)
}

/// [`complete_batch`](super::complete_batch) for a batch with at least
/// [`COPY_MIN_BATCH`](super::COPY_MIN_BATCH) follow-ups (see the module header). A follow-up
/// whose tenant is not its parent's (the worker never builds one; a library caller might)
/// sends the batch down the statement path, which enqueues it in the parent's tenant.
pub(super) async fn complete_copying<'c, A: Connects<'c>>(
    conn: A,
    runner: Uuid,
    completions: &[Completion],
) -> Result<Vec<TaskId>, QueueError> {
    let checked = completions
        .iter()
        .map(|c| CheckedTasks::check(&c.follow_ups, usize::MAX))
        .collect::<Result<Vec<_>, _>>()?;
    let mut conn = conn.connect().await?;
    let mut tx = conn.begin().await?;
    match copy_within(&mut tx, runner, completions, checked).await {
        Ok(Some(lost)) => {
            tx.commit().await?;
            Ok(lost)
        }
        Ok(None) => {
            tx.rollback().await?;
            complete_inserting(&mut conn, runner, completions).await
        }
        Err(e) => {
            // Explicitly: through a pooler the rollback must not wait for the next use.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// The transaction of [`complete_copying`]: the ids whose lease was lost, or `None` when a
/// follow-up is not of its parent's tenant (nothing is to be kept).
async fn copy_within(
    tx: &mut Conn<sqlx::Transaction<'_, Postgres>>,
    runner: Uuid,
    completions: &[Completion],
    checked: Vec<CheckedTasks<'_>>,
) -> Result<Option<Vec<TaskId>>, QueueError> {
    let queues: BTreeSet<(&str, &str)> = completions
        .iter()
        .flat_map(|c| &c.follow_ups)
        .map(|t| (t.tenant.as_str(), t.task_type.as_str()))
        .collect();
    let (tenants, task_types): (Vec<&str>, Vec<&str>) = queues.into_iter().unzip();
    let count = completions.iter().map(|c| c.follow_ups.len()).sum();
    let (raw, pooled) = tx.raw();
    let prelude = copy::prelude(raw, pooled, count, (&tenants, &task_types)).await?;
    let mut rest = prelude.ids.as_slice();
    let enqueued: Vec<&[TaskId]> = completions
        .iter()
        .map(|c| {
            let (theirs, more) = rest.split_at(c.follow_ups.len().min(rest.len()));
            rest = more;
            theirs
        })
        .collect();
    let (applied, lost) = complete_recording_ids(&mut *tx, runner, completions, &enqueued).await?;

    let spawning: HashMap<TaskId, &str> =
        applied.iter().filter(|a| !a.cancelled).map(|a| (a.id, a.tenant.as_str())).collect();
    let (mut parts, mut ids) = (Vec::new(), Vec::new());
    for ((c, checked), theirs) in completions.iter().zip(checked).zip(&enqueued) {
        let Some(&tenant) = spawning.get(&c.id) else { continue };
        if c.follow_ups.iter().any(|t| t.tenant != tenant) {
            return Ok(None);
        }
        parts.push(checked);
        ids.extend_from_slice(theirs);
    }
    if !ids.is_empty() {
        let encoded = copy::encode_parts(&parts)?;
        let (raw, pooled) = tx.raw();
        encoded.send(raw, pooled, &prelude, &ids).await?;
    }
    Ok(Some(lost))
}

/// Checks follow-ups against what their tenant may enqueue: each payload within
/// `max_payload_bytes`, and a module registered for each task type (`with_modules`, the
/// tenant's task types that have one). The message names the element.
pub fn check_follow_ups(
    tasks: &[NewTask],
    max_payload_bytes: usize,
    with_modules: &[String],
) -> Result<(), String> {
    for (i, task) in tasks.iter().enumerate() {
        task.check_payload(max_payload_bytes).map_err(|e| format!("{FOLLOW_UPS_KEY}[{i}]: {e}"))?;
        if !with_modules.contains(&task.task_type) {
            return Err(format!(
                "{FOLLOW_UPS_KEY}[{i}]: no module is registered for task_type {:?}",
                task.task_type
            ));
        }
    }
    Ok(())
}

/// What a follow-up's checks need from the database: the tenant's payload limit (`None`: the
/// deployment's) and which of `task_types` have an active module of the tenant.
pub async fn follow_up_limits<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    task_types: &[String],
) -> Result<(Option<i64>, Vec<String>), QueueError> {
    let (limit, types): (Option<i64>, Option<Vec<String>>) =
        sqlx::query_as(FOLLOW_UP_LIMITS).bind(tenant).bind(task_types).fetch_one(executor).await?;
    Ok((limit, types.unwrap_or_default()))
}

const FOLLOW_UP_LIMITS: &str = r#"
    select (select max_payload_bytes from sweep.tenants where name = $1),
           (select array_agg(task_type) from sweep.active_modules
            where tenant = $1 and task_type = any($2::text[]))
    "#;
#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![FOLLOW_UP_LIMITS];

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn follow_ups_come_out_of_the_result() {
        let mut r = json!({"n": 1, "$enqueue": [
            {"task_type": "b", "payload": {"x": 1}, "priority": 2},
            {"task_type": "c", "delay_ms": 500},
        ]});
        let tasks = take_follow_ups(&mut r, "acme").unwrap();
        assert_eq!(r, json!({"n": 1}), "the member is taken out");
        assert_eq!(tasks.len(), 2);
        assert_eq!((tasks[0].tenant.as_str(), tasks[0].priority), ("acme", 2));
        assert_eq!(tasks[1].payload, json!({}));
        assert!(take_follow_ups(&mut json!([1]), "acme").unwrap().is_empty());
        assert!(take_follow_ups(&mut json!({"n": 1}), "acme").unwrap().is_empty());
    }

    #[test]
    fn bad_follow_ups_are_named() {
        let bad = |v: Value| take_follow_ups(&mut json!({"$enqueue": v}), "acme").unwrap_err();
        assert!(bad(json!({})).contains("must be an array"));
        assert!(bad(json!([{"task_type": "a"}, {"task_type": ""}])).starts_with("$enqueue[1]: "));
        let e = bad(json!([{"task_type": "a", "tenant": "other"}]));
        assert!(e.starts_with("$enqueue[0]: unknown field `tenant`"), "{e}");
        assert!(bad(json!([{"task_type": "a", "payload": [1]}])).contains("JSON object"));
        let many: Vec<Value> = (0..=MAX_FOLLOW_UPS).map(|_| json!({"task_type": "a"})).collect();
        assert!(bad(Value::Array(many)).contains("at most 10000"));
        let tasks = [NewTask::new("a", json!({"s": "xxxx"})), NewTask::new("z", json!({}))];
        let types = ["a".to_owned(), "z".to_owned()];
        assert_eq!(check_follow_ups(&tasks, 12, &types), Ok(()));
        assert!(check_follow_ups(&tasks, 11, &types).unwrap_err().starts_with("$enqueue[0]: "));
        let e = check_follow_ups(&tasks, 100, &types[..1]).unwrap_err();
        assert!(e.starts_with("$enqueue[1]: no module"), "{e}");
    }
}
