//! Runner settings: plain structs with `DEFAULT_*` constants and a `validate()` that
//! cross-checks fields. No environment reads here: `main.rs` parses flags and env once.

use std::time::Duration;

use crate::{queue::RetryPolicy, sandbox::SandboxConfig};

pub const DEFAULT_CONCURRENCY: usize = 16;
/// Instances beyond `concurrency` that let a queue with nothing running start at once.
pub const DEFAULT_SPARE_SLOTS: usize = 4;
/// Most tasks one claim statement takes. A claim's fixed cost in Postgres is several times a
/// claimed row's, so large claims are what keeps Postgres's CPU per task low; claims only get
/// this large when the claim-ahead buffer is (short tasks), see `worker::intake`.
pub const DEFAULT_BATCH_SIZE: usize = 250;
/// Claim statements a runner keeps in flight at once.
pub const DEFAULT_CLAIMERS: usize = 2;
/// Most tasks claimed ahead of free slots (the buffer's size adapts below it, see
/// `worker::intake`: never more than the slots finish in one claim round trip, so a larger cap
/// only matters for tasks much shorter than a round trip). Measured on 2 cores, empty guest:
/// 50 -> 15,400-16,700 tasks/s, 200 -> 19,500-20,000, 1,000 (with claims of 250) -> 27,800.
pub const DEFAULT_MAX_AHEAD: usize = 1000;
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(10);
pub const DEFAULT_REAPER_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_RETENTION_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(60);
pub const DEFAULT_RETENTION_BATCH: usize = 1000;
/// How often a runner vacuums the live table (see `queue::vacuum_live`).
pub const DEFAULT_VACUUM_INTERVAL: Duration = Duration::from_secs(10);
/// How often a runner checks queue hints that say nothing is due (see
/// `queue::repair_queue_hints`).
pub const DEFAULT_HINT_REPAIR_INTERVAL: Duration = Duration::from_secs(5);
/// The longest a runner's cron scheduler sleeps between passes (it wakes at the next due tick
/// sooner; see `worker/scheduler.rs`).
pub const DEFAULT_SCHEDULER_INTERVAL: Duration = Duration::from_secs(1);
/// How often a runner adds what it ran to the charts' per-minute counters.
pub const DEFAULT_MINUTES_INTERVAL: Duration = Duration::from_secs(5);
/// Runner rows silent for this long are pruned from `runners`.
pub const DEFAULT_RUNNER_EXPIRY: Duration = Duration::from_secs(3600);
/// Most reports written in one completion statement.
pub const DEFAULT_REPORT_BATCH: usize = 500;
/// How long finished reports wait for an unreachable Postgres before they are given up: a task
/// that finishes during an outage shorter than this is recorded as finished, not run again.
pub const DEFAULT_REPORT_HOLD: Duration = Duration::from_secs(300);
/// Most bytes of reports (results, logs, error details) kept while Postgres is unreachable.
pub const DEFAULT_REPORT_BUFFER_BYTES: usize = 64 << 20;
/// How long a runner reuses a task's capabilities for the same module version: an egress
/// change, a secret set or deleted reaches every runner's next tasks within this.
pub const DEFAULT_CAPABILITIES_TTL: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    /// Tasks that run at once.
    pub concurrency: usize,
    /// Extra instances, used only for queues with nothing running on any runner while every
    /// slot is busy (see `worker`). The sandbox needs `concurrency + spare_slots` instances.
    pub spare_slots: usize,
    /// Most tasks claimed per statement.
    pub batch_size: usize,
    /// Claim loops running side by side, so one claim's round trip does not idle the slots.
    pub claimers: usize,
    /// Most tasks claimed ahead of free slots, kept ready so a freed slot starts at once (the
    /// runner sizes the buffer below this from its claim round trips and task durations; 0:
    /// claim for free slots only).
    pub max_ahead: usize,
    /// How long a claim is leased; heartbeats renew it every third of this.
    pub lease: Duration,
    /// Backstop for NOTIFY wake-ups.
    pub poll_interval: Duration,
    /// On shutdown, how long running tasks may take to finish before they are handed back.
    pub grace_period: Duration,
    /// Only claim these task types (empty: all).
    pub task_types: Vec<String>,
    /// Backoff for task types whose module sets none.
    pub retry: RetryPolicy,
    pub report_batch: usize,
    /// How long reports wait for an unreachable Postgres before they are given up (and their
    /// leases let lapse, so the tasks run again).
    pub report_hold: Duration,
    /// Most bytes of reports kept while Postgres is unreachable; the oldest go first.
    pub report_buffer_bytes: usize,
    /// Most bytes of compiled modules a runner keeps (see `sandbox::ModuleCache`); past it the
    /// least used are evicted and compiled again when next needed.
    pub module_cache_bytes: u64,
    pub maintenance: MaintenanceConfig,
    pub sandbox: SandboxConfig,
    /// The key tenant secrets were sealed under (`SWEEP_SECRETS_KEY`). `None`: tasks whose
    /// module names secrets fail as `secrets_unavailable` instead of running without them.
    pub secrets_key: Option<crate::secrets::SecretsKey>,
    /// How long a task's capabilities (its tenant's egress policy and HTTP limits, its
    /// module's secrets) are reused for tasks of the same module version: a change to a
    /// policy or secret reaches every runner within this (see `worker/capabilities.rs`).
    pub capabilities_ttl: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MaintenanceConfig {
    pub reaper_interval: Duration,
    pub retention_ttl: Duration,
    pub retention_interval: Duration,
    pub retention_batch: usize,
    pub runner_expiry: Duration,
    pub hint_repair_interval: Duration,
    /// Vacuum the live table this often; `None` leaves it to autovacuum.
    pub vacuum_interval: Option<Duration>,
    /// Run due cron schedules, looking at least this often; `None`: this runner runs none.
    pub scheduler_interval: Option<Duration>,
    /// How often the runner adds what it ran to the charts' per-minute counters.
    pub minutes_interval: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            reaper_interval: DEFAULT_REAPER_INTERVAL,
            retention_ttl: DEFAULT_RETENTION_TTL,
            retention_interval: DEFAULT_RETENTION_INTERVAL,
            retention_batch: DEFAULT_RETENTION_BATCH,
            runner_expiry: DEFAULT_RUNNER_EXPIRY,
            hint_repair_interval: DEFAULT_HINT_REPAIR_INTERVAL,
            vacuum_interval: Some(DEFAULT_VACUUM_INTERVAL),
            scheduler_interval: Some(DEFAULT_SCHEDULER_INTERVAL),
            minutes_interval: DEFAULT_MINUTES_INTERVAL,
        }
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: DEFAULT_CONCURRENCY,
            spare_slots: DEFAULT_SPARE_SLOTS,
            batch_size: DEFAULT_BATCH_SIZE,
            claimers: DEFAULT_CLAIMERS,
            max_ahead: DEFAULT_MAX_AHEAD,
            lease: DEFAULT_LEASE,
            poll_interval: DEFAULT_POLL_INTERVAL,
            grace_period: DEFAULT_GRACE_PERIOD,
            task_types: Vec::new(),
            retry: RetryPolicy::default(),
            report_batch: DEFAULT_REPORT_BATCH,
            report_hold: DEFAULT_REPORT_HOLD,
            report_buffer_bytes: DEFAULT_REPORT_BUFFER_BYTES,
            module_cache_bytes: crate::sandbox::DEFAULT_MODULE_CACHE_BYTES,
            maintenance: MaintenanceConfig::default(),
            sandbox: SandboxConfig {
                max_concurrency: (DEFAULT_CONCURRENCY + DEFAULT_SPARE_SLOTS) as u32,
                ..SandboxConfig::default()
            },
            secrets_key: None,
            capabilities_ttl: DEFAULT_CAPABILITIES_TTL,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    #[error("the lease ({lease:?}) must be at least three times the poll granularity of 1s")]
    LeaseTooShort { lease: Duration },
    #[error(
        "concurrency ({concurrency}) plus spare slots ({spare}) exceeds the sandbox's \
         max_concurrency ({sandbox})"
    )]
    ConcurrencyAboveSandbox { concurrency: usize, spare: usize, sandbox: u32 },
    #[error("retry policy: {0}")]
    Retry(#[from] crate::queue::RetryPolicyError),
    #[error("sandbox: {0}")]
    Sandbox(#[from] crate::sandbox::ConfigError),
}

impl WorkerConfig {
    /// The interval between lease renewals.
    pub fn heartbeat_interval(&self) -> Duration {
        self.lease / 3
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("concurrency", self.concurrency),
            ("batch_size", self.batch_size),
            ("claimers", self.claimers),
            ("report_batch", self.report_batch),
            ("report_buffer_bytes", self.report_buffer_bytes),
            ("retention_batch", self.maintenance.retention_batch),
            ("module_cache_bytes", usize::try_from(self.module_cache_bytes).unwrap_or(usize::MAX)),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        for (name, value) in [
            ("poll_interval", self.poll_interval),
            ("report_hold", self.report_hold),
            ("reaper_interval", self.maintenance.reaper_interval),
            ("retention_interval", self.maintenance.retention_interval),
            ("hint_repair_interval", self.maintenance.hint_repair_interval),
            ("vacuum_interval", self.maintenance.vacuum_interval.unwrap_or(Duration::MAX)),
            ("scheduler_interval", self.maintenance.scheduler_interval.unwrap_or(Duration::MAX)),
        ] {
            if value.is_zero() {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.lease < Duration::from_secs(3) {
            return Err(ConfigError::LeaseTooShort { lease: self.lease });
        }
        let sandbox_slots = self.sandbox.max_concurrency;
        let instances = self.concurrency.saturating_add(self.spare_slots);
        if u32::try_from(instances).map_or(true, |c| c > sandbox_slots) {
            return Err(ConfigError::ConcurrencyAboveSandbox {
                concurrency: self.concurrency,
                spare: self.spare_slots,
                sandbox: sandbox_slots,
            });
        }
        self.retry.validate()?;
        self.sandbox.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        assert_eq!(WorkerConfig::default().validate(), Ok(()));
    }

    #[test]
    fn cross_checks_catch_inconsistent_settings() {
        let c = WorkerConfig { concurrency: 0, ..WorkerConfig::default() };
        assert_eq!(c.validate(), Err(ConfigError::Zero("concurrency")));
        let c = WorkerConfig { lease: Duration::from_secs(1), ..WorkerConfig::default() };
        assert!(matches!(c.validate(), Err(ConfigError::LeaseTooShort { .. })));
        let c = WorkerConfig { concurrency: 1000, ..WorkerConfig::default() };
        assert!(matches!(c.validate(), Err(ConfigError::ConcurrencyAboveSandbox { .. })));
        let mut c = WorkerConfig::default();
        c.maintenance.vacuum_interval = Some(Duration::ZERO);
        assert_eq!(c.validate(), Err(ConfigError::Zero("vacuum_interval")));
        c.maintenance.vacuum_interval = None;
        assert_eq!(c.validate(), Ok(()), "no vacuum interval: autovacuum's job");
    }
}
