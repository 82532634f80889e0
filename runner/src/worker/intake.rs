//! How many tasks a runner holds: its running tasks plus a small local buffer claimed ahead of
//! free slots, sized from what it observes (Graphile Worker's local queue, sized by Little's
//! law instead of by hand).
//!
//! Why: a claim is a round trip. When tasks are short, a slot that frees up while the next claim
//! is still in flight sits idle, and the claims that do go out carry only the one or two slots
//! that happened to be free. Claiming ahead keeps a few tasks ready so freed slots start at once
//! and claims carry full batches. When tasks are long, a buffered task would only wait for a
//! slot while another runner could have started it, so the buffer shrinks to nothing.
//!
//! The buffer's target is the number of tasks the runner's slots finish during one claim round
//! trip: `concurrency x claim_rtt / task_duration` (round trips averaged over recent claims,
//! durations over the tasks that finished in about the last 5 s), capped at `max_ahead` and at
//! what the runner finished in the last 200 ms, rounded down, so tasks longer than a claim round
//! trip on every slot are never claimed ahead, and neither is a flood of a task type the runner
//! has not seen finish yet.
//!
//! A claim goes out once there is room for at least half the buffer (the low-water mark), not
//! for every task that finishes: a claim's fixed cost in Postgres (the function call, its
//! statements, the commit) is several times a claimed row's, so claims of one or two tasks at a
//! time, one per finished task, cost more than the tasks. Half the buffer still arrives before
//! the other half is used up (the buffer is one round trip's worth of tasks), so no slot waits.
//!
//! Invariants:
//! - at most `concurrency + max_ahead` tasks are held (claimed and not yet reported) through
//!   fair claims; reservations are taken with compare-and-swap, so concurrent lanes never
//!   overshoot;
//! - a buffered task holds its lease like a running one (the heartbeat renews it) and is handed
//!   back, uncounted, if the runner stops before it started;
//! - `held` only goes down through [`Intake::finished`] or a reservation's drop, each once per
//!   task, and a decrement that leaves room for a claim (the low-water mark) or nothing held
//!   wakes the lanes waiting for room; room only grows there, so no lane that could claim
//!   sleeps through it.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use tokio::sync::Notify;

/// Weight of the newest sample in the running averages.
const SMOOTHING: f64 = 0.2;

/// The runner's intake: what it holds and how far ahead it may claim.
#[derive(Debug)]
pub(super) struct Intake {
    concurrency: usize,
    max_ahead: usize,
    /// Most tasks one claim takes.
    batch: usize,
    held: AtomicUsize,
    room: Notify,
    pace: Mutex<Pace>,
}

/// How long a finished task's duration counts in the mean: a sample weighs
/// `exp(-age / DURATION_MEMORY)`, in seconds of wall clock, not in samples.
const DURATION_MEMORY: f64 = 5.0;

/// Time constant of the finish rate: finishes count with weight `exp(-age / RATE_MEMORY)`.
const RATE_MEMORY: f64 = 0.5;

/// The buffer never holds more than the runner finished in about this long, whatever the
/// durations say: a flood of a new task type, claimed while the runner had only seen a
/// trickle of short tasks, is then not claimed ahead by the hundred before the first of its
/// tasks finishes and shows how long they take.
const AHEAD_HORIZON: f64 = 0.2;

/// What the runner observed, in seconds (`None` until the first sample).
#[derive(Debug, Default)]
struct Pace {
    /// Running average of recent claims.
    claim_rtt: Option<f64>,
    durations: Durations,
}

/// The mean duration of the tasks that finished in about the last [`DURATION_MEMORY`] seconds.
///
/// Why decayed by time and not per sample: with long and short tasks mixed (a flood of 2 s
/// tasks beside a trickle of 1 ms ones), hundreds of short tasks finish between two long ones,
/// and a per-sample average forgets the long ones within a few samples. The buffer then fills
/// with long tasks that wait seconds for a slot while other runners could run them.
///
/// Beside it, the finish rate: finishes counted with a half-second memory.
#[derive(Debug, Default)]
struct Durations {
    sum: f64,
    weight: f64,
    /// Finishes, decayed with [`RATE_MEMORY`].
    recent: f64,
    first: Option<Instant>,
    at: Option<Instant>,
}

