//! Wake-ups: enqueue statements notify [`NOTIFY_CHANNEL`] once per statement (see `enqueue.rs`);
//! a runner LISTENs and wakes its claim loop within milliseconds, with a poll interval as the
//! backstop for anything a notification misses (a reconnect, a task whose `run_at` arrives).
//!
//! LISTEN needs a session that stays put, which a transaction pooler does not give: behind one
//! a runner listens on a direct connection ([`Wakeups::listen_with`], the store's listen URL)
//! or, without one, only polls ([`Wakeups::polling`]).
//!
//! The same connection LISTENs on [`CANCEL_CHANNEL`]: a cancel of a running task notifies it
//! with `<runner> <task id> <attempt>` (see `dead.rs`); those meant for this runner come out
//! of [`Wakeups::cancel_requests`]. Without LISTEN the runner polls for them instead
//! (`queue::cancel_requests`, see `worker::cancels`).
//!
//! Invariant: a notification that arrives while nobody waits is kept as one stored permit,
//! so the next wait returns at once: wake-ups are never lost, only merged.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use sqlx::{
    postgres::{PgConnectOptions, PgListener, PgPoolOptions},
    PgPool,
};
use tokio::{
    sync::{mpsc, Notify},
    task::JoinHandle,
};
use uuid::Uuid;

use super::{QueueError, Store, TaskId};

/// The channel enqueues notify and runners listen on (see [`notify_tasks!`]).
pub const NOTIFY_CHANNEL: &str = notify_channel!();

/// The channel a cancel of a running task notifies (see [`notify_cancel!`]).
pub const CANCEL_CHANNEL: &str = cancel_channel!();

/// A cancel of a running task, as notified to the runner holding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelRequest {
    pub runner: Uuid,
    pub task: TaskId,
    pub attempt: i32,
}

impl CancelRequest {
    /// Reads a `sweep_cancel` payload, `<runner> <task id> <attempt>`.
    pub fn parse(payload: &str) -> Option<Self> {
        let mut parts = payload.split(' ');
        let request = CancelRequest {
            runner: parts.next()?.parse().ok()?,
            task: parts.next()?.parse().ok()?,
            attempt: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(request)
    }
}

/// A LISTEN connection feeding a [`Notify`] (or none: see [`Wakeups::polling`]). Dropping it
/// stops the listener task.
#[derive(Debug)]
pub struct Wakeups {
    notify: Arc<Notify>,
    /// Wake-ups that came from the database (a notification, a lost connection), counted
    /// before each is signalled: a waiter tells them from the runner's own [`Wakeups::wake`].
    announced: Arc<AtomicU64>,
    listener: Option<JoinHandle<()>>,
    /// The listener's own pool (a listen URL of its own), closed with it: the connection then
    /// goes away without the return-to-pool health check, which would warn when the server is
    /// stopping too (as `sweep dev` stops its Postgres right after the runner).
    own_pool: Option<PgPool>,
    /// Cancel notifications, until a runner takes the receiver.
    cancels: Mutex<Option<mpsc::UnboundedReceiver<CancelRequest>>>,
}

impl Wakeups {
    /// The wake-ups a runner on `store` gets: LISTEN on the store's listen URL if it has one,
    /// else on one of its own connections, unless it goes through a transaction pooler: then
    /// none, polling only.
    pub async fn for_store(store: &Store) -> Result<Self, QueueError> {
        match (store.listen_options(), store.pooled()) {
            (Some(options), _) => Self::listen_with(options).await,
            (None, false) => Self::listen(store.pool()).await,
            (None, true) => Ok(Self::polling()),
        }
    }

    /// Connects (taking one of the pool's connections for good), LISTENs, and returns once the
    /// LISTEN is in place: any enqueue committed after this returns wakes the waiter.
    pub async fn listen(pool: &PgPool) -> Result<Self, QueueError> {
        Self::start(PgListener::connect_with(pool).await?).await
    }

