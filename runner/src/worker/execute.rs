//! Running one claimed task: resolve its module (compiled once per sha256), resolve its limits,
//! run it in the sandbox under a tracing span, and produce the [`Report`] to write back.
//!
//! Runs on the guest runtime (see `guests.rs`). Its one database read, the module's bytes on a
//! cache miss, is sent to the control runtime, so no connection is ever opened or driven by
//! threads that guests keep busy. A cancel (`cancels.rs`) reaches the run through `cancelled`:
//! the sandbox stops the instance and the report carries how long that took. What the task is
//! given beyond computing (egress, HTTP limits, secrets) comes from the runner's
//! `CapabilityCache`; a run given secrets has them redacted from what it leaves behind before
//! anything records it.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use tracing::{field::Empty, Instrument};

use super::capabilities::{redact, CapabilityCache, Granted};
use super::minutes::Tally;
use super::Report;
use crate::errors::error_chain;
use crate::{
    config::WorkerConfig,
    queue::{self, ClaimedTask, FailureKind, ModuleSettings, Store},
    sandbox::{
        Execution, LimitOverrides, Limits, ModuleCache, Outcome, Reuse, Sandbox, TaskInput, Usage,
    },
};

#[allow(clippy::too_many_arguments)]
pub(super) async fn execute(
    store: &Store,
    control: &tokio::runtime::Handle,
    sandbox: &Sandbox,
    modules: &ModuleCache,
    capabilities: &CapabilityCache,
    config: &WorkerConfig,
    minutes: &Tally,
    task: ClaimedTask,
    cancelled: oneshot::Receiver<Instant>,
) -> Report {
    let span = tracing::info_span!(
        "task",
        id = task.id,
        task_type = %task.task_type,
        attempt = task.attempt,
        outcome = Empty,
        duration_ms = Empty,
        fuel = Empty,
    );
    let lag = (chrono::Utc::now() - task.run_at).as_seconds_f64().max(0.0);
    metrics::histogram!(crate::metrics::QUEUE_LAG).record(lag);
    minutes.started(&task.tenant, &task.task_type, (lag * 1000.0) as i64);
    async move {
        // When the cancel reached this runner; a dropped sender (the runner stopping) is no cancel.
        let requested = OnceLock::new();
        let cancel = async {
            match cancelled.await {
                Ok(at) => {
                    let _ = requested.set(at);
                }
                Err(_) => std::future::pending().await,
            }
        };
        // Shared by the module's load (a first run compiles it: seconds for a big module) and
        // the run, so a cancel never waits for a compile.
        tokio::pin!(cancel);
        let retry = config.retry.for_module(task.module.as_ref().map(|m| &m.settings));
        let (execution, sha256) = match &task.module {
            None => (not_run(Outcome::ModuleMissing), None),
            Some(module) => {
                let load = || async {
                    let (store, sha256) = (store.clone(), module.sha256.clone());
                    let read =
                        control.spawn(async move { registered_bytes(&store, &sha256).await });
                    read.await
                        .unwrap_or_else(|e| Err(format!("reading the module did not finish: {e}")))
                };
                let loaded = tokio::select! {
                    biased;
                    () = &mut cancel => None,
                    loaded = modules.get_or_compile(&module.sha256, load) => Some(loaded),
                };
                let execution = match loaded {
                    None => not_run(Outcome::Cancelled),
                    Some(Ok(compiled)) => {
                        let (tenant, task_type) = (&task.tenant, &task.task_type);
                        let granted =
                            capabilities.get(store, control, tenant, task_type, module.version);
                        match granted.await.as_deref() {
                            // The database did not answer (an outage, a full pool): the
                            // guest did not run and the task is as good as unclaimed, so it
                            // goes back uncounted, as when no instance slot is free.
                            Err(why) => not_run(Outcome::NoCapacity(why.clone())),
                            Ok(Granted::Refused(why)) => {
                                not_run(Outcome::SecretsUnavailable(why.clone()))
                            }
                            Ok(Granted::Given { capabilities, redactor, reuse }) => {
                                let limits = Limits::resolve(
                                    &config.sandbox.defaults,
                                    &overrides(&module.settings, task.max_result_bytes),
                                    &config.sandbox.maxima,
                                );
                                // The payload's JSON text as claimed, not re-serialised.
                                let input = TaskInput {
                                    task_id: task.id.to_string(),
                                    task_type: task.task_type.clone(),
                                    attempt: u32::try_from(task.attempt).unwrap_or(0),
                                    max_attempts: u32::try_from(task.max_attempts).unwrap_or(0),
                                    payload: task.payload.as_bytes().to_vec(),
                                    capabilities: capabilities.clone(),
                                    // One tenant's type at one version: the version's
                                    // identity holds its limits and secrets.
                                    reuse: reuse.map(|tasks| Reuse {
                                        scope: format!("{tenant}/{task_type}/{}", module.version),
                                        tasks,
                                    }),
                                };
                                let mut done = sandbox
                                    .run_cancellable(&compiled, &input, &limits, &mut cancel)
                                    .await;
                                redact(&mut done, redactor);
                                done
                            }
                        }
                    }
                    Some(Err(e)) => {
                        let why = error_chain(&e);
                        not_run(Outcome::RunnerError(format!("module not loadable: {why}")))
                    }
                };
                (execution, Some(module.sha256.clone()))
            }
        };
        let mut execution = execution;
        let stopped_in = match execution.outcome {
            Outcome::Cancelled => requested.get().map(Instant::elapsed),
            _ => None,
        };
        let follow_ups = match &mut execution.outcome {
            Outcome::Success(result) => follow_ups(store, control, &task, result).await,
            _ => Ok(Vec::new()),
        };
        record(&task, &execution, stopped_in);
        let failure = match &follow_ups {
            Err((kind, message)) => {
                tracing::info!(attempt = task.attempt, error = %message, "follow-up tasks refused");
                Some(*kind)
            }
            Ok(_) => execution.outcome.failure_kind(),
        };
        minutes.ended(&task.tenant, &task.task_type, failure.as_ref().map(|k| k.as_str()));
        Report { task, execution, module_sha256: sha256, retry, stopped_in, follow_ups }
    }
    .instrument(span)
    .await
}

