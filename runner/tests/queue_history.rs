//! History at scale: finished tasks are partitioned by UTC day of `finished_at`
//! (runner/sql/retention.sql). Finished tasks land in their day's partition (the default one
//! when none covers them, until maintenance moves them), retention drops whole partitions,
//! runners maintaining at once do not trip over each other, and a lookup by id probes an index
//! in every partition.

mod common;

use std::{collections::HashMap, time::Duration};

use chrono::{DateTime, NaiveDate, Utc};
use common::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{self, TaskId};
use sweep_dev::fixtures;

const DAY: Duration = Duration::from_secs(86_400);

/// Inserts a succeeded task `id` that finished `days_ago` days ago (negative: ahead).
async fn insert_finished(pool: &PgPool, id: TaskId, days_ago: f64) {
    sqlx::query(
        "insert into sweep.finished_tasks (id, tenant, task_type, payload, state, priority,
                                           attempts, max_attempts, run_at, errors, result,
                                           created_at, finished_at)
         values ($1, 'default', 'old', '{}', $2, 0, 1, 5, now(), '[]', '{\"ok\": true}', now(),
                 now() - $3 * interval '1 day')",
    )
    .bind(id)
    .bind(TaskState::Succeeded.as_str())
    .bind(days_ago)
    .execute(pool)
    .await
    .unwrap();
}

