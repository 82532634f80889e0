//! What a runner knows about its own leases and its link to Postgres: the leases it holds (so
//! heartbeats renew exactly those) and when it last failed to reach the database (so its
//! reaper does not rescue the leases of runners that were cut off just like it).
//!
//! Invariants:
//! - a lease is held from the spawn of its claimed task until its report was written (or found
//!   fenced out), or until the runner deliberately gives the report up; a task whose guest
//!   panicked or was aborted lets go through [`Hold`]'s drop, so nothing is renewed that
//!   nobody works on (a claim's lease is fresh until its task is spawned);
//! - releasing names the attempt: a task this runner claims again later (a new attempt) is
//!   not let go by the late release of the old one;
//! - a runner counts as just reconnected from its start (it cannot know whether an outage ended
//!   right before it came up) and after every failure to reach the database.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use rustc_hash::FxHashMap;

use crate::queue::TaskId;

/// The leases this runner holds: task id to attempt (hashed with Fx: ids come from a sequence,
/// not from tenants, and the map is hit twice per task).
#[derive(Debug, Default)]
pub(super) struct HeldLeases {
    held: Mutex<FxHashMap<TaskId, i32>>,
}

impl HeldLeases {
    pub(super) fn hold(&self, tasks: impl IntoIterator<Item = (TaskId, i32)>) {
        self.lock().extend(tasks);
    }

    /// Lets go of these attempts (an entry for a newer attempt of the same task stays).
    pub(super) fn release(&self, tasks: impl IntoIterator<Item = (TaskId, i32)>) {
        let mut held = self.lock();
        for (id, attempt) in tasks {
            if held.get(&id) == Some(&attempt) {
                held.remove(&id);
            }
        }
    }

    /// The leases to renew now.
    pub(super) fn snapshot(&self) -> Vec<(TaskId, i32)> {
        self.lock().iter().map(|(&id, &attempt)| (id, attempt)).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<TaskId, i32>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A claimed task's hold on its lease, taken when it is spawned: dropped without
/// [`Hold::handed_over`] (the guest's future panicked or was aborted, or it never started), it
/// lets the lease go so the lease lapses and the reaper takes over.
#[derive(Debug)]
pub(super) struct Hold {
    leases: Option<Arc<HeldLeases>>,
    task: (TaskId, i32),
}

impl Hold {
    pub(super) fn new(leases: &Arc<HeldLeases>, task: (TaskId, i32)) -> Self {
        leases.hold([task]);
        Hold { leases: Some(Arc::clone(leases)), task }
    }

    /// The report is with the reporter, which lets go once it is written.
    pub(super) fn handed_over(mut self) {
        self.leases = None;
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(leases) = self.leases.take() {
            leases.release([self.task]);
        }
    }
}

/// When this runner last failed to reach Postgres (or started).
#[derive(Debug)]
pub(super) struct Reachability {
    last_unreachable: Mutex<Instant>,
}

impl Reachability {
    pub(super) fn new() -> Self {
        Reachability { last_unreachable: Mutex::new(Instant::now()) }
    }

    pub(super) fn unreachable(&self) {
        *self.last_unreachable.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// Records `e` if it says the database could not be reached.
    pub(super) fn note(&self, e: &crate::queue::QueueError) {
        if e.is_unreachable() {
            self.unreachable();
        }
    }

    /// How long the database has answered without a break.
    pub(super) fn steady_for(&self) -> Duration {
        self.last_unreachable.lock().unwrap_or_else(PoisonError::into_inner).elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_release_of_an_old_attempt_keeps_the_new_one() {
        let leases = Arc::new(HeldLeases::default());
        leases.hold([(1, 1), (2, 1)]);
        leases.hold([(1, 2)]);
        leases.release([(1, 1), (2, 1)]);
        assert_eq!(leases.snapshot(), vec![(1, 2)]);
    }

    #[test]
    fn a_dropped_hold_lets_go_and_a_handed_over_one_does_not() {
        let leases = Arc::new(HeldLeases::default());
        drop(Hold::new(&leases, (1, 1)));
        Hold::new(&leases, (2, 1)).handed_over();
        assert_eq!(leases.snapshot(), vec![(2, 1)]);
    }
}
