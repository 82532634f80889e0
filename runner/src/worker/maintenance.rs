//! Background duties of every runner: heartbeats (the leases it holds + its `runners` row),
//! the reaper, vacuuming the live table, retention, pruning of silent runner rows, rejecting
//! module compiles their uploader left unfinished, the repair of queue hints, flushing the
//! per-minute counters and folding the history counts' deltas, and the cron scheduler
//! (`worker/scheduler.rs`). Each stops when the stop flag turns true.
//! All of it is safe to run on every runner at once (see `queue::maintenance`).
//!
//! Outages: a heartbeat that cannot reach Postgres tries again every [`HEARTBEAT_RETRY`], so
//! leases are renewed right after the database answers again. The reaper holds off for one
//! lease after its runner started or last failed to reach the database, and Postgres refuses
//! rescues for one lease after the server started: after an outage every lease looks expired,
//! and the runners holding them get that long to renew them and write their reports first.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, PoisonError,
    },
    time::{Duration, Instant},
};

use tokio::{sync::watch, time::MissedTickBehavior};
use uuid::Uuid;

use super::liveness::{HeldLeases, Reachability};
use super::minutes::Tally;
use crate::{
    config::WorkerConfig,
    queue::{self, Store},
};

/// How long the charts' per-minute counters are kept: the longest range they show (7 days)
/// and a day more.
const MINUTES_KEPT: Duration = Duration::from_secs(8 * 24 * 3600);
/// How long compiled artifacts of another engine (or key) than this runner's are kept: past a
/// rolling upgrade (runners of the old engine still load them meanwhile), then deleted.
const OTHER_ENGINE_ARTIFACTS_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most expired leases rescued per statement.
const REAP_BATCH: usize = 1000;
/// How soon a heartbeat that failed is tried again.
const HEARTBEAT_RETRY: Duration = Duration::from_millis(500);
/// Tasks this runner reports between two vacuums of the live table when work flows fast (the
/// interval, `--vacuum-ms`, is the longest wait). Why: every claimed and every finished task
/// leaves a dead entry at the front of the claim index, and each claim walks over all of them
/// until a vacuum removes them: at 10,000+ tasks/s, a claim 10 s after the last vacuum reads
/// hundreds of index pages of dead entries (drains measured 13,000 tasks/s with a 10 s vacuum,
/// 15,700 with 1 s).
const VACUUM_AFTER_TASKS: u64 = 5_000;
/// How often the vacuum looks at that count, and so the shortest gap between two vacuums.
const VACUUM_CHECK: Duration = Duration::from_secs(1);
/// A vacuum's own cost bounds how often work triggers one: at least this many times its last
/// duration apart, so a table with a huge backlog (whose indexes every vacuum scans whole) is
/// not vacuumed back to back.
const VACUUM_COST_FACTOR: u32 = 10;

