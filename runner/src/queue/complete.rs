//! Reporting outcomes: completions and failed attempts, a whole batch per statement.
//!
//! Invariant (the fence): a report applies only while the task is `running` under this
//! runner's lease at the reported attempt. Anything else (the reaper took the task over, it
//! was retried elsewhere) comes back in `lost` and the row is left untouched.

use std::{collections::HashSet, time::Duration};

use serde_json::Value;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{sql_millis, QueueError, TaskId};

/// Longest error message kept per history entry.
pub const MAX_ERROR_MESSAGE: usize = 4096;

/// A successful attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub id: TaskId,
    pub attempt: i32,
    pub result: Value,
    pub module_sha256: Option<String>,
    /// The handler's stderr tail, if it wrote any.
    pub logs: Option<String>,
}

/// A failed attempt. Build the retry delay with [`super::RetryPolicy`]; the queue decides
/// retry versus dead-letter from `permanent` and the task's attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub id: TaskId,
    pub attempt: i32,
    /// Machine-readable kind, e.g. `handler_error`, `timeout`, `lease_expired`.
    pub kind: String,
    pub message: String,
    pub permanent: bool,
    pub retry_delay: Duration,
    /// Extra fields merged into the history entry (duration_ms, fuel_used, ...). An object.
    pub detail: Value,
    pub module_sha256: Option<String>,
}

/// What became of a batch of failures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailureReport {
    pub retrying: Vec<TaskId>,
    pub dead: Vec<TaskId>,
    /// Fenced out: the lease was lost, nothing was written for these.
    pub lost: Vec<TaskId>,
}

/// Marks the tasks succeeded and stores their results. Returns the ids whose lease was lost.
pub async fn complete_batch<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    completions: &[Completion],
) -> Result<Vec<TaskId>, QueueError> {
    // Rows are locked in id order by every batch statement, so two batches never deadlock.
    let mut sorted: Vec<&Completion> = completions.iter().collect();
    sorted.sort_unstable_by_key(|c| c.id);
    let completions = sorted;
    let ids: Vec<TaskId> = completions.iter().map(|c| c.id).collect();
    let attempts: Vec<i32> = completions.iter().map(|c| c.attempt).collect();
    let results: Vec<&Value> = completions.iter().map(|c| &c.result).collect();
    let shas: Vec<Option<&str>> = completions.iter().map(|c| c.module_sha256.as_deref()).collect();
    let logs: Vec<Option<&str>> = completions.iter().map(|c| c.logs.as_deref()).collect();
    // Per-task values are looked up by the id's position in the (sorted) arrays instead of a
    // join against unnest(): the generic plan of that join compared every row with every
    // input (batch^2). The commit stays synchronous: a lost completion would come back as an
    // expired lease, i.e. a failed attempt, dead-lettered if it was the last (see
    // benches/README.md).
    let applied: Vec<(TaskId,)> = sqlx::query_as(
        r#"
        update tasks t
        set state = 'succeeded',
            result = ($4::jsonb[])[array_position($2::int8[], t.id)],
            module_sha256 = coalesce(($5::text[])[array_position($2::int8[], t.id)],
                                     t.module_sha256),
            logs = ($6::text[])[array_position($2::int8[], t.id)],
            lease_owner = null,
            lease_expires_at = null,
            finished_at = now(),
            updated_at = now()
        where t.id = any($2::int8[]) and t.state = 'running' and t.lease_owner = $1
          and t.attempts = ($3::int4[])[array_position($2::int8[], t.id)]
        returning t.id
        "#,
    )
    .bind(runner)
    .bind(&ids)
    .bind(&attempts)
    .bind(&results)
    .bind(&shas)
    .bind(&logs)
    .fetch_all(executor)
    .await?;
    Ok(lost(&ids, applied.into_iter().map(|(id,)| id)))
}

