//! Wake-ups: enqueue statements notify [`NOTIFY_CHANNEL`] once per statement (see `enqueue.rs`);
//! a runner LISTENs and wakes its claim loop within milliseconds, with a poll interval as the
//! backstop for anything a notification misses (a reconnect, a task whose `run_at` arrives).
//!
//! Invariant: a notification that arrives while nobody waits is kept as one stored permit,
//! so the next wait returns at once: wake-ups are never lost, only merged.

use std::{sync::Arc, time::Duration};

use sqlx::{postgres::PgListener, PgPool};
use tokio::{sync::Notify, task::JoinHandle};

use super::QueueError;

/// The channel enqueues notify and runners listen on (see [`notify_tasks!`]).
pub const NOTIFY_CHANNEL: &str = notify_channel!();

/// A LISTEN connection feeding a [`Notify`]. Dropping it stops the listener task.
#[derive(Debug)]
pub struct Wakeups {
    notify: Arc<Notify>,
    listener: JoinHandle<()>,
}

impl Wakeups {
    /// Connects, LISTENs, and returns once the LISTEN is in place: any enqueue committed after
    /// this returns wakes the waiter.
    pub async fn listen(pool: &PgPool) -> Result<Self, QueueError> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        let notify = Arc::new(Notify::new());
        let forward = Arc::clone(&notify);
        let listener = tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(_) => forward.notify_one(),
                    Err(e) => {
                        // PgListener reconnects by itself on the next recv; wake the waiter so
                        // it polls for anything announced while the connection was down.
                        tracing::warn!(error = %e, "listen connection lost; reconnecting");
                        forward.notify_one();
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        Ok(Wakeups { notify, listener })
    }

    /// Waits for a notification or `poll`, whichever comes first. Returns true if woken by
    /// a notification.
    pub async fn wait(&self, poll: Duration) -> bool {
        tokio::time::timeout(poll, self.notify.notified()).await.is_ok()
    }

    /// Wakes the waiter from inside the process (e.g. a slot became free).
    pub fn wake(&self) {
        self.notify.notify_one();
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.listener.abort();
    }
}
