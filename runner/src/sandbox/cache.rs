//! Compiled-module cache keyed by sha256: compile once per module version, run many times.
//!
//! Owns: [`ModuleCache`].
//!
//! Invariants:
//! - an entry under key `k` was compiled from bytes whose SHA-256 is `k` (checked on load);
//! - concurrent misses for one key load and compile once: later callers await the first;
//!   a failed load/compile leaves no entry behind, so a later call tries again;
//! - compilation runs on tokio's blocking pool, never on an async worker thread;
//! - the cache never evicts by itself (modules are few and versions immutable); the worker
//!   may `remove` keys it knows are unused.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OnceCell;

use super::module::{sha256_hex, CompiledModule};
use super::{BoxError, Sandbox, SandboxError};

type Slot = Arc<OnceCell<Arc<CompiledModule>>>;

/// sha256 -> compiled module, shared by all tasks of a runner. Cheap to clone.
#[derive(Clone)]
pub struct ModuleCache {
    sandbox: Sandbox,
    slots: Arc<Mutex<HashMap<String, Slot>>>,
}

impl fmt::Debug for ModuleCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModuleCache").field("len", &self.len()).finish_non_exhaustive()
    }
}

impl ModuleCache {
    /// An empty cache compiling with `sandbox`.
    pub fn new(sandbox: Sandbox) -> Self {
        ModuleCache { sandbox, slots: Arc::new(Mutex::new(HashMap::new())) }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        // The map stays consistent even if a holder panicked; recover instead of poisoning.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, sha256: &str) -> Slot {
        self.slots().entry(sha256.to_owned()).or_insert_with(|| Arc::new(OnceCell::new())).clone()
    }

    /// The compiled module for `sha256`, if it is already compiled.
    pub fn get(&self, sha256: &str) -> Option<Arc<CompiledModule>> {
        self.slots().get(sha256).and_then(|slot| slot.get().cloned())
    }

    /// The compiled module for `sha256`; on a miss, awaits `load` for the bytes, checks their
    /// hash, and compiles them on the blocking pool.
    pub async fn get_or_compile<F, Fut, E>(
        &self,
        sha256: &str,
        load: F,
    ) -> Result<Arc<CompiledModule>, SandboxError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
        E: Into<BoxError>,
    {
        let slot = self.slot(sha256);
        let result = slot
            .get_or_try_init(|| async {
                let bytes = load().await.map_err(|e| SandboxError::Load {
                    sha256: sha256.to_owned(),
                    source: e.into(),
                })?;
                self.compile_checked(sha256, bytes).await
            })
            .await
            .cloned();
        if result.is_err() {
            self.forget_empty(sha256, &slot);
        }
        result
    }

    /// Removes `sha256`'s slot if it is still `slot` and still empty (after a failed load).
    fn forget_empty(&self, sha256: &str, slot: &Slot) {
        let mut slots = self.slots();
        if slots.get(sha256).is_some_and(|s| Arc::ptr_eq(s, slot) && !s.initialized()) {
            slots.remove(sha256);
        }
    }

    /// Compiles `bytes` on the blocking pool and caches the result under their sha256.
    pub async fn insert(&self, bytes: Vec<u8>) -> Result<Arc<CompiledModule>, SandboxError> {
        let sha256 = sha256_hex(&bytes);
        self.get_or_compile(&sha256, || async move { Ok::<_, BoxError>(bytes) }).await
    }

    async fn compile_checked(
        &self,
        expected: &str,
        bytes: Vec<u8>,
    ) -> Result<Arc<CompiledModule>, SandboxError> {
        let actual = sha256_hex(&bytes);
        if actual != expected {
            return Err(SandboxError::HashMismatch { expected: expected.to_owned(), actual });
        }
        let sandbox = self.sandbox.clone();
        let compiled = tokio::task::spawn_blocking(move || sandbox.compile(&bytes))
            .await
            .map_err(SandboxError::CompileTask)??;
        Ok(Arc::new(compiled))
    }

    /// Caches `module`, compiled elsewhere (an upload's validation), under its sha256, so the
    /// first task that runs it does not compile it again. An entry already there is kept.
    pub fn insert_compiled(&self, module: Arc<CompiledModule>) {
        let slot = self.slot(module.sha256());
        // Err: the slot already holds a module compiled from the same bytes.
        let _ = slot.set(module);
    }

    /// Drops the entry for `sha256`; returns whether there was a compiled module.
    pub fn remove(&self, sha256: &str) -> bool {
        self.slots().remove(sha256).is_some_and(|slot| slot.initialized())
    }

    /// Number of compiled modules held.
    pub fn len(&self) -> usize {
        self.slots().values().filter(|s| s.initialized()).count()
    }

    /// True when no module is compiled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
