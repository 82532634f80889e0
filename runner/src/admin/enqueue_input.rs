//! Reading enqueue bodies: [`EnqueueRequest`] from a JSON object, and the batch route's array
//! of them ([`parse_batch`]) in one pass that names the element and the field of the first
//! error and stops counting work past the batch limit.
//!
//! Invariants:
//! - a request is read from a JSON object only, unknown and repeated fields refused, integers
//!   read as JSON Schema counts them (`json_input`), as every request body;
//! - a batch error names the element's index and, when a field's value was wrong, the field;
//!   a batch over `max` elements is refused (422 `batch_too_large`) without building the
//!   elements past the limit (the rest are skipped, only counted for the message);
//! - nothing here writes: the handler gets every element or an error.

use std::cell::Cell;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use super::json_input::Integer;
use super::models::EnqueueRequest;
use crate::queue::OnParentFailure;

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    TaskType,
    Payload,
    Priority,
    RunAt,
    DelayMs,
    MaxAttempts,
    DedupKey,
    After,
    OnParentFailure,
}

impl Field {
    fn name(&self) -> &'static str {
        match self {
            Field::TaskType => "task_type",
            Field::Payload => "payload",
            Field::Priority => "priority",
            Field::RunAt => "run_at",
            Field::DelayMs => "delay_ms",
            Field::MaxAttempts => "max_attempts",
            Field::DedupKey => "dedup_key",
            Field::After => "after",
            Field::OnParentFailure => "on_parent_failure",
        }
    }
}

/// Reads one request; `field` holds the name of the field whose value is being read, so an
/// error can say which one it was.
struct RequestVisitor<'a> {
    field: &'a Cell<Option<&'static str>>,
}

impl<'de> Visitor<'de> for RequestVisitor<'_> {
    type Value = EnqueueRequest;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a task object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EnqueueRequest, A::Error> {
        let mut task_type: Option<String> = None;
        let mut payload: Option<Value> = None;
        let mut priority: Option<i32> = None;
        let mut run_at: Option<Option<DateTime<Utc>>> = None;
        let mut delay_ms: Option<Option<u64>> = None;
        let mut max_attempts: Option<Option<i32>> = None;
        let mut dedup_key: Option<Option<String>> = None;
        let mut after: Option<Vec<i64>> = None;
        let mut on_parent_failure: Option<OnParentFailure> = None;
        while let Some(key) = map.next_key::<Field>()? {
            let name = key.name();
            self.field.set(Some(name));
            let duplicate = match key {
                Field::TaskType => task_type.replace(map.next_value()?).is_some(),
                Field::Payload => payload.replace(map.next_value()?).is_some(),
                Field::Priority => priority.replace(map.next_value::<Integer<i32>>()?.0).is_some(),
                Field::RunAt => run_at.replace(map.next_value()?).is_some(),
                Field::DelayMs => delay_ms
                    .replace(map.next_value::<Option<Integer<u64>>>()?.map(|i| i.0))
                    .is_some(),
                Field::MaxAttempts => max_attempts
                    .replace(map.next_value::<Option<Integer<i32>>>()?.map(|i| i.0))
                    .is_some(),
                Field::DedupKey => dedup_key.replace(map.next_value()?).is_some(),
                Field::After => after
                    .replace(
                        map.next_value::<Vec<Integer<i64>>>()?.into_iter().map(|i| i.0).collect(),
                    )
                    .is_some(),
                Field::OnParentFailure => on_parent_failure.replace(map.next_value()?).is_some(),
            };
            if duplicate {
                return Err(de::Error::duplicate_field(name));
            }
            self.field.set(None);
        }
        Ok(EnqueueRequest {
            task_type: task_type.ok_or_else(|| de::Error::missing_field("task_type"))?,
            payload: payload.unwrap_or_else(|| Value::Object(serde_json::Map::new())),
            priority: priority.unwrap_or(0),
            run_at: run_at.flatten(),
            delay_ms: delay_ms.flatten(),
            max_attempts: max_attempts.flatten(),
            dedup_key: dedup_key.flatten(),
            after: after.unwrap_or_default(),
            on_parent_failure: on_parent_failure.unwrap_or_default(),
        })
    }
}

impl<'de> Deserialize<'de> for EnqueueRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(RequestVisitor { field: &Cell::new(None) })
    }
}

/// Where a batch's parse stopped.
#[derive(Default)]
struct Progress {
    index: Cell<usize>,
    field: Cell<Option<&'static str>>,
    /// Between the array's brackets (an error there belongs to task `index`).
    in_array: Cell<bool>,
    /// How many elements the body held, when that is more than the limit.
    too_many: Cell<Option<usize>>,
}

struct BatchVisitor<'a> {
    max: usize,
    progress: &'a Progress,
}

struct Element<'a>(&'a Cell<Option<&'static str>>);

impl<'de> DeserializeSeed<'de> for Element<'_> {
    type Value = EnqueueRequest;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<EnqueueRequest, D::Error> {
        d.deserialize_map(RequestVisitor { field: self.0 })
    }
}

impl<'de> Visitor<'de> for BatchVisitor<'_> {
    type Value = Vec<EnqueueRequest>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of task objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.max));
        self.progress.in_array.set(true);
        let out = self.elements(&mut seq, out);
        self.progress.in_array.set(out.is_err());
        out
    }
}

