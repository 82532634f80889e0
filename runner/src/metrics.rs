//! Metrics: the names the runner records under, and the Prometheus recorder that `/metrics`
//! renders.
//!
//! Owns: the metric and label name constants (the worker records with
//! `metrics::counter!(sweep::metrics::TASKS_CLAIMED)` and friends), [`install`] (the global
//! Prometheus recorder, with descriptions and histogram buckets), [`set_queue_gauges`]
//! (the per-state task gauges, refreshed from the queue at scrape time) and
//! [`set_instance_metrics`] (the kept instances, from the sandbox at scrape time).
//!
//! Invariants:
//! - the recorder is installed at most once per process; [`install`] is idempotent and every
//!   caller gets a handle to the same recorder;
//! - recording without an installed recorder is a no-op (the `metrics` crate's default), so
//!   a runner started with the admin API off pays nothing;
//! - histograms listed here render as Prometheus histograms with fixed buckets, not summaries;
//! - a task-gauge series that disappears from the queue's stats is set to 0, not left stale.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use metrics::Unit;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use crate::queue::{TaskState, TypeStats};
use crate::sandbox::WarmStats;

/// Counter: tasks claimed by this runner.
pub const TASKS_CLAIMED: &str = "sweep_tasks_claimed_total";
/// Counter, label [`LABEL_KIND`]: finished attempts by outcome kind (`success`, `timeout`,
/// `out_of_fuel`, ... as `sandbox::Outcome::kind` names them).
pub const TASK_OUTCOMES: &str = "sweep_task_outcomes_total";
/// Histogram: seconds one task's execution took.
pub const TASK_DURATION: &str = "sweep_task_duration_seconds";
/// Histogram: fuel one task's execution used.
pub const TASK_FUEL: &str = "sweep_task_fuel_used";
/// Histogram: seconds from a runner receiving the cancel of a running task to its instance
/// stopped.
pub const CANCEL_STOP: &str = "sweep_cancel_stop_seconds";
/// Histogram: seconds from a task becoming due (`run_at`) to its start (queue lag).
pub const QUEUE_LAG: &str = "sweep_queue_lag_seconds";
/// Counter: reports fenced out because the lease was lost.
pub const LEASES_LOST: &str = "sweep_leases_lost_total";
/// Counter: reports given up because Postgres stayed unreachable past `report_hold` or
/// `report_buffer_bytes`; their leases lapse and the tasks run again.
pub const REPORTS_ABANDONED: &str = "sweep_reports_abandoned_total";
/// Gauge: reports waiting to be written (nonzero while Postgres cannot be reached).
pub const REPORTS_PENDING: &str = "sweep_reports_pending";
/// Gauge, labels [`LABEL_TENANT`], [`LABEL_TASK_TYPE`], [`LABEL_STATE`]: tasks by state, set
/// from the queue's statistics each time `/metrics` is scraped.
pub const TASKS: &str = "sweep_tasks";
/// Gauge, labels [`LABEL_TENANT`], [`LABEL_TASK_TYPE`]: seconds the oldest due task has
/// waited, set at scrape time.
pub const OLDEST_DUE: &str = "sweep_oldest_due_seconds";
/// Gauge: runners registered (alive or not yet pruned), set at scrape time.
pub const RUNNERS: &str = "sweep_runners";

/// Counter: module compiles started (past the structural limits), uploads and first runs.
pub const MODULE_COMPILES: &str = "sweep_module_compiles_total";
/// Gauge: CPU seconds the last compile in a child process used.
pub const MODULE_COMPILE_CPU: &str = "sweep_module_compile_cpu_seconds";
/// Gauge: peak resident bytes of the last compile in a child process.
pub const MODULE_COMPILE_PEAK_RSS: &str = "sweep_module_compile_peak_rss_bytes";
/// Counter: modules loaded from the fleet's artifact store instead of compiled.
pub const MODULE_ARTIFACT_LOADS: &str = "sweep_module_artifact_loads_total";
/// Counter: stored artifacts refused (hash, engine or wasmtime check) and compiled again.
pub const MODULE_ARTIFACTS_REFUSED: &str = "sweep_module_artifacts_refused_total";

