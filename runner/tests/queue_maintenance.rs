//! Maintenance: the reaper rescues tasks of runners that stopped heartbeating, and stats count
//! what is where. Retention of finished tasks is tested in queue_history.rs.

mod common;

use std::{collections::HashSet, time::Duration};

use common::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::{self, ModuleSettings, RetryPolicy, TaskState};

const INSTANT_RETRY: RetryPolicy =
    RetryPolicy { base: Duration::ZERO, cap: Duration::ZERO, jitter: 0.0 };

#[sqlx::test(migrations = false)]
async fn reaper_rescues_the_tasks_of_a_runner_that_stopped_heartbeating(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let (dead_runner, live_runner, reaper) = (new_runner(), new_runner(), new_runner());
    let last_try = queue::enqueue(&pool, task("t", 0).max_attempts(1)).await.unwrap().id;
    enqueue_n(&pool, "t", 3).await;
    // Both claim with leases that expire at once; only the live runner heartbeats.
    let orphans = queue::claim_batch(&pool, dead_runner, 2, &[], Duration::ZERO).await.unwrap();
    let kept = queue::claim_batch(&pool, live_runner, 2, &[], Duration::ZERO).await.unwrap();
    let held: Vec<_> = kept.iter().map(|c| (c.id, c.attempt)).collect();
    queue::heartbeat_leases(&pool, live_runner, Duration::from_secs(600), &held).await.unwrap();

    let policy = RetryPolicy { jitter: 0.0, ..RetryPolicy::default() };
    let report = queue::reap_expired(&pool, reaper, 100, policy, Duration::ZERO).await.unwrap();
    let rescued: HashSet<_> = report.retrying.iter().chain(&report.dead).copied().collect();
    assert_eq!(rescued, orphans.iter().map(|c| c.id).collect());
    assert!(report.lost.is_empty());
    for c in &kept {
        assert_eq!(state(&pool, c.id).await, TaskState::Running, "live runner keeps its tasks");
    }
    for c in &orphans {
        let t = show(&pool, c.id).await;
        let entry = &t.errors[0];
        assert_eq!(entry["kind"], FailureKind::LeaseExpired.as_str());
        assert_eq!(entry["runner"], dead_runner.to_string());
        if c.id == last_try {
            assert_eq!(t.state, TaskState::Dead, "no attempts left");
        } else {
            assert_eq!(t.state, TaskState::Retrying);
            // No module sets a backoff: the default applies, 60 s * 2^1.
            let wait = t.run_at.unwrap() - chrono::Utc::now();
            assert!(wait > chrono::Duration::seconds(100), "{wait}");
        }
    }
    assert!(queue::reap_expired(&pool, reaper, 100, policy, Duration::ZERO)
        .await
        .unwrap()
        .retrying
        .is_empty());
}

