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
//! Invariants: a signal goes only to the attempt it names, once, also when it comes before the
//! claim of that attempt returned or while its batch is prepared (see `in_flight`); a request
//! for an attempt this runner no longer runs is not answered (the report of that attempt reads
//! the request itself, see `queue::complete`). Nothing here is on the claim → run →
//! report path: the poll is one statement per period for the whole runner, and none while it
//! holds nothing.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use super::liveness::HeldLeases;
use super::InFlight;
use crate::queue::{self, CancelRequest, Store};

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
                Some(r) if r.runner == c.runner => c.in_flight.signal(r.task, r.attempt),
                Some(_) => {}
                // The listener is gone (only when the runner stops): keep polling.
                None => c.notified = None,
            },
            _ = interval.tick() => {
                // A kept request older than a period had its attempt's claim return long ago.
                c.in_flight.forget_early(c.poll);
                let held = c.leases.snapshot();
                match queue::cancel_requests(&c.store, c.runner, &held).await {
                    Ok(requested) => {
                        for (task, attempt) in requested {
                            c.in_flight.signal_held(task, attempt);
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
