//! Cron schedules: a tenant's named cron expression (optional seconds), evaluated in an IANA
//! time zone, that enqueues one task per tick.
//!
//! Owns: checking a schedule before anything is written ([`InvalidSchedule`], each message
//! names its field), the `schedules` rows, and the tick itself ([`run_due_schedules`]); what a
//! tick is (the expression, its zone, missed ticks, overlap) is `cron.rs`'s.
//!
//! Invariants:
//! - a tick yields at most one task however many runners run the scheduler: a due row is
//!   taken with `FOR UPDATE SKIP LOCKED` (a row another runner advanced meanwhile fails the
//!   re-checked `next_run_at <= now()`), the tick's task is enqueued with the tick's identity
//!   in its dedup key (`schedule:<id>:<tick>`), and `next_run_at` moves past `now()`, all in
//!   one transaction;
//! - every time is the database's (`now()`), never a runner's clock;
//! - missed ticks (the scheduler did not run, e.g. every runner was down): `catch_up =
//!   latest` enqueues the latest due tick once and drops the earlier ones; `catch_up = skip`
//!   enqueues nothing for a tick reached more than [`LATE_AFTER`](super::LATE_AFTER) after
//!   its time;
//! - overlap `skip`: no task for a tick while the schedule's last task is still in `tasks`
//!   (pending, running or retrying); the tick counts in `skipped_ticks`;
//! - a paused schedule enqueues nothing; resuming it starts from the next tick after the
//!   resume (ticks during the pause are not missed ticks).

use std::{fmt, time::Duration};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};

use super::{
    cron::{plan_tick, CatchUp, CronSpec, InvalidCron, Overlap, TickPlan},
    enqueue::enqueue_keyed,
    sql_count, Conn, Connects, InvalidTask, NewTask, QueueError, TaskId, DEFAULT_TENANT,
};

pub const MAX_SCHEDULE_NAME_LEN: usize = 128;

/// Why a schedule was refused. Nothing was written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidSchedule {
    #[error("name must be 1 to {max} bytes of letters, digits, '.', '-', '_' or ':'")]
    BadName { max: usize },
    #[error(transparent)]
    Cron(#[from] InvalidCron),
    /// The task the schedule would enqueue is invalid (names `task_type`, `payload`, ...).
    #[error(transparent)]
    Task(InvalidTask),
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    #[error(transparent)]
    Invalid(#[from] InvalidSchedule),
    #[error("schedule {0:?} already exists")]
    Exists(String),
    #[error("schedule {0:?} not found")]
    NotFound(String),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl From<sqlx::Error> for ScheduleError {
    fn from(e: sqlx::Error) -> Self {
        ScheduleError::Queue(e.into())
    }
}

/// A schedule to create. Build with [`NewSchedule::new`] and the setters.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSchedule {
    pub tenant: String,
    /// Unique per tenant.
    pub name: String,
    pub cron: String,
    /// IANA name; `UTC` by default.
    pub timezone: String,
    pub task_type: String,
    pub payload: Value,
    pub priority: i32,
    /// `None`: the module's default, else 5 (as for any task).
    pub max_attempts: Option<i32>,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
}

impl NewSchedule {
    pub fn new(
        name: impl Into<String>,
        cron: impl Into<String>,
        task_type: impl Into<String>,
    ) -> Self {
        NewSchedule {
            tenant: DEFAULT_TENANT.to_owned(),
            name: name.into(),
            cron: cron.into(),
            timezone: "UTC".to_owned(),
            task_type: task_type.into(),
            payload: Value::Object(serde_json::Map::new()),
            priority: 0,
            max_attempts: None,
            overlap: Overlap::default(),
            catch_up: CatchUp::default(),
        }
    }
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = tenant.into();
        self
    }
    pub fn timezone(mut self, timezone: impl Into<String>) -> Self {
        self.timezone = timezone.into();
        self
    }
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = payload;
        self
    }
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.overlap = overlap;
        self
    }
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// Checks everything a tick would otherwise fail on, and returns the parsed expression.
    pub fn validate(&self) -> Result<CronSpec, InvalidSchedule> {
        validate_schedule_name(&self.name)?;
        let spec = CronSpec::parse(&self.cron, &self.timezone)?;
        let task = TaskTemplate::of(self).task(0, Utc::now());
        task.validate().map_err(InvalidSchedule::Task)?;
        Ok(spec)
    }

    /// The task a tick enqueues, for payload-size checks before the schedule is created.
    pub fn sample_task(&self) -> NewTask {
        TaskTemplate::of(self).task(0, Utc::now())
    }
}