#[sqlx::test(migrations = false)]
async fn a_rescued_task_backs_off_with_its_task_types_policy(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let quick = ModuleSettings {
        backoff_base_ms: Some(100),
        backoff_cap_ms: Some(300),
        ..ModuleSettings::default()
    };
    register(&pool, "quick", "noop", quick).await;
    let id = queue::enqueue(&pool, task("quick", 0)).await.unwrap().id;
    // Two attempts lost to dead runners: the second rescue's backoff (100 ms * 2^2) is capped at 300.
    for attempt in 1..=2 {
        let lost = queue::claim_batch(&pool, new_runner(), 1, &[], Duration::ZERO).await.unwrap();
        assert_eq!(lost.iter().map(|c| (c.id, c.attempt)).collect::<Vec<_>>(), [(id, attempt)]);
        let slow_default = RetryPolicy { jitter: 0.0, ..RetryPolicy::default() };
        let report = queue::reap_expired(&pool, new_runner(), 10, slow_default, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(report.retrying, [id]);
        // Measured in the database's clock, right after the rescue.
        let (wait_ms,): (f64,) = sqlx::query_as(
            "select (extract(epoch from run_at - now()) * 1000)::float8 from sweep.tasks where id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        let expected = [200.0, 300.0][attempt as usize - 1];
        assert!(wait_ms <= expected && wait_ms > expected - 100.0, "attempt {attempt}: {wait_ms}");
        // Due again at once for the next round.
        sqlx::query("update sweep.tasks set run_at = now() where id = $1")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
    }
}

#[sqlx::test(migrations = false)]
async fn concurrent_reapers_rescue_each_task_once(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    enqueue_n(&pool, "t", 200).await;
    let gone = new_runner();
    queue::claim_batch(&pool, gone, 200, &[], Duration::ZERO).await.unwrap();
    let reapers = (0..4).map(|_| {
        let pool = pool.clone();
        tokio::spawn(async move {
            let me = new_runner();
            let mut got = Vec::new();
            loop {
                let r =
                    queue::reap_expired(&pool, me, 7, INSTANT_RETRY, Duration::ZERO).await.unwrap();
                assert!(r.lost.is_empty());
                if r.retrying.is_empty() {
                    return got;
                }
                got.extend(r.retrying);
            }
        })
    });
    let mut all = Vec::new();
    for r in reapers {
        all.extend(r.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!((all.len(), unique.len()), (200, 200));
    let attempts: Vec<i32> =
        sqlx::query_scalar("select distinct jsonb_array_length(errors) from sweep.tasks")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(attempts, vec![1], "exactly one history entry per task");
}

#[sqlx::test(migrations = false)]
async fn stats_count_by_tenant_type_and_state(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    enqueue_n(&pool, "a", 3).await;
    queue::enqueue(&pool, task("b", 1).tenant("acme").max_attempts(1)).await.unwrap();
    queue::enqueue(&pool, task("a", 9).delay(Duration::from_secs(3600))).await.unwrap();
    let claimed = queue::claim_batch(&pool, runner, 10, &[], LEASE).await.unwrap();
    assert_eq!(claimed.len(), 4);
    let (done, failed): (Vec<_>, Vec<_>) =
        claimed.iter().partition(|c| c.task_type == "a" && c.payload_value().unwrap()["n"] != 2);
    let done: Vec<_> = done.iter().map(|c| completion(c, json!({}))).collect();
    queue::complete_batch(&pool, runner, &done).await.unwrap();
    let failures: Vec<_> = failed
        .iter()
        .map(|c| queue::Failure {
            id: c.id,
            attempt: 1,
            kind: FailureKind::Trap,
            message: "x".into(),
            permanent: false,
            retry_delay: Duration::from_secs(60),
            detail: json!({}),
            module_sha256: None,
            usage: None,
        })
        .collect();
    queue::fail_batch(&pool, runner, &failures).await.unwrap();
    // The rates come from the runners' per-minute counters: what a runner that ran these
    // attempts flushes, and an hour-old minute that has left both windows.
    let minute =
        chrono::DurationRound::duration_trunc(chrono::Utc::now(), chrono::TimeDelta::minutes(1))
            .unwrap();
    let delta = |tenant: &str, task_type: &str, ago: i64, succeeded, failed| queue::MinuteDelta {
        tenant: tenant.into(),
        task_type: task_type.into(),
        minute: minute - chrono::TimeDelta::minutes(ago),
        succeeded,
        failed,
        failures: [("trap".to_owned(), failed)].into(),
        started: succeeded + failed,
        lag_ms: vec![0; queue::MINUTE_LAG_BUCKETS],
    };
    let deltas = [
        delta("acme", "b", 0, 0, 1),
        delta("default", "a", 62, 5, 5),
        delta("default", "a", 0, 2, 1),
    ];
    queue::add_minutes(&pool, &deltas).await.unwrap();

    let stats = queue::queue_stats(&pool, None).await.unwrap();
    assert_eq!(stats.len(), 2);
    let a = &stats.iter().find(|s| s.task_type == "a").unwrap();
    assert_eq!(
        (a.tenant.as_str(), a.pending, a.succeeded, a.retrying, a.dead),
        ("default", 1, 2, 1, 0)
    );
    assert_eq!((a.failures_last_hour, a.completed_last_minute), (1, 2));
    assert_eq!(a.oldest_due_ms, 0, "nothing due: the pending one is delayed, the retry waits");
    let b = stats.iter().find(|s| s.task_type == "b").unwrap();
    assert_eq!((b.tenant.as_str(), b.dead, b.failures_last_hour), ("acme", 1, 1));

    let acme_only = queue::queue_stats(&pool, Some("acme")).await.unwrap();
    assert_eq!(acme_only.len(), 1);
    assert_eq!(acme_only[0].task_type, "b");
}

#[sqlx::test(migrations = false)]
async fn nothing_is_rescued_until_the_server_has_been_up_long_enough(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    enqueue_n(&pool, "t", 1).await;
    let orphan = queue::claim_batch(&pool, new_runner(), 1, &[], Duration::ZERO).await.unwrap();
    // Longer than this server has been up: as if it had just restarted, when every lease looks
    // expired although its runner may be about to renew it.
    let uptime: f64 =
        sqlx::query_scalar("select extract(epoch from now() - pg_postmaster_start_time())::float8")
            .fetch_one(&pool)
            .await
            .unwrap();
    let settle = Duration::from_secs_f64(uptime + 3600.0);
    let early = queue::reap_expired(&pool, new_runner(), 10, INSTANT_RETRY, settle).await.unwrap();
    assert!(early.retrying.is_empty() && early.dead.is_empty(), "{early:?}");
    assert_eq!(state(&pool, orphan[0].id).await, TaskState::Running);
    let later =
        queue::reap_expired(&pool, new_runner(), 10, INSTANT_RETRY, Duration::ZERO).await.unwrap();
    assert_eq!(later.retrying, vec![orphan[0].id]);
}

/// `failures_last_hour` comes from kept totals (runner/sql/hour_failures.sql) folded every few
/// seconds: whatever runners flush, whenever maintenance folds (or several fold at once while
/// others flush), however far time moves between folds and whatever is deleted, it reads what
/// summing the hour of per-minute counters reads.
#[sqlx::test(migrations = false)]
async fn failures_last_hour_match_the_minutes_through_folds_time_and_deletes(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    use rand::{rngs::StdRng, Rng, SeedableRng};

    let db = migrated(db).await;
    let pool = db.pool();
    // Moving time on means moving the data back; a superuser may do it without the triggers.
    let owner = sqlx::PgPool::connect_with(db.options.clone()).await.unwrap();
    let mut rng = StdRng::seed_from_u64(32);
    for round in 0..120 {
        let flush = random_flush(&mut rng);
        queue::add_minutes(&pool, &flush).await.unwrap();
        if rng.random_bool(0.4) {
            queue::fold_kept_counts(&pool).await.unwrap();
        }
        if rng.random_bool(0.2) {
            time_passes(&owner, rng.random_range(1..=20)).await;
        }
        if rng.random_bool(0.1) {
            sqlx::query(
                "delete from sweep.task_minutes
                 where ctid in (select ctid from sweep.task_minutes order by random() limit 2)",
            )
            .execute(&owner)
            .await
            .unwrap();
        }
        assert_failures_match_the_minutes(&pool, &format!("round {round}")).await;
    }

    // Flushes and folds from four runners at once.
    let runners: Vec<_> = (0..4u64)
        .map(|seed| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed);
                for _ in 0..30 {
                    let flush = random_flush(&mut rng);
                    queue::add_minutes(&pool, &flush).await.unwrap();
                    queue::fold_kept_counts(&pool).await.unwrap();
                }
            })
        })
        .collect();
    for runner in runners {
        runner.await.unwrap();
    }
    assert_failures_match_the_minutes(&pool, "after concurrent folds").await;
    queue::fold_kept_counts(&pool).await.unwrap();
    assert_failures_match_the_minutes(&pool, "after the last fold").await;
    let pending: i64 = sqlx::query_scalar("select count(*) from sweep.hour_failure_deltas")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(pending, 0, "a fold with nobody else folding takes every delta");

    // The first `sweep migrate` of a release with kept totals counts the minutes there are.
    for statement in [
        "drop trigger hour_failures_insert on sweep.task_minutes",
        "drop trigger hour_failures_update on sweep.task_minutes",
        "drop trigger hour_failures_delete on sweep.task_minutes",
        "drop trigger hour_failures_truncate on sweep.task_minutes",
        "delete from sweep.hour_failures",
    ] {
        sqlx::query(statement).execute(&owner).await.unwrap();
    }
    queue::add_minutes(&pool, &random_flush(&mut rng)).await.unwrap();
    let attached: bool = sqlx::query_scalar("select sweep.sweep_hour_failures_attach()")
        .fetch_one(&owner)
        .await
        .unwrap();
    assert!(attached);
    assert_failures_match_the_minutes(&pool, "after the first attach").await;
    queue::fold_kept_counts(&pool).await.unwrap();
    assert_failures_match_the_minutes(&pool, "after the first attach and a fold").await;
    queue::add_minutes(&pool, &random_flush(&mut rng)).await.unwrap();
    assert_failures_match_the_minutes(&pool, "after the first attach and a flush").await;

    // A truncate empties the totals with the minutes.
    sqlx::query("truncate sweep.task_minutes").execute(&owner).await.unwrap();
    assert_failures_match_the_minutes(&pool, "after a truncate").await;
    queue::add_minutes(&pool, &random_flush(&mut rng)).await.unwrap();
    queue::fold_kept_counts(&pool).await.unwrap();
    assert_failures_match_the_minutes(&pool, "after a truncate, a flush and a fold").await;
}

