//! Fair share: how the claim divides slots among tenants (by weight) and task types, counted in
//! running tasks across all runners; per-type running limits; the spare-slot claim; and the
//! queue hints that let a claim find due work without reading the backlog.
//!
//! Every verdict is a count read from the database after a claim: no timing.

mod common;

use std::collections::HashMap;

use common::*;
use serde_json::json;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{self, ClaimMode, ClaimedTask, ModuleSettings, NewTask, TenantCaps};
use uuid::Uuid;

async fn backlog(pool: &PgPool, tenant: &str, task_type: &str, n: usize) {
    let tasks: Vec<NewTask> =
        (0..n).map(|i| NewTask::new(task_type, json!({ "i": i })).tenant(tenant)).collect();
    queue::enqueue_many(pool, &tasks).await.expect("enqueue");
}

async fn tenant_with_weight(pool: &PgPool, name: &str, weight: i32) {
    let hash = sweep::sandbox::sha256_hex(name.as_bytes());
    queue::create_tenant(pool, name, &hash, &TenantCaps::default()).await.expect("create tenant");
    let t = queue::set_tenant_weight(pool, name, weight).await.expect("set weight");
    assert_eq!(t.weight, weight);
}

/// Tasks running right now, per tenant (every runner).
async fn running_by_tenant(pool: &PgPool) -> HashMap<String, i64> {
    sweep_dev::fixtures::running_by_tenant(pool).await.expect("count running").into_iter().collect()
}

async fn running_by_type(pool: &PgPool) -> HashMap<String, i64> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "select task_type, count(*) from sweep.tasks where state = $1 group by task_type",
    )
    .bind(TaskState::Running.as_str())
    .fetch_all(pool)
    .await
    .expect("count running");
    rows.into_iter().collect()
}

fn count(map: &HashMap<String, i64>, key: &str) -> i64 {
    map.get(key).copied().unwrap_or(0)
}

