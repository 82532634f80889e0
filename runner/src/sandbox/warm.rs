//! Warm instances: a component's instance kept after a task that ended cleanly, to run the
//! next task of the same scope (a module version of one tenant that opted in at upload,
//! `reuse`), as Cloudflare Workers and AWS Lambda keep theirs.
//!
//! Why: a big guest's fresh instance costs 0.6 ms (componentize-js) to 1.3 ms
//! (componentize-py) of page faults and function references before its first instruction;
//! calling `wasi:cli/run` again on a live instance costs 20 to 65 µs
//! (`benches/results/2026-12-07-1236-big-guest-reuse-probe.md`). What it trades: a task sees
//! what earlier tasks of its scope left in the guest's memory, so it is opt-in.
//!
//! Owns: [`WarmPool`] (idle instances by key, the keys whose modules refuse a second run,
//! counters) and [`Warm`] (one instance between tasks).
//!
//! Invariants:
//! - an instance runs only tasks of one key, (scope, module sha256): never two tenants', never
//!   two module versions';
//! - each task gets its own stdin, output buffers, environment, egress hooks and counters
//!   (`ComponentWasi::renew`), fuel, deadline and limiter flags ([`Warm::renew`]): only what
//!   the guest keeps in its own memory carries over;
//! - an instance goes back to the pool only when its task returned from `run`, no `wasi:http`
//!   resource is left in its table (no socket, body or counter outlives its task), it holds
//!   at most `MAX_HELD_RESOURCES` resources (a guest leaking handles is bounded) and it ran
//!   fewer than its scope's `tasks`; any other ending (a trap, an exit with any code, the
//!   deadline, the memory limit, a cancel) drops it;
//! - a module whose kept instance fails its next run before reading stdin is a command whose
//!   entry runs once (wasi-libc's, which Rust's `wasm32-wasip2` std uses): its key is marked
//!   not reusable on this runner and the task runs on a fresh instance (nothing of it ran);
//! - idle instances hold pool slots: a run that finds no free slot evicts the longest idle
//!   instance before it waits ([`WarmPool::evict_oldest`]); one idle for [`IDLE_TIMEOUT`] is
//!   dropped by a sweeper that runs while the pool holds any;
//! - instances are dropped outside the pool's lock (dropping one returns its slot, which can
//!   take a `madvise`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use wasmtime::Store;
use wasmtime_wasi::p2::bindings::Command;

use super::component::ComponentState;
use super::config::Limits;
use super::outcome::Ending;
use super::pipes::BoundedOutput;
use super::store::{arm, Reuse, TaskInput};

/// An idle instance older than this is dropped: it holds a pool slot and its memory.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// (scope, module sha256).
pub(super) type Key = (String, String);

/// What [`WarmPool::take`] found for a run.
pub(super) enum Found {
    /// An idle instance, now the run's.
    Kept(Warm),
    /// None idle: the run starts a fresh instance, which may be kept.
    Nothing,
    /// The module refuses a second run: a fresh instance, never kept.
    NotReusable,
}

/// One kept instance between tasks.
pub(crate) struct Warm {
    pub(super) store: Store<ComponentState>,
    pub(super) command: Command,
    /// Tasks it has run.
    tasks: u32,
    idle_since: Instant,
}

impl Warm {
    pub(super) fn new(store: Store<ComponentState>, command: Command) -> Warm {
        Warm { store, command, tasks: 1, idle_since: Instant::now() }
    }

    /// Readies the instance for `input`: the task's WASI state, fuel, deadline and limiter
    /// flags. The peak memory carries over: the instance holds the memory it grew to.
    pub(super) fn renew(
        &mut self,
        input: &TaskInput,
        limits: &Limits,
        stderr_bytes: usize,
        started: Instant,
    ) -> wasmtime::Result<(BoundedOutput, BoundedOutput)> {
        self.tasks += 1;
        let outputs = self.store.data_mut().wasi.renew(input, limits.output_bytes, stderr_bytes);
        arm(&mut self.store, limits, started)?;
        Ok(outputs)
    }
}

/// Counts of what the pool did, for tests, the bench and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmStats {
    /// Tasks run on a kept instance.
    pub reused: u64,
    /// Instances put back after a task.
    pub kept: u64,
    /// Instances dropped after a task that did not end cleanly, or that held `wasi:http` or
    /// too many resources.
    pub dropped: u64,
    /// Idle instances dropped for their age or for a slot.
    pub evicted: u64,
    /// Keys found not reusable (their command runs once).
    pub refused: u64,
}

/// The runner's idle instances.
#[derive(Default)]
pub(crate) struct WarmPool {
    state: Mutex<PoolState>,
    sweeping: AtomicBool,
    reused: AtomicU64,
    kept: AtomicU64,
    dropped: AtomicU64,
    evicted: AtomicU64,
    refused: AtomicU64,
}

#[derive(Default)]
struct PoolState {
    idle: HashMap<Key, Vec<Warm>>,
    not_reusable: HashSet<Key>,
}