impl Durations {
    fn add(&mut self, seconds: f64, now: Instant) {
        if let Some(at) = self.at {
            let age = now.saturating_duration_since(at).as_secs_f64();
            let keep = (-age / DURATION_MEMORY).exp();
            self.sum *= keep;
            self.weight *= keep;
            self.recent *= (-age / RATE_MEMORY).exp();
        }
        self.sum += seconds;
        self.weight += 1.0;
        self.recent += 1.0;
        self.first.get_or_insert(now);
        self.at = Some(now);
    }

    fn mean(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.sum / self.weight)
    }

    /// Tasks finished per second lately, as of `now`. A steady rate `r` for `T` seconds leaves
    /// `recent = r * RATE_MEMORY * (1 - exp(-T / RATE_MEMORY))`; dividing by that factor
    /// makes the first fraction of a second count in full.
    fn rate(&self, now: Instant) -> f64 {
        let (Some(first), Some(at)) = (self.first, self.at) else { return 0.0 };
        let since = |t: Instant| now.saturating_duration_since(t).as_secs_f64();
        let filled = RATE_MEMORY * (1.0 - (-since(first) / RATE_MEMORY).exp());
        let recent = self.recent * (-since(at) / RATE_MEMORY).exp();
        // At least 10 ms: the first finishes of a runner are not a rate yet.
        recent / filled.max(0.01)
    }
}

impl Pace {
    /// The fewest tasks worth a claim while the buffer is at `ahead`: half of it, at least 1
    /// and at most a claim's `batch`.
    fn low_water(ahead: usize, batch: usize) -> usize {
        (ahead / 2).min(batch).max(1)
    }

    fn ahead(&self, concurrency: usize, max_ahead: usize, now: Instant) -> usize {
        match (self.claim_rtt, self.durations.mean()) {
            (Some(rtt), Some(task)) => {
                let finished_per_claim = concurrency as f64 * rtt / task.max(1e-6);
                let finished_lately = self.durations.rate(now) * AHEAD_HORIZON;
                (finished_per_claim.min(finished_lately).floor() as usize).min(max_ahead)
            }
            // Nothing known yet: claim for the free slots only.
            _ => 0,
        }
    }
}

fn smooth(average: &mut Option<f64>, sample: f64) {
    *average = Some(average.map_or(sample, |a| a + SMOOTHING * (sample - a)));
}

impl Intake {
    pub(super) fn new(concurrency: usize, max_ahead: usize, batch: usize) -> Arc<Self> {
        Arc::new(Intake {
            concurrency,
            max_ahead,
            batch,
            held: AtomicUsize::new(0),
            room: Notify::new(),
            pace: Mutex::new(Pace::default()),
        })
    }

    fn pace(&self) -> std::sync::MutexGuard<'_, Pace> {
        self.pace.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many tasks this runner may hold now (its slots plus the buffer's current target),
    /// and the fewest a claim should take (see the low-water mark above).
    fn bounds(&self) -> (usize, usize) {
        self.bounds_of(&self.pace(), Instant::now())
    }

    fn bounds_of(&self, pace: &Pace, now: Instant) -> (usize, usize) {
        let ahead = pace.ahead(self.concurrency, self.max_ahead, now);
        (self.concurrency + ahead, Pace::low_water(ahead, self.batch))
    }

    /// Tasks claimed and not yet reported (running or buffered).
    pub(super) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Whether a fair claim would go out now (room for at least the low-water mark).
    pub(super) fn has_room(&self) -> bool {
        let (capacity, low_water) = self.bounds();
        capacity.saturating_sub(self.held()) >= low_water
    }

    /// Reserves room for up to `most` tasks, waiting until there is room for at least the
    /// low-water mark (or `most`, when smaller).
    pub(super) async fn reserve(self: &Arc<Self>, most: usize) -> Reservation {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(r) = self.try_reserve(most) {
                return r;
            }
            notified.await;
        }
    }

    fn try_reserve(self: &Arc<Self>, most: usize) -> Option<Reservation> {
        let (capacity, low_water) = self.bounds();
        let least = low_water.min(most).max(1);
        let mut held = self.held.load(Ordering::Acquire);
        loop {
            let take = capacity.saturating_sub(held).min(most);
            if take < least {
                return None;
            }
            match self.held.compare_exchange_weak(
                held,
                held + take,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(Reservation { intake: Arc::clone(self), left: take }),
                Err(now) => held = now,
            }
        }
    }

    /// Records how long a claim statement took (its round trip).
    pub(super) fn claimed_in(&self, rtt: Duration) {
        smooth(&mut self.pace().claim_rtt, rtt.as_secs_f64());
    }

