//! Per-task store state: the WASI context a guest sees, the memory limiter, and the deadline.
//!
//! Owns: [`StoreState`], [`TaskLimiter`], [`TaskInput`] and the construction of a fresh
//! `Store` for one run ([`new_store`]).
//!
//! Invariants:
//! - a guest sees exactly: stdin = its payload, bounded stdout/stderr, the four `SWEEP_*`
//!   environment variables and those in its `capabilities.env` (after them), no args, no
//!   preopened directories, no host env, no network but a component's outbound HTTP under
//!   its capabilities (`http`), and no blocking of the host thread (WASI sleeps are tokio
//!   timers); see `wasi` and `component` for how;
//! - a memory growth past the task's limit (or one we allowed that then failed) is refused
//!   with a trap *and* recorded in `TaskLimiter::memory_denied`, so `MemoryLimit` is read from
//!   a flag set by our own code;
//! - the epoch callback records `deadline_hit` before it stops the guest; until then it yields
//!   to the async executor on every tick, so a spinning guest cannot starve other tasks.

use std::time::Instant;

use wasmtime::{Engine, ResourceLimiter, Store, UpdateDeadline};

use super::capabilities::Capabilities;
use super::config::Limits;
use super::wasi::GuestWasi;

/// Table elements a guest table may grow to (matches the pooling allocator's default slot).
const MAX_TABLE_ELEMENTS: usize = 20_000;

/// What the sandbox tells a guest about the task it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInput {
    /// Exposed as `SWEEP_TASK_ID`.
    pub task_id: String,
    /// Exposed as `SWEEP_TASK_TYPE`.
    pub task_type: String,
    /// 1-based attempt number, exposed as `SWEEP_ATTEMPT`.
    pub attempt: u32,
    /// Exposed as `SWEEP_MAX_ATTEMPTS`.
    pub max_attempts: u32,
    /// The payload as JSON text; the guest reads it from stdin.
    pub payload: Vec<u8>,
    /// What the run is given beyond computing: hosts it may reach over HTTP (components
    /// only), its HTTP limits, and environment variables (secrets) after the `SWEEP_*` ones.
    pub capabilities: Capabilities,
    /// For a component, whether its instance may be kept for later tasks (see `warm`).
    pub reuse: Option<Reuse>,
}

/// A component instance may be kept after a task that ended cleanly and run later tasks of
/// the same scope: its module version's `reuse` setting.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reuse {
    /// Whose tasks may share an instance: instances are kept and found by it and the
    /// module's sha256, so tasks of two scopes never share one. The worker makes it from
    /// the tenant, the task type and the module version.
    pub scope: String,
    /// Most tasks one instance runs before it is dropped (at least 1).
    pub tasks: u32,
}

impl TaskInput {
    /// Builds an input with `payload` serialized to JSON text.
    pub fn new(
        task_id: impl Into<String>,
        task_type: impl Into<String>,
        attempt: u32,
        max_attempts: u32,
        payload: &serde_json::Value,
    ) -> Self {
        TaskInput {
            task_id: task_id.into(),
            task_type: task_type.into(),
            attempt,
            max_attempts,
            // Serializing a `Value` only fails for non-string map keys, which `Value` can't have.
            payload: serde_json::to_vec(payload).unwrap_or_default(),
            capabilities: Capabilities::none(),
            reuse: None,
        }
    }
}

/// The guest asked for more linear memory than its limit. Raised as a trap by [`TaskLimiter`].
#[derive(Debug, thiserror::Error)]
#[error("memory limit exceeded: guest asked for {desired} bytes, limit is {limit}")]
pub(crate) struct MemoryLimitExceeded {
    desired: usize,
    limit: usize,
}

/// The wall-clock deadline passed while the guest was running wasm code.
#[derive(Debug, thiserror::Error)]
#[error("wall-clock deadline exceeded")]
pub(crate) struct DeadlineExceeded;

/// Memory/table limiter for one store; records whether it refused memory and the most it
/// granted.
#[derive(Debug)]
pub(crate) struct TaskLimiter {
    pub(super) memory_bytes: usize,
    pub memory_denied: bool,
    /// The largest size a memory was allowed to reach (its initial size included: wasmtime
    /// asks the limiter for that too), in bytes.
    pub peak_memory_bytes: usize,
    pub(super) shape: StoreShape,
}

impl ResourceLimiter for TaskLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.memory_denied = true;
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                desired,
                limit: self.memory_bytes,
            }));
        }
        // Growing past the module's own declared maximum is ordinary wasm: grow returns -1.
        let allowed = maximum.is_none_or(|max| desired <= max);
        if allowed {
            self.peak_memory_bytes = self.peak_memory_bytes.max(desired);
        }
        Ok(allowed)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        // We allowed the growth but it failed anyway (pool slot cap, OS out of memory): the
        // guest still can't have the memory, and it is still a memory limit, not a bug.
        self.memory_denied = true;
        Err(error.context("linear memory growth failed"))
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS && maximum.is_none_or(|max| desired <= max))
    }

    fn instances(&self) -> usize {
        self.shape.instances
    }

    fn tables(&self) -> usize {
        self.shape.tables
    }

    fn memories(&self) -> usize {
        1
    }
}

