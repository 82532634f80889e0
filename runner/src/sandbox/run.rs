//! Running one task: fresh store, instantiate, call `_start` (a module) or `wasi:cli/run` (a
//! component), classify; or, for a component whose scope reuses instances, call `run` again
//! on a kept instance (`warm`).
//!
//! Owns: [`Sandbox::run`] and the two deadline mechanisms.
//!
//! Invariants:
//! - one fresh `Store` per run, dropped before `run` returns (which frees the pool slot),
//!   unless the run's scope reuses instances and it ended cleanly: then `warm` keeps it;
//! - two independent stops enforce `limits.timeout`: the epoch callback (for a guest spinning
//!   in wasm code; it also yields to tokio every tick) and `tokio::time::timeout` around the
//!   whole instantiate+call future (for a guest parked in a host call such as a WASI sleep);
//! - a cancel ([`Sandbox::run_cancellable`]) stops the run by dropping that same future, which
//!   drops the instance: a guest parked in a host call is stopped at once, a spinning one at
//!   its next epoch yield (one tick, 10 ms by default), whatever it does;
//! - `run` never fails: every way a run can end is an [`Outcome`].

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use wasmtime::{InstancePre, ModuleExport, Store};
use wasmtime_wasi::p2::bindings::{Command, CommandPre};

