//! Enqueueing: one task or tens of thousands in one statement, with dedup keys, and a single
//! NOTIFY per statement (never one per row: per-row notifies serialise commits). A large batch
//! without dedup keys goes through binary `COPY` instead (`copy.rs`), with the same rows.
//!
//! Invariant: the whole batch is checked before anything is sent (`batch.rs`: every task
//! valid, every payload serialised once and within its limit); an invalid task rejects the
//! batch and writes nothing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{postgres::PgArguments, query::QueryAs, Executor, Postgres};

use super::{
    copy, sql_millis, types::Schedule, CheckedTasks, Connects, Enqueued, InvalidTask, NewTask,
    OnParentFailure, QueueError, TaskId, TaskState, DEFAULT_MAX_ATTEMPTS,
};

/// Enqueues `task`, with no limit on its payload's size (see [`enqueue_within`]).
pub async fn enqueue<'c, A>(conn: A, task: NewTask) -> Result<Enqueued, QueueError>
where
    A: Connects<'c>,
{
    enqueue_within(conn, task, usize::MAX).await
}

/// Enqueues `task` if its payload is at most `max_payload_bytes` of compact JSON; a larger one
/// is refused ([`InvalidTask::PayloadTooLarge`]) before anything is written.
pub async fn enqueue_within<'c, A>(
    conn: A,
    task: NewTask,
    max_payload_bytes: usize,
) -> Result<Enqueued, QueueError>
where
    A: Connects<'c>,
{
    let mut ids = enqueue_many_within(conn, std::slice::from_ref(&task), max_payload_bytes).await?;
    ids.pop().ok_or_else(|| QueueError::Corrupt("enqueue returned no id".into()))
}

/// Enqueues `tasks` in one statement and returns their ids in input order, with no limit on
/// payload sizes (see [`enqueue_many_within`]).
pub async fn enqueue_many<'c, A>(conn: A, tasks: &[NewTask]) -> Result<Vec<Enqueued>, QueueError>
where
    A: Connects<'c>,
{
    enqueue_many_within(conn, tasks, usize::MAX).await
}

/// [`enqueue_many`] for tasks whose payloads are each at most `max_payload_bytes` of compact
/// JSON: one larger payload refuses the whole batch before anything is written.
pub async fn enqueue_many_within<'c, A>(
    conn: A,
    tasks: &[NewTask],
    max_payload_bytes: usize,
) -> Result<Vec<Enqueued>, QueueError>
where
    A: Connects<'c>,
{
    enqueue_many_using(conn, tasks, max_payload_bytes, EnqueueMethod::Auto).await
}

/// How a batch is written. Both write the same rows and answer the same ids (`copy.rs` says
/// how); only their speed differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EnqueueMethod {
    /// `Copy` for a batch of at least [`COPY_MIN_BATCH`](super::COPY_MIN_BATCH) tasks
    /// without dedup keys, else `Insert`.
    #[default]
    Auto,
    /// One `INSERT ... SELECT FROM unnest(...)` statement (the only one that takes dedup keys).
    Insert,
    /// Binary `COPY` in a transaction of its own (a savepoint inside the caller's); a batch
    /// with a dedup key is still inserted.
    Copy,
}

/// [`enqueue_many_within`] by the given method (for measuring them against each other; use
/// `Auto`, the default, otherwise).
pub async fn enqueue_many_using<'c, A>(
    conn: A,
    tasks: &[NewTask],
    max_payload_bytes: usize,
    method: EnqueueMethod,
) -> Result<Vec<Enqueued>, QueueError>
where
    A: Connects<'c>,
{
    let checked = CheckedTasks::check(tasks, max_payload_bytes)?;
    write(conn, &checked, method).await
}

/// Enqueues tasks already checked (see [`CheckedTasks`]) in one statement, or one `COPY` for a
/// large batch without dedup keys; returns their ids in input order.
pub async fn enqueue_checked<'c, A>(
    conn: A,
    tasks: &CheckedTasks<'_>,
) -> Result<Vec<Enqueued>, QueueError>
where
    A: Connects<'c>,
{
    write(conn, tasks, EnqueueMethod::Auto).await
}