/// The hint (`next_run_at`) of the queue of `task_type`, a test's only queue of that type.
async fn hint_of(pool: &PgPool, task_type: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    sqlx::query_scalar("select next_run_at from sweep.queues where task_type = $1")
        .bind(task_type)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn complete(pool: &PgPool, runner: Uuid, tasks: &[ClaimedTask]) {
    let done: Vec<_> = tasks.iter().map(|c| completion(c, json!({}))).collect();
    let lost = queue::complete_batch(pool, runner, &done).await.expect("complete");
    assert!(lost.is_empty());
}

#[sqlx::test(migrations = false)]
async fn two_backlogged_tenants_get_two_of_four_slots_each(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    backlog(&pool, "a", "work", 50).await;
    backlog(&pool, "b", "work", 50).await;
    let got = claim(&pool, new_runner(), 4).await;
    assert_eq!(got.len(), 4);
    let running = running_by_tenant(&pool).await;
    assert_eq!((count(&running, "a"), count(&running, "b")), (2, 2));
}

#[sqlx::test(migrations = false)]
async fn a_tenant_alone_takes_every_slot(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    backlog(&pool, "a", "work", 50).await;
    // Another tenant with nothing due yet takes nothing away.
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    queue::enqueue(&pool, NewTask::new("work", json!({})).tenant("b").run_at(tomorrow))
        .await
        .expect("enqueue");
    assert_eq!(claim(&pool, new_runner(), 8).await.len(), 8);
    assert_eq!(count(&running_by_tenant(&pool).await, "a"), 8);
}

#[sqlx::test(migrations = false)]
async fn weight_two_gets_twice_the_slots(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    tenant_with_weight(&pool, "light", 1).await;
    tenant_with_weight(&pool, "heavy", 2).await;
    backlog(&pool, "light", "work", 50).await;
    backlog(&pool, "heavy", "work", 50).await;
    // In one claim, and slot by slot across claims of two runners: both end at 2 : 4.
    assert_eq!(claim(&pool, new_runner(), 6).await.len(), 6);
    let running = running_by_tenant(&pool).await;
    assert_eq!((count(&running, "light"), count(&running, "heavy")), (2, 4));

    for _ in 0..6 {
        assert_eq!(claim(&pool, new_runner(), 1).await.len(), 1);
    }
    let running = running_by_tenant(&pool).await;
    assert_eq!((count(&running, "light"), count(&running, "heavy")), (4, 8));
}

#[sqlx::test(migrations = false)]
async fn a_low_weight_tenant_is_never_starved(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    tenant_with_weight(&pool, "small", 1).await;
    tenant_with_weight(&pool, "huge", 10_000).await;
    backlog(&pool, "small", "work", 20).await;
    backlog(&pool, "huge", "work", 200).await;
    // A tenant holding nothing comes first, whatever the weights.
    assert_eq!(claim(&pool, new_runner(), 4).await.len(), 4);
    assert_eq!(count(&running_by_tenant(&pool).await, "small"), 1);
    // And again each time its task is done.
    let runner = new_runner();
    for round in 0..5 {
        let small: Vec<ClaimedTask> =
            claim(&pool, runner, 1).await.into_iter().filter(|c| c.tenant == "small").collect();
        assert_eq!(small.len(), 0, "round {round}: it already holds one");
        let mine: Vec<(i64, i32)> = sqlx::query_as(
            "select id, attempts from sweep.tasks where tenant = 'small' and state = $1",
        )
        .bind(TaskState::Running.as_str())
        .fetch_all(&pool)
        .await
        .unwrap();
        let owner: Uuid = sqlx::query_scalar("select lease_owner from sweep.tasks where id = $1")
            .bind(mine[0].0)
            .fetch_one(&pool)
            .await
            .unwrap();
        let done = queue::Completion {
            id: mine[0].0,
            attempt: mine[0].1,
            result: json!({}),
            module_sha256: None,
            logs: None,
            follow_ups: Vec::new(),
            usage: None,
        };
        assert!(queue::complete_batch(&pool, owner, &[done]).await.unwrap().is_empty());
        let next = claim(&pool, runner, 1).await;
        assert_eq!(next[0].tenant, "small", "round {round}: the freed slot goes back to it");
    }
}

#[sqlx::test(migrations = false)]
async fn a_slow_task_type_does_not_block_a_fast_one(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    backlog(&pool, "a", "slow", 100).await;
    backlog(&pool, "a", "fast", 10).await;
    let runner = new_runner();
    let first = claim(&pool, runner, 4).await;
    let by_type = running_by_type(&pool).await;
    assert_eq!((count(&by_type, "slow"), count(&by_type, "fast")), (2, 2));
    // The fast ones finish, the slow ones keep their slots: freed slots go to the fast type.
    let fast: Vec<ClaimedTask> = first.into_iter().filter(|c| c.task_type == "fast").collect();
    complete(&pool, runner, &fast).await;
    let next = claim(&pool, runner, 2).await;
    assert!(next.iter().all(|c| c.task_type == "fast"), "{next:?}");
    let by_type = running_by_type(&pool).await;
    assert_eq!((count(&by_type, "slow"), count(&by_type, "fast")), (2, 2));
}

#[sqlx::test(migrations = false)]
async fn share_counts_slots_held_not_claims(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    // `long` never finishes during the test, `short` finishes at once: a runner that claims
    // one slot at a time must not let `long` pile up slots by being slow.
    backlog(&pool, "long", "work", 100).await;
    backlog(&pool, "short", "work", 100).await;
    let runner = new_runner();
    for _ in 0..20 {
        let got = claim(&pool, runner, 1).await;
        let short: Vec<ClaimedTask> = got.into_iter().filter(|c| c.tenant == "short").collect();
        complete(&pool, runner, &short).await;
    }
    let running = running_by_tenant(&pool).await;
    assert_eq!(count(&running, "long"), 1, "{running:?}");
}

#[sqlx::test(migrations = false)]
async fn priority_and_run_at_still_order_a_task_type(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let past = |mins| chrono::Utc::now() - chrono::Duration::minutes(mins);
    let tasks = vec![
        task("t", 0).priority(0).run_at(past(1)),
        task("t", 1).priority(5).run_at(past(1)),
        task("t", 2).priority(5).run_at(past(10)),
        NewTask::new("t", json!({})).tenant("other").priority(100),
    ];
    let ids: Vec<_> =
        queue::enqueue_many(&pool, &tasks).await.unwrap().into_iter().map(|e| e.id).collect();
    // Fair share first (one each), priority within a tenant's task type.
    let got = claim(&pool, new_runner(), 2).await;
    let mut got_ids: Vec<_> = got.iter().map(|c| c.id).collect();
    got_ids.sort_unstable();
    assert_eq!(got_ids, vec![ids[2], ids[3]]);
    for expected in [ids[1], ids[0]] {
        let next = claim(&pool, new_runner(), 1).await;
        assert_eq!(next.iter().map(|c| c.id).collect::<Vec<_>>(), vec![expected]);
    }
}

#[sqlx::test(migrations = false)]
async fn per_type_running_limit_holds_across_two_runners(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let limited = ModuleSettings { max_running: Some(3), ..Default::default() };
    register(&pool, "limited", "noop", limited).await;
    backlog(&pool, "default", "limited", 20).await;
    backlog(&pool, "default", "free", 20).await;
    let (a, b) = (new_runner(), new_runner());
    let by_a = claim(&pool, a, 10).await;
    let by_b = claim(&pool, b, 10).await;
    assert_eq!(by_a.len() + by_b.len(), 20, "the unlimited type fills the rest");
    let by_type = running_by_type(&pool).await;
    assert_eq!(count(&by_type, "limited"), 3);
    assert!(claim(&pool, b, 10).await.iter().all(|c| c.task_type != "limited"));
    // One finishes on runner a: runner b may start exactly one more.
    let one: Vec<ClaimedTask> =
        by_a.into_iter().filter(|c| c.task_type == "limited").take(1).collect();
    complete(&pool, a, &one).await;
    let more = queue::claim_batch(&pool, b, 10, &["limited".to_owned()], LEASE).await.unwrap();
    assert_eq!(more.len(), 1);
    assert_eq!(count(&running_by_type(&pool).await, "limited"), 3);
}

#[sqlx::test(migrations = false)]
async fn tenant_cap_and_fair_share_hold_together(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let caps = TenantCaps { max_running: Some(2), ..TenantCaps::default() };
    queue::create_tenant(&pool, "capped", &"c".repeat(64), &caps).await.unwrap();
    backlog(&pool, "capped", "work", 20).await;
    backlog(&pool, "open", "work", 20).await;
    assert_eq!(claim(&pool, new_runner(), 6).await.len(), 6, "the cap idles no slot");
    assert_eq!(claim(&pool, new_runner(), 6).await.len(), 6);
    let running = running_by_tenant(&pool).await;
    assert_eq!((count(&running, "capped"), count(&running, "open")), (2, 10));
}

#[sqlx::test(migrations = false)]
async fn spare_slots_let_in_idle_queues_and_tenants_below_their_share(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    backlog(&pool, "flood", "spin", 100).await;
    let runner = new_runner();
    assert_eq!(claim(&pool, runner, 4).await.len(), 4);
    let starved = |n| queue::claim(&pool, runner, n, &[], LEASE, ClaimMode::Starved);
    assert!(starved(4).await.unwrap().is_empty(), "flood already runs: no spare slot for it");

    backlog(&pool, "newcomer", "small", 5).await;
    backlog(&pool, "flood", "other", 5).await;
    let got = starved(4).await.unwrap();
    let mut queues: Vec<(String, String)> =
        got.iter().map(|c| (c.tenant.clone(), c.task_type.clone())).collect();
    queues.sort();
    assert_eq!(
        queues,
        vec![("flood".into(), "other".into()), ("newcomer".into(), "small".into())],
        "one task for each queue that had nothing running"
    );
    // flood holds 5, newcomer 1 (the window's level is 3 per unit of weight): only newcomer
    // is below its share, and it gets one more.
    let again = starved(4).await.unwrap();
    assert_eq!(again.iter().map(|c| c.tenant.as_str()).collect::<Vec<_>>(), vec!["newcomer"]);
    sqlx::query("delete from sweep.tasks where tenant = 'newcomer' and state <> $1")
        .bind(TaskState::Running.as_str())
        .execute(&pool)
        .await
        .unwrap();
    assert!(starved(4).await.unwrap().is_empty(), "nothing of newcomer left; flood is above");
}

#[sqlx::test(migrations = false)]
async fn a_drained_queue_is_found_again(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    enqueue_n(&pool, "t", 2).await;
    let first = claim(&pool, runner, 5).await;
    assert_eq!(first.len(), 2);
    let hint = hint_of(&pool, "t").await;
    assert_eq!(hint, None, "the claim that came up short cleared the hint");

    // A retry makes it due again...
    let failure = queue::Failure {
        id: first[0].id,
        attempt: first[0].attempt,
        kind: FailureKind::HandlerError,
        message: "again".into(),
        permanent: false,
        retry_delay: std::time::Duration::ZERO,
        detail: json!({}),
        module_sha256: None,
        usage: None,
    };
    let report = queue::fail_batch(&pool, runner, &[failure]).await.unwrap();
    assert_eq!(report.retrying, vec![first[0].id]);
    let again = claim(&pool, runner, 5).await;
    assert_eq!(again.iter().map(|c| c.id).collect::<Vec<_>>(), vec![first[0].id]);
    // ... and so does an enqueue, and a task scheduled later leaves the hint at its time.
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    queue::enqueue(&pool, task("t", 9).run_at(later)).await.unwrap();
    let now_id = queue::enqueue(&pool, task("t", 10)).await.unwrap().id;
    assert_eq!(claim(&pool, runner, 5).await.iter().map(|c| c.id).collect::<Vec<_>>(), [now_id]);
    let hint = hint_of(&pool, "t").await;
    let hint = hint.expect("the scheduled task keeps a hint");
    assert!((hint - later).num_milliseconds().abs() < 5, "{hint} vs {later}");
}

/// The general claim corrects the hints of every queue it empties in one look: a queue left
/// with later tasks at several priorities gets the earliest of them (not its highest
/// priority's), one with later tasks at one priority that task's time, one with nothing left
/// no hint.
#[sqlx::test(migrations = false)]
async fn a_claim_that_empties_several_queues_moves_each_hint_to_its_next_task(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let now = chrono::Utc::now();
    let (in_1h, in_2h, in_30m) = (
        now + chrono::Duration::hours(1),
        now + chrono::Duration::hours(2),
        now + chrono::Duration::minutes(30),
    );
    let tasks = [
        task("mixed", 1),
        task("mixed", 2).priority(5).run_at(in_2h),
        task("mixed", 3).run_at(in_1h),
        task("single", 4),
        task("single", 5).run_at(in_30m),
        task("single", 6).run_at(in_2h),
        task("gone", 7),
    ];
    queue::enqueue_many(&pool, &tasks).await.unwrap();
    // Three due queues: the general claim's statement, not the one-queue one.
    let claimed = claim(&pool, new_runner(), 10).await;
    let mut got: Vec<i64> =
        claimed.iter().map(|c| c.payload_value().unwrap()["n"].as_i64().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, [1, 4, 7]);
    let near = |hint: Option<chrono::DateTime<chrono::Utc>>, at: chrono::DateTime<chrono::Utc>| {
        hint.is_some_and(|h| (h - at).num_milliseconds().abs() < 5)
    };
    let mixed = hint_of(&pool, "mixed").await;
    assert!(near(mixed, in_1h), "the earliest waiting task, of the lower priority: {mixed:?}");
    let single = hint_of(&pool, "single").await;
    assert!(near(single, in_30m), "{single:?}");
    assert_eq!(hint_of(&pool, "gone").await, None);
}

/// An enqueue that lowers a hint holds the queue row until it commits, so a claim that cannot
/// see its task yet cannot clear the hint past it. The enqueue lowers the hint at once here
/// (its task is earlier than the hint), which holds the row by the update's own lock.
#[sqlx::test(migrations = false)]
async fn a_claim_cannot_clear_a_hint_an_enqueue_in_flight_lowered(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let first = queue::enqueue(&pool, task("t", 1)).await.unwrap().id;

    let mut tx = pool.begin().await.unwrap();
    let earlier = chrono::Utc::now() - chrono::Duration::minutes(1);
    let in_flight = queue::enqueue(&mut *tx, task("t", 2).run_at(earlier)).await.unwrap().id;
    // The claim sees the committed hint, takes the one task it can see and comes up short:
    // it would clear the hint, but the enqueue holds the row.
    assert_eq!(claim(&pool, runner, 5).await.iter().map(|c| c.id).collect::<Vec<_>>(), [first]);
    tx.commit().await.unwrap();

    let hint = hint_of(&pool, "t").await;
    assert!(hint.is_some_and(|h| (h - earlier).num_milliseconds().abs() < 5), "{hint:?}");
    let found = claim(&pool, runner, 5).await;
    assert_eq!(found.iter().map(|c| c.id).collect::<Vec<_>>(), [in_flight]);
}

/// An enqueue that meets its queue row held by a claim (clearing the hint) waits for that claim
/// and then lowers the hint it cleared, so its task is found without the hint repair.
#[sqlx::test(migrations = false)]
async fn an_enqueue_lowers_a_hint_a_claim_was_clearing(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    enqueue_n(&pool, "t", 1).await;
    assert_eq!(claim(&pool, runner, 5).await.len(), 1);
    assert_eq!(hint_of(&pool, "t").await, None, "the short claim cleared the hint");

    // The row as a claim clearing the hint holds it.
    let mut clearing = pool.begin().await.unwrap();
    sqlx::query("select 1 from sweep.queues where task_type = 't' for update")
        .execute(&mut *clearing)
        .await
        .unwrap();
    let enqueuing = tokio::spawn({
        let pool = pool.clone();
        async move { queue::enqueue(&pool, task("t", 2)).await }
    });
    backends_waiting_on_a_lock(&pool, 1).await;
    clearing.commit().await.unwrap();
    let id = enqueuing.await.unwrap().unwrap().id;

    assert!(hint_of(&pool, "t").await.is_some(), "the enqueue lowered the hint after the claim");
    assert_eq!(claim(&pool, runner, 5).await.iter().map(|c| c.id).collect::<Vec<_>>(), [id]);
}

#[sqlx::test(migrations = false)]
async fn the_hint_repair_finds_work_the_hints_missed(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    enqueue_n(&pool, "t", 3).await;
    // As if a lowering had been skipped: the hint says nothing waits.
    sqlx::query("update sweep.queues set next_run_at = null").execute(&pool).await.unwrap();
    assert!(claim(&pool, new_runner(), 5).await.is_empty());
    assert_eq!(queue::repair_queue_hints(&pool).await.unwrap(), 1);
    assert_eq!(claim(&pool, new_runner(), 5).await.len(), 3);
    assert_eq!(queue::repair_queue_hints(&pool).await.unwrap(), 0, "nothing left to repair");
}

#[sqlx::test(migrations = false)]
async fn more_due_queues_than_a_claim_looks_at_are_all_served(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    // A claim looks at a window of limit + 16 due queues; with 300 of them every claim is
    // still full while work is due (drained queues leave the window at once) and all of it is
    // claimed in exactly as many claims as it takes.
    for t in 0..300 {
        backlog(&pool, &format!("t{t}"), "work", 1).await;
    }
    let runner = new_runner();
    for _ in 0..6 {
        assert_eq!(claim(&pool, runner, 50).await.len(), 50);
    }
    assert!(claim(&pool, runner, 50).await.is_empty());
    assert_eq!(running_by_tenant(&pool).await.len(), 300);
}

/// A crowded window (at least as many due queues as the claim's size) shares the slots among
/// its first size / 4 + 16 queues: each winner takes 2 or 3 of a claim of 100 (41 queues), every
/// claim is full while work is due, the queues the rest of the window filled from are rehinted
/// when they run dry, and the draining ends with no queue left due.
#[sqlx::test(migrations = false)]
async fn a_crowded_claim_gives_each_winner_a_few_slots_and_stays_full(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    for t in 0..300 {
        backlog(&pool, &format!("t{t}"), "work", 10).await;
    }
    let runner = new_runner();
    let first = claim(&pool, runner, 100).await;
    assert_eq!(first.len(), 100);
    let mut per_tenant: HashMap<&str, usize> = HashMap::new();
    for c in &first {
        *per_tenant.entry(c.tenant.as_str()).or_default() += 1;
    }
    // 100 slots over the 41 queues shared among: 18 of them get 3, the rest 2.
    assert_eq!(per_tenant.len(), 41, "{per_tenant:?}");
    assert!(per_tenant.values().all(|&n| n == 2 || n == 3), "{per_tenant:?}");

    // Two due tasks a queue: the head's queues run dry at once and the rest of the window fills
    // the claim; all 600 in exactly 6 claims, and no hint is left pointing at a dry queue.
    for t in 0..300 {
        backlog(&pool, &format!("u{t}"), "pair", 2).await;
    }
    let other = new_runner();
    for _ in 0..6 {
        let got = queue::claim(&pool, other, 100, &["pair".to_string()], LEASE, ClaimMode::Fair)
            .await
            .expect("claim");
        assert_eq!(got.len(), 100);
    }
    let left: i64 = sqlx::query_scalar(
        "select count(*) from sweep.queues where task_type = 'pair' and next_run_at is not null",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, 0, "dry queues still hinted due");
}

/// With more tenants than slots most of them hold nothing, all at the same level, and the tie
/// alone decides who is served: a lottery weighted by weight, so the weight-2 half of 200
/// tenants wins about 62% of the slots of claims of 8, not all of them (heavier first) nor half
/// (an even draw). 150 claims, each rolled back: the weight-1 half's share is 0.38 with a
/// standard deviation of 0.014 (simulated), well inside 0.30-0.45.
#[sqlx::test(migrations = false)]
async fn at_level_zero_weights_decide_by_lottery(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    for i in 0..100 {
        for (prefix, weight) in [("light", 1), ("heavy", 2)] {
            let name = format!("{prefix}{i}");
            tenant_with_weight(&pool, &name, weight).await;
            backlog(&pool, &name, "work", 1).await;
        }
    }
    let runner = new_runner();
    let (mut light, mut all) = (0usize, 0usize);
    for _ in 0..150 {
        let mut tx = pool.begin().await.expect("begin");
        let got =
            queue::claim(&mut *tx, runner, 8, &[], LEASE, ClaimMode::Fair).await.expect("claim");
        tx.rollback().await.expect("rollback");
        assert_eq!(got.len(), 8);
        light += got.iter().filter(|c| c.tenant.starts_with("light")).count();
        all += got.len();
    }
    let share = light as f64 / all as f64;
    assert!((0.30..=0.45).contains(&share), "the weight-1 half won {share:.3} of the slots");
}

/// Two runners' spare-slot claims at the same moment: the first admits the newly due queue
/// and holds its try-lock until it commits; the second gets no slot for it meanwhile, and after
/// the commit sees the first one's task running.
#[sqlx::test(migrations = false)]
async fn two_runners_spare_slots_do_not_both_admit_a_newly_due_queue(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    backlog(&pool, "flood", "spin", 100).await;
    let (a, b) = (new_runner(), new_runner());
    assert_eq!(claim(&pool, a, 4).await.len(), 4);
    backlog(&pool, "newcomer", "small", 5).await;

    let mut first = pool.begin().await.expect("begin");
    let by_a =
        queue::claim(&mut *first, a, 4, &[], LEASE, ClaimMode::Starved).await.expect("claim");
    assert_eq!(by_a.iter().map(|c| c.tenant.as_str()).collect::<Vec<_>>(), vec!["newcomer"]);
    let mut second = pool.begin().await.expect("begin");
    let by_b =
        queue::claim(&mut *second, b, 4, &[], LEASE, ClaimMode::Starved).await.expect("claim");
    assert!(by_b.is_empty(), "a's claim is in flight: {by_b:?}");
    second.rollback().await.expect("rollback");
    first.commit().await.expect("commit");

    // Committed: newcomer got exactly one spare slot between the two runners.
    let running = running_by_tenant(&pool).await;
    assert_eq!((count(&running, "flood"), count(&running, "newcomer")), (4, 1));
}
