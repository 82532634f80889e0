//! The reporter: turns executions into completions and failed attempts and writes them back
//! in batches, while the claim loop already runs the next tasks (pipelining).
//!
//! Invariants: a task the sandbox found no instance slot for is handed back uncounted, never
//! charged a failed attempt. A report whose lease was lost is dropped with a warning (another
//! attempt owns the task now); a report that cannot be written after a few tries is dropped
//! too: the lease then expires and the reaper counts the attempt as failed, so at-least-once
//! still holds.

use std::{sync::Arc, time::Duration};

use serde_json::json;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::{
    config::WorkerConfig,
    queue::{self, ClaimedTask, Completion, Failure, FailureKind, RetryPolicy, Store},
    sandbox::{Execution, Outcome},
};

const WRITE_TRIES: u32 = 3;

/// A finished execution of a claimed task, ready to be written back.
#[derive(Debug)]
pub struct Report {
    pub task: ClaimedTask,
    pub execution: Execution,
    pub module_sha256: Option<String>,
    pub retry: RetryPolicy,
}

pub(super) async fn run(
    store: Store,
    runner: Uuid,
    config: Arc<WorkerConfig>,
    mut reports: mpsc::UnboundedReceiver<Report>,
) {
    let mut batch = Vec::with_capacity(config.report_batch);
    while reports.recv_many(&mut batch, config.report_batch).await > 0 {
        flush(&store, runner, std::mem::take(&mut batch)).await;
    }
}

async fn flush(store: &Store, runner: Uuid, batch: Vec<Report>) {
    let (unrun, batch): (Vec<Report>, Vec<Report>) =
        batch.into_iter().partition(|r| matches!(r.execution.outcome, Outcome::NoCapacity(_)));
    if !unrun.is_empty() {
        // The sandbox had no instance slot for these: nothing of the guest ran, so the attempt
        // is not the task's. Back to the queue, uncounted.
        let leases: Vec<(queue::TaskId, i32)> =
            unrun.iter().map(|r| (r.task.id, r.task.attempt)).collect();
        if let Some(released) = with_retries(|| queue::release_batch(store, runner, &leases)).await
        {
            tracing::warn!(
                tasks = released.len(),
                "no free instance slot; handed the tasks back to the queue uncounted"
            );
        }
    }
    let (done, failed): (Vec<Report>, Vec<Report>) =
        batch.into_iter().partition(|r| r.execution.outcome.is_success());
    if !done.is_empty() {
        let completions: Vec<Completion> = done.into_iter().map(completion).collect();
        if let Some(lost) =
            with_retries(|| queue::complete_batch(store, runner, &completions)).await
        {
            note_lost(&lost);
        }
    }
    if !failed.is_empty() {
        let failures: Vec<Failure> = {
            let mut rng = rand::rng();
            failed.iter().map(|r| failure(r, &mut rng)).collect()
        };
        if let Some(report) = with_retries(|| queue::fail_batch(store, runner, &failures)).await {
            note_lost(&report.lost);
        }
    }
}

/// A successful report, moved (results and logs can be large: no copies on the hot path).
fn completion(r: Report) -> Completion {
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
    }
}

fn failure(r: &Report, rng: &mut impl rand::Rng) -> Failure {
    let e = &r.execution;
    let mut detail = json!({
        "duration_ms": u64::try_from(e.duration.as_millis()).unwrap_or(u64::MAX),
        "fuel_used": e.fuel_used,
    });
    if !e.stderr.is_empty() {
        detail["stderr"] = json!(e.stderr);
        detail["stderr_truncated"] = json!(e.stderr_truncated);
    }
    if let Outcome::HandlerError { exit_code, .. } = e.outcome {
        detail["exit_code"] = json!(exit_code);
    }
    Failure {
        id: r.task.id,
        attempt: r.task.attempt,
        kind: e.outcome.failure_kind().unwrap_or(FailureKind::RunnerError),
        message: e.failure_message().unwrap_or_default(),
        permanent: e.outcome.is_permanent(),
        retry_delay: r.retry.delay(u32::try_from(r.task.attempt).unwrap_or(0), rng),
        detail,
        module_sha256: r.module_sha256.clone(),
    }
}

async fn with_retries<T, F, Fut>(mut write: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, queue::QueueError>>,
{
    for attempt in 1..=WRITE_TRIES {
        match write().await {
            Ok(v) => return Some(v),
            Err(e) => {
                tracing::warn!(error = %e, attempt, "writing task reports failed");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
        }
    }
    tracing::error!("giving up on a batch of reports; their leases will expire and be rescued");
    None
}

fn note_lost(lost: &[queue::TaskId]) {
    if !lost.is_empty() {
        metrics::counter!(crate::metrics::LEASES_LOST).increment(lost.len() as u64);
        tracing::warn!(tasks = ?lost, "lease lost before the report: another attempt owns these tasks");
    }
}
