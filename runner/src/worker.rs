//! The runner loop: claim -> run -> report, with heartbeats, maintenance and graceful shutdown.
//!
//! Shape: claim lanes take as many due tasks as there is room for (free slots plus a small
//! buffer claimed ahead of them, sized from the observed pace: see `intake`; up to a batch),
//! shared fairly among tenants and task types by the claim itself, and spawn each as a task of
//! its own on the guest runtime ([`Guests`]), apart from the runtime of the lanes, heartbeats,
//! reporter and admin API. A task claimed ahead waits there for a slot, in claim order. Each hands its outcome to the reporter, which writes completions and failures
//! back in batches while the lanes already claim the next batch.
//! Heartbeats renew the leases of the tasks this runner executes or still holds a report for
//! (`liveness`); maintenance runs the reaper, retention, runner pruning, the repair of
//! queue hints and the cron scheduler (`scheduler`); `cancels` stops a running task whose
//! cancel was requested (its guest future gets the signal, the sandbox drops the instance, the
//! report ends the task `cancelled`).
//!
//! Spare slots: while every slot is busy, a lane woken by an enqueue claims in
//! [`ClaimMode::Starved`] into the spare slots (instances beyond `concurrency`): one task each
//! for queues with nothing running anywhere or whose tenant holds less than its share. A newly
//! due tenant or task type so starts within one wake-up even when long tasks hold every slot;
//! its guest shares the cores with the others at their epoch yields, and freed slots then go to
//! it by fair share.
//!
//! Invariants:
//! - room in the intake is held from claim until the outcome is queued for reporting, and a
//!   slot (semaphore permit) from the start of the guest until then, so at most
//!   `concurrency` + `spare_slots` tasks run at once (the spare ones only for queues that had
//!   nothing running, or a tenant below its share, when claimed) and at most `concurrency` +
//!   `max_ahead` + `spare_slots` are held;
//! - a task claimed ahead that has not started when the runner stops is handed back at once,
//!   uncounted;
//! - every task this runner claimed ends in exactly one report: a completion, a failure, or
//!   (on shutdown past the grace period) a release that hands it back uncounted; no task is
//!   left `running` after `run` returns, except when the database is unreachable, in which case
//!   the lease expires and the reaper of another runner takes over;
//! - a lease is renewed only while this runner holds it (from the claim until its report is
//!   written or given up): a report that is never written lets its lease lapse.

mod cancels;
mod capabilities;
mod execute;
mod guests;
mod in_flight;
mod intake;
mod liveness;
mod maintenance;
mod minutes;
mod report;
mod scheduler;