/// A schedule name: short, printable, safe in URLs (the task type's alphabet).
pub fn validate_schedule_name(name: &str) -> Result<(), InvalidSchedule> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
    if name.is_empty() || name.len() > MAX_SCHEDULE_NAME_LEN || !name.chars().all(allowed) {
        return Err(InvalidSchedule::BadName { max: MAX_SCHEDULE_NAME_LEN });
    }
    Ok(())
}

/// The parts of a schedule its tasks are made from.
struct TaskTemplate<'a> {
    tenant: &'a str,
    task_type: &'a str,
    payload: &'a Value,
    priority: i32,
    max_attempts: Option<i32>,
}

impl<'a> TaskTemplate<'a> {
    fn of(s: &'a NewSchedule) -> Self {
        TaskTemplate {
            tenant: &s.tenant,
            task_type: &s.task_type,
            payload: &s.payload,
            priority: s.priority,
            max_attempts: s.max_attempts,
        }
    }

    /// The task of schedule `id`'s tick at `tick`; the tick is its identity (dedup key).
    fn task(&self, id: i64, tick: DateTime<Utc>) -> NewTask {
        let mut task = NewTask::new(self.task_type, self.payload.clone())
            .tenant(self.tenant)
            .priority(self.priority);
        task.max_attempts = self.max_attempts;
        task.dedup_key(tick_key(id, tick))
    }
}

/// The dedup key of schedule `id`'s task for the tick at `tick`.
pub fn tick_key(id: i64, tick: DateTime<Utc>) -> String {
    format!("schedule:{id}:{}", tick.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

/// A schedule as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct CronSchedule {
    pub id: i64,
    pub tenant: String,
    pub name: String,
    pub cron: String,
    pub timezone: String,
    pub task_type: String,
    /// The payload of every task it enqueues.
    #[schema(value_type = Object)]
    pub payload: Value,
    pub priority: i32,
    /// `null`: the module's default, else 5.
    #[schema(required)]
    pub max_attempts: Option<i32>,
    #[sqlx(try_from = "String")]
    pub overlap: Overlap,
    #[sqlx(try_from = "String")]
    pub catch_up: CatchUp,
    pub paused: bool,
    #[schema(required)]
    pub paused_at: Option<DateTime<Utc>>,
    /// The next tick (UTC). While paused, the tick it would have run; a resume recomputes it.
    pub next_run_at: DateTime<Utc>,
    /// The tick of the last task it enqueued.
    #[schema(required)]
    pub last_run_at: Option<DateTime<Utc>>,
    /// The last task it enqueued (`GET /v1/tasks/{id}`).
    #[schema(required, value_type = Option<i64>)]
    pub last_task_id: Option<TaskId>,
    /// Ticks that enqueued nothing because the previous task was still live (`overlap: skip`).
    pub skipped_ticks: i64,
    pub created_at: DateTime<Utc>,
}

/// Creates `new` (validated first; nothing is written for an invalid one). Its first tick is
/// the first after the database's `now()`.
pub async fn create_schedule<'c, A>(
    conn: A,
    new: &NewSchedule,
) -> Result<CronSchedule, ScheduleError>
where
    A: Connects<'c>,
{
    let spec = new.validate()?;
    let mut conn = conn.connect().await?;
    let now: DateTime<Utc> = sqlx::query_scalar(SCHEDULE_NOW).fetch_one(&mut conn).await?;
    let next = spec
        .next_after(now)
        .ok_or_else(|| InvalidSchedule::from(InvalidCron::NeverFires(new.cron.clone())))?;
    let row: Option<CronSchedule> = sqlx::query_as(SCHEDULE_CREATE)
        .bind(&new.tenant)
        .bind(&new.name)
        .bind(&new.cron)
        .bind(spec.timezone())
        .bind(&new.task_type)
        .bind(&new.payload)
        .bind(new.priority)
        .bind(new.max_attempts)
        .bind(new.overlap.as_str())
        .bind(new.catch_up.as_str())
        .bind(next)
        .fetch_optional(&mut conn)
        .await?;
    row.ok_or_else(|| ScheduleError::Exists(new.name.clone()))
}

/// Schedules of tenant `scope` (every tenant's for `None`), by tenant and name.
pub async fn list_schedules<'c, E: PgExecutor<'c>>(
    executor: E,
    scope: Option<&str>,
) -> Result<Vec<CronSchedule>, QueueError> {
    Ok(sqlx::query_as(SCHEDULE_LIST).bind(scope).fetch_all(executor).await?)
}