/// The follow-up tasks a successful result asks for (`$enqueue`, taken out of it), checked as
/// an enqueue of the task's tenant would be; a refusal fails the attempt with its kind. The
/// tenant's limits are read (on the control runtime) only when there are follow-ups.
async fn follow_ups(
    store: &Store,
    control: &tokio::runtime::Handle,
    task: &ClaimedTask,
    result: &mut serde_json::Value,
) -> Result<Vec<queue::NewTask>, (FailureKind, String)> {
    let rejected = |m| (FailureKind::FollowUpRejected, m);
    let tasks = queue::take_follow_ups(result, &task.tenant).map_err(rejected)?;
    if tasks.is_empty() {
        return Ok(tasks);
    }
    let mut types: Vec<String> = tasks.iter().map(|t| t.task_type.clone()).collect();
    types.sort_unstable();
    types.dedup();
    let (store, tenant) = (store.clone(), task.tenant.clone());
    let read = control.spawn(async move { queue::follow_up_limits(&store, &tenant, &types).await });
    let (limit, with_modules) = match read.await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return Err((FailureKind::RunnerError, format!("checking follow-ups: {e}"))),
        Err(e) => return Err((FailureKind::RunnerError, format!("checking follow-ups: {e}"))),
    };
    let limit = limit
        .and_then(|l| usize::try_from(l).ok())
        .unwrap_or(crate::admin::DEFAULT_MAX_PAYLOAD_BYTES);
    queue::check_follow_ups(&tasks, limit, &with_modules).map_err(rejected)?;
    Ok(tasks)
}

/// The registered bytes of the module with this sha256, or why there are none (the message a
/// task's failure or a warm-up's log line carries).
pub(super) async fn registered_bytes(store: &Store, sha256: &str) -> Result<Vec<u8>, String> {
    match queue::module_bytes(store, sha256).await {
        Ok(Some(bytes)) => Ok(bytes),
        Ok(None) => Err(format!("module {sha256} vanished from the registry")),
        Err(e) => Err(e.to_string()),
    }
}

/// The report of a task claimed ahead that never got a slot because the runner is stopping:
/// handed back to the queue uncounted (nothing of the guest ran).
pub(super) fn unstarted(task: ClaimedTask) -> Report {
    let why = "the runner stopped before the task started".to_owned();
    let execution = not_run(Outcome::NoCapacity(why));
    Report {
        task,
        execution,
        module_sha256: None,
        retry: Default::default(),
        stopped_in: None,
        follow_ups: Ok(Vec::new()),
    }
}