    /// One held task is reported; `ran_for` is how long its guest ran (`None`: it never
    /// started, e.g. handed back at shutdown).
    fn finished(&self, ran_for: Option<Duration>) {
        // One lock and one clock read per task: the sample and the bounds it leads to.
        let now = Instant::now();
        let bounds = {
            let mut pace = self.pace();
            if let Some(d) = ran_for {
                pace.durations.add(d.as_secs_f64(), now);
            }
            self.bounds_of(&pace, now)
        };
        self.release_within(1, bounds);
    }

    fn release(&self, n: usize) {
        if n > 0 {
            self.release_within(n, self.bounds());
        }
    }

    /// Gives back `n` places, `bounds` being the capacity and low-water mark as of now.
    fn release_within(&self, n: usize, (capacity, low_water): (usize, usize)) {
        let held = self.held.fetch_sub(n, Ordering::AcqRel) - n;
        // Wake the lanes only when one of them would claim now (or for `drained`): a wake per
        // finished task would unpark a thread of the control runtime per task, for a lane that
        // looks and goes back to sleep. Room only grows here, so no lane that could claim
        // misses its wake-up (one that finds room after a pace change is the lane that just
        // claimed, which looks again itself).
        if held == 0 || capacity.saturating_sub(held) >= low_water {
            self.room.notify_waiters();
        }
    }

    /// Resolves once nothing is held.
    pub(super) async fn drained(&self) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.held() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Room reserved for a claim's tasks; what no task takes goes back when dropped.
#[derive(Debug)]
pub(super) struct Reservation {
    intake: Arc<Intake>,
    left: usize,
}

impl Reservation {
    pub(super) fn len(&self) -> usize {
        self.left
    }

    /// One task's place, taken out of the reservation (`None` once it is used up).
    pub(super) fn take_one(&mut self) -> Option<Ticket> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(Ticket { intake: Arc::clone(&self.intake), ran_for: None })
    }
}

/// One held task's place in the intake, given back when dropped (also when its task panicked
/// or was aborted), with how long its guest ran if it did.
#[derive(Debug)]
pub(super) struct Ticket {
    intake: Arc<Intake>,
    ran_for: Option<Duration>,
}