pub async fn get_schedule<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    name: &str,
) -> Result<CronSchedule, ScheduleError> {
    let row: Option<CronSchedule> =
        sqlx::query_as(SCHEDULE_GET).bind(tenant).bind(name).fetch_optional(executor).await?;
    row.ok_or_else(|| ScheduleError::NotFound(name.to_owned()))
}

/// Stops the schedule's ticks until [`resume_schedule`]; pausing a paused one changes nothing.
pub async fn pause_schedule<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    name: &str,
) -> Result<CronSchedule, ScheduleError> {
    let row: Option<CronSchedule> =
        sqlx::query_as(SCHEDULE_PAUSE).bind(tenant).bind(name).fetch_optional(executor).await?;
    row.ok_or_else(|| ScheduleError::NotFound(name.to_owned()))
}

/// Resumes a paused schedule from its first tick after the database's `now()`; resuming a
/// running one changes nothing.
pub async fn resume_schedule<'c, A: Connects<'c>>(
    conn: A,
    tenant: &str,
    name: &str,
) -> Result<CronSchedule, ScheduleError> {
    let mut conn = conn.connect().await?;
    let current = get_schedule(&mut conn, tenant, name).await?;
    if !current.paused {
        return Ok(current);
    }
    let spec = CronSpec::parse(&current.cron, &current.timezone).map_err(InvalidSchedule::from)?;
    let now: DateTime<Utc> = sqlx::query_scalar(SCHEDULE_NOW).fetch_one(&mut conn).await?;
    let next = spec
        .next_after(now)
        .ok_or_else(|| InvalidSchedule::from(InvalidCron::NeverFires(current.cron.clone())))?;
    let row: Option<CronSchedule> = sqlx::query_as(SCHEDULE_RESUME)
        .bind(tenant)
        .bind(name)
        .bind(next)
        .fetch_optional(&mut conn)
        .await?;
    match row {
        Some(row) => Ok(row),
        // Resumed (or deleted) by someone else in between.
        None => get_schedule(&mut conn, tenant, name).await,
    }
}

/// Deletes the schedule; the tasks it already enqueued stay.
pub async fn delete_schedule<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    name: &str,
) -> Result<CronSchedule, ScheduleError> {
    let row: Option<CronSchedule> =
        sqlx::query_as(SCHEDULE_DELETE).bind(tenant).bind(name).fetch_optional(executor).await?;
    row.ok_or_else(|| ScheduleError::NotFound(name.to_owned()))
}

/// What one scheduler pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Tasks enqueued.
    pub enqueued: usize,
    /// Ticks that enqueued nothing: the previous task was live (`overlap: skip`) or the tick
    /// was late (`catch_up: skip`).
    pub skipped: usize,
    /// Schedules paused because they have no tick left (or could not be read).
    pub stopped: usize,
    /// Until the earliest next tick of any unpaused schedule, by the database's clock (zero
    /// when one is due); `None` without schedules.
    pub next_due_in: Option<Duration>,
}

/// A due schedule row, locked for this tick.
#[derive(Debug, sqlx::FromRow)]
struct DueRow {
    id: i64,
    tenant: String,
    cron: String,
    timezone: String,
    task_type: String,
    payload: Value,
    priority: i32,
    max_attempts: Option<i32>,
    overlap: String,
    catch_up: String,
    next_run_at: DateTime<Utc>,
    last_task_id: Option<TaskId>,
    now: DateTime<Utc>,
}

/// Most schedules ticked per transaction.
const TICK_BATCH: usize = 100;

/// Enqueues the task of every due, unpaused schedule's tick (see the module header for the
/// guarantees), a batch of schedules per transaction, and says when the next one is due.
/// Safe on every runner at once.
pub async fn run_due_schedules<'c, A: Connects<'c>>(conn: A) -> Result<TickReport, QueueError> {
    let mut conn = conn.connect().await?;
    let mut report = TickReport::default();
    loop {
        let mut tx = conn.begin().await?;
        let taken = match tick_batch(&mut tx, &mut report).await {
            Ok(taken) => {
                tx.commit().await?;
                taken
            }
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(e);
            }
        };
        if taken < TICK_BATCH {
            break;
        }
    }
    let ms: Option<i64> = sqlx::query_scalar(SCHEDULE_NEXT_DUE).fetch_one(&mut conn).await?;
    report.next_due_in = ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
    Ok(report)
}

