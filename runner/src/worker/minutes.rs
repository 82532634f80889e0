//! The runner's share of the per-minute counters the dashboard charts (`queue::add_minutes`):
//! starts and their due-to-start time, successes and failed attempts by kind, counted in
//! memory as tasks run and added to Postgres by maintenance every few seconds and once more at
//! shutdown.
//!
//! Why in memory: the counts then cost the claim and the reports nothing (no statement, no row
//! lock shared between runners on their way); one small upsert per flush interval is all.
//! What that means: minutes are this runner's clock (the due time is Postgres's, as for
//! `sweep_queue_lag_seconds`); an attempt counts when it ends on the runner, so one whose report
//! was later lost or given up counts too (it did run); a runner killed outright loses what it
//! counted since its last flush.
//!
//! Invariant: a failed flush keeps its counts for the next one (counts are only ever added).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};

use crate::queue::{self, lag_bucket, MinuteDelta, QueueError, Store, MINUTE_LAG_BUCKETS};

type Key = (String, String, DateTime<Utc>);

/// Counts not yet added to Postgres, by (tenant, task type, minute).
#[derive(Debug, Default)]
pub struct Tally {
    counts: Mutex<BTreeMap<Key, MinuteDelta>>,
}

fn minute(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::minutes(1)).unwrap_or(at)
}

impl Tally {
    fn with(
        &self,
        tenant: &str,
        task_type: &str,
        at: DateTime<Utc>,
        f: impl FnOnce(&mut MinuteDelta),
    ) {
        let minute = minute(at);
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let delta =
            counts.entry((tenant.to_owned(), task_type.to_owned(), minute)).or_insert_with(|| {
                MinuteDelta {
                    tenant: tenant.to_owned(),
                    task_type: task_type.to_owned(),
                    minute,
                    succeeded: 0,
                    failed: 0,
                    failures: BTreeMap::new(),
                    started: 0,
                    lag_ms: vec![0; MINUTE_LAG_BUCKETS],
                }
            });
        f(delta);
    }

    /// A task started `lag_ms` after it was due.
    pub fn started(&self, tenant: &str, task_type: &str, lag_ms: i64) {
        self.with(tenant, task_type, Utc::now(), |d| {
            d.started += 1;
            d.lag_ms[lag_bucket(lag_ms.max(0))] += 1;
        });
    }

    /// An attempt ended: `None` for a success, else its failure kind.
    pub fn ended(&self, tenant: &str, task_type: &str, failure: Option<&str>) {
        self.with(tenant, task_type, Utc::now(), |d| match failure {
            None => d.succeeded += 1,
            Some(kind) => {
                d.failed += 1;
                *d.failures.entry(kind.to_owned()).or_default() += 1;
            }
        });
    }

    /// Adds what was counted to Postgres; on failure the counts stay for the next flush.
    pub async fn flush(&self, store: &Store) -> Result<(), QueueError> {
        let taken =
            std::mem::take(&mut *self.counts.lock().unwrap_or_else(PoisonError::into_inner));
        if taken.is_empty() {
            return Ok(());
        }
        let deltas: Vec<MinuteDelta> = taken.values().cloned().collect();
        match queue::add_minutes(store, &deltas).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
                for (key, delta) in taken {
                    let kept = counts.entry(key).or_insert_with(|| MinuteDelta {
                        succeeded: 0,
                        failed: 0,
                        failures: BTreeMap::new(),
                        started: 0,
                        lag_ms: vec![0; MINUTE_LAG_BUCKETS],
                        ..delta.clone()
                    });
                    kept.succeeded += delta.succeeded;
                    kept.failed += delta.failed;
                    kept.started += delta.started;
                    for (kind, n) in delta.failures {
                        *kept.failures.entry(kind).or_default() += n;
                    }
                    for (slot, n) in kept.lag_ms.iter_mut().zip(delta.lag_ms) {
                        *slot += n;
                    }
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn counts_gather_per_key() {
        let tally = Tally::default();
        tally.started("acme", "mail", 15);
        tally.started("acme", "mail", 15);
        tally.ended("acme", "mail", None);
        tally.ended("acme", "mail", Some("timeout"));
        tally.ended("acme", "mail", Some("timeout"));
        tally.ended("acme", "sms", Some("trap"));
        let counts = tally.counts.lock().unwrap();
        let mail: Vec<&MinuteDelta> = counts.values().filter(|d| d.task_type == "mail").collect();
        let started: i64 = mail.iter().map(|d| d.started).sum();
        let timeouts: i64 =
            mail.iter().map(|d| d.failures.get("timeout").copied().unwrap_or(0)).sum();
        assert_eq!((started, timeouts), (2, 2));
        assert!(mail.iter().all(|d| d.minute == minute(d.minute)));
        let lag: i64 = mail.iter().map(|d| d.lag_ms[lag_bucket(15)]).sum();
        assert_eq!(lag, 2);
    }
}