/// The `T` of every task's `Store<T>`: the guest's WASI state `W` (a module's
/// [`GuestWasi`], a component's `ComponentWasi`) and what limits the run.
pub(crate) struct TaskState<W> {
    pub wasi: W,
    pub limiter: TaskLimiter,
    /// `None` only if `started + timeout` overflows `Instant` (then only the tokio timeout,
    /// which saturates, applies).
    pub deadline: Option<Instant>,
    pub deadline_hit: bool,
}

/// A preview-1 module's store state.
pub(crate) type StoreState = TaskState<GuestWasi>;

impl<W> std::fmt::Debug for TaskState<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskState")
            .field("limiter", &self.limiter)
            .field("deadline", &self.deadline)
            .field("deadline_hit", &self.deadline_hit)
            .finish_non_exhaustive()
    }
}

/// How many core instances and tables one store may hold: 1 and 1 for a module; a
/// component is several core modules (its code and the adapters its toolchain adds), each
/// an instance, most with a table. Memories stay at 1 either way: the limiter bounds each
/// memory by the task's limit, so one memory keeps the limit the task's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoreShape {
    pub instances: usize,
    pub tables: usize,
}

impl StoreShape {
    pub(crate) const MODULE: StoreShape = StoreShape { instances: 1, tables: 1 };
    pub(crate) const COMPONENT: StoreShape =
        StoreShape { instances: COMPONENT_CORE_INSTANCES, tables: COMPONENT_CORE_INSTANCES };
}

/// Core instances (and tables) one component may create: `wasm32-wasip2` Rust components
/// have 3 to 4 (the program, a shim and its fix-up, sometimes an adapter), componentize-js
/// ones 4, componentize-py ones 14 (CPython, its libc and runtime are dynamically linked
/// libraries, each an instance). 32 leaves room for other toolchains; what a slot costs the
/// pool is address space for its table, reserved, not memory.
pub(crate) const COMPONENT_CORE_INSTANCES: usize = 32;

/// A fresh store for one run of a guest with WASI state `wasi`, with fuel, limiter and epoch
/// callback installed.
pub(crate) fn new_store<W: Send + 'static>(
    engine: &Engine,
    wasi: W,
    shape: StoreShape,
    limits: &Limits,
    started: Instant,
) -> wasmtime::Result<Store<TaskState<W>>> {
    let state = TaskState {
        wasi,
        limiter: TaskLimiter { memory_bytes: 0, memory_denied: false, peak_memory_bytes: 0, shape },
        deadline: None,
        deadline_hit: false,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.limiter);
    arm(&mut store, limits, started)?;
    store.epoch_deadline_callback(|mut ctx| {
        let state = ctx.data_mut();
        if state.deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            state.deadline_hit = true;
            return Err(wasmtime::Error::new(DeadlineExceeded));
        }
        Ok(UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())))
    });
    Ok(store)
}

/// Arms `store` for one run under `limits` from `started`: its fuel, its deadline, the
/// limiter's limit, and flags cleared. The limiter's peak is left as it is: a kept instance
/// (`warm`) still holds the memory it grew to.
pub(crate) fn arm<W>(
    store: &mut Store<TaskState<W>>,
    limits: &Limits,
    started: Instant,
) -> wasmtime::Result<()> {
    let state = store.data_mut();
    state.limiter.memory_bytes = usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX);
    state.limiter.memory_denied = false;
    state.deadline = started.checked_add(limits.timeout);
    state.deadline_hit = false;
    store.set_fuel(limits.fuel)?;
    store.set_epoch_deadline(1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(memory_bytes: usize) -> TaskLimiter {
        TaskLimiter {
            memory_bytes,
            memory_denied: false,
            peak_memory_bytes: 0,
            shape: StoreShape::MODULE,
        }
    }

    #[test]
    fn memory_within_limit_is_allowed() -> wasmtime::Result<()> {
        let mut l = limiter(1 << 20);
        assert!(l.memory_growing(0, 1 << 20, None)?);
        assert!(!l.memory_denied);
        assert_eq!(l.peak_memory_bytes, 1 << 20);
        Ok(())
    }

    #[test]
    fn memory_past_limit_traps_and_is_recorded() {
        let mut l = limiter(1 << 16);
        let err = l.memory_growing(0, 1 << 17, None).err();
        assert!(err.is_some_and(|e| e.is::<MemoryLimitExceeded>()));
        assert!(l.memory_denied);
    }

    #[test]
    fn permitted_growth_that_fails_is_recorded() {
        let mut l = limiter(1 << 30);
        assert!(l.memory_grow_failed(wasmtime::Error::msg("pool slot full")).is_err());
        assert!(l.memory_denied);
    }

    #[test]
    fn module_maximum_is_ordinary_failure() -> wasmtime::Result<()> {
        let mut l = limiter(1 << 30);
        assert!(!l.memory_growing(0, 1 << 17, Some(1 << 16))?);
        assert!(!l.memory_denied);
        assert_eq!(l.peak_memory_bytes, 0, "a refused growth is not a peak");
        Ok(())
    }

    #[test]
    fn task_input_serializes_payload() {
        let input = TaskInput::new("id", "t", 1, 3, &serde_json::json!({"a": 1}));
        assert_eq!(input.payload, br#"{"a":1}"#);
    }
}