/// Counter, label [`LABEL_TENANT`]: attempts that ran, per tenant (usage, for billing).
pub const TENANT_ATTEMPTS: &str = "sweep_tenant_attempts_total";
/// Counter, label [`LABEL_TENANT`]: of those, attempts that ran on an instance an earlier task
/// of their version left (`reuse`); the rest started a fresh one.
pub const TENANT_ATTEMPTS_KEPT: &str = "sweep_tenant_attempts_on_kept_instances_total";
/// Counter, label [`LABEL_TENANT`]: wall-clock milliseconds of the tenant's attempts.
pub const TENANT_WALL: &str = "sweep_tenant_wall_milliseconds_total";
/// Counter, label [`LABEL_TENANT`]: fuel the tenant's attempts used.
pub const TENANT_FUEL: &str = "sweep_tenant_fuel_total";
/// Counter, label [`LABEL_TENANT`]: outbound HTTP requests the tenant's attempts sent.
pub const TENANT_HTTP_REQUESTS: &str = "sweep_tenant_http_requests_total";
/// Counter, label [`LABEL_TENANT`]: outbound HTTP requests refused (egress policy, limits).
pub const TENANT_HTTP_REFUSED: &str = "sweep_tenant_http_refused_total";
/// Counter, label [`LABEL_TENANT`]: request body bytes the tenant's attempts sent.
pub const TENANT_BYTES_SENT: &str = "sweep_tenant_http_sent_bytes_total";
/// Counter, label [`LABEL_TENANT`]: response body bytes the tenant's attempts received.
pub const TENANT_BYTES_RECEIVED: &str = "sweep_tenant_http_received_bytes_total";

/// Gauge: component instances this process keeps idle for their version's next task.
pub const INSTANCES_IDLE: &str = "sweep_instances_idle";
/// Counter, label [`LABEL_EVENT`]: what became of kept instances in this process: `kept` (put
/// back after a task), `dropped` (after a task that did not end cleanly, or held resources),
/// `evicted` (idle too long, or its slot was wanted), `refused` (its command runs once).
pub const INSTANCE_EVENTS: &str = "sweep_instance_events_total";

/// Label of [`TASK_OUTCOMES`].
pub const LABEL_KIND: &str = "kind";
/// Label of [`INSTANCE_EVENTS`].
pub const LABEL_EVENT: &str = "event";
pub const LABEL_TENANT: &str = "tenant";
pub const LABEL_TASK_TYPE: &str = "task_type";
pub const LABEL_STATE: &str = "state";

const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
];
const LAG_BUCKETS: &[f64] =
    &[0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];