async fn write<'c, A>(
    conn: A,
    checked: &CheckedTasks<'_>,
    method: EnqueueMethod,
) -> Result<Vec<Enqueued>, QueueError>
where
    A: Connects<'c>,
{
    let tasks = checked.tasks();
    if checked.has_parents() {
        let mut conn = conn.connect().await?;
        return insert_after(&mut conn, checked).await;
    }
    let copy = match method {
        EnqueueMethod::Auto => tasks.len() >= copy::COPY_MIN_BATCH,
        EnqueueMethod::Insert => false,
        EnqueueMethod::Copy => !tasks.is_empty(),
    };
    if copy && tasks.iter().all(|t| t.dedup_key.is_none()) {
        let encoded = copy::encode(checked)?;
        let mut conn = conn.connect().await?;
        let (raw, pooled) = conn.raw();
        return copy::enqueue_copy(raw, pooled, encoded).await;
    }
    let mut conn = conn.connect().await?;
    let columns = Columns::of(checked, 0..tasks.len());
    if columns.dedup_keys.iter().all(Option::is_none) {
        return insert_plain(&mut conn, &columns).await;
    }
    let rows = insert(&mut conn, &columns).await?;

    let mut out: Vec<Option<Enqueued>> = rows;
    // A dedup key held by a task committed after this statement's snapshot resolves to no id
    // (ON CONFLICT skipped the row, the lookup could not see the winner). Rare: enqueue those
    // rows again, which either finds the winner now or creates the task.
    for _ in 0..3 {
        let missing: Vec<usize> = (0..out.len()).filter(|&i| out[i].is_none()).collect();
        if missing.is_empty() {
            break;
        }
        let again = insert(&mut conn, &Columns::of(checked, missing.iter().copied())).await?;
        for (slot, found) in missing.into_iter().zip(again) {
            out[slot] = found;
        }
    }
    out.into_iter()
        .map(|e| e.ok_or_else(|| QueueError::Corrupt("dedup key kept changing hands".into())))
        .collect()
}

/// Enqueues one task, which must have a dedup key, on `conn`: for a caller inside its own
/// transaction (the scheduler, which enqueues a tick and advances its schedule together).
/// `None`: a live task holds the key but was committed after this statement's snapshot.
pub(super) async fn enqueue_keyed<'c, E: Executor<'c, Database = Postgres>>(
    conn: E,
    task: &NewTask,
) -> Result<Option<Enqueued>, QueueError> {
    let checked = CheckedTasks::check(std::slice::from_ref(task), usize::MAX)
        .map_err(|e| QueueError::Invalid(e.into_innermost()))?;
    if task.dedup_key.is_none() {
        return Err(QueueError::Corrupt("enqueue_keyed needs a dedup key".into()));
    }
    let rows = insert(conn, &Columns::of(&checked, 0..1)).await?;
    Ok(rows.into_iter().next().flatten())
}

/// Enqueues a batch in which some tasks wait for parents, through `sweep_enqueue_after`
/// (runner/sql/dependencies.sql), which locks the live parents, finds the ended ones and writes
/// the tasks and their edges in one statement, or answers the bad edges and writes nothing.
pub(super) async fn insert_after<'c, E: Executor<'c, Database = Postgres>>(
    conn: E,
    checked: &CheckedTasks<'_>,
) -> Result<Vec<Enqueued>, QueueError> {
    let tasks = checked.tasks();
    let columns = Columns::of(checked, 0..tasks.len());
    let run_on_failure: Vec<bool> =
        tasks.iter().map(|t| t.on_parent_failure == OnParentFailure::Run).collect();
    let budgets: Vec<i64> = (0..tasks.len()).map(|i| checked.result_budget(i)).collect();
    // Edges as (child position, parent), each task's parents once; `places` maps an edge back
    // to the task and the index in its `after` that an error names.
    let mut edge_task = Vec::new();
    let mut edge_parent = Vec::new();
    let mut places = Vec::new();
    for (i, task) in tasks.iter().enumerate() {
        let mut seen = std::collections::HashSet::with_capacity(task.after.len());
        for (j, &parent) in task.after.iter().enumerate() {
            if seen.insert(parent) {
                edge_task.push(i32::try_from(i + 1).unwrap_or(i32::MAX));
                edge_parent.push(parent);
                places.push((i, j));
            }
        }
    }
    let rows: Vec<(i32, Option<TaskId>, Option<String>)> = columns
        .bind(sqlx::query_as(INSERT_AFTER))
        .bind(&run_on_failure)
        .bind(&budgets)
        .bind(&edge_task)
        .bind(&edge_parent)
        .bind(DEFAULT_MAX_ATTEMPTS)
        .fetch_all(conn)
        .await?;
    let mut ids = Vec::with_capacity(rows.len());
    for (pos, id, problem) in rows {
        let Some(problem) = problem else {
            let id = id.ok_or_else(|| QueueError::Corrupt("enqueue returned no id".into()))?;
            ids.push(Enqueued { id, created: true });
            continue;
        };
        let edge = usize::try_from(pos).ok().and_then(|p| p.checked_sub(1));
        let Some(&(task, index)) = edge.and_then(|e| places.get(e)) else {
            return Err(QueueError::Corrupt(format!("no edge {pos}")));
        };
        let id = tasks[task].after[index];
        let error = match problem.parse::<TaskState>() {
            Ok(state) => InvalidTask::ParentFailed { index, id, state },
            Err(_) => InvalidTask::UnknownParent { index, id },
        };
        return Err(InvalidTask::InBatch { index: task, source: Box::new(error) }.into());
    }
    if ids.len() != tasks.len() {
        return Err(QueueError::Corrupt(format!(
            "enqueued {} of {} tasks",
            ids.len(),
            tasks.len()
        )));
    }
    Ok(ids)
}

