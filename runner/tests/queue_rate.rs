//! Rate limits in the claim: a task type's bucket holds across concurrent claimers (counted
//! from the started_at of the claimed tasks, never from a timer), combines with fair share
//! and running limits, and bad limits are refused naming the field with nothing written.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{self, FlowError, ModuleSettings, NewTask, RateLimit, TenantCaps};

async fn module_for(pool: &PgPool, tenant: &str, task_type: &str, settings: ModuleSettings) {
    let bytes = format!("module {tenant}/{task_type}").into_bytes();
    let sha = sweep::sandbox::sha256_hex(&bytes);
    queue::register_module(pool, tenant, task_type, &sha, &bytes, &settings)
        .await
        .expect("register");
}

async fn backlog(pool: &PgPool, tenant: &str, task_type: &str, n: usize) {
    let tasks: Vec<NewTask> =
        (0..n).map(|i| NewTask::new(task_type, json!({ "i": i })).tenant(tenant)).collect();
    queue::enqueue_many(pool, &tasks).await.expect("enqueue");
}

async fn limit(pool: &PgPool, tenant: &str, task_type: &str, rate_per_sec: f64, burst: i32) {
    let l = RateLimit { rate_per_sec, burst };
    let c = queue::set_rate_limit(pool, tenant, task_type, Some(l)).await.expect("rate limit");
    assert_eq!((c.rate_per_sec, c.burst), (Some(rate_per_sec), Some(burst)));
}

/// When each started task of `task_type` started, in seconds after the first (small numbers,
/// so a float holds the microseconds exactly enough), in order.
async fn starts(pool: &PgPool, task_type: &str) -> Vec<f64> {
    sqlx::query_scalar(
        "select extract(epoch from started_at - min(started_at) over ())::float8
         from sweep.tasks
         where task_type = $1 and started_at is not null order by started_at",
    )
    .bind(task_type)
    .fetch_all(pool)
    .await
    .expect("started_at")
}

/// The largest excess, over all windows [t_i, t_j] of the start times, of the starts inside
/// the window over what the bucket allows in it (burst + rate * length). At most 0 when the
/// limit held.
fn worst_excess(starts: &[f64], rate: f64, burst: i32) -> f64 {
    let mut worst = f64::MIN;
    for i in 0..starts.len() {
        for j in i..starts.len() {
            let allowed = f64::from(burst) + rate * (starts[j] - starts[i]);
            worst = worst.max((j - i + 1) as f64 - allowed);
        }
    }
    worst
}

#[sqlx::test(migrations = false)]
async fn the_ceiling_holds_across_three_concurrent_claimers(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let (rate, burst) = (40.0, 5);
    module_for(&pool, "default", "limited", ModuleSettings::default()).await;
    backlog(&pool, "default", "limited", 2000).await;
    limit(&pool, "default", "limited", rate, burst).await;

    // Three claimers, each on its own connection, claiming as fast as they can for a while.
    // The duration only bounds the run; the verdict is counted from started_at below.
    let run_for = Duration::from_millis(2500);
    let began = Instant::now();
    let claimers: Vec<_> = (0..3)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let runner = new_runner();
                let (mut claims, mut claimed) = (0u64, 0usize);
                while began.elapsed() < run_for {
                    claimed +=
                        queue::claim_batch(&pool, runner, 4, &[], LEASE).await.unwrap().len();
                    claims += 1;
                }
                (claims, claimed)
            })
        })
        .collect();
    let mut per_claimer = Vec::new();
    for c in claimers {
        per_claimer.push(c.await.unwrap());
    }
    let elapsed = began.elapsed().as_secs_f64();
    let starts = starts(&pool, "limited").await;
    let claimed: usize = per_claimer.iter().map(|(_, n)| n).sum();
    assert_eq!(starts.len(), claimed);
    assert!(per_claimer.iter().all(|&(claims, _)| claims > 1), "{per_claimer:?}");

    let excess = worst_excess(&starts, rate, burst);
    let span = starts.last().unwrap() - starts.first().unwrap();
    let allowed = f64::from(burst) + rate * span;
    eprintln!(
        "rate limit {rate}/s burst {burst}, 3 claimers for {elapsed:.2}s: {} starts over \
         {span:.3}s, allowed {allowed:.1} ({:.1}% of the ceiling); worst window excess \
         {excess:.3}; claims per claimer {:?}",
        starts.len(),
        100.0 * starts.len() as f64 / allowed,
        per_claimer.iter().map(|(c, _)| c).collect::<Vec<_>>(),
    );
    assert!(excess <= 1e-6, "a window held more starts than the bucket allows: {excess:e}");
    // The bucket refilled and was taken from again (not only the first burst).
    assert!(starts.len() > burst as usize, "{}", starts.len());
    // Claims that found no token left the tasks alone.
    let waiting: i64 =
        sqlx::query_scalar("select count(*) from sweep.tasks where state = 'pending'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(waiting as usize + starts.len(), 2000);
}

