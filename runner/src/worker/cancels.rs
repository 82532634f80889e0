//! Stopping tasks this runner holds when their cancel is requested: the `sweep_cancel`
//! notifications (those naming this runner), and a poll of the held leases for requests, the
//! backstop for a notification missed while the LISTEN connection was down and the only way
//! in when the runner cannot LISTEN (a transaction pooler and no `--listen-url`).
//!
//! Latency from the request's commit to the signal: a notification arrives within
//! milliseconds; a poll finds the request within its period, the poll interval when the
//! runner does not LISTEN (1 s by default) and a third of the lease otherwise (10 s by
//! default, only for a missed notification). The sandbox then stops the instance within one
//! epoch tick (see `sandbox::run`).
//!
//! Invariants: a signal goes only to the attempt it names (a request for an attempt this runner
//! no longer runs is ignored: the report of that attempt reads the request itself, see
//! `queue::complete`); each attempt is signalled once. Nothing here is on the claim → run →
//! report path: the poll is one statement per period for the whole runner, and none while it
//! holds nothing.

use std::{sync::PoisonError, time::Duration, time::Instant};

use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use super::liveness::HeldLeases;
use super::InFlight;
use crate::queue::{self, CancelRequest, Store, TaskId};

pub(super) struct Cancels {
    pub(super) store: Store,
    pub(super) runner: Uuid,
    pub(super) in_flight: InFlight,
    pub(super) leases: std::sync::Arc<HeldLeases>,
    /// The `sweep_cancel` notifications, when the runner LISTENs.
    pub(super) notified: Option<mpsc::UnboundedReceiver<CancelRequest>>,
    pub(super) poll: Duration,
}

pub(super) async fn run(mut c: Cancels, mut stop: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(c.poll);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            request = next(&mut c.notified) => match request {
                Some(r) if r.runner == c.runner => signal(&c.in_flight, r.task, r.attempt),
                Some(_) => {}
                // The listener is gone (only when the runner stops): keep polling.
                None => c.notified = None,
            },
            _ = interval.tick() => {
                let held = c.leases.snapshot();
                match queue::cancel_requests(&c.store, c.runner, &held).await {
                    Ok(requested) => {
                        for (task, attempt) in requested {
                            signal(&c.in_flight, task, attempt);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "polling for cancel requests failed"),
                }
            }
        }
    }
}

async fn next(
    notified: &mut Option<mpsc::UnboundedReceiver<CancelRequest>>,
) -> Option<CancelRequest> {
    match notified {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Tells the running attempt to stop, if this runner still runs it.
fn signal(in_flight: &InFlight, task: TaskId, attempt: i32) {
    let mut map = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(running) = map.get_mut(&task).filter(|r| r.attempt == attempt) else { return };
    if let Some(cancel) = running.cancel.take() {
        tracing::info!(id = task, attempt, "cancel requested: stopping the instance");
        // The guest may have ended meanwhile (its receiver gone): its report reads the request.
        let _ = cancel.send(Instant::now());
    }
}
