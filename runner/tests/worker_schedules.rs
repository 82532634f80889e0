//! Cron schedules run by real runners on one database: each tick yields exactly one task
//! with three runners' schedulers racing for it (and one of them restarted); missed ticks after
//! a downtime follow the schedule's catch-up policy; overlap `skip` holds ticks back while the
//! previous task is live. Verdicts come from the database, polled with a deadline.

mod common;

use std::{collections::BTreeMap, time::Duration};

use chrono::{DateTime, Utc};
use common::*;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::{
    config::WorkerConfig,
    queue::{self, CatchUp, CronSchedule, ModuleSettings, NewSchedule, Overlap},
    sandbox::sha256_hex,
};

const DEADLINE: Duration = Duration::from_secs(60);

/// Registers the empty handler (succeeds at once) as `task_type` of tenant `default`.
async fn register_empty(pool: &PgPool, task_type: &str) {
    let bytes = sweep_dev::modules::empty_module();
    queue::register_module(
        pool,
        "default",
        task_type,
        &sha256_hex(&bytes),
        &bytes,
        &ModuleSettings::default(),
    )
    .await
    .expect("register");
}

/// Every task schedule `id` enqueued, live, finished or dead: (dedup key, task id, state).
async fn schedule_tasks(pool: &PgPool, id: i64) -> Vec<(String, i64, String)> {
    sqlx::query_as(
        r#"
        select dedup_key, id, state from (
            select dedup_key, id, state from sweep.tasks
            union all select dedup_key, id, state from sweep.finished_tasks
            union all select dedup_key, id, 'dead' from sweep.dead_tasks
        ) t
        where dedup_key like 'schedule:' || $1 || ':%'
        order by id
        "#,
    )
    .bind(id.to_string())
    .fetch_all(pool)
    .await
    .expect("schedule tasks")
}

/// Tasks per tick, from the dedup keys.
async fn tasks_per_tick(pool: &PgPool, id: i64) -> BTreeMap<DateTime<Utc>, usize> {
    let mut per_tick = BTreeMap::new();
    for (key, _, _) in schedule_tasks(pool, id).await {
        // `schedule:<id>:<RFC 3339 tick>`: the tick holds colons itself.
        let tick = key.splitn(3, ':').nth(2).unwrap_or_else(|| panic!("bad key {key}"));
        let at = DateTime::parse_from_rfc3339(tick).expect("tick time").with_timezone(&Utc);
        *per_tick.entry(at).or_default() += 1;
    }
    per_tick
}

async fn schedule(pool: &PgPool, name: &str) -> CronSchedule {
    queue::get_schedule(pool, "default", name).await.expect("schedule")
}

async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("select now()").fetch_one(pool).await.expect("now")
}

/// Polls until `done` holds of the schedule's tasks per tick, for at most [`DEADLINE`].
async fn wait_ticks(
    pool: &PgPool,
    id: i64,
    what: &str,
    done: impl Fn(&BTreeMap<DateTime<Utc>, usize>) -> bool,
) -> BTreeMap<DateTime<Utc>, usize> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let ticks = tasks_per_tick(pool, id).await;
        if done(&ticks) {
            return ticks;
        }
        assert!(tokio::time::Instant::now() < deadline, "never {what}: {ticks:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn config() -> WorkerConfig {
    let mut config = test_config();
    config.maintenance.scheduler_interval = Some(Duration::from_secs(1));
    config
}

#[sqlx::test(migrations = false)]
async fn each_tick_yields_one_task_with_three_runners_and_a_restarted_one(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    register_empty(&pool, "tick").await;
    let s = queue::create_schedule(
        &pool,
        &NewSchedule::new("every-second", "* * * * * *", "tick").overlap(Overlap::Allow),
    )
    .await
    .expect("create");

    let mut runners: Vec<_> = (0..3).map(|_| start_worker(&db, config())).collect();
    let first = wait_ticks(&pool, s.id, "saw 4 ticks", |t| t.len() >= 4).await;
    // A runner stops and another starts in its place, mid-schedule.
    runners.remove(0).stop().await;
    runners.push(start_worker(&db, config()));
    let seen = first.len();
    let all = wait_ticks(&pool, s.id, "saw 4 more ticks", |t| t.len() >= seen + 4).await;
    for runner in runners {
        runner.stop().await;
    }

    let all_after = tasks_per_tick(&pool, s.id).await;
    assert!(all_after.len() >= all.len());
    let doubled: Vec<_> = all_after.iter().filter(|(_, n)| **n != 1).collect();
    assert!(doubled.is_empty(), "ticks with more than one task: {doubled:?} of {all_after:?}");
    for (tick, _) in &all_after {
        assert_eq!(tick.timestamp_subsec_nanos(), 0, "ticks are whole seconds: {tick}");
    }
    // Each task was enqueued soon after its tick (by the database's clock), not a period late.
    let lateness: Vec<f64> = sqlx::query_scalar(
        r#"
        select extract(epoch from created_at - substr(dedup_key, length('schedule:' || $1 || ':') + 1)::timestamptz)::float8
        from (select dedup_key, created_at from sweep.tasks
              union all select dedup_key, created_at from sweep.finished_tasks) t
        where dedup_key like 'schedule:' || $1 || ':%'
        "#,
    )
    .bind(s.id.to_string())
    .fetch_all(&pool)
    .await
    .expect("lateness");
    let worst = lateness.iter().copied().fold(0.0_f64, f64::max);
    eprintln!("{} ticks, enqueued at most {worst:.3} s after their time", lateness.len());
    assert!(lateness.iter().all(|l| (0.0..5.0).contains(l)), "ticks enqueued late: {lateness:?}");
    // The schedule names its latest tick and task.
    let (last_tick, _) = all_after.iter().next_back().expect("a tick");
    let row = schedule(&pool, "every-second").await;
    assert_eq!(row.last_run_at, Some(*last_tick));
    let tasks = schedule_tasks(&pool, s.id).await;
    assert_eq!(row.last_task_id, tasks.last().map(|(_, id, _)| *id));
    assert!(row.next_run_at > *last_tick);
}

