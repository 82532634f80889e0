//! Compiled-module cache keyed by sha256: compile once per module version, run many times,
//! within a bound on the memory the compiled modules take.
//!
//! Owns: [`ModuleCache`], a `moka` cache weighted by [`CompiledModule::resident_bytes`].
//!
//! Invariants:
//! - an entry under key `k` was compiled from bytes whose SHA-256 is `k` (checked on load);
//! - concurrent misses for one key load and compile once: later callers await the first and
//!   share its result, error included; a failed load/compile leaves no entry behind, so a
//!   later call tries again;
//! - compilation runs on tokio's blocking pool, never on an async worker thread;
//! - with shared artifacts ([`ModuleCache::share_artifacts`]: a store and the runners' key),
//!   a miss first asks the store for the module's artifact (no module bytes read, no compile
//!   when it has a sound one), and a compile's tagged artifact is offered to it before the
//!   entry is published (see `artifacts`); without (no `SWEEP_SECRETS_KEY`), every miss
//!   compiles and nothing is stored;
//! - the entries' summed weight stays within the bound given at construction: past it, the
//!   least likely to be used again are evicted (moka's TinyLFU admission and LRU eviction).
//!   Eviction is applied by moka's housekeeping, which runs as the cache is used, so the
//!   bound can be passed briefly by the entries of the latest writes. An evicted module that
//!   a running task still holds lives until that task drops it; the next task of that
//!   version compiles it again;
//! - one entry larger than the whole bound is not kept (the task still runs with it).

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};

use moka::future::Cache;

use super::artifacts::SharedArtifacts;
use super::module::{sha256_hex, CompiledModule};
use super::{BoxError, Sandbox, SandboxError};

/// How much the compiled modules of one runner may take by default, in bytes.
pub const DEFAULT_MODULE_CACHE_BYTES: u64 = 256 << 20;

/// sha256 -> compiled module, shared by all tasks of a runner. Cheap to clone.
#[derive(Clone)]
pub struct ModuleCache {
    sandbox: Sandbox,
    entries: Cache<String, Arc<CompiledModule>>,
    max_bytes: u64,
    /// Where and under which key compiled artifacts are shared with other runners, once set.
    artifacts: Arc<OnceLock<SharedArtifacts>>,
}

impl fmt::Debug for ModuleCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModuleCache")
            .field("entries", &self.entries.entry_count())
            .field("weighted_bytes", &self.entries.weighted_size())
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl ModuleCache {
    /// An empty cache compiling with `sandbox`, holding at most
    /// [`DEFAULT_MODULE_CACHE_BYTES`] of compiled modules.
    pub fn new(sandbox: Sandbox) -> Self {
        Self::with_max_bytes(sandbox, DEFAULT_MODULE_CACHE_BYTES)
    }

    /// An empty cache compiling with `sandbox`, holding at most `max_bytes` of compiled
    /// modules (as estimated by [`CompiledModule::resident_bytes`]).
    pub fn with_max_bytes(sandbox: Sandbox, max_bytes: u64) -> Self {
        let entries = Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|_: &String, m: &Arc<CompiledModule>| {
                u32::try_from(m.resident_bytes()).unwrap_or(u32::MAX)
            })
            .build();
        ModuleCache { sandbox, entries, max_bytes, artifacts: Arc::default() }
    }

    /// Shares compiled artifacts as `shared` says from now on, for this cache and its
    /// clones: a miss loads the module's artifact from its store when that has a sound one
    /// (tagged under its key), and a compile offers it the new artifact, tagged. Set once;
    /// false (and `shared` unused) when already set.
    pub fn share_artifacts(&self, shared: SharedArtifacts) -> bool {
        self.artifacts.set(shared).is_ok()
    }

    /// How artifacts are shared, when they are.
    pub fn shared_artifacts(&self) -> Option<&SharedArtifacts> {
        self.artifacts.get()
    }

    /// The bound on the entries' summed weight, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The compiled module for `sha256`, if it is cached.
    pub async fn get(&self, sha256: &str) -> Option<Arc<CompiledModule>> {
        self.entries.get(sha256).await
    }

    /// True when a compiled module for `sha256` is cached (no effect on what is evicted).
    pub fn contains(&self, sha256: &str) -> bool {
        self.entries.contains_key(sha256)
    }

    /// The compiled module for `sha256`; on a miss, loads it from the artifact store if that
    /// has it, else awaits `load` for the bytes, checks their hash, and compiles them on the
    /// blocking pool. Callers that miss at the same time share one load and compile, and its
    /// error.
    pub async fn get_or_compile<F, Fut, E>(
        &self,
        sha256: &str,
        load: F,
    ) -> Result<Arc<CompiledModule>, Arc<SandboxError>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
        E: Into<BoxError>,
    {
        self.entries
            .try_get_with_by_ref(sha256, async {
                if let Some(shared) = self.artifacts.get() {
                    if let Some(stored) = shared.load(&self.sandbox, sha256).await {
                        return Ok(Arc::new(stored));
                    }
                }
                let bytes = load().await.map_err(|e| SandboxError::Load {
                    sha256: sha256.to_owned(),
                    source: e.into(),
                })?;
                self.compile_checked(sha256, bytes).await
            })
            .await
    }

    /// Compiles `bytes` on the blocking pool and caches the result under their sha256.
    pub async fn insert(&self, bytes: Vec<u8>) -> Result<Arc<CompiledModule>, Arc<SandboxError>> {
        let sha256 = sha256_hex(&bytes);
        self.get_or_compile(&sha256, || async move { Ok::<_, BoxError>(bytes) }).await
    }

    /// Caches a module compiled elsewhere under its [`CompiledModule::sha256`] (which
    /// `prepare` computed from the bytes it compiled), replacing any entry of that key.
    pub async fn insert_compiled(&self, module: Arc<CompiledModule>) {
        self.entries.insert(module.sha256().to_owned(), module).await;
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
        let shared = self.artifacts.get();
        let key = shared.map(|shared| shared.key().clone());
        let (compiled, artifact) = tokio::task::spawn_blocking(move || {
            sandbox.compile_sharing(&bytes, None, key.as_ref())
        })
        .await
        .map_err(SandboxError::CompileTask)??;
        if let (Some(shared), Some(artifact)) = (shared, artifact) {
            shared.save(artifact).await;
        }
        Ok(Arc::new(compiled))
    }

    /// Drops the entry for `sha256`; returns whether there was one.
    pub async fn remove(&self, sha256: &str) -> bool {
        self.entries.remove(sha256).await.is_some()
    }

    /// Applies pending evictions and counts now, so [`Self::len`] and
    /// [`Self::weighted_bytes`] are exact (they lag the latest writes otherwise).
    pub async fn settle(&self) {
        self.entries.run_pending_tasks().await;
    }

    /// Number of compiled modules held (as of the last housekeeping, see [`Self::settle`]).
    pub fn len(&self) -> u64 {
        self.entries.entry_count()
    }

    /// True when no module is held (as [`Self::len`] counts).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entries' summed weight in bytes (as of the last housekeeping).
    pub fn weighted_bytes(&self) -> u64 {
        self.entries.weighted_size()
    }
}