use super::capabilities::Usage;
use super::component::{call_run, run_again, ComponentState, ComponentWasi};
use super::config::Limits;
use super::module::{CompiledModule, Handler};
use super::outcome::{classify, Ending, Execution, Outcome, RunFacts};
use super::pipes::{BoundedOutput, Overflow};
use super::store::{new_store, StoreShape, StoreState, TaskInput, TaskState};
use super::warm::{Found, Key, Warm, WarmPool};
use super::wasi::GuestWasi;
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
        let (ran, (stdout, stderr)) = match (&module.handler, &input.reuse) {
            (Handler::Module { pre, start }, _) => {
                let (stdout, stderr) = outputs(limits);
                let entry = ModuleEntry { pre, start };
                let wasi = || GuestWasi::new(input, &stdout, &stderr);
                let ran = self
                    .attempt(&entry, wasi, StoreShape::MODULE, limits, started, &mut cancel)
                    .await
                    .map(|(mut store, ending)| ran_of(&mut store, ending));
                (ran, (stdout, stderr))
            }
            (Handler::Component(pre), Some(reuse)) => {
                let key = WarmPool::key(reuse, &module.info().sha256);
                self.run_warm(pre, &key, reuse.tasks, input, limits, started, &mut cancel).await
            }
            (Handler::Component(pre), None) => {
                self.run_fresh(pre, input, limits, started, &mut cancel).await
            }
        };
        let ran = match ran {
            Ok(ran) => ran,
            Err(outcome) => return finish(outcome, &stderr, started),
        };

        let out = stdout.take();
        let err = stderr.take();
        let stderr_text = String::from_utf8_lossy(&err.bytes);
        let outcome = classify(RunFacts {
            ending: ran.ending,
            stdout: &out.bytes,
            stdout_overflowed: out.overflowed,
            deadline_hit: ran.deadline_hit,
            memory_denied: ran.memory_denied,
            stderr_tail: &stderr_text,
        });
        Execution {
            outcome,
            stderr: stderr_text.into_owned(),
            stderr_truncated: err.overflowed,
            duration: started.elapsed(),
            usage: Usage { fuel_used: limits.fuel.saturating_sub(ran.fuel_left), ..ran.usage },
            on_kept_instance: ran.kept,
        }
    }

    /// Runs a component on a fresh instance that is dropped afterwards.
    async fn run_fresh(
        &self,
        pre: &CommandPre<ComponentState>,
        input: &TaskInput,
        limits: &Limits,
        started: Instant,
        cancel: &mut Pin<&mut impl Future<Output = ()>>,
    ) -> (Result<Ran, Outcome>, (BoundedOutput, BoundedOutput)) {
        let (stdout, stderr) = outputs(limits);
        let wasi = || ComponentWasi::new(input, &stdout, &stderr);
        let ran = self
            .attempt(pre, wasi, StoreShape::COMPONENT, limits, started, cancel)
            .await
            .map(|(mut store, ending)| ran_of(&mut store, ending));
        (ran, (stdout, stderr))
    }

    /// Runs a component whose scope keeps instances (`warm`): on an idle instance of its
    /// `key` if there is one, else on a fresh one, which is kept afterwards (for at most
    /// `tasks` tasks) if the task ended cleanly. An idle instance that refuses a second run
    /// marks the key not reusable, and the task runs on a fresh instance.
    #[allow(clippy::too_many_arguments)]
    async fn run_warm(
        &self,
        pre: &CommandPre<ComponentState>,
        key: &Key,
        tasks: u32,
        input: &TaskInput,
        limits: &Limits,
        started: Instant,
        cancel: &mut Pin<&mut impl Future<Output = ()>>,
    ) -> (Result<Ran, Outcome>, (BoundedOutput, BoundedOutput)) {
        let pool = &self.inner.warm;
        match pool.take(key) {
            Found::NotReusable => return self.run_fresh(pre, input, limits, started, cancel).await,
            Found::Nothing => {}
            Found::Kept(mut warm) => {
                let outputs = match warm.renew(input, limits, STDERR_TAIL_BYTES, started) {
                    Ok(outputs) => outputs,
                    Err(e) => {
                        let why = format!("failed to set up store: {e:#}");
                        return (Err(Outcome::RunnerError(why)), outputs(limits));
                    }
                };
                let run = run_again(&warm.command, &mut warm.store);
                let ending = within(limits, cancel, run).await;
                if !refused_second_run(&warm.store, &ending) {
                    let ran = Ran { kept: true, ..ran_of(&mut warm.store, ending) };
                    pool.give_back(key, tasks, warm, &ran.ending);
                    return (Ok(ran), outputs);
                }
                pool.refuse(key);
                drop(warm);
            }
        }
        let (stdout, stderr) = outputs(limits);
        let entry = Keep { pre, command: Mutex::new(None) };
        let wasi = || ComponentWasi::new(input, &stdout, &stderr);
        let ran = self
            .attempt(&entry, wasi, StoreShape::COMPONENT, limits, started, cancel)
            .await
            .map(|(mut store, ending)| {
                let ran = ran_of(&mut store, ending);
                let command = entry.command.into_inner().unwrap_or_else(PoisonError::into_inner);
                if let Some(command) = command {
                    pool.give_back(key, tasks, Warm::new(store, command), &ran.ending);
                }
                ran
            });
        (ran, (stdout, stderr))
    }

    /// Runs `entry` in a fresh store of guest state `wasi()`, again (with a new state) while
    /// the instance pool has no free slot: at once after dropping an idle warm instance if
    /// there is one, else after a pause, for up to [`CAPACITY_WAIT`]. `Err` is an outcome
    /// reached before the guest ran: a store that could not be set up, a cancel while waiting.
    async fn attempt<W: Guest, E: Entry<W>>(
        &self,
        entry: &E,
        wasi: impl Fn() -> W,
        shape: StoreShape,
        limits: &Limits,
        started: Instant,
        cancel: &mut Pin<&mut impl Future<Output = ()>>,
    ) -> Result<(Store<TaskState<W>>, Ending), Outcome> {
        let mut pause = Duration::from_millis(1);
        loop {
            let mut store = new_store(self.engine(), wasi(), shape, limits, started)
                .map_err(|e| Outcome::RunnerError(format!("failed to set up store: {e:#}")))?;
            let ending = within(limits, cancel, entry.call(&mut store)).await;
            // No free slot in the instance pool: a slot freed a moment ago may not be back
            // yet. Nothing of the guest ran; free an idle instance's slot or wait a little,
            // and try again.
            if matches!(&ending, Ending::InstantiateFailed(e) if no_capacity(e))
                && started.elapsed() + pause < CAPACITY_WAIT
            {
                drop(store);
                if self.inner.warm.evict_oldest() {
                    continue;
                }
                tokio::select! {
                    biased;
                    () = &mut *cancel => return Err(Outcome::Cancelled),
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_millis(50));
                continue;
            }
            return Ok((store, ending));
        }
    }
}

/// Awaits `call` until `limits.timeout` (then [`Ending::Elapsed`]) or `cancel`.
async fn within(
    limits: &Limits,
    cancel: &mut Pin<&mut impl Future<Output = ()>>,
    call: impl Future<Output = Ending>,
) -> Ending {
    // Cancel first: polled at every epoch yield of a spinning guest, and woken by itself
    // while a guest waits in a host call.
    tokio::select! {
        biased;
        () = &mut *cancel => Ending::Cancelled,
        ended = tokio::time::timeout(limits.timeout, call) => ended.unwrap_or(Ending::Elapsed),
    }
}

/// A run's stdout (of `limits.output_bytes`, stopping the guest past it) and stderr (its
/// tail).
fn outputs(limits: &Limits) -> (BoundedOutput, BoundedOutput) {
    let stdout = BoundedOutput::new(limits.output_bytes, Overflow::Stop);
    (stdout, BoundedOutput::new(STDERR_TAIL_BYTES, Overflow::KeepTail))
}

