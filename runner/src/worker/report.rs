//! The reporter: turns executions into completions and failed attempts and writes them back
//! in batches, while the claim loop already runs the next tasks (pipelining).
//!
//! When Postgres cannot be reached, the reports wait in memory and are retried with backoff
//! until it answers again; meanwhile the heartbeat keeps renewing their leases (they stay
//! held, see `liveness`), so a task that finished during an outage is recorded as finished
//! afterwards, not rescued and run again. The wait is bounded: reports older than
//! `report_hold`, or beyond `report_buffer_bytes` in all, are given up oldest first, with an
//! error line and [`metrics::REPORTS_ABANDONED`]; their leases are let go, so they lapse and the
//! reaper rescues the tasks (at-least-once still holds).
//!
//! Invariants:
//! - writes happen in the order the reports arrived, one statement per group, and a group is
//!   retried whole (each statement is atomic, so a failed one wrote nothing);
//! - a task the sandbox found no instance slot for is handed back uncounted, never charged a
//!   failed attempt;
//! - a report whose lease was lost is dropped with a warning (another attempt owns the task);
//! - on shutdown, pending reports get the grace period to be written, then are given up.
//!
//! [`metrics::REPORTS_ABANDONED`]: crate::metrics::REPORTS_ABANDONED

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use serde_json::json;
use tokio::sync::mpsc::{self, error::TryRecvError};
use uuid::Uuid;

use super::liveness::{HeldLeases, Reachability};
use crate::{
    config::WorkerConfig,
    queue::{
        self, AttemptUsage, ClaimedTask, Completion, Failure, FailureKind, QueueError, RetryPolicy,
        Store, TaskId,
    },
    sandbox::{Execution, Outcome},
};

/// First retry of a failed write; doubles up to [`RETRY_MAX`]. Short, so reports are written
/// within about a second of Postgres answering again, well inside the reapers' hold-off.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// A finished execution of a claimed task, ready to be written back.
#[derive(Debug)]
pub struct Report {
    pub task: ClaimedTask,
    pub execution: Execution,
    pub module_sha256: Option<String>,
    pub retry: RetryPolicy,
    /// A cancel stopped the run: from the request reaching this runner to the instance stopped.
    pub stopped_in: Option<Duration>,
    /// A success's follow-up tasks (`$enqueue`, checked), or why they were refused: then the
    /// attempt is reported failed with that kind and message.
    pub follow_ups: Result<Vec<queue::NewTask>, (FailureKind, String)>,
}

impl Report {
    /// Whether the guest ran (a task handed back unrun did not).
    pub(super) fn ran(&self) -> bool {
        !matches!(self.execution.outcome, Outcome::NoCapacity(_))
    }
}

/// What the reporter shares with the rest of the runner.
pub(super) struct Reporter {
    pub(super) store: Store,
    pub(super) runner: Uuid,
    pub(super) config: Arc<WorkerConfig>,
    pub(super) leases: Arc<HeldLeases>,
    pub(super) reach: Arc<Reachability>,
    /// Tasks whose reports were written (completions, failures, hand-backs).
    pub(super) reported: Arc<AtomicU64>,
}

pub(super) async fn run(reporter: Reporter, mut reports: mpsc::UnboundedReceiver<Report>) {
    let batch_size = reporter.config.report_batch;
    let mut pending = Pending::default();
    let mut retry = RETRY_FIRST;
    let mut closed_at: Option<Instant> = None;
    loop {
        if pending.is_empty() {
            let mut batch = Vec::with_capacity(batch_size);
            if closed_at.is_some() || reports.recv_many(&mut batch, batch_size).await == 0 {
                break;
            }
            pending.push(batch);
        } else if closed_at.is_none() {
            // What finished meanwhile joins the queue now, so the bounds see it.
            let mut batch = Vec::new();
            while batch.len() < batch_size {
                match reports.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closed_at = Some(Instant::now());
                        break;
                    }
                }
            }
            pending.push(batch);
        }
        // A write waits for a connection while Postgres is away; it must not wait past the
        // point where its reports are to be given up.
        let config = &reporter.config;
        let give_up_at = pending.give_up_at(config.report_hold);
        let give_up_at =
            closed_at.map_or(give_up_at, |at| give_up_at.min(at + config.grace_period));
        let written =
            tokio::time::timeout_at(give_up_at.into(), reporter.write(&mut pending)).await;
        match written {
            Ok(Ok(())) => {
                if retry != RETRY_FIRST {
                    // Caught up after failures (the gauge is only set off the healthy path).
                    metrics::gauge!(crate::metrics::REPORTS_PENDING).set(0.0);
                    retry = RETRY_FIRST;
                }
                continue;
            }
            Ok(Err(e)) => {
                reporter.reach.note(&e);
                tracing::warn!(error = %e, pending = pending.reports(), "writing task reports failed; retrying");
            }
            Err(_) => {
                reporter.reach.unreachable();
                tracing::warn!(pending = pending.reports(), "writing task reports timed out");
            }
        }
        let shutting_down = closed_at.is_some_and(|at| at.elapsed() >= config.grace_period);
        let given_up = if shutting_down {
            std::mem::take(&mut pending.groups).into()
        } else {
            pending.over_bounds(config.report_hold, config.report_buffer_bytes)
        };
        reporter.abandon(given_up);
        metrics::gauge!(crate::metrics::REPORTS_PENDING).set(pending.reports() as f64);
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(RETRY_MAX);
    }
}