use std::{
    future::Future,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use self::intake::{Intake, Reservation, Ticket};
use self::liveness::{HeldLeases, Hold, Reachability};
use crate::{
    config::WorkerConfig,
    queue::{
        self, ClaimCursor, ClaimMode, ClaimedTask, Conn, Connects, QueueError, Role, Store, Wakeups,
    },
    sandbox::{ModuleCache, Sandbox, SandboxError, SharedArtifacts},
};

pub use guests::Guests;
pub use report::Report;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    #[error("invalid configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    #[error("queue: {0}")]
    Queue(#[from] QueueError),
    #[error("starting the guest runtime: {0}")]
    GuestRuntime(#[from] std::io::Error),
    #[error("a runner needs a store opened for the runner role, got {0:?}")]
    WrongRole(Role),
}

/// What a runner did over its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    pub claimed: u64,
    pub released: u64,
}

/// A runner: its identity, its database, its sandbox and settings.
#[derive(Debug, Clone)]
pub struct Worker {
    id: Uuid,
    store: Store,
    sandbox: Sandbox,
    guests: Guests,
    modules: ModuleCache,
    /// What each task is given (egress, HTTP limits, secrets), per module version.
    capabilities: capabilities::CapabilityCache,
    config: Arc<WorkerConfig>,
    /// What ran, per minute, until maintenance adds it to the charts' counters.
    minutes: Arc<minutes::Tally>,
}

type InFlight = Arc<in_flight::InFlight>;

/// What a claim lane shares with the others.
struct Lane {
    /// What the runner holds and how far ahead it claims (fair claims reserve room here).
    intake: Arc<Intake>,
    /// Execution slots: a fairly claimed task waits for one (in claim order) before it runs.
    slots: Arc<Semaphore>,
    spare: Arc<Semaphore>,
    /// Fair claims in flight on any lane: their slots are taken but their tasks are not
    /// `running` yet, so a spare-slot claim now would see those queues as idle.
    fair_claims: Arc<AtomicUsize>,
    /// Signalled whenever a fair claim ends.
    claim_done: Arc<tokio::sync::Notify>,
    reports: mpsc::UnboundedSender<Report>,
    in_flight: InFlight,
    leases: Arc<HeldLeases>,
    wakeups: Arc<Wakeups>,
    stop: watch::Receiver<bool>,
}

impl Worker {
    /// A runner working through `store`, which must be opened for [`Role::Runner`].
    pub fn new(store: &Store, config: WorkerConfig) -> Result<Self, WorkerError> {
        config.validate()?;
        let sandbox = Sandbox::new(config.sandbox.clone())?;
        Self::with_sandbox(store, sandbox, config)
    }

    /// A worker sharing an existing sandbox (the admin API validates uploads with the same
    /// engine).
    pub fn with_sandbox(
        store: &Store,
        sandbox: Sandbox,
        config: WorkerConfig,
    ) -> Result<Self, WorkerError> {
        if store.role() != Role::Runner {
            return Err(WorkerError::WrongRole(store.role()));
        }
        let store = store.clone();
        let modules = ModuleCache::with_max_bytes(sandbox.clone(), config.module_cache_bytes);
        // Compiled artifacts are shared through the database, read and written on this
        // (the control) runtime, and only tagged under the deployment key's sub-key: without
        // a key, the database could hand this runner native code of anyone's making.
        match &config.secrets_key {
            Some(key) => {
                let control = tokio::runtime::Handle::try_current().ok();
                let store = Arc::new(queue::PgArtifacts::new(store.clone(), control));
                modules.share_artifacts(SharedArtifacts::new(store, key.artifact_key()));
            }
            None => tracing::info!("{}", crate::sandbox::NO_KEY_NO_SHARING),
        }
        let guests = Guests::start_default()?;
        let capabilities =
            capabilities::CapabilityCache::new(config.secrets_key.clone(), config.capabilities_ttl);
        Ok(Worker {
            id: Uuid::new_v4(),
            store,
            sandbox,
            guests,
            modules,
            capabilities,
            config: Arc::new(config),
            minutes: Arc::default(),
        })
    }

    pub fn id(&self) -> Uuid {
        self.id
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// The runner's compiled-module cache (a clone shares it): the admin API served next to
    /// it fills it, benches look at what it holds.
    pub fn modules(&self) -> &ModuleCache {
        &self.modules
    }

    /// Runs until `shutdown` resolves, then stops claiming, lets running tasks finish within
    /// the grace period, hands the rest back, flushes reports and deregisters.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<WorkerSummary, WorkerError> {
        tokio::pin!(shutdown);
        let wakeups = tokio::select! {
            started = self.start_up() => started?,
            () = &mut shutdown => return Ok(WorkerSummary::default()),
        };
        tracing::info!(runner = %self.id, allocator = ?self.sandbox.allocator(), "runner started");
        if !wakeups.listening() {
            tracing::info!(
                runner = %self.id,
                poll_ms = self.config.poll_interval.as_millis() as u64,
                "no LISTEN: the database URL goes through a transaction pooler, which cannot \
                 keep a LISTEN session, and no listen URL (--listen-url, SWEEP_LISTEN_URL) \
                 names a direct connection; claiming every poll interval instead"
            );
        }

        let (stop_tx, stop_rx) = watch::channel(false);
        // Compile the active modules ahead, beside the first claims: otherwise the first tasks
        // of every module wait for its compile while holding slots, and the tasks behind them
        // wait for those slots (the "stall at task number --concurrency" of a cold runner).
        let warm = tokio::spawn(warm_modules(
            self.store.clone(),
            self.modules.clone(),
            self.config.task_types.clone(),
            stop_rx.clone(),
        ));
        let (report_tx, report_rx) = mpsc::unbounded_channel();
        let leases = Arc::new(HeldLeases::default());
        // Tasks whose reports were written: the vacuum follows the work (see `maintenance`).
        let reported = Arc::new(AtomicU64::new(0));
        let reach = Arc::new(Reachability::new());
        let reporter = tokio::spawn(report::run(
            report::Reporter {
                store: self.store.clone(),
                runner: self.id,
                config: Arc::clone(&self.config),
                leases: Arc::clone(&leases),
                reach: Arc::clone(&reach),
                reported: Arc::clone(&reported),
            },
            report_rx,
        ));
        let heartbeat = tokio::spawn(maintenance::heartbeat(
            self.store.clone(),
            self.id,
            self.config.lease,
            Arc::clone(&leases),
            Arc::clone(&reach),
            stop_rx.clone(),
        ));
        let upkeep = tokio::spawn(maintenance::run(
            self.store.clone(),
            self.id,
            self.sandbox.artifact_engine().to_owned(),
            Arc::clone(&self.config),
            Arc::clone(&reach),
            Arc::clone(&reported),
            Arc::clone(&self.minutes),
            stop_rx.clone(),
        ));
        let in_flight: InFlight = Arc::default();
        let notified = wakeups.cancel_requests();
        // With LISTEN the poll only backs up missed notifications; without, it is the way in.
        let poll =
            if notified.is_some() { self.config.lease / 3 } else { self.config.poll_interval };
        let cancels = tokio::spawn(cancels::run(
            cancels::Cancels {
                store: self.store.clone(),
                runner: self.id,
                in_flight: Arc::clone(&in_flight),
                leases: Arc::clone(&leases),
                notified,
                poll,
            },
            stop_rx.clone(),
        ));

        let intake =
            Intake::new(self.config.concurrency, self.config.max_ahead, self.config.batch_size);
        let slots = Arc::new(Semaphore::new(self.config.concurrency));
        let spare = Arc::new(Semaphore::new(self.config.spare_slots));
        let fair_claims = Arc::new(AtomicUsize::new(0));
        let claim_done = Arc::new(tokio::sync::Notify::new());
        let wakeups = Arc::new(wakeups);
        let (claim_stop_tx, claim_stop_rx) = watch::channel(false);
        let lanes: Vec<_> = (0..self.config.claimers)
            .map(|_| {
                let lane = Lane {
                    intake: Arc::clone(&intake),
                    slots: Arc::clone(&slots),
                    spare: Arc::clone(&spare),
                    fair_claims: Arc::clone(&fair_claims),
                    claim_done: Arc::clone(&claim_done),
                    reports: report_tx.clone(),
                    in_flight: Arc::clone(&in_flight),
                    leases: Arc::clone(&leases),
                    wakeups: Arc::clone(&wakeups),
                    stop: claim_stop_rx.clone(),
                };
                tokio::spawn(self.clone().claim_loop(lane))
            })
            .collect();
        shutdown.await;
        let _ = claim_stop_tx.send(true);
        let mut summary = WorkerSummary::default();
        for lane in lanes {
            summary.claimed += lane.await.unwrap_or(0);
        }

        tracing::info!(runner = %self.id, "stopping: no new claims, waiting for running tasks");
        // Buffered tasks that had not started are handed back at once (they see the stop).
        let all_spare = u32::try_from(self.config.spare_slots).unwrap_or(u32::MAX);
        let drained = tokio::time::timeout(self.config.grace_period, async {
            let _ = tokio::join!(intake.drained(), spare.acquire_many(all_spare));
        })
        .await;
        if drained.is_err() {
            summary.released = self.hand_back(&in_flight).await;
        }
        drop(report_tx);
        if let Err(e) = reporter.await {
            tracing::error!(error = %e, "reporter task failed");
        }
        let _ = stop_tx.send(true);
        let _ = tokio::join!(heartbeat, upkeep, cancels, warm);
        if let Err(e) = self.minutes.flush(&self.store).await {
            tracing::warn!(error = %e, "could not add the last minutes' counts for the charts");
        }
        if let Err(e) = queue::deregister_runner(&self.store, self.id).await {
            // Not fatal: the row stops heartbeating and is pruned.
            tracing::warn!(error = %e, "could not deregister the runner");
        }
        tracing::info!(runner = %self.id, claimed = summary.claimed, released = summary.released, "runner stopped");
        Ok(summary)
    }

    /// Registers the runner and starts listening, waiting for Postgres while it cannot be
    /// reached (a runner started during an outage rides it out like a running one).
    async fn start_up(&self) -> Result<Wakeups, QueueError> {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        queue::while_unreachable(self.config.poll_interval, QueueError::is_unreachable, || async {
            queue::register_runner(&self.store, self.id, &host, std::process::id()).await?;
            Wakeups::for_store(&self.store).await
        })
        .await
    }

    /// One claim lane: waits for room (free slots plus the buffer claimed ahead, see
    /// `intake`), claims up to that many due tasks (at most a batch), spawns each, and sleeps
    /// on NOTIFY, the earliest due time it knows of, or the poll interval when nothing is due. While every slot is busy, a wake-up
    /// lets it claim into the spare slots instead. Several lanes keep several claims in flight,
    /// each with its own claim cursor and connection ([`LaneClaims`]). Returns how many tasks
    /// it claimed.
    async fn claim_loop(self, lane: Lane) -> u64 {
        let mut claimed_total = 0;
        let mut stop = lane.stop.clone();
        let mut held = LaneClaims::default();
        loop {
            let seats = tokio::select! {
                biased;
                _ = stop.changed() => break,
                room = lane.intake.reserve(self.config.batch_size) => Seats::Fair(room),
                spare = spare_wakeup(&lane, self.config.poll_interval) => match spare {
                    Some(p) => Seats::Spare(top_up(&lane.spare, p, self.config.batch_size)),
                    None => break,
                },
            };
            let mode = seats.mode();
            match self.claim_into(&lane, seats, &mut held).await {
                Claimed::Tasks(n) => {
                    claimed_total += n;
                    if n > 0 {
                        held.early_retry = None;
                    }
                    if n == 0 && mode == ClaimMode::Fair {
                        let idle = self.idle_wait(&mut held).await;
                        tokio::select! {
                            biased;
                            _ = stop.changed() => break,
                            _ = lane.wakeups.wait(idle) => {}
                        }
                    }
                }
                // It already waited out the poll interval.
                Claimed::Failed => {}
            }
        }
        claimed_total
    }

    /// Claims as many tasks as `seats` has room for, in their mode, and spawns them; room no
    /// task took goes back when the seats drop.
    async fn claim_into(&self, lane: &Lane, seats: Seats, held: &mut LaneClaims) -> Claimed {
        let (want, mode) = (seats.len(), seats.mode());
        let _in_flight = (mode == ClaimMode::Fair).then(|| FairClaim::start(lane));
        let sent = std::time::Instant::now();
        let claimed = match self.claim_on(held, want, mode).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "claim failed; retrying after the poll interval");
                drop(seats);
                let mut stop = lane.stop.clone();
                tokio::select! {
                    _ = stop.changed() => {},
                    () = tokio::time::sleep(self.config.poll_interval) => {},
                }
                return Claimed::Failed;
            }
        };
        if mode == ClaimMode::Fair {
            lane.intake.claimed_in(sent.elapsed());
        }
        let count = claimed.len() as u64;
        metrics::counter!(crate::metrics::TASKS_CLAIMED).increment(count);
        // A full batch: more is probably due; let an idle lane start claiming too. After a fair
        // claim, only when there is room for another: otherwise the woken lane would send a
        // spare-slot claim (the general statement, the costly one) for queues already running.
        let more = match mode {
            ClaimMode::Fair => want == self.config.batch_size && lane.intake.has_room(),
            ClaimMode::Starved => true,
        };
        if claimed.len() == want && more {
            lane.wakeups.wake();
        }
        // Entered before anything is awaited, so a cancel that arrives while the batch's
        // capabilities are read is kept for the guest instead of waiting for the poll.
        let cancels = lane.in_flight.enter(claimed.iter().map(|t| (t.id, t.attempt)));
        if let Some(conn) = held.conn.as_mut() {
            self.capabilities.prefetch(conn, &claimed).await;
        }
        let mut seats = seats.split(claimed.len());
        for (task, cancelled) in claimed.into_iter().zip(cancels) {
            let Some(seat) = seats.pop() else {
                lane.in_flight.leave(task.id);
                continue;
            };
            let hold = Hold::new(&lane.leases, (task.id, task.attempt));
            self.spawn_task(task, seat, hold, lane, cancelled);
        }
        Claimed::Tasks(count)
    }

    /// One claim statement on the lane's connection, taken from the pool first if the lane
    /// has none; a connection whose claim failed is dropped (it may be broken), so the next
    /// claim takes a fresh one.
    async fn claim_on(
        &self,
        held: &mut LaneClaims,
        want: usize,
        mode: ClaimMode,
    ) -> Result<Vec<ClaimedTask>, QueueError> {
        let conn = match &mut held.conn {
            Some(conn) => conn,
            None => held.conn.insert((&self.store).connect().await?),
        };
        let claimed = queue::claim_from(
            conn,
            self.id,
            want,
            &self.config.task_types,
            self.config.lease,
            mode,
            &mut held.cursor,
        )
        .await;
        if claimed.is_err() {
            held.conn = None;
        }
        claimed
    }

    /// How long a lane that found nothing due sleeps unless a wake-up comes first: until the
    /// earliest due time the queue hints hold (`queue::next_due_in`), so a delayed task starts
    /// at its `run_at`, and at most the poll interval. While a hint has passed with nothing
    /// claimed (an early hint, or a queue held back by its caps) it looks again after
    /// [`EARLY_RETRY`], doubling on each empty claim in a row up to the poll interval: an early
    /// hint is raised by the next claim that probes its queue, and may hide a task due sooner
    /// than the poll interval; a held-back queue costs a few claims per idle spell. Asked on
    /// the lane's own connection, and only after a claim that came back empty: a busy lane
    /// never sends it.
    async fn idle_wait(&self, held: &mut LaneClaims) -> std::time::Duration {
        let poll = self.config.poll_interval;
        let Some(conn) = held.conn.as_mut() else { return poll };
        match queue::next_due_in(conn, &self.config.task_types).await {
            Ok(next) => {
                let due = next.due_in.map_or(poll, |d| d.min(poll));
                if !next.early {
                    held.early_retry = None;
                    return due;
                }
                let retry = held.early_retry.map_or(EARLY_RETRY, |r| (r * 2).min(poll));
                held.early_retry = Some(retry);
                due.min(retry)
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the next due time failed; polling instead");
                held.conn = None;
                poll
            }
        }
    }

    /// Spawns a claimed task entered in `lane.in_flight`; `cancelled` is its entry's receiver
    /// (a cancel sent before is waiting in it).
    fn spawn_task(
        &self,
        task: ClaimedTask,
        seat: Seat,
        hold: Hold,
        lane: &Lane,
        cancelled: oneshot::Receiver<Instant>,
    ) {
        let id = task.id;
        let worker = self.clone();
        let reports = lane.reports.clone();
        let registry = Arc::clone(&lane.in_flight);
        let (slots, stop) = (Arc::clone(&lane.slots), lane.stop.clone());
        let control = tokio::runtime::Handle::current();
        let handle = self.guests.spawn(async move {
            // A fairly claimed task may have been claimed ahead: it waits for a slot, in claim
            // order, and goes back untouched if the runner stops first.
            let slot = match &seat {
                Seat::Fair(_) => tokio::select! {
                    biased;
                    () = stopped(stop) => None,
                    permit = slots.acquire_owned() => permit.ok(),
                },
                Seat::Spare(_) => None,
            };
            let report = match (&seat, &slot) {
                (Seat::Fair(_), None) => execute::unstarted(task),
                _ => {
                    // Boxed: the run's future is large, and unboxed it would make this one as
                    // large, copied whole on every move into the runtime (`perf`: 3.5% of the
                    // runner's time in a no-op drain went to that copy).
                    Box::pin(execute::execute(
                        &worker.store,
                        &control,
                        &worker.sandbox,
                        &worker.modules,
                        &worker.capabilities,
                        &worker.config,
                        &worker.minutes,
                        task,
                        cancelled,
                    ))
                    .await
                }
            };
            registry.leave(id);
            let ran_for = report.ran().then_some(report.execution.duration);
            // The reporter outlives every task (it stops only when all senders are gone), and
            // lets the lease go once the report is written.
            if reports.send(report).is_ok() {
                hold.handed_over();
            }
            // The slot first, so a lane woken by the room below finds it free.
            drop(slot);
            seat.finished(ran_for);
        });
        // A task that already left (it ended first) is not entered again.
        lane.in_flight.spawned(id, handle.abort_handle());
    }

    /// Aborts whatever still runs after the grace period and hands it back to the queue.
    async fn hand_back(&self, in_flight: &InFlight) -> u64 {
        let stuck = in_flight.abort_all();
        if stuck.is_empty() {
            return 0;
        }
        // Each aborted task lets its lease go as its `Hold` drops.
        match queue::release_batch(&self.store, self.id, &stuck).await {
            Ok(released) => {
                tracing::warn!(
                    count = released.len(),
                    "grace period over: handed running tasks back"
                );
                released.len() as u64
            }
            Err(e) => {
                tracing::error!(error = %e, "could not hand tasks back; their leases will expire");
                0
            }
        }
    }
}