pub(super) async fn heartbeat(
    store: Store,
    runner: Uuid,
    lease: Duration,
    leases: Arc<HeldLeases>,
    reach: Arc<Reachability>,
    mut stop: watch::Receiver<bool>,
) {
    let period = lease / 3;
    loop {
        let wait = match queue::heartbeat_leases(&store, runner, lease, &leases.snapshot()).await {
            Ok(_) => period,
            Err(e) => {
                reach.note(&e);
                tracing::warn!(error = %e, "heartbeat failed");
                HEARTBEAT_RETRY.min(period)
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    store: Store,
    runner: Uuid,
    artifact_engine: String,
    config: Arc<WorkerConfig>,
    reach: Arc<Reachability>,
    reported: Arc<AtomicU64>,
    minutes: Arc<Tally>,
    stop: watch::Receiver<bool>,
) {
    let m = &config.maintenance;
    let reaper = every(m.reaper_interval, stop.clone(), || async {
        if reach.steady_for() < config.lease {
            // Just started or reconnected: leases that look expired may belong to runners that
            // were cut off like this one and are about to renew them.
            return;
        }
        // Rescued tasks back off with their type's policy, over the runner's default.
        match queue::reap_expired(&store, runner, REAP_BATCH, config.retry, config.lease).await {
            Ok(r) if !(r.retrying.is_empty() && r.dead.is_empty()) => tracing::warn!(
                retrying = r.retrying.len(),
                dead = r.dead.len(),
                "rescued tasks whose runner stopped heartbeating"
            ),
            Ok(_) => {}
            Err(e) => {
                reach.note(&e);
                tracing::warn!(error = %e, "reaper failed");
            }
        }
    });
    // Read and written between awaits only, never held across one.
    let vacuum_pace = Mutex::new(VacuumPace::new(reported.load(Ordering::Relaxed)));
    let vacuum = async {
        let Some(interval) = m.vacuum_interval else { return };
        every(interval.min(VACUUM_CHECK), stop.clone(), || async {
            let now_reported = reported.load(Ordering::Relaxed);
            if !lock(&vacuum_pace).due(now_reported, interval) {
                return;
            }
            let started = Instant::now();
            if let Err(e) = queue::vacuum_live(&store).await {
                tracing::warn!(error = %e, "vacuuming the task table failed");
            }
            lock(&vacuum_pace).vacuumed(now_reported, started);
        })
        .await
    };
    let retention = every(m.retention_interval, stop.clone(), || async {
        loop {
            match queue::retain_finished(&store, m.retention_ttl, m.retention_batch).await {
                Ok(r) => {
                    if r.created > 0 || r.dropped > 0 {
                        tracing::info!(
                            created = r.created,
                            dropped = r.dropped,
                            "finished-task partitions maintained"
                        );
                    }
                    if r.deleted as usize >= m.retention_batch {
                        continue;
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "retention failed");
                    break;
                }
            }
        }
        if let Err(e) = queue::prune_runners(&store, m.runner_expiry).await {
            tracing::warn!(error = %e, "pruning runners failed");
        }
        if let Err(e) = queue::prune_minutes(&store, MINUTES_KEPT, m.retention_batch).await {
            tracing::warn!(error = %e, "pruning the charts' old minutes failed");
        }
        let kept = OTHER_ENGINE_ARTIFACTS_KEPT;
        let key_id = config.secrets_key.as_ref().map(|key| key.id());
        match queue::prune_artifacts(&store, &artifact_engine, key_id, kept).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(artifacts = n, "pruned compiled artifacts nothing needs"),
            Err(e) => tracing::warn!(error = %e, "pruning compiled artifacts failed"),
        }
        let interrupted_after = interrupted_after(&config.sandbox.compile);
        match queue::reject_interrupted_compiles(&store, interrupted_after).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                modules = n,
                "rejected module versions whose compile was interrupted (their uploader stopped)"
            ),
            Err(e) => tracing::warn!(error = %e, "rejecting interrupted compiles failed"),
        }
    });
    let counts = every(m.minutes_interval, stop.clone(), || async {
        if let Err(e) = minutes.flush(&store).await {
            tracing::warn!(error = %e, "adding the charts' per-minute counts failed; kept for the next try");
        }
        if let Err(e) = queue::fold_kept_counts(&store).await {
            tracing::warn!(error = %e, "folding the kept counts' deltas failed; kept for the next try");
        }
    });
    let hints = every(m.hint_repair_interval, stop.clone(), || async {
        match queue::repair_queue_hints(&store).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(queues = n, "repaired queue hints that were late"),
            Err(e) => tracing::warn!(error = %e, "repairing queue hints failed"),
        }
    });
    let scheduler_stop = stop.clone();
    let scheduler = async {
        let Some(period) = m.scheduler_interval else { return };
        super::scheduler::run(store.clone(), period, scheduler_stop).await
    };
    tokio::join!(reaper, vacuum, retention, hints, scheduler, counts);
}

/// How old a version still `compiling` must be before it counts as interrupted: twice the
/// longest compile this runner's limits allow (the uploading process may have other limits,
/// and its compile may have waited for a slot first), and a minute more.
fn interrupted_after(compile: &crate::sandbox::CompileLimits) -> Duration {
    compile.longest_compile().saturating_mul(2).saturating_add(Duration::from_secs(60))
}

/// When the live table is next vacuumed: after `interval` at the latest, sooner once this
/// runner reported [`VACUUM_AFTER_TASKS`] since the last vacuum (and the last one's cost allows).
#[derive(Debug)]
struct VacuumPace {
    last: Instant,
    last_cost: Duration,
    reported_then: u64,
}

impl VacuumPace {
    fn new(reported: u64) -> Self {
        VacuumPace { last: Instant::now(), last_cost: Duration::ZERO, reported_then: reported }
    }

    fn due(&self, reported: u64, interval: Duration) -> bool {
        let since = self.last.elapsed();
        since >= interval
            || (reported.saturating_sub(self.reported_then) >= VACUUM_AFTER_TASKS
                && since >= self.last_cost * VACUUM_COST_FACTOR)
    }

    fn vacuumed(&mut self, reported: u64, started: Instant) {
        self.last_cost = started.elapsed();
        self.last = Instant::now();
        self.reported_then = reported;
    }
}

fn lock(pace: &Mutex<VacuumPace>) -> MutexGuard<'_, VacuumPace> {
    pace.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Calls `tick` every `period` until `stop` turns true.
async fn every<F, Fut>(period: Duration, mut stop: watch::Receiver<bool>, mut tick: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => tick().await,
            // The flag only ever turns true (or its sender goes away): any change means stop.
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vacuums_follow_the_work_within_the_interval_and_their_own_cost() {
        let interval = Duration::from_secs(10);
        let mut pace = VacuumPace::new(100);
        assert!(!pace.due(100 + VACUUM_AFTER_TASKS - 1, interval), "too little work yet");
        assert!(pace.due(100 + VACUUM_AFTER_TASKS, interval), "enough work");
        // A vacuum that took 2 s: work alone brings the next one no sooner than 20 s later.
        pace.vacuumed(100, Instant::now() - Duration::from_secs(2));
        assert!(!pace.due(100 + 10 * VACUUM_AFTER_TASKS, Duration::from_secs(60)));
        // The interval still holds when nothing is reported.
        pace.last = Instant::now() - interval;
        assert!(pace.due(100, interval));
    }
}