impl BatchVisitor<'_> {
    fn elements<'de, A: SeqAccess<'de>>(
        &self,
        seq: &mut A,
        mut out: Vec<EnqueueRequest>,
    ) -> Result<Vec<EnqueueRequest>, A::Error> {
        loop {
            self.progress.index.set(out.len());
            if out.len() == self.max {
                let mut total = out.len();
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    total += 1;
                }
                if total > self.max {
                    self.progress.too_many.set(Some(total));
                    return Err(de::Error::custom("too many tasks"));
                }
                return Ok(out);
            }
            match seq.next_element_seed(Element(&self.progress.field))? {
                Some(request) => out.push(request),
                None => return Ok(out),
            }
        }
    }
}

/// The batch route's body: at most `max` task objects (422 `batch_too_large` past it), every
/// error a 400 `invalid_json` naming the task's index and the field (`task 3: priority: ...`).
pub fn parse_batch(bytes: &[u8], max: usize) -> Result<Vec<EnqueueRequest>, ApiError> {
    let progress = Progress::default();
    let mut json = serde_json::Deserializer::from_slice(bytes);
    let parsed = json
        .deserialize_seq(BatchVisitor { max, progress: &progress })
        .and_then(|requests| json.end().map(|()| requests));
    parsed.map_err(|e| {
        if let Some(got) = progress.too_many.get() {
            return ApiError::unprocessable(
                "batch_too_large",
                format!("a batch holds at most {max} tasks, got {got}"),
            );
        }
        // Errors outside the brackets (not an array, trailing input) name no task.
        let at = match (progress.in_array.get(), progress.field.get()) {
            (false, _) => String::new(),
            (true, None) => format!("task {}: ", progress.index.get()),
            (true, Some(field)) => format!("task {}: {field}: ", progress.index.get()),
        };
        ApiError::bad_request("invalid_json", format!("invalid JSON body: {at}{e}"))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn message(body: &str, max: usize) -> (u16, String, String) {
        let e = parse_batch(body.as_bytes(), max).unwrap_err();
        (e.status.as_u16(), e.code.to_owned(), e.message)
    }

    #[test]
    fn a_batch_parses_as_each_request_would() {
        let got = parse_batch(
            br#"[{"task_type": "a"}, {"task_type": "b", "payload": {"x": 1}, "priority": 2.0,
                 "delay_ms": 5, "max_attempts": null, "dedup_key": "k"}]"#,
            10,
        )
        .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].priority, got[0].payload.clone()), (0, serde_json::json!({})));
        assert_eq!((got[1].priority, got[1].delay_ms, got[1].max_attempts), (2, Some(5), None));
        assert_eq!(got[1].dedup_key.as_deref(), Some("k"));
        let one: EnqueueRequest =
            crate::admin::json_input::from_slice(br#"{"task_type": "a", "run_at": null}"#).unwrap();
        assert_eq!(one, got[0]);
        assert!(parse_batch(b"[]", 1).unwrap().is_empty());
    }

    #[test]
    fn errors_name_the_task_and_the_field() {
        let (status, code, m) =
            message(r#"[{"task_type": "a"}, {"task_type": "a", "priority": 1.5}]"#, 10);
        assert_eq!((status, code.as_str()), (400, "invalid_json"));
        assert!(m.starts_with("invalid JSON body: task 1: priority: "), "{m}");
        let (_, _, m) = message(r#"[{"task_type": "a"}, {"task_type": "a"}, {"nope": 1}]"#, 10);
        assert!(m.starts_with("invalid JSON body: task 2: unknown field `nope`"), "{m}");
        let (_, _, m) = message(r#"[{"payload": {}}]"#, 10);
        assert!(m.starts_with("invalid JSON body: task 0: missing field `task_type`"), "{m}");
        let (_, _, m) = message(r#"[{"task_type": "a", "task_type": "b"}]"#, 10);
        assert!(m.contains("task 0: ") && m.contains("duplicate field `task_type`"), "{m}");
        let (_, _, m) = message(r#"[{"task_type": "a"}, ["a"]]"#, 10);
        assert!(m.starts_with("invalid JSON body: task 1: invalid type: sequence"), "{m}");
        let (_, _, m) = message(r#"{"task_type": "a"}"#, 10);
        assert!(m.starts_with("invalid JSON body: invalid type: map"), "{m}");
        let (_, _, m) = message(r#"[{"task_type": "a", "run_at": "soon"}]"#, 10);
        assert!(m.starts_with("invalid JSON body: task 0: run_at: "), "{m}");
        let (_, _, m) = message(r#"[{"task_type": "a"}] x"#, 10);
        assert!(m.starts_with("invalid JSON body: trailing characters"), "{m}");
    }

    #[test]
    fn past_the_limit_is_batch_too_large_with_the_count() {
        let (status, code, m) = message(r#"[{"task_type": "a"}, {"task_type": "a"}, 7, {}]"#, 2);
        assert_eq!((status, code.as_str()), (422, "batch_too_large"));
        assert_eq!(m, "a batch holds at most 2 tasks, got 4");
        assert_eq!(
            parse_batch(br#"[{"task_type": "a"}, {"task_type": "a"}]"#, 2).unwrap().len(),
            2
        );
    }
}