/// What a run that ended with `ending` left behind in `store`. The caller drops the store
/// (dropping its instances gives the pool slot back) or keeps it (`warm`).
fn ran_of<W: Guest>(store: &mut Store<TaskState<W>>, ending: Ending) -> Ran {
    let fuel_left = store.get_fuel().unwrap_or(0);
    let state = store.data();
    let mut usage = Usage {
        peak_memory_bytes: u64::try_from(state.limiter.peak_memory_bytes).unwrap_or(u64::MAX),
        ..Usage::default()
    };
    state.wasi.add_usage(&mut usage);
    Ran {
        ending,
        fuel_left,
        deadline_hit: state.deadline_hit,
        memory_denied: state.limiter.memory_denied,
        usage,
        kept: false,
    }
}

/// Whether a kept instance refused to run again: its `run` trapped on `unreachable` before
/// the guest read stdin or asked for any HTTP, which is how wasi-libc's command entry (Rust
/// `fn main`, C `main`) refuses a second call. Any other failure (out of fuel, a deadline, a
/// trap after the guest did something) is the task's own ending: the task is not run again,
/// so nothing it did outside can happen twice.
fn refused_second_run(store: &Store<ComponentState>, ending: &Ending) -> bool {
    let Ending::CallFailed(e) = ending else { return false };
    e.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::UnreachableCodeReached)
        && !store.data().wasi.reached_outside()
}

/// What a run that reached the guest left behind.
struct Ran {
    ending: Ending,
    fuel_left: u64,
    deadline_hit: bool,
    memory_denied: bool,
    /// Peak memory and, for a component, HTTP; fuel is filled in by the caller.
    usage: Usage,
    /// On an instance an earlier task left.
    kept: bool,
}

/// A guest's WASI state, as far as a run needs to know it.
trait Guest: Send + 'static {
    /// Adds what the guest used beyond fuel and memory (outbound HTTP) to `usage`.
    fn add_usage(&self, usage: &mut Usage);
}

impl Guest for GuestWasi {
    fn add_usage(&self, _usage: &mut Usage) {}
}

impl Guest for ComponentWasi {
    fn add_usage(&self, usage: &mut Usage) {
        self.egress.add_usage(usage);
    }
}

/// How a compiled handler is entered in a store of guest state `W`.
trait Entry<W>: Sync {
    fn call<'s>(
        &'s self,
        store: &'s mut Store<TaskState<W>>,
    ) -> impl Future<Output = Ending> + Send + 's;
}

/// A module's instance-pre and its `_start`.
struct ModuleEntry<'a> {
    pre: &'a InstancePre<StoreState>,
    start: &'a ModuleExport,
}

impl Entry<GuestWasi> for ModuleEntry<'_> {
    fn call<'s>(
        &'s self,
        store: &'s mut Store<StoreState>,
    ) -> impl Future<Output = Ending> + Send + 's {
        call_start(self.pre, self.start, store)
    }
}

impl Entry<ComponentWasi> for CommandPre<ComponentState> {
    async fn call(&self, store: &mut Store<ComponentState>) -> Ending {
        call_run(self, store).await.0
    }
}

/// A component's instance-pre, keeping the instance it makes (`warm`).
struct Keep<'a> {
    pre: &'a CommandPre<ComponentState>,
    command: Mutex<Option<Command>>,
}

impl Entry<ComponentWasi> for Keep<'_> {
    async fn call(&self, store: &mut Store<ComponentState>) -> Ending {
        let (ending, command) = call_run(self.pre, store).await;
        *self.command.lock().unwrap_or_else(PoisonError::into_inner) = command;
        ending
    }
}

async fn call_start(
    pre: &InstancePre<StoreState>,
    start: &ModuleExport,
    store: &mut Store<StoreState>,
) -> Ending {
    let instance = match pre.instantiate_async(&mut *store).await {
        Ok(instance) => instance,
        Err(e) => return Ending::InstantiateFailed(e),
    };
    let start =
        instance.get_module_export(&mut *store, start).and_then(|export| export.into_func());
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

/// The execution of a run that never reached the guest: it used nothing.
fn finish(outcome: Outcome, stderr: &BoundedOutput, started: Instant) -> Execution {
    let err = stderr.take();
    Execution {
        outcome,
        stderr: String::from_utf8_lossy(&err.bytes).into_owned(),
        stderr_truncated: err.overflowed,
        duration: started.elapsed(),
        usage: Usage::default(),
        on_kept_instance: false,
    }
}