const FUEL_BUCKETS: &[f64] = &[1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11];
/// How often the background thread drains histogram buffers.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    #[error("cannot build the Prometheus recorder")]
    Build(#[source] BuildError),
    #[error("cannot start the metrics upkeep thread")]
    Upkeep(#[source] std::io::Error),
    /// An earlier [`install`] failed (typically: another global recorder was installed first).
    #[error("the Prometheus recorder could not be installed: {0}")]
    Unavailable(String),
}

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// Installs the Prometheus recorder as the global `metrics` recorder (once per process) and
/// returns a handle that renders the text format. Later calls return the same handle. Fails
/// when another global recorder was installed first.
pub fn install() -> Result<PrometheusHandle, MetricsError> {
    let installed = HANDLE.get_or_init(|| {
        build_and_install().map_err(|e| match std::error::Error::source(&e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        })
    });
    match installed {
        Ok(handle) => Ok(handle.clone()),
        // The first attempt's error is not Clone; its text is kept instead.
        Err(message) => Err(MetricsError::Unavailable(message.clone())),
    }
}

fn build_and_install() -> Result<PrometheusHandle, MetricsError> {
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(TASK_DURATION.into()), SECONDS_BUCKETS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(QUEUE_LAG.into()), LAG_BUCKETS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(TASK_FUEL.into()), FUEL_BUCKETS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(CANCEL_STOP.into()), SECONDS_BUCKETS))
        .map_err(MetricsError::Build)?;
    let handle = builder.install_recorder().map_err(MetricsError::Build)?;
    let upkeep = handle.clone();
    // Detached for the life of the process, like the recorder it maintains.
    std::thread::Builder::new()
        .name("sweep-metrics-upkeep".to_owned())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_INTERVAL);
            upkeep.run_upkeep();
        })
        .map_err(MetricsError::Upkeep)?;
    describe();
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(TASKS_CLAIMED, Unit::Count, "Tasks claimed by this runner.");
    describe_counter!(TASK_OUTCOMES, Unit::Count, "Finished attempts, by outcome kind.");
    describe_counter!(LEASES_LOST, Unit::Count, "Reports fenced out because the lease was lost.");
    describe_counter!(
        REPORTS_ABANDONED,
        Unit::Count,
        "Reports given up after Postgres stayed unreachable past the report bounds."
    );
    describe_gauge!(REPORTS_PENDING, Unit::Count, "Reports waiting for Postgres to answer.");
    describe_histogram!(TASK_DURATION, Unit::Seconds, "Wall-clock time of one task execution.");
    describe_histogram!(TASK_FUEL, Unit::Count, "Fuel one task execution used.");
    describe_histogram!(
        CANCEL_STOP,
        Unit::Seconds,
        "Time from a runner receiving a task's cancel to its instance stopped."
    );
    describe_histogram!(QUEUE_LAG, Unit::Seconds, "Time from a task becoming due to its start.");
    describe_gauge!(TASKS, Unit::Count, "Tasks by tenant, task type and state (dead included).");
    describe_gauge!(OLDEST_DUE, Unit::Seconds, "Age of the oldest due task, by type.");
    describe_gauge!(RUNNERS, Unit::Count, "Runners registered in the database.");
    describe_gauge!(INSTANCES_IDLE, Unit::Count, "Component instances kept idle for a next task.");
    describe_counter!(
        INSTANCE_EVENTS,
        Unit::Count,
        "Kept instances: kept, dropped, evicted, refused."
    );
    describe_counter!(
        MODULE_COMPILES,
        Unit::Count,
        "Module compiles started (uploads, first runs)."
    );
    describe_gauge!(MODULE_COMPILE_CPU, Unit::Seconds, "CPU time of the last child compile.");
    describe_counter!(
        MODULE_ARTIFACT_LOADS,
        Unit::Count,
        "Modules loaded from the fleet's artifact store instead of compiled."
    );
    describe_counter!(
        MODULE_ARTIFACTS_REFUSED,
        Unit::Count,
        "Stored artifacts refused by their checks and compiled again."
    );
    describe_counter!(TENANT_ATTEMPTS, Unit::Count, "Attempts that ran, by tenant.");
    describe_counter!(
        TENANT_ATTEMPTS_KEPT,
        Unit::Count,
        "Attempts that ran on an instance kept from an earlier task, by tenant."
    );
    describe_counter!(TENANT_WALL, Unit::Milliseconds, "Wall-clock time of attempts, by tenant.");
    describe_counter!(TENANT_FUEL, Unit::Count, "Fuel attempts used, by tenant.");
    describe_counter!(TENANT_HTTP_REQUESTS, Unit::Count, "Outbound HTTP requests, by tenant.");
    describe_counter!(
        TENANT_HTTP_REFUSED,
        Unit::Count,
        "Outbound HTTP requests refused by the egress policy or limits, by tenant."
    );
    describe_counter!(TENANT_BYTES_SENT, Unit::Bytes, "HTTP request body bytes sent, by tenant.");
    describe_counter!(
        TENANT_BYTES_RECEIVED,
        Unit::Bytes,
        "HTTP response body bytes received, by tenant."
    );
    describe_gauge!(MODULE_COMPILE_PEAK_RSS, Unit::Bytes, "Peak RSS of the last child compile.");
}

/// Label sets of [`TASKS`] set by the previous scrape, so vanished ones can be zeroed.
static LAST_SERIES: Mutex<Option<HashSet<(String, String)>>> = Mutex::new(None);

