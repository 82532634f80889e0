//! Bulk enqueue through binary `COPY`: the path `enqueue_many` takes for a large batch
//! without dedup keys (see [`COPY_MIN_BATCH`]), writing exactly the rows the `INSERT` path
//! would, about twice as fast. A completion with many follow-ups sends them through the same
//! steps inside its own transaction (`follow_ups.rs`).
//!
//! One transaction (a savepoint when the caller's connection is already in one):
//! 1. `COPY_PRELUDE`: the transaction's `now()`, one id per task from the tasks sequence, and
//!    the active modules' `max_attempts` defaults for the batch's queues;
//! 2. `COPY sweep.tasks (...) FROM STDIN (FORMAT binary)` of the tuples encoded here;
//! 3. `COPY_WAKE`: `sweep_wake_queues` for each queue of the batch with its earliest `run_at`,
//!    and one `pg_notify`;
//! 4. commit. Any failure rolls all of it back: nothing partial is ever visible.
//!
//! Invariants (what makes its rows the `INSERT` path's rows):
//! - every column the `INSERT` path computes in SQL is computed here from the same inputs:
//!   `run_at` from the transaction's `now()` (the value the omitted `created_at` and
//!   `updated_at` defaults take), `max_attempts` as the task's, else the active module's,
//!   else [`DEFAULT_MAX_ATTEMPTS`]; ids are drawn in input order; every other column takes its
//!   table default, as with the `INSERT`;
//! - payloads are written as a `jsonb` parameter is (version byte, then the compact JSON text
//!   the batch was checked as, `batch.rs`), the very bytes whose size was checked;
//! - timestamps are truncated to microseconds as sqlx truncates a bound `DateTime`;
//! - through a pooled store every statement here is unnamed and inside the transaction
//!   (`queue/pooler.rs`); a direct connection keeps sqlx's cached statements.

use std::collections::HashMap;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::{types::Json, Connection, PgConnection};

use super::{
    sql_count, sql_millis, types::Schedule, CheckedTasks, Enqueued, InvalidTask, NewTask,
    QueueError, DEFAULT_MAX_ATTEMPTS,
};

/// Batches at least this large (and without dedup keys) go through `COPY`; smaller ones
/// through the single `INSERT` statement, whose one round trip beats the transaction and
/// five round trips of this path. Not yet measured: `enqueue/{insert,copy}/{100,1000}` in
/// the criterion enqueue bench is where to set it from.
pub const COPY_MIN_BATCH: usize = 1_000;

/// What one `COPY` is sent in: large enough that the per-message cost vanishes, small enough
/// that Postgres starts on the first rows while the rest are still on the way.
const SEND_CHUNK: usize = 1 << 20;

const COPY_PRELUDE: &str = concat!(
    "with ",
    module_defaults_cte!("select * from unnest($2::text[], $3::text[])"),
    r#"
    select now() as now,
           array(select nextval((select pg_get_serial_sequence('sweep.tasks', 'id')::regclass))
                 from generate_series(1, $1::int8)) as ids,
           d.by_type as defaults
    from module_defaults d
"#
);

/// The fixed-size columns first: their place in each tuple is known before the prelude has
/// answered, so they are written as placeholders and filled in afterwards.
const COPY_TASKS: &str = "copy sweep.tasks (id, run_at, max_attempts, priority, tenant, \
                          task_type, payload) from stdin (format binary)";

const COPY_WAKE: &str = concat!(
    "select sweep.sweep_wake_queues($1::text[], $2::text[], $3::timestamptz[]), ",
    notify_tasks!()
);

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![COPY_PRELUDE, COPY_TASKS, COPY_WAKE];

/// `PGCOPY\n\377\r\n\0`, no flags, no header extension.
const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
const FIELDS: i16 = 7;
/// From a tuple's start: field count (2), then length (4) + value for each fixed field.
const ID_AT: usize = 2 + 4;
const RUN_AT_AT: usize = ID_AT + 8 + 4;
const MAX_ATTEMPTS_AT: usize = RUN_AT_AT + 8 + 4;