/// The batch (or some of its tasks) as column arrays, the shape `unnest` wants; payloads as
/// the JSON text they were checked as.
struct Columns<'a> {
    tenants: Vec<&'a str>,
    task_types: Vec<&'a str>,
    payloads: Vec<&'a str>,
    priorities: Vec<i32>,
    run_ats: Vec<Option<DateTime<Utc>>>,
    delays_ms: Vec<i64>,
    max_attempts: Vec<Option<i32>>,
    dedup_keys: Vec<Option<&'a str>>,
}

impl<'a> Columns<'a> {
    /// The tasks of `checked` at `indices`, in that order.
    fn of(checked: &'a CheckedTasks<'_>, indices: impl ExactSizeIterator<Item = usize>) -> Self {
        let n = indices.len();
        let mut c = Columns {
            tenants: Vec::with_capacity(n),
            task_types: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            priorities: Vec::with_capacity(n),
            run_ats: Vec::with_capacity(n),
            delays_ms: Vec::with_capacity(n),
            max_attempts: Vec::with_capacity(n),
            dedup_keys: Vec::with_capacity(n),
        };
        let (tasks, payloads) = (checked.tasks(), checked.payloads());
        for i in indices {
            let t = &tasks[i];
            let (run_at, delay) = match t.schedule {
                Schedule::Now => (None, Duration::ZERO),
                Schedule::At(at) => (Some(at), Duration::ZERO),
                Schedule::After(d) => (None, d),
            };
            c.tenants.push(&t.tenant);
            c.task_types.push(&t.task_type);
            c.payloads.push(&payloads[i]);
            c.priorities.push(t.priority);
            c.run_ats.push(run_at);
            c.delays_ms.push(sql_millis(delay));
            c.max_attempts.push(t.max_attempts);
            c.dedup_keys.push(t.dedup_key.as_deref());
        }
        c
    }

    /// Binds `$1` to `$7`, the columns both insert statements take in this order.
    fn bind<'q, O>(
        &'q self,
        query: QueryAs<'q, Postgres, O, PgArguments>,
    ) -> QueryAs<'q, Postgres, O, PgArguments> {
        query
            .bind(&self.tenants)
            .bind(&self.task_types)
            .bind(&self.payloads)
            .bind(&self.priorities)
            .bind(&self.run_ats)
            .bind(&self.delays_ms)
            .bind(&self.max_attempts)
    }
}

/// The bulk path, for batches without dedup keys: nothing can conflict, so a plain INSERT.
/// Ids are drawn in input order before any join can reorder rows, so the returned ids, sorted,
/// are the input order.
async fn insert_plain<'c, E: Executor<'c, Database = Postgres>>(
    conn: E,
    c: &Columns<'_>,
) -> Result<Vec<Enqueued>, QueueError> {
    let rows: Vec<(TaskId,)> =
        c.bind(sqlx::query_as(INSERT_PLAIN)).bind(DEFAULT_MAX_ATTEMPTS).fetch_all(conn).await?;
    let mut ids: Vec<TaskId> = rows.into_iter().map(|(id,)| id).collect();
    if ids.len() != c.tenants.len() {
        return Err(QueueError::Corrupt(format!(
            "inserted {} of {} tasks",
            ids.len(),
            c.tenants.len()
        )));
    }
    ids.sort_unstable();
    Ok(ids.into_iter().map(|id| Enqueued { id, created: true }).collect())
}

