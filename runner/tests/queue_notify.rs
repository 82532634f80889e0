//! Wake-up: an idle claimer wakes on NOTIFY, long before its poll interval.

mod common;

use std::time::Duration;

use common::*;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::{self, Wakeups};

/// Far longer than the test may take: if the waiter only woke by polling, the test would fail
/// on the outer timeout instead.
const POLL: Duration = Duration::from_secs(3600);

#[sqlx::test(migrations = false)]
async fn idle_claimer_wakes_on_enqueue(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let wakeups = Wakeups::listen(&pool).await.unwrap();
    let runner = new_runner();
    assert!(claim(&pool, runner, 1).await.is_empty());

    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let woken = wakeups.wait(POLL).await;
            (woken, claim(&pool, runner, 10).await)
        })
    };
    // One statement, three tasks: one wake-up is enough to get all of them.
    let ids = enqueue_n(&pool, "t", 3).await;
    let (woken, claimed) = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter was not woken by NOTIFY")
        .unwrap();
    assert!(woken, "woken by the notification, not the poll");
    assert_eq!(claimed.len(), ids.len());
}

#[sqlx::test(migrations = false)]
async fn a_notification_while_nobody_waits_is_not_lost(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let wakeups = Wakeups::listen(&pool).await.unwrap();
    queue::enqueue(&pool, task("t", 1)).await.unwrap();
    // The enqueue committed before anyone waited: the stored permit wakes the next wait.
    let woken = tokio::time::timeout(Duration::from_secs(30), wakeups.wait(POLL)).await;
    assert_eq!(woken, Ok(true));
}
