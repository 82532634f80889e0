//! New tasks checked for enqueueing: the step before anything is written.
//!
//! Invariants: a [`CheckedTasks`] holds only valid tasks ([`NewTask::validate`]), at most
//! [`MAX_BATCH`] of them, each payload serialised once, as compact JSON, and no longer than the
//! limit it was checked against. That text is what both ways of writing send (the `INSERT` of
//! `enqueue.rs` binds it, the `COPY` of `copy.rs` frames it), so an enqueue serialises and
//! measures a payload once, and a caller that checks a request before it looks anything up
//! (the admin API) enqueues what it checked without a second pass.

use super::{InvalidTask, NewTask};

/// The most tasks one enqueue takes (a few MB of parameters at most).
pub const MAX_BATCH: usize = 100_000;

/// Tasks that passed [`CheckedTasks::check`], with their payloads as JSON text.
#[derive(Debug)]
pub struct CheckedTasks<'a> {
    tasks: &'a [NewTask],
    payloads: Vec<String>,
    limit: usize,
}

impl<'a> CheckedTasks<'a> {
    /// Checks `tasks` in order, each payload at most `max_payload_bytes` of compact JSON
    /// (`usize::MAX`: no limit). The first bad task refuses the batch, named by its index
    /// ([`InvalidTask::InBatch`]; [`InvalidTask::innermost`] is the task's own error).
    pub fn check(tasks: &'a [NewTask], max_payload_bytes: usize) -> Result<Self, InvalidTask> {
        if tasks.len() > MAX_BATCH {
            return Err(InvalidTask::BatchTooLarge { got: tasks.len(), max: MAX_BATCH });
        }
        let mut payloads = Vec::with_capacity(tasks.len());
        for (index, task) in tasks.iter().enumerate() {
            let in_batch = |e| InvalidTask::InBatch { index, source: Box::new(e) };
            task.validate().map_err(in_batch)?;
            // Serialising a `Value` cannot fail (its map keys are strings).
            let json = serde_json::to_string(&task.payload).unwrap_or_default();
            if json.len() > max_payload_bytes {
                let limit = max_payload_bytes;
                return Err(in_batch(InvalidTask::PayloadTooLarge { size: json.len(), limit }));
            }
            payloads.push(json);
        }
        Ok(CheckedTasks { tasks, payloads, limit: max_payload_bytes })
    }

    /// What the payload limit leaves of task `i`'s payload for its parents' results
    /// (`$parents`), in bytes.
    pub(super) fn result_budget(&self, i: usize) -> i64 {
        let left = self.limit.saturating_sub(self.payloads[i].len());
        i64::try_from(left).unwrap_or(i64::MAX)
    }

    /// True when a task waits for parents (the batch is written by `enqueue.rs`'s
    /// dependent insert, never by `COPY`).
    pub(super) fn has_parents(&self) -> bool {
        self.tasks.iter().any(|t| !t.after.is_empty())
    }

    pub fn tasks(&self) -> &'a [NewTask] {
        self.tasks
    }

    /// Each task's payload as compact JSON, in task order.
    pub fn payloads(&self) -> &[String] {
        &self.payloads
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn payloads_are_compact_json_measured_once() {
        let tasks = [NewTask::new("a", json!({})), NewTask::new("a", json!({"k": "vvvv"}))];
        let checked = CheckedTasks::check(&tasks, 12).unwrap();
        assert_eq!(checked.payloads(), [r#"{}"#, r#"{"k":"vvvv"}"#], "12 bytes");
        match CheckedTasks::check(&tasks, 11) {
            Err(InvalidTask::InBatch { index: 1, source }) => {
                assert_eq!(*source, InvalidTask::PayloadTooLarge { size: 12, limit: 11 })
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_first_bad_task_names_the_batch_error() {
        let tasks = [
            NewTask::new("a", json!({})),
            NewTask::new("", json!({})),
            NewTask::new("a", json!([1])),
        ];
        let e = CheckedTasks::check(&tasks, usize::MAX).unwrap_err();
        assert!(matches!(e, InvalidTask::InBatch { index: 1, .. }), "{e:?}");
        assert_eq!(e.innermost(), &InvalidTask::EmptyTaskType);
        let many = vec![NewTask::new("a", json!({})); MAX_BATCH + 1];
        assert!(matches!(
            CheckedTasks::check(&many, usize::MAX),
            Err(InvalidTask::BatchTooLarge { .. })
        ));
    }
}