/// One queue of the batch: where its tasks' defaults come from and the earliest `run_at`.
struct Queue<'a> {
    tenant: &'a str,
    task_type: &'a str,
    earliest: Option<DateTime<Utc>>,
}

/// The batch as `COPY` data, with the per-tuple fields the prelude decides still blank.
pub(super) struct Encoded<'a> {
    tasks: Vec<&'a NewTask>,
    buf: Vec<u8>,
    /// Where each task's tuple starts in `buf`.
    starts: Vec<usize>,
    /// Each task's queue, as an index into `queues`.
    queue_of: Vec<u32>,
    queues: Vec<Queue<'a>>,
}

/// Encodes the checked batch (`batch.rs`: valid tasks, payloads as compact JSON within their
/// limit). Nothing has been sent when this fails: only a payload too long for a `COPY` field
/// (2 GiB) can still be refused here.
pub(super) fn encode<'a>(checked: &CheckedTasks<'a>) -> Result<Encoded<'a>, InvalidTask> {
    encode_parts(std::slice::from_ref(checked))
}

/// [`encode`] for several checked batches written as one, in order.
pub(super) fn encode_parts<'a>(parts: &[CheckedTasks<'a>]) -> Result<Encoded<'a>, InvalidTask> {
    let count = parts.iter().map(|p| p.tasks().len()).sum();
    let mut tasks = Vec::with_capacity(count);
    let mut buf = Vec::with_capacity(HEADER.len() + count * 96 + 2);
    buf.extend_from_slice(HEADER);
    let mut starts = Vec::with_capacity(count);
    let mut queue_of = Vec::with_capacity(count);
    let mut queues: Vec<Queue<'a>> = Vec::new();
    let mut index: HashMap<(&str, &str), u32> = HashMap::new();
    let all = parts.iter().flat_map(|p| p.tasks().iter().zip(p.payloads()));
    for (i, (task, payload)) in all.enumerate() {
        tasks.push(task);
        let key = (task.tenant.as_str(), task.task_type.as_str());
        let q = match index.get(&key) {
            Some(&q) => q,
            None => {
                let q = u32::try_from(queues.len()).unwrap_or(u32::MAX);
                queues.push(Queue { tenant: key.0, task_type: key.1, earliest: None });
                index.insert(key, q);
                q
            }
        };
        queue_of.push(q);
        starts.push(buf.len());
        buf.extend_from_slice(&FIELDS.to_be_bytes());
        for width in [8i32, 8, 4] {
            buf.extend_from_slice(&width.to_be_bytes());
            buf.resize(buf.len() + width as usize, 0);
        }
        field(&mut buf, &task.priority.to_be_bytes());
        field(&mut buf, task.tenant.as_bytes());
        field(&mut buf, task.task_type.as_bytes());
        // jsonb's binary format: a version byte, then the JSON text.
        let size = payload.len();
        let len = i32::try_from(size + 1).map_err(|_| InvalidTask::InBatch {
            index: i,
            source: Box::new(InvalidTask::PayloadTooLarge { size, limit: i32::MAX as usize - 1 }),
        })?;
        buf.extend_from_slice(&len.to_be_bytes());
        buf.push(1);
        buf.extend_from_slice(payload.as_bytes());
    }
    buf.extend_from_slice(&(-1i16).to_be_bytes());
    Ok(Encoded { tasks, buf, starts, queue_of, queues })
}

fn field(buf: &mut Vec<u8>, value: &[u8]) {
    // Tenants, task types and priorities are validated short; payloads are written apart.
    buf.extend_from_slice(&(value.len() as i32).to_be_bytes());
    buf.extend_from_slice(value);
}

/// Microseconds since 2000-01-01 UTC, Postgres's `timestamptz`, truncated as sqlx truncates.
fn pg_micros(at: DateTime<Utc>) -> Result<i64, QueueError> {
    let epoch = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single();
    epoch
        .and_then(|epoch| (at - epoch).num_microseconds())
        .ok_or_else(|| QueueError::Corrupt(format!("run_at {at} does not fit a timestamptz")))
}