impl WarmPool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // Nothing panics while holding it; the maps stay consistent either way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key of `reuse`'s instances of the module with `sha256`: made once per run.
    pub(super) fn key(reuse: &Reuse, sha256: &str) -> Key {
        (reuse.scope.clone(), sha256.to_owned())
    }

    /// What a run of `key` starts on: the most recently used idle instance, a fresh one that
    /// may be kept, or a fresh one that may not (its module refused a second run). One look.
    pub(super) fn take(&self, key: &Key) -> Found {
        let found = {
            let mut state = self.lock();
            if state.not_reusable.contains(key) {
                return Found::NotReusable;
            }
            state.idle.get_mut(key).and_then(Vec::pop)
        };
        match found {
            Some(warm) => {
                self.reused.fetch_add(1, Ordering::Relaxed);
                Found::Kept(warm)
            }
            None => Found::Nothing,
        }
    }

    /// Marks `key` not reusable: its instance refused a second run.
    pub(super) fn refuse(&self, key: &Key) {
        let gone = {
            let mut state = self.lock();
            state.not_reusable.insert(key.clone());
            state.idle.remove(key)
        };
        self.refused.fetch_add(1, Ordering::Relaxed);
        drop(gone);
    }

    /// After a task on `warm`: back to the pool if it `ended` cleanly, holds no `wasi:http`
    /// resource and too few resources to be leaking, has run fewer than `tasks` tasks and
    /// `key` is reusable; dropped otherwise.
    pub(super) fn give_back(
        self: &Arc<Self>,
        key: &Key,
        tasks: u32,
        mut warm: Warm,
        ending: &Ending,
    ) {
        let clean = matches!(ending, Ending::Returned) && warm.store.data_mut().wasi.may_be_kept();
        if !clean {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if warm.tasks >= tasks {
            return;
        }
        warm.idle_since = Instant::now();
        {
            let mut state = self.lock();
            if state.not_reusable.contains(key) {
                drop(state);
                return;
            }
            // The key is cloned only for the first instance it keeps: `take` leaves its list.
            match state.idle.get_mut(key) {
                Some(list) => list.push(warm),
                None => {
                    state.idle.insert(key.clone(), vec![warm]);
                }
            }
        }
        self.kept.fetch_add(1, Ordering::Relaxed);
        self.sweep_while_idle();
    }

    /// Drops the instance idle the longest; whether there was one.
    pub(super) fn evict_oldest(&self) -> bool {
        let oldest = {
            let mut state = self.lock();
            let oldest = state
                .idle
                .iter()
                .filter_map(|(key, list)| Some((key, list.first()?.idle_since)))
                .min_by_key(|(_, since)| *since)
                .map(|(key, _)| key.clone());
            oldest.and_then(|key| {
                let list = state.idle.get_mut(&key)?;
                let warm = list.remove(0);
                if list.is_empty() {
                    state.idle.remove(&key);
                }
                Some(warm)
            })
        };
        let found = oldest.is_some();
        if found {
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        drop(oldest);
        found
    }

    /// Drops instances idle for `IDLE_TIMEOUT` or longer; whether any are left.
    fn evict_idle(&self, now: Instant) -> bool {
        let (old, left) = {
            let mut state = self.lock();
            let mut old = Vec::new();
            for list in state.idle.values_mut() {
                // Oldest first: each list is pushed to in the order its instances went idle.
                let stale = list.partition_point(|w| {
                    now.saturating_duration_since(w.idle_since) >= IDLE_TIMEOUT
                });
                old.extend(list.drain(..stale));
            }
            state.idle.retain(|_, list| !list.is_empty());
            (old, !state.idle.is_empty())
        };
        self.evicted.fetch_add(old.len() as u64, Ordering::Relaxed);
        drop(old);
        left
    }

    /// Starts the sweeper unless it runs: a task on the current tokio runtime that drops
    /// stale instances every half `IDLE_TIMEOUT` and ends when the pool is empty (or gone).
    fn sweep_while_idle(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweeping.store(false, Ordering::Release);
            return;
        };
        let pool: Weak<WarmPool> = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(IDLE_TIMEOUT / 2).await;
                let Some(pool) = pool.upgrade() else { return };
                if !pool.evict_idle(Instant::now()) {
                    pool.sweeping.store(false, Ordering::Release);
                    // An instance kept between the sweep and the flag: sweep on for it.
                    if pool.lock().idle.is_empty() || pool.sweeping.swap(true, Ordering::AcqRel) {
                        return;
                    }
                }
            }
        });
    }

    /// Idle instances held now.
    pub(super) fn idle(&self) -> usize {
        self.lock().idle.values().map(Vec::len).sum()
    }

    pub(super) fn stats(&self) -> WarmStats {
        WarmStats {
            reused: self.reused.load(Ordering::Relaxed),
            kept: self.kept.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::sandbox::{Outcome, Sandbox, SandboxConfig};

    #[tokio::test]
    async fn instances_idle_past_the_timeout_are_dropped() {
        let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
        let bytes = sweep_dev::modules::component_bytes("component-noop");
        let module = sandbox.compile(&bytes).unwrap();
        let reuse = Some(Reuse { scope: "t".into(), tasks: 10 });
        let input = TaskInput { reuse, ..TaskInput::new("1", "t", 1, 1, &json!({})) };
        let ran = sandbox.run(&module, &input, &Limits::DEFAULT).await;
        assert!(matches!(ran.outcome, Outcome::Success(_)), "{ran:?}");
        let pool = &sandbox.inner.warm;
        assert!(pool.evict_idle(Instant::now()), "not idle long enough yet");
        assert_eq!(pool.idle(), 1);
        assert!(!pool.evict_idle(Instant::now() + IDLE_TIMEOUT));
        assert_eq!((pool.idle(), pool.stats().evicted), (0, 1));
    }
}