    /// [`Wakeups::listen`] on a connection of its own to `options`.
    pub async fn listen_with(options: &PgConnectOptions) -> Result<Self, QueueError> {
        // The listener's own pool of one, only there to reconnect it (as `PgListener::connect`).
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_with(options.clone())
            .await?;
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.ignore_pool_close_event(true);
        let mut wakeups = Self::start(listener).await?;
        wakeups.own_pool = Some(pool);
        Ok(wakeups)
    }

    async fn start(mut listener: PgListener) -> Result<Self, QueueError> {
        listener.listen_all([NOTIFY_CHANNEL, CANCEL_CHANNEL]).await?;
        let notify = Arc::new(Notify::new());
        let announced = Arc::new(AtomicU64::new(0));
        let (forward, count) = (Arc::clone(&notify), Arc::clone(&announced));
        let announce = move || {
            count.fetch_add(1, Ordering::Release);
            forward.notify_one();
        };
        let (cancel_tx, cancel_rx) = mpsc::unbounded_channel();
        let listener = tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(n) if n.channel() == CANCEL_CHANNEL => {
                        match CancelRequest::parse(n.payload()) {
                            // Nobody takes them (not a runner): dropped.
                            Some(request) => drop(cancel_tx.send(request)),
                            None => tracing::warn!(
                                payload = n.payload(),
                                "ignoring a malformed cancel notification"
                            ),
                        }
                    }
                    Ok(_) => announce(),
                    Err(e) => {
                        // PgListener reconnects by itself on the next recv; wake the waiter so
                        // it polls for anything announced while the connection was down.
                        tracing::warn!(error = %e, "listen connection lost; reconnecting");
                        announce();
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        Ok(Wakeups {
            notify,
            announced,
            listener: Some(listener),
            own_pool: None,
            cancels: Mutex::new(Some(cancel_rx)),
        })
    }

    /// No LISTEN: every [`Wakeups::wait`] lasts its poll interval unless [`Wakeups::wake`]
    /// cuts it short.
    pub fn polling() -> Self {
        Wakeups {
            notify: Arc::new(Notify::new()),
            announced: Arc::new(AtomicU64::new(0)),
            listener: None,
            own_pool: None,
            cancels: Mutex::new(None),
        }
    }

    /// The cancel notifications of every runner (filter by [`CancelRequest::runner`]), once:
    /// `None` when polling, or when already taken.
    pub fn cancel_requests(&self) -> Option<mpsc::UnboundedReceiver<CancelRequest>> {
        self.cancels.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Whether a LISTEN connection feeds these wake-ups.
    pub fn listening(&self) -> bool {
        self.listener.is_some()
    }

    /// Waits for a notification or `poll`, whichever comes first. Returns true if woken by
    /// a notification.
    pub async fn wait(&self, poll: Duration) -> bool {
        tokio::time::timeout(poll, self.notify.notified()).await.is_ok()
    }

    /// How many wake-ups the database has sent so far: a waiter that reads it before
    /// [`Wakeups::wait`] and again after learns whether anything new was announced, or only
    /// the runner itself woke it ([`Wakeups::wake`]).
    pub fn announced(&self) -> u64 {
        self.announced.load(Ordering::Acquire)
    }

    /// Wakes the waiter from inside the process (e.g. a slot became free).
    pub fn wake(&self) {
        self.notify.notify_one();
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        if let Some(pool) = &self.own_pool {
            // Marks the pool closed at once (the future only waits for the connections).
            drop(pool.close());
        }
        if let Some(listener) = &self.listener {
            listener.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_payloads_parse_strictly() {
        let runner = Uuid::new_v4();
        assert_eq!(
            CancelRequest::parse(&format!("{runner} 42 3")),
            Some(CancelRequest { runner, task: 42, attempt: 3 })
        );
        assert_eq!(CancelRequest::parse(&format!("{runner} 42")), None);
        assert_eq!(CancelRequest::parse(&format!("{runner} 42 3 4")), None);
        assert_eq!(CancelRequest::parse("nope 42 3"), None);
        assert_eq!(CancelRequest::parse(""), None);
    }
}