/// Resolves, once every slot is busy, no fair claim is in flight (its tasks are not `running`
/// yet, so their queues would look idle) and the database announced something (an enqueue's
/// notification) or the poll interval passed (the backstop, which also covers delayed tasks
/// coming due), with a spare slot. A wake-up from inside the runner (room for a fair claim, a
/// full batch) announces no new queue, so it sends no spare-slot claim: in a drain of queues
/// that already run, every such claim would come back empty after reading all running tasks.
/// Pending while a slot is free: the caller's slot branch takes over, and a wake-up this lane
/// already took is handed on to whichever lane waits next.
async fn spare_wakeup(lane: &Lane, poll: std::time::Duration) -> Option<OwnedSemaphorePermit> {
    let (mut woken, mut took_wake) = (false, false);
    // The poll's backstop is a deadline: the runner's own wake-ups, which a busy runner sends
    // often, must not push it back (it is what finds a queue that came due without a NOTIFY).
    let mut backstop: Option<tokio::time::Instant> = None;
    loop {
        if lane.intake.has_room() {
            if took_wake {
                lane.wakeups.wake();
            }
            return std::future::pending().await;
        }
        let claim_done = lane.claim_done.notified();
        tokio::pin!(claim_done);
        claim_done.as_mut().enable();
        if lane.fair_claims.load(Ordering::Acquire) > 0 {
            claim_done.await;
            continue;
        }
        if !woken {
            let deadline = *backstop.get_or_insert_with(|| tokio::time::Instant::now() + poll);
            let announced = lane.wakeups.announced();
            let notified = lane
                .wakeups
                .wait(deadline.saturating_duration_since(tokio::time::Instant::now()))
                .await;
            took_wake |= notified;
            woken = !notified || lane.wakeups.announced() != announced;
            continue;
        }
        let permit = Arc::clone(&lane.spare).acquire_owned().await.ok()?;
        if !lane.intake.has_room() && lane.fair_claims.load(Ordering::Acquire) == 0 {
            return Some(permit);
        }
    }
}

