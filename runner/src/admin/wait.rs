//! Waiting for a task to end (`GET /v1/tasks/{id}?wait=30s`), woken by Postgres: one LISTEN
//! connection per admin process on `sweep_done` (`queue::DONE_CHANNEL`), started at the first
//! wait, fans each notification out to the requests waiting in this process.
//!
//! The order that makes it race-free: subscribe (the LISTEN is in place), then mark the task
//! (`queue::watch_task`; the statement that ends a marked task notifies), then read it. A task
//! that ended before the mark is not live any more: the mark finds nothing and the read shows
//! it ended. One that ends after the mark notifies, and the subscription hears it.
//!
//! Without LISTEN (the admin store goes through a transaction pooler), waiting reads the task
//! again every [`POLL_WITHOUT_LISTEN`]: a pooler cannot keep a LISTEN session.
//!
//! Invariants: a wait never outlasts its bound; a lost LISTEN connection wakes every waiter
//! (they read their task again) and is made again at the next recv; the listener ends when the
//! admin store is closed, so closing it never waits for the listener.

use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::{broadcast, OnceCell};

use super::error::ApiError;
use super::AdminState;
use crate::queue::{self, TaskId, TaskView};

/// Longest wait a request may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// How often a wait reads the task again when the store cannot LISTEN.
const POLL_WITHOUT_LISTEN: Duration = Duration::from_millis(500);
/// The id sent to every waiter when notifications may have been missed.
const EVERYONE: TaskId = 0;

/// The process's subscription to task ends, once started (`None`: the store cannot LISTEN).
#[derive(Debug, Default)]
pub struct Ends {
    events: OnceCell<Option<broadcast::Sender<TaskId>>>,
}

impl Ends {
    async fn subscribe(&self, state: &AdminState) -> Option<broadcast::Receiver<TaskId>> {
        let sender = self
            .events
            .get_or_init(|| async {
                if state.store().pooled() {
                    return None;
                }
                match start(state).await {
                    Ok(sender) => Some(sender),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot LISTEN for task ends; waits will poll");
                        None
                    }
                }
            })
            .await;
        sender.as_ref().map(broadcast::Sender::subscribe)
    }
}

async fn start(state: &AdminState) -> Result<broadcast::Sender<TaskId>, sqlx::Error> {
    let mut listener = PgListener::connect_with(state.store().pool()).await?;
    listener.listen(queue::DONE_CHANNEL).await?;
    let (sender, _) = broadcast::channel(1024);
    let events = sender.clone();
    tokio::spawn(async move {
        loop {
            match listener.recv().await {
                Ok(n) => {
                    if let Ok(id) = n.payload().parse::<TaskId>() {
                        let _ = events.send(id);
                    }
                }
                Err(sqlx::Error::PoolClosed) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "the task-end LISTEN connection was lost; reconnecting");
                    let _ = events.send(EVERYONE);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
    Ok(sender)
}

/// Reads `id` (as `scope` may) once it has ended or `wait` has passed, whichever is first.
pub async fn until_ended(
    state: &AdminState,
    scope: Option<&str>,
    id: TaskId,
    wait: Duration,
) -> Result<TaskView, ApiError> {
    let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
    let mut events = state.ends().subscribe(state).await;
    let task = queue::get_task(state.store(), scope, id).await?;
    if !task.state.is_live() || !queue::watch_task(state.store(), scope, id).await? {
        return Ok(queue::get_task(state.store(), scope, id).await?);
    }
    loop {
        let woken = match events.as_mut() {
            Some(events) => loop {
                match tokio::time::timeout_at(deadline, events.recv()).await {
                    Err(_elapsed) => break false,
                    Ok(Ok(ended)) if ended == id || ended == EVERYONE => break true,
                    Ok(Ok(_)) => continue,
                    // Missed some: this one may be among them.
                    Ok(Err(broadcast::error::RecvError::Lagged(_))) => break true,
                    Ok(Err(broadcast::error::RecvError::Closed)) => break false,
                }
            },
            None => {
                let next = (tokio::time::Instant::now() + POLL_WITHOUT_LISTEN).min(deadline);
                tokio::time::sleep_until(next).await;
                true
            }
        };
        let task = queue::get_task(state.store(), scope, id).await?;
        if !task.state.is_live() || !woken || tokio::time::Instant::now() >= deadline {
            return Ok(task);
        }
    }
}

/// `30s`, `500ms`, `2m` or a number of seconds; longer asks wait [`MAX_WAIT`].
pub fn parse_wait(raw: &str) -> Result<Duration, ApiError> {
    let raw = raw.trim();
    let bad = || {
        ApiError::bad_request(
            "invalid_parameter",
            format!("parameter `wait` must be a duration like 30s, 500ms or 2m, got {raw:?}"),
        )
    };
    let (number, unit) = match raw.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => raw.split_at(i),
        None => (raw, "s"),
    };
    let n: f64 = number.parse().map_err(|_| bad())?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(bad()),
    };
    if secs.is_nan() || secs < 0.0 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs.min(MAX_WAIT.as_secs_f64())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn waits_read_as_durations() {
        assert_eq!(parse_wait("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_wait("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_wait("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_wait("5").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_wait("90s").unwrap(), MAX_WAIT, "longer asks wait the most");
        assert_eq!(parse_wait(&"9".repeat(400)).unwrap(), MAX_WAIT);
        for bad in ["", "2h", "-1s", "xs", "1.5.2s"] {
            assert_eq!(parse_wait(bad).unwrap_err().code, "invalid_parameter", "{bad}");
        }
    }
}