/// Limits from the module's registry settings and the tenant's result limit, which bounds the
/// task's stdout (the sandbox caps them all by the runner maxima).
fn overrides(s: &ModuleSettings, max_result_bytes: Option<i64>) -> LimitOverrides {
    let positive = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok()).filter(|&v| v > 0);
    LimitOverrides {
        fuel: positive(s.fuel),
        timeout: positive(s.timeout_ms).map(Duration::from_millis),
        memory_bytes: positive(s.memory_bytes),
        output_bytes: positive(max_result_bytes).map(|v| usize::try_from(v).unwrap_or(usize::MAX)),
    }
}

fn not_run(outcome: Outcome) -> Execution {
    Execution {
        outcome,
        stderr: String::new(),
        stderr_truncated: false,
        duration: Duration::ZERO,
        usage: Usage::default(),
        on_kept_instance: false,
    }
}

fn record(task: &ClaimedTask, execution: &Execution, stopped_in: Option<Duration>) {
    let span = tracing::Span::current();
    let kind = execution.outcome.label();
    span.record("outcome", kind);
    span.record("duration_ms", execution.duration.as_secs_f64() * 1000.0);
    span.record("fuel", execution.usage.fuel_used);
    metrics::counter!(crate::metrics::TASK_OUTCOMES, "kind" => kind).increment(1);
    metrics::histogram!(crate::metrics::TASK_DURATION).record(execution.duration.as_secs_f64());
    metrics::histogram!(crate::metrics::TASK_FUEL).record(execution.usage.fuel_used as f64);
    if !matches!(execution.outcome, Outcome::NoCapacity(_)) {
        count_usage(&task.tenant, execution);
    }
    if let Some(stop) = stopped_in {
        metrics::histogram!(crate::metrics::CANCEL_STOP).record(stop.as_secs_f64());
        tracing::info!(
            attempt = task.attempt,
            stop_ms = stop.as_secs_f64() * 1000.0,
            "task cancelled: instance stopped"
        );
    } else if execution.outcome.is_success() {
        tracing::debug!("task succeeded");
    } else {
        let message = execution.failure_message().unwrap_or_default();
        tracing::info!(attempt = task.attempt, error = %message, "task failed");
    }
}

/// The tenant's usage counters (what a platform bills on), per attempt that ran or was
/// refused its secrets.
fn count_usage(tenant: &str, execution: &Execution) {
    use crate::metrics::{
        LABEL_TENANT, TENANT_ATTEMPTS, TENANT_ATTEMPTS_KEPT, TENANT_BYTES_RECEIVED,
        TENANT_BYTES_SENT, TENANT_FUEL, TENANT_HTTP_REFUSED, TENANT_HTTP_REQUESTS, TENANT_WALL,
    };
    let u = &execution.usage;
    let t = || tenant.to_owned();
    metrics::counter!(TENANT_ATTEMPTS, LABEL_TENANT => t()).increment(1);
    if execution.on_kept_instance {
        metrics::counter!(TENANT_ATTEMPTS_KEPT, LABEL_TENANT => t()).increment(1);
    }
    metrics::counter!(TENANT_FUEL, LABEL_TENANT => t()).increment(u.fuel_used);
    metrics::counter!(TENANT_HTTP_REQUESTS, LABEL_TENANT => t()).increment(u.http_requests.into());
    metrics::counter!(TENANT_HTTP_REFUSED, LABEL_TENANT => t()).increment(u.http_refused.into());
    metrics::counter!(TENANT_BYTES_SENT, LABEL_TENANT => t()).increment(u.bytes_sent);
    metrics::counter!(TENANT_BYTES_RECEIVED, LABEL_TENANT => t()).increment(u.bytes_received);
    // Milliseconds: counters are integers, and most attempts take less than a second.
    metrics::counter!(TENANT_WALL, LABEL_TENANT => t())
        .increment(u64::try_from(execution.duration.as_millis()).unwrap_or(u64::MAX));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonsense_overrides_fall_back_to_defaults() {
        let s = ModuleSettings {
            fuel: Some(-5),
            timeout_ms: Some(0),
            memory_bytes: Some(1 << 20),
            ..Default::default()
        };
        let o = overrides(&s, Some(0));
        assert_eq!((o.fuel, o.timeout, o.memory_bytes), (None, None, Some(1 << 20)));
        assert_eq!(o.output_bytes, None);
        assert_eq!(overrides(&s, Some(512)).output_bytes, Some(512));
    }
}