#[sqlx::test(migrations = false)]
async fn a_rate_limit_combines_with_fair_share_and_running_limits(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let hash = format!("{:064x}", 4242);
    queue::create_tenant(&pool, "a", &hash, &TenantCaps::default()).await.unwrap();
    module_for(&pool, "a", "rated", ModuleSettings::default()).await;
    module_for(&pool, "b", "work", ModuleSettings::default()).await;
    let two = ModuleSettings { max_running: Some(2), ..Default::default() };
    module_for(&pool, "b", "both", two).await;
    backlog(&pool, "a", "rated", 20).await;
    backlog(&pool, "b", "work", 20).await;
    // One start every 100 s: within this test, the burst is all there is.
    limit(&pool, "a", "rated", 0.01, 3).await;

    let runner = new_runner();
    let got = claim(&pool, runner, 10).await;
    let rated = got.iter().filter(|c| c.task_type == "rated").count();
    assert_eq!((rated, got.len()), (3, 10), "the burst, and tenant b takes the rest");
    let got = claim(&pool, runner, 10).await;
    assert!(got.iter().all(|c| c.task_type == "work"), "no token left for a");
    assert_eq!(got.len(), 10);

    // A running limit of 2 and a burst of 5: each claim takes the smaller of the two.
    backlog(&pool, "b", "both", 20).await;
    limit(&pool, "b", "both", 0.01, 5).await;
    let only = ["both".to_owned()];
    let mut taken = Vec::new();
    for want_now in [2, 2, 1, 0] {
        let got = queue::claim_batch(&pool, runner, 10, &only, LEASE).await.unwrap();
        assert_eq!(got.len(), want_now, "after {taken:?}");
        taken.push(got.len());
        let done: Vec<_> = got.iter().map(|c| completion(c, json!({}))).collect();
        assert!(queue::complete_batch(&pool, runner, &done).await.unwrap().is_empty());
    }
    let tokens: f64 = sqlx::query_scalar(
        "select tokens from sweep.queues where tenant = 'b' and task_type = 'both'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!((0.0..0.01).contains(&tokens), "{tokens}");

    // Cleared: the rest goes at once.
    let c = queue::set_rate_limit(&pool, "a", "rated", None).await.unwrap();
    assert_eq!((c.rate_per_sec, c.burst), (None, None));
    let got = queue::claim_batch(&pool, runner, 30, &["rated".to_owned()], LEASE).await.unwrap();
    assert_eq!(got.len(), 17);
}

#[sqlx::test(migrations = false)]
async fn bad_rate_limits_name_the_field_and_write_nothing(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    module_for(&pool, "default", "work", ModuleSettings::default()).await;
    let cases = [
        (0.0, 5, "rate_per_sec"),
        (-1.0, 5, "rate_per_sec"),
        (f64::NAN, 5, "rate_per_sec"),
        (f64::INFINITY, 5, "rate_per_sec"),
        (2_000_000.0, 5, "rate_per_sec"),
        (5.0, 0, "burst"),
        (5.0, -3, "burst"),
    ];
    for (rate_per_sec, burst, field) in cases {
        let l = RateLimit { rate_per_sec, burst };
        match queue::set_rate_limit(&pool, "default", "work", Some(l)).await {
            Err(e @ FlowError::BadRateLimit { .. }) => {
                assert!(e.to_string().starts_with(field), "{e}")
            }
            other => panic!("{rate_per_sec}/{burst}: expected BadRateLimit, got {other:?}"),
        }
    }
    let ok = RateLimit { rate_per_sec: 5.0, burst: 5 };
    assert!(matches!(
        queue::set_rate_limit(&pool, "default", "nothing", Some(ok)).await,
        Err(FlowError::NoModule { .. })
    ));
    let limited: i64 =
        sqlx::query_scalar("select count(*) from sweep.queues where rate_per_sec is not null")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(limited, 0);
    assert!(queue::list_queue_controls(&pool, None).await.unwrap().is_empty());
}