/// Most modules a starting runner compiles ahead (the cache's byte bound still applies).
const WARM_MODULES: usize = 64;

/// Compiles the most recently activated modules (of the runner's task types) into the cache,
/// one at a time, until done or stopped. A task that needs one of them meanwhile waits for the
/// same compile (the cache runs each sha256's compile once). Failures only cost the warm-up:
/// the task that needs the module reports them.
async fn warm_modules(
    store: Store,
    modules: ModuleCache,
    task_types: Vec<String>,
    mut stop: watch::Receiver<bool>,
) {
    let shas = match queue::active_module_shas(&store, &task_types, WARM_MODULES).await {
        Ok(shas) => shas,
        Err(e) => {
            tracing::debug!(error = %e, "could not list the active modules to compile ahead");
            return;
        }
    };
    let started = std::time::Instant::now();
    let mut compiled = 0;
    for sha256 in shas {
        let load = || execute::registered_bytes(&store, &sha256);
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            done = modules.get_or_compile(&sha256, load) => match done {
                Ok(_) => compiled += 1,
                Err(e) => tracing::debug!(%sha256, error = %e, "compiling ahead failed"),
            },
        }
    }
    if compiled > 0 {
        let ms = started.elapsed().as_millis() as u64;
        tracing::info!(modules = compiled, ms, "compiled the active modules ahead");
    }
}