/// One batch in the caller's transaction; returns how many rows it took.
async fn tick_batch<C>(tx: &mut Conn<C>, report: &mut TickReport) -> Result<usize, QueueError>
where
    C: std::ops::DerefMut<Target = PgConnection> + Send + fmt::Debug,
{
    let rows: Vec<DueRow> =
        sqlx::query_as(SCHEDULE_TAKE_DUE).bind(sql_count(TICK_BATCH)).fetch_all(&mut *tx).await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let previous: Vec<TaskId> = rows.iter().filter_map(|r| r.last_task_id).collect();
    // `tasks` holds only live tasks (pending, running, retrying): present means live.
    let live: Vec<TaskId> =
        sqlx::query_scalar(SCHEDULE_LIVE_TASKS).bind(&previous).fetch_all(&mut *tx).await?;
    for row in &rows {
        let spec = match CronSpec::parse(&row.cron, &row.timezone) {
            Ok(spec) => spec,
            Err(e) => {
                tracing::warn!(schedule = row.id, error = %e, "pausing a schedule that cannot be read");
                advance(tx, row.id, None, None, None, 0).await?;
                report.stopped += 1;
                continue;
            }
        };
        // The table's checks admit only the policies' names.
        let catch_up: CatchUp = row.catch_up.parse().unwrap_or_default();
        let overlap: Overlap = row.overlap.parse().unwrap_or_default();
        let previous_live = row.last_task_id.is_some_and(|id| live.contains(&id));
        match plan_tick(&spec, row.next_run_at, row.now, catch_up, overlap, previous_live) {
            TickPlan::Skip { next, overlapped, .. } => {
                advance(tx, row.id, next, None, None, i64::from(overlapped)).await?;
                report.skipped += 1;
                report.stopped += usize::from(next.is_none());
            }
            TickPlan::Run { tick, next } => {
                let template = TaskTemplate {
                    tenant: &row.tenant,
                    task_type: &row.task_type,
                    payload: &row.payload,
                    priority: row.priority,
                    max_attempts: row.max_attempts,
                };
                let task = template.task(row.id, tick);
                match enqueue_keyed(&mut *tx, &task).await {
                    Ok(enqueued) => {
                        let id = enqueued.map(|e| e.id);
                        advance(tx, row.id, next, Some(tick), id, 0).await?;
                        report.enqueued += usize::from(enqueued.is_some_and(|e| e.created));
                        report.stopped += usize::from(next.is_none());
                    }
                    Err(QueueError::Invalid(e)) => {
                        // Checked at create; only a row changed behind the API's back gets here.
                        tracing::warn!(schedule = row.id, error = %e, "pausing a schedule whose task is invalid");
                        advance(tx, row.id, None, None, None, 0).await?;
                        report.stopped += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(rows.len())
}

/// Moves schedule `id` to its `next` tick (`None`: pauses it, nothing left to run), recording
/// the tick and task it enqueued and the ticks it skipped for overlap.
async fn advance<C>(
    tx: &mut Conn<C>,
    id: i64,
    next: Option<DateTime<Utc>>,
    tick: Option<DateTime<Utc>>,
    task: Option<TaskId>,
    skipped: i64,
) -> Result<(), QueueError>
where
    C: std::ops::DerefMut<Target = PgConnection> + Send + fmt::Debug,
{
    sqlx::query(SCHEDULE_ADVANCE)
        .bind(id)
        .bind(next)
        .bind(tick)
        .bind(task)
        .bind(skipped)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The columns of [`CronSchedule`], for every statement that returns one.
macro_rules! schedule_columns {
    () => {
        "id, tenant, name, cron, timezone, task_type, payload, priority, max_attempts, overlap,
         catch_up, paused_at is not null as paused, paused_at, next_run_at, last_run_at,
         last_task_id, skipped_ticks, created_at"
    };
}

const SCHEDULE_NOW: &str = "select now()";

const SCHEDULE_CREATE: &str = concat!(
    r#"
    insert into sweep.schedules (tenant, name, cron, timezone, task_type, payload, priority,
                                 max_attempts, overlap, catch_up, next_run_at)
    values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
    on conflict (tenant, name) do nothing
    returning "#,
    schedule_columns!()
);

const SCHEDULE_LIST: &str = concat!(
    "select ",
    schedule_columns!(),
    r#"
    from sweep.schedules
    where $1::text is null or tenant = $1
    order by tenant, name
    "#
);

const SCHEDULE_GET: &str = concat!(
    "select ",
    schedule_columns!(),
    " from sweep.schedules where tenant = $1 and name = $2"
);

const SCHEDULE_PAUSE: &str = concat!(
    r#"
    update sweep.schedules set paused_at = coalesce(paused_at, now())
    where tenant = $1 and name = $2
    returning "#,
    schedule_columns!()
);

const SCHEDULE_RESUME: &str = concat!(
    r#"
    update sweep.schedules set paused_at = null, next_run_at = $3
    where tenant = $1 and name = $2 and paused_at is not null
    returning "#,
    schedule_columns!()
);

const SCHEDULE_DELETE: &str = concat!(
    "delete from sweep.schedules where tenant = $1 and name = $2 returning ",
    schedule_columns!()
);

/// Due rows, locked; a row another scheduler holds is skipped, and one it advanced since this
/// statement's snapshot is re-checked against `next_run_at <= now()` and dropped.
const SCHEDULE_TAKE_DUE: &str = r#"
    select id, tenant, cron, timezone, task_type, payload, priority, max_attempts, overlap,
           catch_up, next_run_at, last_task_id, now() as now
    from sweep.schedules
    where paused_at is null and next_run_at <= now()
    order by next_run_at
    limit $1
    for update skip locked
    "#;

const SCHEDULE_LIVE_TASKS: &str = "select id from sweep.tasks where id = any($1::int8[])";

const SCHEDULE_ADVANCE: &str = r#"
    update sweep.schedules
    set next_run_at = coalesce($2::timestamptz, next_run_at),
        paused_at = case when $2::timestamptz is null then now() else paused_at end,
        last_run_at = coalesce($3::timestamptz, last_run_at),
        last_task_id = coalesce($4::int8, last_task_id),
        skipped_ticks = skipped_ticks + $5::int8
    where id = $1
    "#;

/// Milliseconds until the earliest tick of an unpaused schedule, on the server's clock now
/// (`clock_timestamp()`: `now()` is the transaction's start).
const SCHEDULE_NEXT_DUE: &str = r#"
    select (extract(epoch from min(next_run_at) - clock_timestamp()) * 1000)::int8
    from sweep.schedules
    where paused_at is null
    "#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![
    SCHEDULE_NOW,
    SCHEDULE_CREATE,
    SCHEDULE_LIST,
    SCHEDULE_GET,
    SCHEDULE_PAUSE,
    SCHEDULE_RESUME,
    SCHEDULE_DELETE,
    SCHEDULE_TAKE_DUE,
    SCHEDULE_LIVE_TASKS,
    SCHEDULE_ADVANCE,
    SCHEDULE_NEXT_DUE,
];

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::queue::cron::tests::utc;
    use serde_json::json;

    #[test]
    fn a_schedule_is_checked_field_by_field() {
        assert!(matches!(
            NewSchedule::new("n", "* * *", "t").validate().unwrap_err(),
            InvalidSchedule::Cron(InvalidCron::BadCron { .. })
        ));
        let ok = NewSchedule::new("n", "* * * * *", "t");
        assert!(ok.validate().is_ok());
        assert_eq!(
            NewSchedule::new("a b", "* * * * *", "t").validate().unwrap_err(),
            InvalidSchedule::BadName { max: MAX_SCHEDULE_NAME_LEN }
        );
        assert_eq!(
            ok.clone().payload(json!([1])).validate().unwrap_err(),
            InvalidSchedule::Task(InvalidTask::PayloadNotObject("an array"))
        );
        assert!(matches!(
            ok.clone().max_attempts(0).validate().unwrap_err(),
            InvalidSchedule::Task(InvalidTask::MaxAttemptsOutOfRange { .. })
        ));
        assert_eq!(
            NewSchedule::new("n", "* * * * *", "").validate().unwrap_err(),
            InvalidSchedule::Task(InvalidTask::EmptyTaskType)
        );
    }

    #[test]
    fn the_tick_is_in_the_dedup_key() {
        assert_eq!(tick_key(7, utc(2026, 12, 1, 0, 0, 5)), "schedule:7:2026-12-01T00:00:05Z");
        let t = NewSchedule::new("n", "* * * * * *", "t").tenant("acme").priority(3);
        let task = TaskTemplate::of(&t).task(9, utc(2026, 12, 1, 0, 0, 5));
        assert_eq!(task.dedup_key.as_deref(), Some("schedule:9:2026-12-01T00:00:05Z"));
        assert_eq!((task.tenant.as_str(), task.priority), ("acme", 3));
    }
}
