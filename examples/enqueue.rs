//! Run with `cargo run -p sweep --example enqueue` (DATABASE_URL names a database that
//! `sweep migrate` has set up; Sweep's tables live in its `sweep` schema, beside the
//! application's own).
//!
//! Enqueues work from a host program through the library, inside the caller's own
//! transaction, the way an application enqueues jobs next to its own writes: the tasks exist
//! only if the transaction commits. The application's own pool is all it needs: every queue
//! function takes an executor, and no Sweep setting touches the application's connections.

use serde_json::json;
use sweep::queue::{self, NewTask};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/sweep".to_owned());
    let pool = sqlx::PgPool::connect(&url).await?;

    let mut tx = pool.begin().await?;
    // ... the application's own writes go here, in `tx` ...
    let welcome = NewTask::new(
        "template",
        json!({"template": "Welcome, {{name}}!", "vars": {"name": "Ada"}}),
    )
    .dedup_key("welcome-mail:ada");
    let report = NewTask::new("wordcount", json!({"text": "a nightly report"}))
        .delay(std::time::Duration::from_secs(3600))
        .priority(-1);
    let ids = queue::enqueue_many(&mut *tx, &[welcome.clone(), report]).await?;
    tx.commit().await?;
    println!("enqueued {ids:?}");

    // The same dedup key again, while the first is still live: nothing new is created.
    let again = queue::enqueue(&pool, welcome).await?;
    println!("again: {again:?} (created: {})", again.created);

    for s in queue::queue_stats(&pool, None).await? {
        println!("{:<10} pending={} oldest_due_ms={}", s.task_type, s.pending, s.oldest_due_ms);
    }
    Ok(())
}