/// What a claim lane keeps from one claim to the next.
///
/// - Its claim cursor (`queue::ClaimCursor`): its next claim from a single due queue starts
///   where its last one ended.
/// - Its connection, held between claims rather than taken from the pool each time. The claim
///   function is a large PL/pgSQL function, and each server process compiles and plans it
///   on its first call: 5-25 ms, once per connection. Through the pool, the claims rotated
///   over every connection the runner had opened, and on an idle queue each of those first
///   calls fell on a task's way to its start (the p99 of enqueue-to-start). A held connection
///   pays it once per lane, at the runner's first claim.
#[derive(Default)]
struct LaneClaims {
    cursor: ClaimCursor,
    conn: Option<Conn<sqlx::pool::PoolConnection<sqlx::Postgres>>>,
    /// The last wait after an empty claim that saw a passed hint (see `idle_wait`); `None`
    /// once a claim takes tasks or no hint has passed.
    early_retry: Option<std::time::Duration>,
}

/// The first wait of a lane whose empty claim saw a passed hint (see `Worker::idle_wait`).
const EARLY_RETRY: std::time::Duration = std::time::Duration::from_millis(2);

/// What one claim of a lane came to.
enum Claimed {
    /// This many tasks were claimed and spawned (0: nothing was due).
    Tasks(u64),
    /// The claim statement failed; the lane has already waited out the poll interval.
    Failed,
}