#[sqlx::test(migrations = false)]
async fn after_downtime_the_latest_missed_tick_runs_once(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    register_empty(&pool, "tick").await;
    let s = queue::create_schedule(&pool, &NewSchedule::new("minutely", "0 * * * * *", "tick"))
        .await
        .expect("create");
    // Every runner was down for an hour: sixty ticks were missed.
    sqlx::query("update sweep.schedules set next_run_at = now() - interval '1 hour' where id = $1")
        .bind(s.id)
        .execute(&pool)
        .await
        .expect("simulate downtime");
    let before = db_now(&pool).await;

    let runner = start_worker(&db, config());
    let ticks = wait_ticks(&pool, s.id, "ran a missed tick", |t| !t.is_empty()).await;
    runner.stop().await;

    let (first, count) = ticks.iter().next().map(|(t, n)| (*t, *n)).expect("a tick");
    assert_eq!(count, 1);
    // The latest minute at or before the runner's first pass, not an hour-old one.
    assert!(first <= db_now(&pool).await && before - first < chrono::Duration::seconds(61));
    let all = tasks_per_tick(&pool, s.id).await;
    assert!(all.len() <= 2, "one missed tick (and at most the next one) ran: {all:?}");
    let row = schedule(&pool, "minutely").await;
    assert!(row.next_run_at > first);
}

#[sqlx::test(migrations = false)]
async fn after_downtime_catch_up_skip_runs_no_late_tick(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    register_empty(&pool, "tick").await;
    let s = queue::create_schedule(
        &pool,
        &NewSchedule::new("minutely", "0 * * * * *", "tick").catch_up(CatchUp::Skip),
    )
    .await
    .expect("create");
    sqlx::query("update sweep.schedules set next_run_at = now() - interval '1 hour' where id = $1")
        .bind(s.id)
        .execute(&pool)
        .await
        .expect("simulate downtime");

    let runner = start_worker(&db, config());
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let advanced_at = loop {
        let row = schedule(&pool, "minutely").await;
        let now = db_now(&pool).await;
        if row.next_run_at > now {
            break now;
        }
        assert!(tokio::time::Instant::now() < deadline, "never advanced: {row:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    runner.stop().await;
    let late: Vec<_> = tasks_per_tick(&pool, s.id)
        .await
        .into_keys()
        .filter(|tick| *tick < advanced_at - chrono::Duration::seconds(10))
        .collect();
    assert!(late.is_empty(), "late ticks ran: {late:?}");
    assert_eq!(schedule(&pool, "minutely").await.skipped_ticks, 0, "late ticks are not overlaps");
}

#[sqlx::test(migrations = false)]
async fn overlap_skip_holds_ticks_while_the_previous_task_is_live(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    register_empty(&pool, "tick").await;
    let s = queue::create_schedule(&pool, &NewSchedule::new("held", "* * * * * *", "tick"))
        .await
        .expect("create");
    assert_eq!(s.overlap, Overlap::Skip, "skip is the default");
    // This runner schedules but claims only another type: the tick's task stays pending.
    let runner = start_worker(&db, WorkerConfig { task_types: vec!["other".into()], ..config() });
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let held = loop {
        let row = schedule(&pool, "held").await;
        if row.skipped_ticks >= 2 {
            break row;
        }
        assert!(tokio::time::Instant::now() < deadline, "never skipped: {row:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let tasks = schedule_tasks(&pool, s.id).await;
    assert_eq!(tasks.len(), 1, "one task while it is live: {tasks:?}");
    let (_, live, state) = &tasks[0];
    assert_eq!((state.as_str(), held.last_task_id), ("pending", Some(*live)));

    // Once it is no longer live, the next tick enqueues again.
    queue::cancel(&pool, None, *live).await.expect("cancel");
    wait_ticks(&pool, s.id, "enqueued after the cancel", |t| t.len() >= 2).await;
    runner.stop().await;
    let tasks = schedule_tasks(&pool, s.id).await;
    assert!(tasks.iter().filter(|(_, _, state)| state == "pending").count() <= 1, "{tasks:?}");
}

#[sqlx::test(migrations = false)]
async fn a_paused_schedule_resumes_from_the_next_tick(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    register_empty(&pool, "tick").await;
    let s = queue::create_schedule(
        &pool,
        &NewSchedule::new("napping", "* * * * * *", "tick").overlap(Overlap::Allow),
    )
    .await
    .expect("create");
    let paused = queue::pause_schedule(&pool, "default", "napping").await.expect("pause");
    assert!(paused.paused && paused.paused_at.is_some());
    // Paused for "an hour": resuming does not run the ticks of the pause.
    sqlx::query("update sweep.schedules set next_run_at = now() - interval '1 hour' where id = $1")
        .bind(s.id)
        .execute(&pool)
        .await
        .expect("age the schedule");
    let resumed = queue::resume_schedule(&pool, "default", "napping").await.expect("resume");
    let now = db_now(&pool).await;
    assert!(!resumed.paused && resumed.next_run_at > now - chrono::Duration::seconds(1));

    let runner = start_worker(&db, config());
    let ticks = wait_ticks(&pool, s.id, "ticked after the resume", |t| !t.is_empty()).await;
    runner.stop().await;
    let first = *ticks.keys().next().expect("a tick");
    assert!(first >= resumed.next_run_at, "no tick of the pause ran: {ticks:?}");
}
