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

/// Counts by tenant, then task type, then minute: nested so that counting into a key that
/// exists borrows the names instead of copying them (twice per task), and so that a flush
/// sends the keys in order.
type Counts = BTreeMap<String, BTreeMap<String, BTreeMap<DateTime<Utc>, MinuteDelta>>>;

/// Counts not yet added to Postgres, by (tenant, task type, minute).
#[derive(Debug, Default)]
pub struct Tally {
    counts: Mutex<Counts>,
}

fn minute(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::minutes(1)).unwrap_or(at)
}

fn empty(tenant: &str, task_type: &str, minute: DateTime<Utc>) -> MinuteDelta {
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
}

/// The delta of (tenant, task type, minute) in `counts`, made empty if there is none.
fn entry<'a>(
    counts: &'a mut Counts,
    tenant: &str,
    task_type: &str,
    minute: DateTime<Utc>,
) -> &'a mut MinuteDelta {
    if !counts.contains_key(tenant) {
        counts.insert(tenant.to_owned(), BTreeMap::new());
    }
    let types = counts.get_mut(tenant).expect("inserted above");
    if !types.contains_key(task_type) {
        types.insert(task_type.to_owned(), BTreeMap::new());
    }
    let minutes = types.get_mut(task_type).expect("inserted above");
    minutes.entry(minute).or_insert_with(|| empty(tenant, task_type, minute))
}

impl Tally {
    fn with(
        &self,
        tenant: &str,
        task_type: &str,
        at: DateTime<Utc>,
        f: impl FnOnce(&mut MinuteDelta),
    ) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        f(entry(&mut counts, tenant, task_type, minute(at)));
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
        // In key order, as the nesting keeps them: runners flushing at once upsert the same
        // rows in the same order.
        let deltas: Vec<MinuteDelta> = taken
            .into_values()
            .flat_map(BTreeMap::into_values)
            .flat_map(BTreeMap::into_values)
            .collect();
        if deltas.is_empty() {
            return Ok(());
        }
        match queue::add_minutes(store, &deltas).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
                for delta in deltas {
                    let kept = entry(&mut counts, &delta.tenant, &delta.task_type, delta.minute);
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
        let mail: Vec<&MinuteDelta> = counts["acme"]["mail"].values().collect();
        assert_eq!(counts["acme"]["sms"].values().map(|d| d.failed).sum::<i64>(), 1);
        let started: i64 = mail.iter().map(|d| d.started).sum();
        let timeouts: i64 =
            mail.iter().map(|d| d.failures.get("timeout").copied().unwrap_or(0)).sum();
        assert_eq!((started, timeouts), (2, 2));
        assert!(mail.iter().all(|d| d.minute == minute(d.minute)));
        let lag: i64 = mail.iter().map(|d| d.lag_ms[lag_bucket(15)]).sum();
        assert_eq!(lag, 2);
    }
}