/// The partition holding finished task `id`.
async fn partition_of(pool: &PgPool, id: TaskId) -> String {
    sqlx::query_scalar("select tableoid::regclass::text from sweep.finished_tasks where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The name of the day partition `days_ago` days before now (UTC).
async fn day_partition(pool: &PgPool, days_ago: i32) -> String {
    sqlx::query_scalar(
        "select 'sweep.finished_tasks_'
                || to_char((now() - $1 * interval '1 day') at time zone 'UTC', 'YYYYMMDD')",
    )
    .bind(days_ago)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Every partition: name, whether it is the default, its bounds.
async fn partitions(
    pool: &PgPool,
) -> Vec<(String, bool, Option<DateTime<Utc>>, Option<DateTime<Utc>>)> {
    sqlx::query_as(
        "select part::text, is_default, lower, upper from sweep.sweep_finished_partitions()
         order by is_default, lower nulls first",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn in_default(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sweep.finished_tasks_default")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The kept counts (totals and deltas not folded yet, which `GET /v1/stats` reads) against a
/// count of the tables they stand for; a key whose counts all came to zero is the same as
/// none. Checked again after a fold, which must change no count and leave no delta.
async fn assert_counts_kept(pool: &PgPool) {
    check_counts(pool).await;
    queue::fold_kept_counts(pool).await.unwrap();
    let (deltas,): (i64,) =
        sqlx::query_as("select count(*) from sweep.history_deltas").fetch_one(pool).await.unwrap();
    assert_eq!(deltas, 0, "a fold moves every committed delta");
    check_counts(pool).await;
}

async fn check_counts(pool: &PgPool) {
    type Row = (String, String, NaiveDate, i64, i64, i64);
    let kept: Vec<Row> = sqlx::query_as(
        "select tenant, task_type, day, sum(succeeded)::int8, sum(cancelled)::int8,
                sum(dead)::int8
         from (select * from sweep.history_counts union all select * from sweep.history_deltas) k
         group by 1, 2, 3
         having (sum(succeeded), sum(cancelled), sum(dead)) <> (0, 0, 0)
         order by 1, 2, 3",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let counted: Vec<Row> = sqlx::query_as(
        "select tenant, task_type, day, sum(s)::int8, sum(c)::int8, sum(d)::int8
         from (select tenant, task_type, (finished_at at time zone 'UTC')::date as day,
                      (state = 'succeeded')::int as s, (state = 'cancelled')::int as c, 0 as d
               from sweep.finished_tasks
               union all
               select tenant, task_type, (died_at at time zone 'UTC')::date, 0, 0, 1
               from sweep.dead_tasks) every
         group by 1, 2, 3 order by 1, 2, 3",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(kept, counted, "kept counts against the history");
}

/// Claims and completes `n` new tasks of type "t"; returns their ids.
async fn complete_new(pool: &PgPool, n: i64) -> Vec<TaskId> {
    enqueue_n(pool, "t", n).await;
    let runner = new_runner();
    let claimed = claim(pool, runner, n as usize).await;
    let done: Vec<_> = claimed.iter().map(|c| completion(c, json!({"done": c.id}))).collect();
    assert!(queue::complete_batch(pool, runner, &done).await.unwrap().is_empty());
    claimed.iter().map(|c| c.id).collect()
}

#[sqlx::test(migrations = false)]
async fn a_new_database_starts_with_day_partitions_and_a_default(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let names: Vec<String> = partitions(&pool).await.into_iter().map(|p| p.0).collect();
    let mut expected = Vec::new();
    for ago in [0, -1, -2, -3] {
        expected.push(day_partition(&pool, ago).await);
    }
    expected.push("sweep.finished_tasks_default".to_owned());
    assert_eq!(names, expected);
}

#[sqlx::test(migrations = false)]
async fn finished_tasks_land_in_their_days_partition_and_the_default_catches_the_rest(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let today = day_partition(&pool, 0).await;
    let done = complete_new(&pool, 2).await;
    let cancelled = enqueue_n(&pool, "t", 1).await[0];
    queue::cancel(&pool, None, cancelled).await.unwrap();
    for id in done.iter().chain([&cancelled]) {
        assert_eq!(partition_of(&pool, *id).await, today);
    }
    assert_eq!(state(&pool, cancelled).await, TaskState::Cancelled);

    // No partition covers two days ago: the row goes to the default partition, and is found.
    insert_finished(&pool, 900_001, 2.0).await;
    insert_finished(&pool, 900_002, 1.5).await;
    assert_eq!(partition_of(&pool, 900_001).await, "sweep.finished_tasks_default");
    assert_eq!(state(&pool, 900_001).await, TaskState::Succeeded);

    // Maintenance creates the partitions those rows need and moves them there.
    let r = queue::retain_finished(&pool, 7 * DAY, 100).await.unwrap();
    assert_eq!((r.dropped, r.deleted), (0, 0), "{r:?}");
    assert!(r.created >= 1, "{r:?}");
    assert_eq!(partition_of(&pool, 900_001).await, day_partition(&pool, 2).await);
    let (yesterday, before) = (day_partition(&pool, 1).await, day_partition(&pool, 2).await);
    let second = partition_of(&pool, 900_002).await;
    assert!(second == yesterday || second == before, "36 hours ago is in {second}");
    assert_eq!(in_default(&pool).await, 0);
    assert_eq!(state(&pool, 900_002).await, TaskState::Succeeded);

    let again = queue::retain_finished(&pool, 7 * DAY, 100).await.unwrap();
    assert_eq!(again, queue::Retention::default(), "nothing left to do");
    assert_counts_kept(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn retention_drops_partitions_wholly_older_than_the_ttl_and_keeps_newer_rows(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    sqlx::query("select sweep.sweep_finished_add_partitions(now() - interval '10 days', now())")
        .execute(&pool)
        .await
        .unwrap();
    for (id, days_ago) in [(901, 9.5), (902, 5.0), (903, 4.2), (904, 2.9), (905, 1.0), (906, 0.0)] {
        insert_finished(&pool, id, days_ago).await;
    }
    // Older than any partition: kept in the default partition until it expires.
    insert_finished(&pool, 907, 20.0).await;
    assert_eq!(partition_of(&pool, 907).await, "sweep.finished_tasks_default");
    let done = complete_new(&pool, 2).await;
    let live = enqueue_n(&pool, "t", 2).await;

    let r = queue::retain_finished(&pool, 3 * DAY, 100).await.unwrap();
    assert!(r.dropped >= 6, "days 10 to 4 ago are wholly older than 3 days: {r:?}");
    assert_eq!(r.deleted, 1, "the expired row of the default partition");
    let (cutoff,): (DateTime<Utc>,) =
        sqlx::query_as("select now() - interval '3 days'").fetch_one(&pool).await.unwrap();
    for (name, is_default, _, upper) in partitions(&pool).await {
        assert!(is_default || upper.unwrap() > cutoff, "{name} should have been dropped");
    }
    let left: Vec<TaskId> = sqlx::query_scalar("select id from sweep.finished_tasks order by id")
        .fetch_all(&pool)
        .await
        .unwrap();
    // Row 903 (4.2 days old) is gone with its partition; row 904 (2.9 days) is within the TTL.
    let mut expected = done.clone();
    expected.extend([904, 905, 906]);
    assert_eq!(left, expected);
    for id in live {
        assert_eq!(state(&pool, id).await, TaskState::Pending, "live tasks are never touched");
    }
    // Every partition still needed is there: new completions land in today's.
    let more = complete_new(&pool, 3).await;
    assert_eq!(partition_of(&pool, more[0]).await, day_partition(&pool, 0).await);
    assert_counts_kept(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn retention_deletes_expired_rows_outside_day_partitions_in_batches(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let ids = enqueue_n(&pool, "t", 30).await;
    let claimed = claim(&pool, runner, 25).await;
    let done: Vec<_> = claimed.iter().take(20).map(|c| completion(c, json!({}))).collect();
    queue::complete_batch(&pool, runner, &done).await.unwrap();
    queue::cancel(&pool, None, *ids.last().unwrap()).await.unwrap();
    // Moved back a month, where no partition is: into the default partition.
    sqlx::query("update sweep.finished_tasks set finished_at = now() - interval '30 days'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(in_default(&pool).await, 21);

    let mut rounds = Vec::new();
    loop {
        let n = queue::retain_finished(&pool, DAY, 10).await.unwrap().deleted;
        rounds.push(n);
        if n < 10 {
            break;
        }
    }
    assert_eq!(rounds, vec![10, 10, 1]);
    let left: Vec<String> = sqlx::query_scalar("select distinct state from sweep.tasks order by 1")
        .fetch_all(&pool)
        .await
        .unwrap();
    let left: Vec<TaskState> = left.iter().map(|s| s.parse().unwrap()).collect();
    assert_eq!(left, vec![TaskState::Pending, TaskState::Running], "live tasks are never deleted");
    let history: i64 = sqlx::query_scalar("select count(*) from sweep.finished_tasks")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(history, 0, "every finished task was old enough to go");
    assert_counts_kept(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn runners_maintaining_at_once_neither_fail_nor_duplicate_partitions(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    // Rows in the default partition for three past days, plus old partitions to drop.
    sqlx::query(
        "select sweep.sweep_finished_add_partitions(now() - interval '12 days',
                                                            now() - interval '9 days')",
    )
    .execute(&pool)
    .await
    .unwrap();
    for i in 0..90 {
        insert_finished(&pool, 500_000 + i, 1.0 + f64::from(i as i32 % 3) + 0.01).await;
    }
    insert_finished(&pool, 600_000, 11.0).await;
    let workers: Vec<_> = (0..6)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut total = queue::Retention::default();
                for _ in 0..5 {
                    let r = queue::retain_finished(&pool, 7 * DAY, 20).await.expect("retention");
                    queue::fold_kept_counts(&pool).await.expect("fold");
                    total.created += r.created;
                    total.dropped += r.dropped;
                    total.deleted += r.deleted;
                }
                total
            })
        })
        .collect();
    // Completions and lookups go on meanwhile.
    let traffic = {
        let pool = pool.clone();
        tokio::spawn(async move {
            for _ in 0..10 {
                let ids = complete_new(&pool, 5).await;
                for id in ids {
                    assert_eq!(state(&pool, id).await, TaskState::Succeeded);
                }
            }
        })
    };
    let mut dropped = 0;
    for w in workers {
        dropped += w.await.unwrap().dropped;
    }
    traffic.await.unwrap();
    assert_eq!(dropped, 4, "days 12 to 9 ago, each dropped once");
    assert_eq!(in_default(&pool).await, 0, "every row was moved to its day's partition");
    let parts = partitions(&pool).await;
    let ranges: Vec<_> =
        parts.iter().filter(|p| !p.1).map(|p| (p.2.unwrap(), p.3.unwrap())).collect();
    for pair in ranges.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "no overlap: {parts:?}");
    }
    for ago in [0, -1, -2, -3] {
        let name = day_partition(&pool, ago).await;
        assert!(parts.iter().any(|p| p.0 == name), "{name} missing: {parts:?}");
    }
    let (history,): (i64,) = sqlx::query_as(
        "select count(*) from sweep.finished_tasks where id between 500000 and 600000",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(history, 90, "the expired row went with its partition, the others stayed");
    assert_counts_kept(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn kept_counts_follow_every_end_and_every_removal(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let done = complete_new(&pool, 3).await;
    let cancelled = enqueue_n(&pool, "t", 1).await[0];
    queue::cancel(&pool, None, cancelled).await.unwrap();
    queue::enqueue(&pool, task("t", 9).tenant("acme").max_attempts(1)).await.unwrap();
    let runner = new_runner();
    let failing = claim(&pool, runner, 1).await.remove(0);
    let failure = queue::Failure {
        id: failing.id,
        attempt: 1,
        kind: FailureKind::Trap,
        message: "x".into(),
        permanent: true,
        retry_delay: Duration::ZERO,
        detail: json!({}),
        module_sha256: None,
        usage: None,
    };
    queue::fail_batch(&pool, runner, &[failure]).await.unwrap();
    assert_eq!(state(&pool, failing.id).await, TaskState::Dead);
    assert_counts_kept(&pool).await;
    let counts = |stats: &[queue::TypeStats]| -> Vec<(String, i64, i64, i64)> {
        stats.iter().map(|s| (s.tenant.clone(), s.succeeded, s.cancelled, s.dead)).collect()
    };
    let stats = queue::queue_stats(&pool, None).await.unwrap();
    assert_eq!(counts(&stats), [("acme".into(), 0, 0, 1), ("default".into(), 3, 1, 0)]);

    // Deleted for good, requeued: out of the counts in the same statement.
    let deleted = queue::delete_tasks(&pool, None, &[done[0], cancelled]).await.unwrap();
    assert_eq!(deleted.len(), 2);
    queue::requeue(&pool, None, failing.id).await.unwrap();
    assert_counts_kept(&pool).await;
    let (zeros,): (i64,) = sqlx::query_as(
        "select count(*) from sweep.history_counts where (succeeded, cancelled, dead) = (0, 0, 0)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(zeros, 0, "a total that came to zero went with the fold");
    let stats = queue::queue_stats(&pool, None).await.unwrap();
    assert_eq!(counts(&stats), [("acme".into(), 0, 0, 0), ("default".into(), 2, 0, 0)]);
    assert_eq!(stats[0].pending, 1, "the requeued task");

    // A hand-made fix that moves rows to another day moves their counts with them.
    sqlx::query("update sweep.finished_tasks set finished_at = finished_at - interval '2 days'")
        .execute(&pool)
        .await
        .unwrap();
    assert_counts_kept(&pool).await;

    // A database whose history was not counted yet (as before the counts existed): the next
    // install counts what is there and keeps counting.
    for table in ["finished_tasks", "dead_tasks"] {
        for event in ["insert", "delete", "update", "truncate"] {
            sqlx::query(&format!("drop trigger history_counts_{event} on sweep.{table}"))
                .execute(&pool)
                .await
                .unwrap();
        }
    }
    sqlx::query("delete from sweep.history_counts").execute(&pool).await.unwrap();
    insert_finished(&pool, 900_001, 0.0).await;
    insert_finished(&pool, 900_002, 1.0).await;
    queue::migrate_with(db.options.clone()).await.unwrap();
    assert_counts_kept(&pool).await;
    complete_new(&pool, 2).await;
    assert_counts_kept(&pool).await;
    let stats = queue::queue_stats(&pool, None).await.unwrap();
    let succeeded: i64 = stats.iter().map(|s| s.succeeded).sum();
    assert_eq!(succeeded, 6, "2 left, 2 inserted by hand, 2 more completed");

    sqlx::query("truncate sweep.finished_tasks").execute(&pool).await.unwrap();
    assert_counts_kept(&pool).await;
}

/// Every (node type, relation) in an EXPLAIN (FORMAT JSON) plan.
fn scans(plan: &Value, out: &mut Vec<(String, String)>) {
    if let Some(rel) = plan.get("Relation Name").and_then(Value::as_str) {
        let node = plan["Node Type"].as_str().unwrap_or_default().to_owned();
        out.push((node, rel.to_owned()));
    }
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        scans(child, out);
    }
}

#[sqlx::test(migrations = false)]
async fn a_lookup_by_id_is_an_index_probe_in_every_partition(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    fixtures::fill_finished(&pool, "old", 50_000).await.unwrap();
    complete_new(&pool, 5).await;
    sqlx::query("analyze sweep.finished_tasks").execute(&pool).await.unwrap();
    let sizes: HashMap<String, i64> = sqlx::query_as(
        "select tableoid::regclass::text, count(*) from sweep.finished_tasks group by 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(name, n): (String, i64)| (name.trim_start_matches("sweep.").to_owned(), n))
    .collect();
    assert!(sizes.values().filter(|&&n| n >= 1000).count() >= 4, "{sizes:?}");
    let id: TaskId = sqlx::query_scalar("select min(id) + 20000 from sweep.finished_tasks")
        .fetch_one(&pool)
        .await
        .unwrap();

    // The finished branch of queue::get_task, planned as a generic plan (as a cached
    // prepared statement ends up) and as a custom one, for the operator and for a tenant.
    for (m, mode) in ["force_generic_plan", "force_custom_plan"].iter().enumerate() {
        for (t, tenant) in ["null", "'default'"].iter().enumerate() {
            let lookup = format!("lookup_{m}_{t}");
            let mut tx = pool.begin().await.unwrap();
            sqlx::raw_sql(&format!(
                "set local plan_cache_mode = {mode};
                 prepare {lookup}(int8, text) as
                     select id, state, result from sweep.finished_tasks
                     where id = $1 and ($2::text is null or tenant = $2);"
            ))
            .execute(&mut *tx)
            .await
            .unwrap();
            let (plan,): (Value,) =
                sqlx::query_as(&format!("explain (format json) execute {lookup}({id}, {tenant})"))
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
            let mut found = Vec::new();
            scans(&plan[0]["Plan"], &mut found);
            for (name, rows) in &sizes {
                let nodes: Vec<_> = found.iter().filter(|(_, rel)| rel == name).collect();
                assert!(!nodes.is_empty(), "{mode} {tenant}: {name} not probed: {found:?}");
                // A partition of a few pages may be read whole; one of any size is probed.
                if *rows >= 1000 {
                    for (node, _) in nodes {
                        assert!(
                            node == "Index Scan" || node == "Index Only Scan",
                            "{mode} {tenant}: {node} on {name} ({rows} rows)"
                        );
                    }
                }
            }
            assert_eq!(
                sqlx::query_as::<_, (TaskId,)>(&format!("execute {lookup}({id}, {tenant})"))
                    .fetch_all(&mut *tx)
                    .await
                    .unwrap(),
                vec![(id,)]
            );
            tx.rollback().await.unwrap();
        }
    }
    assert_eq!(show(&pool, id).await.state, TaskState::Succeeded);
}
