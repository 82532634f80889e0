//! Claiming: order, due time, type filters, leases, and exactly-once under concurrency.

mod common;

use std::collections::HashSet;

use common::*;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::{self, ClaimCursor, ClaimMode::Fair, NewTask, TaskState};

#[sqlx::test(migrations = false)]
async fn claim_sets_running_with_attempt_and_lease(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let ids = enqueue_n(&pool, "t", 3).await;
    let claimed = claim(&pool, runner, 2).await;
    assert_eq!(claimed.len(), 2);
    for c in &claimed {
        assert_eq!(c.attempt, 1);
        // The payload comes as the JSON text the guest reads, the enqueued object's.
        let n = ids.iter().position(|&id| id == c.id).unwrap() as i64;
        assert_eq!(c.payload_value().unwrap(), serde_json::json!({ "n": n }), "{}", c.payload);
        assert_eq!(state(&pool, c.id).await, TaskState::Running);
    }
    let (owner, expires): (uuid::Uuid, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("select lease_owner, lease_expires_at from sweep.tasks where id = $1")
            .bind(claimed[0].id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(owner, runner);
    assert!(expires > chrono::Utc::now() + chrono::Duration::seconds(50));
    // The third is still there for the next claim; then nothing is left.
    let rest = claim(&pool, runner, 10).await;
    assert_eq!(rest.len(), 1);
    assert!(ids.contains(&rest[0].id));
    assert!(claim(&pool, runner, 10).await.is_empty());
}

#[sqlx::test(migrations = false)]
async fn claim_order_is_priority_then_run_at_then_id(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let past = |mins| chrono::Utc::now() - chrono::Duration::minutes(mins);
    let tasks = vec![
        task("t", 0).priority(0).run_at(past(1)),   // 4th
        task("t", 1).priority(5).run_at(past(1)),   // 2nd
        task("t", 2).priority(-1).run_at(past(60)), // 6th: deferred
        task("t", 3).priority(5).run_at(past(10)),  // 1st
        task("t", 4).priority(0).run_at(past(1)),   // 5th: same as #0, later id
        task("t", 5).priority(1),                   // 3rd
    ];
    let ids: Vec<_> =
        queue::enqueue_many(&pool, &tasks).await.unwrap().into_iter().map(|e| e.id).collect();
    let mut order = Vec::new();
    loop {
        let got = claim(&pool, new_runner(), 1).await;
        let Some(c) = got.first() else { break };
        order.push(c.id);
    }
    assert_eq!(order, vec![ids[3], ids[1], ids[5], ids[0], ids[4], ids[2]]);
}

/// A claimer's cursor moves its scan on, never past a due task: a task that became due behind
/// the cursor (here: enqueued with an earlier `run_at`) waits for the claim after the cursor's
/// (without a cursor it would come at once), and a more urgent task enqueued meanwhile still
/// comes first; the cursor then sits at the urgent task's priority, and the rest come in
/// claim order from the head of theirs.
#[sqlx::test(migrations = false)]
async fn a_cursor_moves_the_scan_on_and_skips_no_due_task(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let past = |mins| chrono::Utc::now() - chrono::Duration::minutes(mins);
    let first: Vec<_> = (0..6).map(|i| task("t", i).run_at(past(5))).collect();
    let first: Vec<_> =
        queue::enqueue_many(&pool, &first).await.unwrap().into_iter().map(|e| e.id).collect();
    let runner = new_runner();
    let mut cursor = ClaimCursor::default();
    let mut claim_one = async || {
        let got = queue::claim_from(&pool, runner, 1, &[], LEASE, Fair, &mut cursor).await.unwrap();
        got.first().map(|c| c.id)
    };
    assert_eq!(claim_one().await, Some(first[0]));
    assert_eq!(claim_one().await, Some(first[1]));

    let later = vec![
        task("t", 10).priority(-1).run_at(past(60)), // less urgent: last
        task("t", 11).run_at(past(60)),              // behind the cursor
    ];
    let later: Vec<_> =
        queue::enqueue_many(&pool, &later).await.unwrap().into_iter().map(|e| e.id).collect();
    assert_eq!(claim_one().await, Some(first[2]), "the cursor's claim goes on from the cursor");
    let urgent = queue::enqueue_many(&pool, &[task("t", 12).priority(3)]).await.unwrap()[0].id;
    let mut order = Vec::new();
    while let Some(id) = claim_one().await {
        order.push(id);
    }
    assert_eq!(order, vec![urgent, later[1], first[3], first[4], first[5], later[0]]);
}

#[sqlx::test(migrations = false)]
async fn claim_filters_by_task_type(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let a = enqueue_n(&pool, "a", 2).await;
    enqueue_n(&pool, "b", 2).await;
    let only_a =
        queue::claim_batch(&pool, new_runner(), 10, &["a".to_string()], LEASE).await.unwrap();
    let got: HashSet<_> = only_a.iter().map(|c| c.id).collect();
    assert_eq!(got, a.into_iter().collect());
}

#[sqlx::test(migrations = false)]
async fn eight_concurrent_claimers_drain_ten_thousand_tasks_exactly_once(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let tasks: Vec<NewTask> = (0..10_000).map(|i| task("hammer", i)).collect();
    let ids: HashSet<_> =
        queue::enqueue_many(&pool, &tasks).await.unwrap().into_iter().map(|e| e.id).collect();

    let claimers = (0..8).map(|k| {
        let pool = pool.clone();
        tokio::spawn(async move {
            let runner = new_runner();
            // Half the claimers keep a cursor, as a runner's claim lanes do.
            let mut cursor = (k % 2 == 1).then(ClaimCursor::default);
            let mut mine = Vec::new();
            loop {
                let limit = 1 + (k * 7) % 50;
                let batch = match cursor.as_mut() {
                    None => claim(&pool, runner, limit).await,
                    Some(cursor) => {
                        queue::claim_from(&pool, runner, limit, &[], LEASE, Fair, cursor)
                            .await
                            .unwrap()
                    }
                };
                if batch.is_empty() {
                    return mine;
                }
                let done: Vec<_> =
                    batch.iter().map(|c| completion(c, serde_json::json!({"by": k}))).collect();
                let lost = queue::complete_batch(&pool, runner, &done).await.unwrap();
                assert!(lost.is_empty(), "no lease can be lost here");
                mine.extend(batch.into_iter().map(|c| c.id));
            }
        })
    });
    let mut seen = HashSet::new();
    let mut total = 0;
    for h in claimers {
        for id in h.await.unwrap() {
            total += 1;
            assert!(seen.insert(id), "task {id} claimed twice");
        }
    }
    assert_eq!(total, 10_000);
    assert_eq!(seen, ids);
    let (succeeded, max_attempts): (i64, i32) = sqlx::query_as(
        "select count(*) filter (where state = $1), max(attempts) from sweep.finished_tasks",
    )
    .bind(TaskState::Succeeded.as_str())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((succeeded, max_attempts), (10_000, 1));
}

#[sqlx::test(migrations = false)]
async fn heartbeat_extends_only_the_leases_the_runner_names_and_owns(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let (a, b) = (new_runner(), new_runner());
    queue::register_runner(&pool, a, "host-a", 1).await.unwrap();
    enqueue_n(&pool, "t", 5).await;
    let short = std::time::Duration::from_secs(5);
    let claimed = queue::claim_batch(&pool, a, 3, &[], short).await.unwrap();
    let theirs = queue::claim_batch(&pool, b, 2, &[], short).await.unwrap();
    // a still works on two of its tasks; it gave the third up (a report it could not write),
    // so that lease must lapse. Naming b's tasks, or an attempt that is not the current one,
    // renews nothing either.
    let (mine, given_up) = claimed.split_at(2);
    let mut named: Vec<_> = mine.iter().map(|c| (c.id, c.attempt)).collect();
    named.extend(theirs.iter().map(|c| (c.id, c.attempt)));
    named.push((given_up[0].id, given_up[0].attempt + 1));
    let extended = queue::heartbeat_leases(&pool, a, std::time::Duration::from_secs(600), &named)
        .await
        .unwrap();
    assert_eq!(extended, 2);
    let expiry = |id| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>(
                "select lease_expires_at from sweep.tasks where id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let far = chrono::Utc::now() + chrono::Duration::seconds(500);
    for c in mine {
        assert!(expiry(c.id).await > far);
    }
    for c in theirs.iter().chain(given_up) {
        assert!(expiry(c.id).await < far);
    }
    let runners = queue::list_runners(&pool).await.unwrap();
    assert_eq!(runners.len(), 1);
    assert_eq!(runners[0].host, "host-a");
}

/// What a claimer that found nothing learns from the hints: the time to the earliest future
/// hint, and whether a hint has passed. An early hint (here set back by hand, as a claim that
/// could not raise it leaves it) hides its queue's next task from the first; it is flagged,
/// and the next claim that probes the queue raises it to that task's due time.
#[sqlx::test(migrations = false)]
async fn an_early_hint_is_flagged_until_a_claim_raises_it(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let runner = new_runner();
    let none = queue::next_due_in(&pool, &[]).await.unwrap();
    assert_eq!(none, queue::NextDue { due_in: None, early: false });

    let delay = std::time::Duration::from_secs(30);
    queue::enqueue(&pool, NewTask::new("later", serde_json::json!({})).delay(delay)).await.unwrap();
    let next = queue::next_due_in(&pool, &[]).await.unwrap();
    assert!(!next.early);
    let due_in = next.due_in.expect("a future hint");
    assert!(due_in > delay - std::time::Duration::from_secs(5) && due_in <= delay, "{due_in:?}");
    // Another type's claimer sees none of it.
    let other = queue::next_due_in(&pool, &["other".to_owned()]).await.unwrap();
    assert_eq!(other, queue::NextDue { due_in: None, early: false });

    sqlx::query("update sweep.queues set next_run_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let early = queue::next_due_in(&pool, &[]).await.unwrap();
    assert_eq!(early, queue::NextDue { due_in: None, early: true });

    assert!(claim(&pool, runner, 10).await.is_empty());
    let raised = queue::next_due_in(&pool, &[]).await.unwrap();
    assert!(!raised.early, "the claim raised the hint");
    let due_in = raised.due_in.expect("the hint is the task's due time again");
    assert!(due_in > delay - std::time::Duration::from_secs(5) && due_in <= delay, "{due_in:?}");
}