/// What one runner flushes: a few keys, each once, in minutes from 75 ago to now.
fn random_flush(rng: &mut impl rand::Rng) -> Vec<queue::MinuteDelta> {
    let now =
        chrono::DurationRound::duration_trunc(chrono::Utc::now(), chrono::TimeDelta::minutes(1))
            .unwrap();
    let mut keys = std::collections::BTreeMap::new();
    for _ in 0..5 {
        let key = (
            format!("t{}", rng.random_range(0..3)),
            format!("type{}", rng.random_range(0..3)),
            now - chrono::TimeDelta::minutes(rng.random_range(0..=75)),
        );
        *keys.entry(key).or_insert(0) += rng.random_range(0..5);
    }
    keys.into_iter()
        .map(|((tenant, task_type, minute), failed)| queue::MinuteDelta {
            tenant,
            task_type,
            minute,
            succeeded: 1,
            failed,
            failures: [("trap".to_owned(), failed)].into(),
            started: 1 + failed,
            lag_ms: vec![0; queue::MINUTE_LAG_BUCKETS],
        })
        .collect()
}

/// Moves every minute the counters and the kept totals know `minutes` back, as if that much
/// time had passed, without the triggers (which would count the move as new minutes).
async fn time_passes(owner: &sqlx::PgPool, minutes: i32) {
    let mut tx = owner.begin().await.unwrap();
    for statement in [
        "set local session_replication_role = replica",
        "create temp table moving on commit drop as select * from sweep.task_minutes",
        "delete from sweep.task_minutes",
        "insert into sweep.task_minutes
         select tenant, task_type, minute - $1 * interval '1 minute', succeeded, failed,
                failures, started, lag_ms
         from moving",
        "update sweep.hour_failures set since = since - $1 * interval '1 minute'",
        "update sweep.hour_failure_deltas set minute = minute - $1 * interval '1 minute'",
    ] {
        let query = sqlx::query(statement);
        let query = if statement.contains("$1") { query.bind(minutes) } else { query };
        query.execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// Stats (for everyone and for one tenant) against the hour of per-minute counters summed
/// directly, at the same `now()`. Sums that land on a half may round either way.
async fn assert_failures_match_the_minutes(pool: &sqlx::PgPool, context: &str) {
    let mut tx = pool.begin().await.unwrap();
    let summed: Vec<(String, String, f64)> = sqlx::query_as(
        "select tenant, task_type,
                sum(failed * least(1, date_part('epoch', minute + interval '61 minutes' - now())
                                      / 60))
         from sweep.task_minutes where minute > now() - interval '61 minutes'
         group by 1, 2",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    for tenant in [None, Some("t1")] {
        let stats = queue::queue_stats(&mut *tx, tenant).await.unwrap();
        let read = |t: &str, ty: &str| {
            stats
                .iter()
                .find(|s| s.tenant == t && s.task_type == ty)
                .map_or(0, |s| s.failures_last_hour)
        };
        for (t, ty, expected) in summed.iter().filter(|s| tenant.is_none_or(|x| x == s.0)) {
            let got = read(t, ty) as f64;
            let on_a_half = ((expected.fract() - 0.5).abs()) < 1e-6;
            assert!(
                got == expected.round() || on_a_half && (got - expected).abs() <= 0.5 + 1e-6,
                "{context}, {t}/{ty} ({tenant:?}): stats read {got}, the minutes sum to {expected}"
            );
        }
        for s in &stats {
            let counted = summed.iter().any(|(t, ty, _)| (t, ty) == (&s.tenant, &s.task_type));
            assert!(
                counted || s.failures_last_hour == 0,
                "{context}: stats read {} failures for {}/{} that no minute holds",
                s.failures_last_hour,
                s.tenant,
                s.task_type
            );
        }
    }
    tx.rollback().await.unwrap();
}