async fn insert<'c, E: Executor<'c, Database = Postgres>>(
    conn: E,
    c: &Columns<'_>,
) -> Result<Vec<Option<Enqueued>>, QueueError> {
    // Ids are drawn up front so each input row can be matched to its inserted row; rows
    // skipped by ON CONFLICT find their task among this statement's inserts (same key twice
    // in one batch) or among live tasks.
    let rows: Vec<(Option<i64>, bool)> = c
        .bind(sqlx::query_as(INSERT_DEDUP))
        .bind(&c.dedup_keys)
        .bind(DEFAULT_MAX_ATTEMPTS)
        .fetch_all(conn)
        .await?;
    Ok(rows.into_iter().map(|(id, created)| id.map(|id| Enqueued { id, created })).collect())
}

const INSERT_PLAIN: &str = concat!(
    r#"
        with input as (
            select nextval((select pg_get_serial_sequence('sweep.tasks', 'id')::regclass)) as id, i.*
            from unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::timestamptz[],
                        $6::int8[], $7::int4[])
                 as i(tenant, task_type, payload, priority, run_at, delay_ms, max_attempts)
        ),
        "#,
    module_defaults_cte!("select tenant, task_type from input"),
    r#",
        inserted as (
            insert into sweep.tasks (id, tenant, task_type, payload, priority, run_at, max_attempts)
            select input.id, input.tenant, input.task_type, input.payload::jsonb, input.priority,
                   coalesce(input.run_at, now() + input.delay_ms * interval '1 millisecond'),
                   coalesce(input.max_attempts,
                            (d.by_type ->> (input.tenant || '/' || input.task_type))::int4, $8)
            from input
            cross join module_defaults d
            returning id, tenant, task_type, run_at
        ),
        woken as (
            select count(*) from (select "#,
    notify_tasks!(),
    r#" from inserted limit 1) n
        ),
        "#,
    wake_queues_cte!("inserted"),
    r#"
        select id from inserted cross join woken cross join woken_queues
        "#
);

const INSERT_DEDUP: &str = concat!(
    r#"
        with input as materialized (
            select nextval((select pg_get_serial_sequence('sweep.tasks', 'id')::regclass)) as id, i.*
            from unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::timestamptz[],
                        $6::int8[], $7::int4[], $8::text[])
                 with ordinality
                 as i(tenant, task_type, payload, priority, run_at, delay_ms, max_attempts,
                      dedup_key, ord)
        ),
        "#,
    module_defaults_cte!("select tenant, task_type from input"),
    r#",
        inserted as (
            insert into sweep.tasks (id, tenant, task_type, payload, priority, run_at, max_attempts,
                               dedup_key)
            select input.id, input.tenant, input.task_type, input.payload::jsonb, input.priority,
                   coalesce(input.run_at, now() + input.delay_ms * interval '1 millisecond'),
                   coalesce(input.max_attempts,
                            (d.by_type ->> (input.tenant || '/' || input.task_type))::int4, $9),
                   input.dedup_key
            from input
            cross join module_defaults d
            order by input.ord
            on conflict (tenant, dedup_key)
                where dedup_key is not null and state in "#,
    state!(live),
    r#"
                do nothing
            returning id, tenant, task_type, run_at, dedup_key
        ),
        woken as (
            select count(*) from (select "#,
    notify_tasks!(),
    r#" from inserted limit 1) n
        ),
        "#,
    wake_queues_cte!("inserted"),
    r#"
        select coalesce(mine.id, sibling.id, live.id) as id, mine.id is not null as created
        from input
        cross join woken
        cross join woken_queues
        left join inserted mine on mine.id = input.id
        left join lateral (
            select s.id from inserted s
            where mine.id is null and s.tenant = input.tenant and s.dedup_key = input.dedup_key
            limit 1
        ) sibling on true
        left join lateral (
            select t.id from sweep.tasks t
            where mine.id is null and sibling.id is null
              and t.tenant = input.tenant and t.dedup_key = input.dedup_key
              and t.state in "#,
    state!(live),
    r#"
            limit 1
        ) live on true
        order by input.ord
        "#
);
const INSERT_AFTER: &str = r#"
    select pos, id, problem
    from sweep.sweep_enqueue_after($1::text[], $2::text[], $3::text[], $4::int4[],
                                   $5::timestamptz[], $6::int8[], $7::int4[], $8::bool[],
                                   $9::int8[], $10::int4[], $11::int8[], $12::int4)
    "#;
#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] =
    statements![INSERT_PLAIN, INSERT_DEDUP, INSERT_AFTER];