/// What [`prelude`] answers: the transaction's `now()`, ids drawn from the tasks sequence in
/// ascending order, and the active modules' `max_attempts` defaults by `tenant/task_type`.
pub(super) struct Prelude {
    pub now: DateTime<Utc>,
    pub ids: Vec<i64>,
    defaults: HashMap<String, i32>,
}

/// Draws `count` ids and reads the defaults of `queues` (tenants, task types), inside the
/// caller's transaction on `conn`; `pooled` as in [`enqueue_copy`].
pub(super) async fn prelude(
    conn: &mut PgConnection,
    pooled: bool,
    count: usize,
    (tenants, task_types): (&[&str], &[&str]),
) -> Result<Prelude, QueueError> {
    let (now, mut ids, Json(defaults)): (DateTime<Utc>, Vec<i64>, Json<HashMap<String, i32>>) =
        sqlx::query_as(COPY_PRELUDE)
            .bind(sql_count(count))
            .bind(tenants)
            .bind(task_types)
            .persistent(!pooled)
            .fetch_one(&mut *conn)
            .await?;
    if ids.len() != count {
        return Err(QueueError::Corrupt(format!("drew {} ids for {count} tasks", ids.len())));
    }
    ids.sort_unstable();
    Ok(Prelude { now, ids, defaults })
}

impl<'a> Encoded<'a> {
    /// The batch's queues, as [`prelude`] takes them.
    pub(super) fn queues(&self) -> (Vec<&'a str>, Vec<&'a str>) {
        self.queues.iter().map(|q| (q.tenant, q.task_type)).unzip()
    }