/// Counts a fair claim as in flight until dropped (after its tasks were spawned, or on error).
struct FairClaim<'a>(&'a Lane);

impl<'a> FairClaim<'a> {
    fn start(lane: &'a Lane) -> Self {
        lane.fair_claims.fetch_add(1, Ordering::AcqRel);
        FairClaim(lane)
    }
}

impl Drop for FairClaim<'_> {
    fn drop(&mut self) {
        self.0.fair_claims.fetch_sub(1, Ordering::AcqRel);
        self.0.claim_done.notify_waiters();
    }
}

/// Room for one claim's tasks: reserved in the intake (fair) or spare permits (starved).
enum Seats {
    Fair(Reservation),
    Spare(Vec<OwnedSemaphorePermit>),
}

/// One claimed task's place: it gives it back when its report is queued (or when dropped).
enum Seat {
    Fair(Ticket),
    Spare(OwnedSemaphorePermit),
}

impl Seats {
    fn mode(&self) -> ClaimMode {
        match self {
            Seats::Fair(_) => ClaimMode::Fair,
            Seats::Spare(_) => ClaimMode::Starved,
        }
    }

    fn len(&self) -> usize {
        match self {
            Seats::Fair(r) => r.len(),
            Seats::Spare(p) => p.iter().map(OwnedSemaphorePermit::num_permits).sum(),
        }
    }