/// Records failed attempts: each task either goes back to `retrying` after its delay or, when
/// the failure is permanent or this was its last attempt, moves to `dead_tasks`, in one
/// statement.
pub async fn fail_batch<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    failures: &[Failure],
) -> Result<FailureReport, QueueError> {
    let mut sorted: Vec<&Failure> = failures.iter().collect();
    sorted.sort_unstable_by_key(|f| f.id);
    let failures = sorted;
    let ids: Vec<TaskId> = failures.iter().map(|f| f.id).collect();
    let attempts: Vec<i32> = failures.iter().map(|f| f.attempt).collect();
    let kinds: Vec<&str> = failures.iter().map(|f| f.kind.as_str()).collect();
    let messages: Vec<&str> =
        failures.iter().map(|f| truncate(&f.message, MAX_ERROR_MESSAGE)).collect();
    let permanent: Vec<bool> = failures.iter().map(|f| f.permanent).collect();
    let delays: Vec<i64> = failures.iter().map(|f| sql_millis(f.retry_delay)).collect();
    let details: Vec<Value> = failures
        .iter()
        .map(|f| {
            if f.detail.is_object() {
                f.detail.clone()
            } else {
                Value::Object(Default::default())
            }
        })
        .collect();
    let shas: Vec<Option<&str>> = failures.iter().map(|f| f.module_sha256.as_deref()).collect();

    let rows: Vec<(TaskId, bool)> = sqlx::query_as(
        r#"
        with input as (
            select f.*,
                   jsonb_build_object('at', now(), 'attempt', f.attempt, 'kind', f.kind,
                                      'message', f.message) || f.detail as entry
            from unnest($2::int8[], $3::int4[], $4::text[], $5::text[], $6::bool[], $7::int8[],
                        $8::jsonb[], $9::text[])
                 as f(id, attempt, kind, message, permanent, delay_ms, detail, sha)
        ),
        fenced as (
            select t.id, f.entry, f.message, f.kind, f.delay_ms, f.sha,
                   (f.permanent or t.attempts >= t.max_attempts) as dies
            from tasks t join input f on t.id = f.id
            where t.state = 'running' and t.lease_owner = $1 and t.attempts = f.attempt
            for update of t
        ),
        retried as (
            update tasks t
            set state = 'retrying',
                run_at = now() + f.delay_ms * interval '1 millisecond',
                last_error = f.message,
                errors = t.errors || jsonb_build_array(f.entry),
                module_sha256 = coalesce(f.sha, t.module_sha256),
                lease_owner = null,
                lease_expires_at = null,
                updated_at = now()
            from fenced f
            where t.id = f.id and not f.dies
            returning t.id
        ),
        killed as (
            delete from tasks t
            using fenced f
            where t.id = f.id and f.dies
            returning t.*, f.entry, f.message as final_message, f.kind as final_kind,
                      f.sha as final_sha
        ),
        buried as (
            insert into dead_tasks (id, tenant, task_type, payload, priority, attempts,
                                    max_attempts, dedup_key, last_error, errors, module_sha256,
                                    reason, created_at, started_at)
            select id, tenant, task_type, payload, priority, attempts, max_attempts, dedup_key,
                   final_message, errors || jsonb_build_array(entry),
                   coalesce(final_sha, module_sha256), final_kind, created_at, started_at
            from killed
            returning id
        )
        select id, false from retried
        union all
        select id, true from buried
        "#,
    )
    .bind(runner)
    .bind(&ids)
    .bind(&attempts)
    .bind(&kinds)
    .bind(&messages)
    .bind(&permanent)
    .bind(&delays)
    .bind(&details)
    .bind(&shas)
    .fetch_all(executor)
    .await?;

    let mut report = FailureReport::default();
    for (id, dead) in rows {
        if dead {
            report.dead.push(id);
        } else {
            report.retrying.push(id);
        }
    }
    report.lost = lost(&ids, report.retrying.iter().chain(&report.dead).copied());
    Ok(report)
}

/// The ids of `sent` that are not in `applied`.
fn lost(sent: &[TaskId], applied: impl IntoIterator<Item = TaskId>) -> Vec<TaskId> {
    let applied: HashSet<TaskId> = applied.into_iter().collect();
    sent.iter().copied().filter(|id| !applied.contains(id)).collect()
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }

    #[test]
    fn lost_is_what_was_not_applied() {
        assert_eq!(lost(&[1, 2, 3], [3, 1]), vec![2]);
        assert!(lost(&[1], [1]).is_empty());
    }
}