    /// Sends the tasks, task `i` with id `ids[i]`, inside the caller's transaction on `conn`,
    /// then wakes their queues (`pooled` as in [`enqueue_copy`]). `prelude` must hold the
    /// defaults of every queue of the batch.
    pub(super) async fn send(
        mut self,
        conn: &mut PgConnection,
        pooled: bool,
        prelude: &Prelude,
        ids: &[i64],
    ) -> Result<(), QueueError> {
        if ids.len() != self.tasks.len() {
            return Err(QueueError::Corrupt(format!(
                "{} ids for {} tasks",
                ids.len(),
                self.tasks.len()
            )));
        }
        let now = prelude.now;
        let queue_defaults: Vec<i32> = self
            .queues
            .iter()
            .map(|q| {
                let key = format!("{}/{}", q.tenant, q.task_type);
                prelude.defaults.get(&key).copied().unwrap_or(DEFAULT_MAX_ATTEMPTS)
            })
            .collect();
        for (i, task) in self.tasks.iter().enumerate() {
            let run_at = match task.schedule {
                Schedule::Now => now,
                Schedule::At(at) => at,
                Schedule::After(d) => now + chrono::Duration::milliseconds(sql_millis(d)),
            };
            let q = self.queue_of[i] as usize;
            let max_attempts = task.max_attempts.unwrap_or(queue_defaults[q]);
            let queue = &mut self.queues[q];
            queue.earliest = Some(queue.earliest.map_or(run_at, |e| e.min(run_at)));
            let at = self.starts[i];
            let buf = &mut self.buf;
            buf[at + ID_AT..at + ID_AT + 8].copy_from_slice(&ids[i].to_be_bytes());
            buf[at + RUN_AT_AT..at + RUN_AT_AT + 8]
                .copy_from_slice(&pg_micros(run_at)?.to_be_bytes());
            buf[at + MAX_ATTEMPTS_AT..at + MAX_ATTEMPTS_AT + 4]
                .copy_from_slice(&max_attempts.to_be_bytes());
        }

        let mut copy = conn.copy_in_raw(COPY_TASKS).await?;
        for chunk in self.buf.chunks(SEND_CHUNK) {
            if let Err(e) = copy.send(chunk).await {
                let _ = copy.abort("sending the batch failed").await;
                return Err(e.into());
            }
        }
        let copied = copy.finish().await?;
        if copied != self.tasks.len() as u64 {
            return Err(QueueError::Corrupt(format!(
                "copied {copied} of {} tasks",
                self.tasks.len()
            )));
        }

        let (tenants, task_types) = self.queues();
        let run_ats: Vec<DateTime<Utc>> =
            self.queues.iter().map(|q| q.earliest.unwrap_or(now)).collect();
        sqlx::query(COPY_WAKE)
            .bind(&tenants)
            .bind(&task_types)
            .bind(&run_ats)
            .persistent(!pooled)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// Writes the tasks [`encode`]d into `encoded` through `COPY` on `conn` (see the module
/// header); `pooled`: the connection is a transaction pooler's, so no statement may be named.
pub(super) async fn enqueue_copy(
    conn: &mut PgConnection,
    pooled: bool,
    encoded: Encoded<'_>,
) -> Result<Vec<Enqueued>, QueueError> {
    let count = encoded.tasks.len();
    let mut tx = conn.begin().await?;
    let result = async {
        let (tenants, task_types) = encoded.queues();
        let prelude = prelude(&mut tx, pooled, count, (&tenants, &task_types)).await?;
        encoded.send(&mut tx, pooled, &prelude, &prelude.ids).await?;
        Ok(prelude.ids)
    }
    .await;
    match result {
        Ok(ids) => {
            tx.commit().await?;
            Ok(ids.into_iter().map(|id| Enqueued { id, created: true }).collect())
        }
        Err(e) => {
            // Explicitly, not on drop: through a pooler the rollback must not wait for the
            // connection's next use (see pooler.rs).
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tuples_have_their_fields_where_the_patcher_writes() {
        let tasks = vec![
            NewTask::new("a", json!({"x": [1, 2]})).priority(-7),
            NewTask::new("b", json!({})).tenant("t2"),
            NewTask::new("a", json!({"y": "z"})),
        ];
        let e = encode(&CheckedTasks::check(&tasks, usize::MAX).unwrap()).unwrap();
        assert_eq!(e.queues.len(), 2, "two distinct queues");
        assert_eq!(e.queue_of, vec![0, 1, 0]);
        assert_eq!(&e.buf[..HEADER.len()], HEADER);
        assert_eq!(&e.buf[e.buf.len() - 2..], &[0xff, 0xff], "trailer");
        let t = e.starts[0];
        assert_eq!(&e.buf[t..t + 2], &7i16.to_be_bytes());
        assert_eq!(&e.buf[t + ID_AT - 4..t + ID_AT], &8i32.to_be_bytes());
        assert_eq!(&e.buf[t + RUN_AT_AT - 4..t + RUN_AT_AT], &8i32.to_be_bytes());
        assert_eq!(&e.buf[t + MAX_ATTEMPTS_AT - 4..t + MAX_ATTEMPTS_AT], &4i32.to_be_bytes());
        let p = t + MAX_ATTEMPTS_AT + 4;
        assert_eq!(&e.buf[p..p + 8], &[0, 0, 0, 4, 0xff, 0xff, 0xff, 0xf9], "priority -7");
        // The payload field: length, version 1, compact JSON.
        let payload = br#"{"x":[1,2]}"#;
        let end = e.starts[1];
        assert_eq!(&e.buf[end - payload.len()..end], payload);
        assert_eq!(e.buf[end - payload.len() - 1], 1);
        let len = i32::from_be_bytes(
            e.buf[end - payload.len() - 5..end - payload.len() - 1].try_into().unwrap(),
        );
        assert_eq!(len as usize, payload.len() + 1);
    }

    #[test]
    fn timestamps_count_microseconds_from_2000() {
        let at = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 1).unwrap()
            + chrono::Duration::nanoseconds(2_999);
        assert_eq!(pg_micros(at).unwrap(), 1_000_002);
    }
}