/// Sets the task gauges from the queue's statistics (all tenants) and the runner count.
pub fn set_queue_gauges(stats: &[TypeStats], runners: usize) {
    let mut now = HashSet::with_capacity(stats.len());
    for s in stats {
        set_type(&s.tenant, &s.task_type, Some(s));
        now.insert((s.tenant.clone(), s.task_type.clone()));
    }
    let mut last = LAST_SERIES.lock().unwrap_or_else(PoisonError::into_inner);
    for (tenant, task_type) in last.iter().flatten() {
        if !now.contains(&(tenant.clone(), task_type.clone())) {
            set_type(tenant, task_type, None);
        }
    }
    *last = Some(now);
    metrics::gauge!(RUNNERS).set(runners as f64);
}

/// Sets the kept-instance metrics from the sandbox's pool: read at scrape time, like the task
/// gauges, since the pool keeps its own counts.
pub fn set_instance_metrics(stats: WarmStats, idle: usize) {
    metrics::gauge!(INSTANCES_IDLE).set(idle as f64);
    for (event, count) in [
        ("kept", stats.kept),
        ("dropped", stats.dropped),
        ("evicted", stats.evicted),
        ("refused", stats.refused),
    ] {
        metrics::counter!(INSTANCE_EVENTS, LABEL_EVENT => event).absolute(count);
    }
}

fn set_type(tenant: &str, task_type: &str, s: Option<&TypeStats>) {
    let counts = s.map_or([0; 7], |s| {
        [s.blocked, s.pending, s.running, s.retrying, s.succeeded, s.cancelled, s.dead]
    });
    for (state, count) in TaskState::ALL.into_iter().map(TaskState::as_str).zip(counts) {
        metrics::gauge!(TASKS, LABEL_TENANT => tenant.to_owned(),
            LABEL_TASK_TYPE => task_type.to_owned(), LABEL_STATE => state)
        .set(count as f64);
    }
    let oldest = s.map_or(0.0, |s| s.oldest_due_ms as f64 / 1000.0);
    metrics::gauge!(OLDEST_DUE, LABEL_TENANT => tenant.to_owned(),
        LABEL_TASK_TYPE => task_type.to_owned())
    .set(oldest);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn install_is_idempotent_and_renders_described_histograms() {
        let a = install().expect("install");
        let b = install().expect("install again");
        metrics::histogram!(TASK_DURATION).record(0.02);
        metrics::counter!(TASK_OUTCOMES, LABEL_KIND => "success").increment(1);
        let stats = TypeStats {
            tenant: "acme".into(),
            task_type: "resize".into(),
            pending: 3,
            ..TypeStats::default()
        };
        set_queue_gauges(&[stats], 2);
        let text = b.render();
        // Two handles, one recorder (series order varies between renders).
        assert!(a.render().contains("sweep_runners 2"));
        assert!(text.contains("sweep_task_duration_seconds_bucket{le=\"0.025\"} 1"), "{text}");
        assert!(text.contains("sweep_task_outcomes_total{kind=\"success\"} 1"), "{text}");
        assert!(
            text.contains("sweep_tasks{tenant=\"acme\",task_type=\"resize\",state=\"pending\"} 3"),
            "{text}"
        );
        assert!(text.contains("# HELP sweep_runners"), "{text}");

        let pool = WarmStats { reused: 9, kept: 7, dropped: 2, evicted: 1, refused: 0 };
        set_instance_metrics(pool, 4);
        let text = a.render();
        for line in [
            "sweep_instances_idle 4",
            "sweep_instance_events_total{event=\"kept\"} 7",
            "sweep_instance_events_total{event=\"dropped\"} 2",
            "sweep_instance_events_total{event=\"evicted\"} 1",
            "sweep_instance_events_total{event=\"refused\"} 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in {text}");
        }

        // A series that vanishes from the stats drops to zero instead of going stale.
        set_queue_gauges(&[], 0);
        let text = a.render();
        assert!(
            text.contains("sweep_tasks{tenant=\"acme\",task_type=\"resize\",state=\"pending\"} 0"),
            "{text}"
        );
    }
}