impl Ticket {
    /// Gives the place back, recording how long the guest ran (`None`: it never started).
    pub(super) fn finished(mut self, ran_for: Option<Duration>) {
        self.ran_for = ran_for;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.intake.finished(self.ran_for);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.intake.release(self.left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_tasks_buffer_up_to_the_cap_and_long_ones_not_at_all() {
        let now = Instant::now();
        let pace =
            |rtt: f64, task: f64| Pace { claim_rtt: Some(rtt), durations: steady(task, now) };
        // 16 slots, 2 ms claims, 50 us tasks: 640 would finish per claim (and 200 finished in
        // the last 200 ms); capped at 50.
        assert_eq!(pace(0.002, 0.000_05).ahead(16, 50, now), 50);
        // 10 ms tasks: 3.2 finish per claim.
        assert_eq!(pace(0.002, 0.01).ahead(16, 50, now), 3);
        // 1 s tasks: none.
        assert_eq!(pace(0.002, 1.0).ahead(16, 50, now), 0);
        assert_eq!(Pace::default().ahead(16, 50, now), 0);
    }

    #[test]
    fn long_tasks_among_many_short_ones_keep_the_buffer_empty() {
        let start = Instant::now();
        let mut pace = Pace { claim_rtt: Some(0.002), durations: Durations::default() };
        // A 2 s task finished, then 300 tasks of 0.1 ms over the next second: per sample, the
        // long one would be forgotten; over the last seconds the mean is still ~6 ms.
        pace.durations.add(2.0, start);
        for i in 1..=300 {
            pace.durations.add(0.000_1, start + Duration::from_millis(i * 3));
        }
        assert_eq!(pace.ahead(16, 1000, start + Duration::from_millis(900)), 5);
        // Half a minute later, short tasks only: the long one is all but forgotten.
        for i in 1..=300 {
            pace.durations.add(0.000_1, start + Duration::from_secs(30) + Duration::from_millis(i));
        }
        let mean = pace.durations.mean().expect("a mean");
        assert!(mean < 0.000_12, "mean {mean}");
    }

    /// A task of `seconds` finished every millisecond for the second before `now`.
    fn steady(seconds: f64, now: Instant) -> Durations {
        let mut durations = Durations::default();
        for ms in (0..1000).rev() {
            durations.add(seconds, now - Duration::from_millis(ms));
        }
        durations
    }

    /// 4 slots, 1 ms claims, 0.1 ms tasks finishing 1,000 a second: a buffer of 10, claims of
    /// at least 5.
    fn buffered_intake() -> Arc<Intake> {
        let intake = Intake::new(4, 10, 50);
        intake.claimed_in(Duration::from_millis(1));
        intake.pace().durations = steady(0.000_1, Instant::now());
        intake
    }

    #[test]
    fn the_buffer_holds_no_more_than_the_runner_finished_lately() {
        let start = Instant::now();
        let mut pace = Pace { claim_rtt: Some(0.002), durations: Durations::default() };
        // A trickle of 0.1 ms tasks, 50 a second for 2 s: by duration alone 320 ahead, but
        // 200 ms of this runner's work is about 10 tasks.
        for i in 0..100 {
            pace.durations.add(0.000_1, start + Duration::from_millis(20 * i));
        }
        let ahead = pace.ahead(16, 1000, start + Duration::from_millis(1990));
        assert!((8..=11).contains(&ahead), "ahead {ahead}");
    }

    #[tokio::test]
    async fn with_a_buffer_claims_wait_for_room_for_half_of_it() {
        let intake = buffered_intake();
        let mut held = intake.try_reserve(100).expect("room");
        assert_eq!(held.len(), 14);
        // Three tasks done: room for 3, under the low-water mark of 5.
        let done: Vec<Ticket> = (0..3).filter_map(|_| held.take_one()).collect();
        drop(done);
        assert!(!intake.has_room());
        assert!(intake.try_reserve(100).is_none());
        // Two more: room for 5, a claim goes out.
        drop(held.take_one());
        drop(held.take_one());
        assert!(intake.has_room());
        assert_eq!(intake.try_reserve(100).expect("room").len(), 5);
        // A claim asking for fewer than the mark still gets them.
        drop(held.take_one());
        assert_eq!(intake.try_reserve(1).expect("room").len(), 1);
    }

    #[tokio::test]
    async fn reservations_never_exceed_capacity_and_give_back_what_they_do_not_use() {
        let intake = Intake::new(4, 0, 50);
        let mut a = intake.try_reserve(3).expect("room");
        assert_eq!(a.len(), 3);
        let b = intake.try_reserve(3).expect("room for one");
        assert_eq!(b.len(), 1);
        assert!(intake.try_reserve(1).is_none());
        drop(b);
        let ticket = a.take_one().expect("a place");
        drop(a);
        // One task still held (taken from `a`).
        assert_eq!(intake.held(), 1);
        ticket.finished(Some(Duration::from_millis(1)));
        assert_eq!(intake.held(), 0);
    }

    #[tokio::test]
    async fn a_waiting_claim_gets_room_once_the_low_water_mark_is_free() {
        let intake = buffered_intake();
        // 14 held: the 4 slots and a buffer of 10; claims take at least 5.
        let mut held = intake.try_reserve(100).expect("room");
        let mut tickets: Vec<Ticket> = (0..14).filter_map(|_| held.take_one()).collect();
        let waiter = tokio::spawn({
            let intake = Arc::clone(&intake);
            async move { intake.reserve(100).await.len() }
        });
        tokio::task::yield_now().await;
        for _ in 0..4 {
            drop(tickets.pop());
            tokio::task::yield_now().await;
            assert!(!waiter.is_finished(), "a claim for fewer than 5 went out");
        }
        // The release that frees the fifth place must wake it (a bound, not a verdict: without
        // the wake-up the test would hang).
        drop(tickets.pop());
        let woken = tokio::time::timeout(Duration::from_secs(10), waiter).await;
        assert_eq!(woken.expect("the waiting claim was never woken").expect("joined"), 5);
    }

    #[tokio::test]
    async fn a_waiting_reservation_is_woken_when_a_task_finishes() {
        let intake = Intake::new(1, 0, 50);
        let ticket = intake.try_reserve(1).expect("room").take_one().expect("a place");
        let waiter = tokio::spawn({
            let intake = Arc::clone(&intake);
            async move { intake.reserve(5).await.len() }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(ticket);
        assert_eq!(waiter.await.expect("joined"), 1);
    }
}