    /// One seat per task; the rest goes back when dropped.
    fn split(self, tasks: usize) -> Vec<Seat> {
        match self {
            Seats::Fair(mut room) => {
                let mut seats = Vec::with_capacity(tasks);
                while seats.len() < tasks {
                    let Some(ticket) = room.take_one() else { break };
                    seats.push(Seat::Fair(ticket));
                }
                seats
            }
            Seats::Spare(permits) => {
                split_permits(permits, tasks).into_iter().map(Seat::Spare).collect()
            }
        }
    }
}

impl Seat {
    fn finished(self, ran_for: Option<std::time::Duration>) {
        match self {
            Seat::Fair(ticket) => ticket.finished(ran_for),
            Seat::Spare(permit) => drop(permit),
        }
    }
}

/// `first` plus as many free permits of `semaphore` as a batch allows.
fn top_up(
    semaphore: &Arc<Semaphore>,
    first: OwnedSemaphorePermit,
    batch: usize,
) -> Vec<OwnedSemaphorePermit> {
    let mut permits = vec![first];
    let extra = semaphore.available_permits().min(batch - 1);
    if extra > 0 {
        if let Ok(more) = Arc::clone(semaphore).try_acquire_many_owned(extra as u32) {
            permits.push(more);
        }
    }
    permits
}

/// Resolves once `stop` says true (at once if it already does).
async fn stopped(mut stop: watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Splits a set of permits into one single-slot permit per task, returning the rest to the
/// semaphore when dropped.
fn split_permits(permits: Vec<OwnedSemaphorePermit>, tasks: usize) -> Vec<OwnedSemaphorePermit> {
    let mut singles = Vec::with_capacity(tasks);
    for mut p in permits {
        while p.num_permits() > 1 && singles.len() < tasks {
            if let Some(one) = p.split(1) {
                singles.push(one);
            }
        }
        if singles.len() < tasks {
            singles.push(p);
        }
    }
    singles
}

/// Resolves once SIGINT or SIGTERM arrives.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
