//! The attempts this runner claimed and has not reported yet, so a cancel can stop one and a
//! shutdown can abort and hand back what is left.
//!
//! Invariants:
//! - an attempt is entered when its claim returns, before anything else is awaited, and leaves
//!   when its guest's report is sent: the claim's commit already shows it `running`, so a
//!   cancel may name it from then on, also while its batch's capabilities are still read;
//! - a cancel is delivered once, to the attempt it names; one for an attempt of this runner
//!   not entered yet (the notification outran the claim's own answer) is kept and delivered by
//!   [`InFlight::enter`]; a notified one for an attempt that already left waits in the same
//!   place unanswered (its report read the request itself) until [`InFlight::forget_early`];
//!   a polled one for such an attempt is dropped at once;
//! - the entry's cancel channel exists before the guest does, so a cancel sent before the
//!   guest starts is found by the guest at its start.

use std::{
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use rustc_hash::FxHashMap;
use tokio::{sync::oneshot, task::AbortHandle};

use crate::queue::TaskId;

#[derive(Debug, Default)]
pub(super) struct InFlight {
    entries: Mutex<Entries>,
}

/// Hashed with Fx, as the held leases are (`liveness`): keys are task ids, from a sequence.
#[derive(Debug, Default)]
struct Entries {
    running: FxHashMap<TaskId, Running>,
    /// Cancels for attempts not entered: the attempt and when the request reached the runner.
    early: FxHashMap<TaskId, (i32, Instant)>,
}

/// One claimed attempt.
#[derive(Debug)]
struct Running {
    attempt: i32,
    /// None until the attempt is spawned.
    abort: Option<AbortHandle>,
    /// Stops the guest (with when the request reached this runner); taken when sent.
    cancel: Option<oneshot::Sender<Instant>>,
}

impl InFlight {
    /// Enters a claim's attempts (task, attempt), each with a cancel channel, and returns the
    /// receivers in claim order (one already holding a cancel that came before).
    pub(super) fn enter(
        &self,
        claimed: impl IntoIterator<Item = (TaskId, i32)>,
    ) -> Vec<oneshot::Receiver<Instant>> {
        let mut entries = self.lock();
        let Entries { running, early } = &mut *entries;
        claimed
            .into_iter()
            .map(|(task, attempt)| {
                let (cancel, cancelled) = oneshot::channel();
                let mut cancel = Some(cancel);
                if let Some((named, at)) = early.remove(&task) {
                    if named == attempt {
                        send(task, attempt, &mut cancel, at);
                    }
                }
                running.insert(task, Running { attempt, abort: None, cancel });
                cancelled
            })
            .collect()
    }

    /// The attempt's guest was spawned; a shutdown past its grace aborts it through `abort`.
    pub(super) fn spawned(&self, task: TaskId, abort: AbortHandle) {
        if let Some(running) = self.lock().running.get_mut(&task) {
            running.abort = Some(abort);
        }
    }

    /// The attempt's report was sent, or it was never spawned.
    pub(super) fn leave(&self, task: TaskId) {
        self.lock().running.remove(&task);
    }

    /// Tells the attempt to stop if it is entered, or keeps the request for [`Self::enter`]: a
    /// notification can outrun the claim's own answer.
    pub(super) fn signal(&self, task: TaskId, attempt: i32) {
        self.stop(task, attempt, true);
    }

    /// Tells the attempt to stop if it is entered. For requests found by polling the held
    /// leases: a lease is held from the spawn, after the entry, so a miss is an attempt that
    /// already left (its report is being written), never one still to come.
    pub(super) fn signal_held(&self, task: TaskId, attempt: i32) {
        self.stop(task, attempt, false);
    }

    fn stop(&self, task: TaskId, attempt: i32, keep: bool) {
        let mut entries = self.lock();
        match entries.running.get_mut(&task) {
            Some(running) if running.attempt == attempt => {
                send(task, attempt, &mut running.cancel, Instant::now());
            }
            // Another attempt of the task runs here: the request was for an older one.
            Some(_) => {}
            None if keep => {
                entries.early.insert(task, (attempt, Instant::now()));
            }
            None => {}
        }
    }

    /// Drops kept requests older than `age`: their attempt's claim had long returned, so the
    /// attempt had already left (or a poll of the held leases will deliver the request).
    pub(super) fn forget_early(&self, age: Duration) {
        self.lock().early.retain(|_, (_, at)| at.elapsed() < age);
    }

    /// Empties the registry, aborting every spawned guest, and returns the attempts it held.
    pub(super) fn abort_all(&self) -> Vec<(TaskId, i32)> {
        let mut entries = self.lock();
        entries.early.clear();
        entries
            .running
            .drain()
            .map(|(id, running)| {
                if let Some(abort) = running.abort {
                    abort.abort();
                }
                (id, running.attempt)
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn send(task: TaskId, attempt: i32, cancel: &mut Option<oneshot::Sender<Instant>>, at: Instant) {
    if let Some(cancel) = cancel.take() {
        tracing::info!(id = task, attempt, "cancel requested: stopping the instance");
        // The guest may have ended meanwhile (its receiver gone): its report reads the request.
        let _ = cancel.send(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_before_the_claim_returned_reaches_the_attempt_it_names() {
        let in_flight = InFlight::default();
        in_flight.signal(1, 2);
        in_flight.signal(3, 1);
        let mut receivers = in_flight.enter([(1, 2), (3, 2)]);
        assert!(receivers[0].try_recv().is_ok(), "the kept request is delivered");
        assert!(receivers[1].try_recv().is_err(), "a request for an older attempt is not");
    }

    #[test]
    fn a_cancel_reaches_an_entered_attempt_once() {
        let in_flight = InFlight::default();
        let mut receivers = in_flight.enter([(1, 1)]);
        in_flight.signal(1, 1);
        in_flight.signal(1, 1);
        assert!(receivers[0].try_recv().is_ok());
        assert_eq!(in_flight.lock().early.len(), 0);
        in_flight.leave(1);
        assert_eq!(in_flight.abort_all(), vec![]);
    }

    #[test]
    fn a_polled_request_for_an_attempt_that_left_is_not_kept() {
        let in_flight = InFlight::default();
        in_flight.signal_held(7, 1);
        assert_eq!(in_flight.lock().early.len(), 0);
    }

    #[test]
    fn kept_requests_for_attempts_that_left_are_forgotten() {
        let in_flight = InFlight::default();
        in_flight.signal(7, 1);
        in_flight.forget_early(Duration::from_secs(60));
        assert_eq!(in_flight.lock().early.len(), 1);
        in_flight.forget_early(Duration::ZERO);
        assert_eq!(in_flight.lock().early.len(), 0);
    }
}