impl Reporter {
    /// Writes the pending groups in order until one fails (it stays at the front).
    async fn write(&self, pending: &mut Pending) -> Result<(), QueueError> {
        let (pool, runner) = (&self.store, self.runner);
        while let Some(group) = pending.groups.front() {
            match &group.writes {
                Writes::Release(leases) => {
                    let released = queue::release_batch(pool, runner, leases).await?;
                    tracing::warn!(
                        tasks = released.len(),
                        "handed tasks that did not start (no free instance slot, or the runner \
                         is stopping) back to the queue uncounted"
                    );
                }
                Writes::Complete(completions) => {
                    note_lost(&queue::complete_batch(pool, runner, completions).await?);
                }
                Writes::Fail(failures) => {
                    note_lost(&queue::fail_batch(pool, runner, failures).await?.lost);
                }
            }
            if let Some(done) = pending.groups.pop_front() {
                done.writes.release(&self.leases);
                self.reported.fetch_add(done.writes.len() as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Gives reports up: their leases are let go and lapse, and the reaper rescues the tasks.
    fn abandon(&self, groups: Vec<Group>) {
        let count: usize = groups.iter().map(|g| g.writes.len()).sum();
        if count == 0 {
            return;
        }
        for g in &groups {
            g.writes.release(&self.leases);
        }
        metrics::counter!(crate::metrics::REPORTS_ABANDONED).increment(count as u64);
        tracing::error!(
            reports = count,
            hold = ?self.config.report_hold,
            buffer_bytes = self.config.report_buffer_bytes,
            "Postgres stayed unreachable past the report bounds: gave these reports up; their \
             leases will lapse and the tasks run again"
        );
    }
}

/// Reports waiting to be written, oldest first, in groups of one statement each.
#[derive(Debug, Default)]
struct Pending {
    groups: VecDeque<Group>,
}

#[derive(Debug)]
struct Group {
    writes: Writes,
    since: Instant,
    /// Bytes it holds, estimated only once a write failed (the healthy path never needs it).
    weight: Option<usize>,
}

#[derive(Debug)]
enum Writes {
    Release(Vec<(TaskId, i32)>),
    Complete(Vec<Completion>),
    Fail(Vec<Failure>),
}

impl Writes {
    fn len(&self) -> usize {
        match self {
            Writes::Release(l) => l.len(),
            Writes::Complete(c) => c.len(),
            Writes::Fail(f) => f.len(),
        }
    }

    /// Lets go of the leases of these reports.
    fn release(&self, leases: &HeldLeases) {
        match self {
            Writes::Release(l) => leases.release(l.iter().copied()),
            Writes::Complete(c) => leases.release(c.iter().map(|c| (c.id, c.attempt))),
            Writes::Fail(f) => leases.release(f.iter().map(|f| (f.id, f.attempt))),
        }
    }

    fn weight(&self) -> usize {
        const ROW: usize = 64;
        match self {
            Writes::Release(l) => l.len() * ROW,
            Writes::Complete(c) => c
                .iter()
                .map(|c| ROW + json_len(&c.result) + c.logs.as_ref().map_or(0, String::len))
                .sum(),
            Writes::Fail(f) => f.iter().map(|f| ROW + f.message.len() + json_len(&f.detail)).sum(),
        }
    }
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    fn reports(&self) -> usize {
        self.groups.iter().map(|g| g.writes.len()).sum()
    }

    /// Splits a batch of reports into its statements: hand-backs, completions, failures.
    fn push(&mut self, batch: Vec<Report>) {
        if batch.is_empty() {
            return;
        }
        let since = Instant::now();
        // One pass, each report turned into its statement's row where it lies: a report is
        // large, and sorting whole reports into lists first moved each of them twice.
        let (mut unrun, mut done, mut failed) = (Vec::new(), Vec::new(), Vec::new());
        let mut rng = rand::rng();
        for r in batch {
            if matches!(r.execution.outcome, Outcome::NoCapacity(_)) {
                // The sandbox had no instance slot: nothing of the guest ran, so the attempt
                // is not the task's. Back to the queue, uncounted.
                unrun.push((r.task.id, r.task.attempt));
            } else if r.execution.outcome.is_success() && r.follow_ups.is_ok() {
                done.push(completion(r));
            } else {
                failed.push(failure(&r, &mut rng));
            }
        }
        for writes in [Writes::Release(unrun), Writes::Complete(done), Writes::Fail(failed)] {
            if writes.len() > 0 {
                self.groups.push_back(Group { writes, since, weight: None });
            }
        }
    }

    /// When the oldest group is to be given up (now when there is none).
    fn give_up_at(&self, hold: Duration) -> Instant {
        self.groups.front().map_or_else(Instant::now, |g| g.since + hold)
    }

    /// Takes off the oldest groups that waited longer than `hold` or do not fit in `bytes`.
    fn over_bounds(&mut self, hold: Duration, bytes: usize) -> Vec<Group> {
        let mut total: usize = self
            .groups
            .iter_mut()
            .map(|g| *g.weight.get_or_insert_with(|| g.writes.weight()))
            .sum();
        let mut given_up = Vec::new();
        while let Some(oldest) = self.groups.front() {
            if oldest.since.elapsed() <= hold && total <= bytes {
                break;
            }
            if let Some(g) = self.groups.pop_front() {
                total -= g.weight.unwrap_or(0);
                given_up.push(g);
            }
        }
        given_up
    }
}

/// Length of `v` as JSON, without building the text.
fn json_len(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, v);
    count.0
}

/// A successful report, moved (results and logs can be large: no copies on the hot path).
fn completion(r: Report) -> Completion {
    let usage = attempt_usage(&r.execution);
    let result = match r.execution.outcome {
        Outcome::Success(value) => value,
        _ => serde_json::Value::Null,
    };
    let stderr = r.execution.stderr;
    Completion {
        id: r.task.id,
        attempt: r.task.attempt,
        result,
        module_sha256: r.module_sha256,
        logs: (!stderr.is_empty()).then_some(stderr),
        follow_ups: r.follow_ups.unwrap_or_default(),
        usage: Some(usage),
    }
}

fn failure(r: &Report, rng: &mut impl rand::Rng) -> Failure {
    let e = &r.execution;
    let mut detail = json!({
        "duration_ms": u64::try_from(e.duration.as_millis()).unwrap_or(u64::MAX),
        "fuel_used": e.usage.fuel_used,
    });
    if !e.stderr.is_empty() {
        detail["stderr"] = json!(e.stderr);
        detail["stderr_truncated"] = json!(e.stderr_truncated);
    }
    if let Outcome::HandlerError { exit_code, .. } = e.outcome {
        detail["exit_code"] = json!(exit_code);
    }
    if let Some(stop) = r.stopped_in {
        // Tenths of a millisecond: a stop takes a few milliseconds.
        detail["stop_ms"] = json!((stop.as_secs_f64() * 10_000.0).round() / 10.0);
    }
    // A success whose follow-ups were refused fails with the refusal (never permanent: the
    // handler may ask for other ones next time).
    let (kind, message, permanent) = match &r.follow_ups {
        Err((kind, message)) => (*kind, message.clone(), false),
        Ok(_) => (
            e.outcome.failure_kind().unwrap_or(FailureKind::RunnerError),
            e.failure_message().unwrap_or_default(),
            e.outcome.is_permanent(),
        ),
    };
    Failure {
        id: r.task.id,
        attempt: r.task.attempt,
        kind,
        message,
        permanent,
        retry_delay: r.retry.delay(u32::try_from(r.task.attempt).unwrap_or(0), rng),
        detail,
        module_sha256: r.module_sha256.clone(),
        usage: Some(attempt_usage(e)),
    }
}

/// What the run used, as the queue records it per attempt (saturating at `i64::MAX`).
fn attempt_usage(e: &Execution) -> AttemptUsage {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let u = &e.usage;
    AttemptUsage {
        duration_ms: i64::try_from(e.duration.as_millis()).unwrap_or(i64::MAX),
        fuel_used: n(u.fuel_used),
        peak_memory_bytes: n(u.peak_memory_bytes),
        http_requests: u.http_requests.into(),
        http_refused: u.http_refused.into(),
        bytes_sent: n(u.bytes_sent),
        bytes_received: n(u.bytes_received),
    }
}

fn note_lost(lost: &[queue::TaskId]) {
    if !lost.is_empty() {
        metrics::counter!(crate::metrics::LEASES_LOST).increment(lost.len() as u64);
        tracing::warn!(tasks = ?lost, "lease lost before the report: another attempt owns these tasks");
    }
}
