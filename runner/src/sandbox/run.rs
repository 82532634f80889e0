//! Running one task: fresh store, instantiate, call `_start`, classify.
//!
//! Owns: [`Sandbox::run`] and the two deadline mechanisms.
//!
//! Invariants:
//! - one fresh `Store` per run, dropped before `run` returns (which frees the pool slot);
//! - two independent stops enforce `limits.timeout`: the epoch callback (for a guest spinning
//!   in wasm code; it also yields to tokio every tick) and `tokio::time::timeout` around the
//!   whole instantiate+call future (for a guest parked in a host call such as a WASI sleep);
//! - a cancel ([`Sandbox::run_cancellable`]) stops the run by dropping that same future, which
//!   drops the instance: a guest parked in a host call is stopped at once, a spinning one at
//!   its next epoch yield (one tick, 10 ms by default), whatever it does;
//! - `run` never fails: every way a run can end is an [`Outcome`].

use std::future::Future;
use std::time::{Duration, Instant};

use wasmtime::Store;

use super::capabilities::Usage;
use super::config::Limits;
use super::module::CompiledModule;
use super::outcome::{classify, Ending, Execution, Outcome, RunFacts};
use super::pipes::{BoundedOutput, Overflow};
use super::store::{new_store, StoreState, TaskInput};
use super::Sandbox;

/// How much of a guest's stderr is kept (the most recent bytes).
pub const STDERR_TAIL_BYTES: usize = 8 * 1024;

/// How long a run waits for a free instance slot before it gives up with
/// [`Outcome::NoCapacity`] (which the worker hands back to the queue, uncounted).
pub const CAPACITY_WAIT: Duration = Duration::from_secs(1);

fn no_capacity(e: &wasmtime::Error) -> bool {
    e.is::<wasmtime::PoolConcurrencyLimitError>()
}

impl Sandbox {
    /// Runs `module` once for `input` under `limits` (capped at the configured maxima).
    /// Never fails: errors of the guest and of the runner alike are reported in
    /// [`Execution::outcome`].
    ///
    /// Must be awaited inside a tokio runtime with the time driver enabled. With the pooling
    /// allocator at most `max_concurrency` runs can be in flight; a run that finds no free slot
    /// waits up to [`CAPACITY_WAIT`] for one, then ends with [`Outcome::NoCapacity`], so the
    /// worker should bound its concurrency to match.
    pub async fn run(
        &self,
        module: &CompiledModule,
        input: &TaskInput,
        limits: &Limits,
    ) -> Execution {
        self.run_cancellable(module, input, limits, std::future::pending()).await
    }

    /// [`Sandbox::run`], stopped with [`Outcome::Cancelled`] as soon as `cancel` resolves
    /// (before the guest started, too): the instance is dropped wherever the guest is, within
    /// one epoch tick for a guest spinning in wasm code and at once for one parked in a host
    /// call (a WASI sleep, a read).
    pub async fn run_cancellable(
        &self,
        module: &CompiledModule,
        input: &TaskInput,
        limits: &Limits,
        cancel: impl Future<Output = ()>,
    ) -> Execution {
        tokio::pin!(cancel);
        let started = Instant::now();
        let limits = &limits.capped_by(&self.config().maxima);
        let stdout = BoundedOutput::new(limits.output_bytes, Overflow::Stop);
        let stderr = BoundedOutput::new(STDERR_TAIL_BYTES, Overflow::KeepTail);

        let mut pause = Duration::from_millis(1);
        let (ending, fuel_left, deadline_hit, memory_denied) = loop {
            match new_store(self.engine(), input, limits, started, &stdout, &stderr) {
                Ok(mut store) => {
                    // Cancel first: polled at every epoch yield of a spinning guest, and woken
                    // by itself while a guest waits in a host call.
                    let ending = tokio::select! {
                        biased;
                        () = &mut cancel => Ending::Cancelled,
                        ended = tokio::time::timeout(limits.timeout, call_start(module, &mut store)) => {
                            ended.unwrap_or(Ending::Elapsed)
                        }
                    };
                    // No free slot in the instance pool: a slot freed a moment ago may not be
                    // back yet. Nothing of the guest ran; wait a little and try again.
                    if matches!(&ending, Ending::InstantiateFailed(e) if no_capacity(e))
                        && started.elapsed() + pause < CAPACITY_WAIT
                    {
                        drop(store);
                        tokio::select! {
                            biased;
                            () = &mut cancel => {
                                let outcome = Outcome::Cancelled;
                                return finish(outcome, &stderr, started, 0);
                            }
                            () = tokio::time::sleep(pause) => {}
                        }
                        pause = (pause * 2).min(Duration::from_millis(50));
                        continue;
                    }
                    let fuel_left = store.get_fuel().unwrap_or(0);
                    let state = store.data();
                    break (ending, fuel_left, state.deadline_hit, state.limiter.memory_denied);
                }
                Err(e) => {
                    let outcome = Outcome::RunnerError(format!("failed to set up store: {e:#}"));
                    return finish(outcome, &stderr, started, 0);
                }
            }
        };

        let out = stdout.take();
        let err = stderr.take();
        let stderr_text = String::from_utf8_lossy(&err.bytes);
        let outcome = classify(RunFacts {
            ending,
            stdout: &out.bytes,
            stdout_overflowed: out.overflowed,
            deadline_hit,
            memory_denied,
            stderr_tail: &stderr_text,
        });
        Execution {
            outcome,
            stderr: stderr_text.into_owned(),
            stderr_truncated: err.overflowed,
            duration: started.elapsed(),
            usage: Usage { fuel_used: limits.fuel.saturating_sub(fuel_left), ..Usage::default() },
        }
    }
}

async fn call_start(module: &CompiledModule, store: &mut Store<StoreState>) -> Ending {
    let instance = match module.pre.instantiate_async(&mut *store).await {
        Ok(instance) => instance,
        Err(e) => return Ending::InstantiateFailed(e),
    };
    let start = instance
        .get_module_export(&mut *store, &module.start)
        .and_then(|export| export.into_func());
    let Some(start) = start else {
        // Unreachable for a validated module; reported rather than panicked on.
        return Ending::InstantiateFailed(wasmtime::Error::msg("`_start` export vanished"));
    };
    let start = match start.typed::<(), ()>(&*store) {
        Ok(f) => f,
        Err(e) => return Ending::InstantiateFailed(e),
    };
    match start.call_async(&mut *store, ()).await {
        Ok(()) => Ending::Returned,
        Err(e) => Ending::CallFailed(e),
    }
}

fn finish(outcome: Outcome, stderr: &BoundedOutput, started: Instant, fuel_used: u64) -> Execution {
    let err = stderr.take();
    Execution {
        outcome,
        stderr: String::from_utf8_lossy(&err.bytes).into_owned(),
        stderr_truncated: err.overflowed,
        duration: started.elapsed(),
        usage: Usage { fuel_used, ..Usage::default() },
    }
}
