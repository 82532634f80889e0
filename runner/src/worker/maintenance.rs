//! Background duties of every runner: heartbeats (the leases it holds + its `runners` row),
//! the reaper, vacuuming the live table, retention, pruning of silent runner rows, the
//! repair of queue hints and the cron scheduler (`worker/scheduler.rs`). Each stops when the stop flag turns true.
//! All of it is safe to run on every runner at once (see `queue::maintenance`).
//!
//! Outages: a heartbeat that cannot reach Postgres tries again every [`HEARTBEAT_RETRY`], so
//! leases are renewed right after the database answers again. The reaper holds off for one
//! lease after its runner started or last failed to reach the database, and Postgres refuses
//! rescues for one lease after the server started: after an outage every lease looks expired,
//! and the runners holding them get that long to renew them and write their reports first.

use std::{future::Future, sync::Arc, time::Duration};

use tokio::{sync::watch, time::MissedTickBehavior};
use uuid::Uuid;

use super::liveness::{HeldLeases, Reachability};
use crate::{
    config::WorkerConfig,
    queue::{self, Store},
};

/// Most expired leases rescued per statement.
const REAP_BATCH: usize = 1000;
/// How soon a heartbeat that failed is tried again.
const HEARTBEAT_RETRY: Duration = Duration::from_millis(500);

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

pub(super) async fn run(
    store: Store,
    runner: Uuid,
    config: Arc<WorkerConfig>,
    reach: Arc<Reachability>,
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
    let vacuum_stop = stop.clone();
    let vacuum = async {
        let Some(period) = m.vacuum_interval else { return };
        every(period, vacuum_stop, || async {
            if let Err(e) = queue::vacuum_live(&store).await {
                tracing::warn!(error = %e, "vacuuming the task table failed");
            }
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
    tokio::join!(reaper, vacuum, retention, hints, scheduler);
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
