//! Compile once per fleet: the artifacts compile children write are kept where every runner
//! finds them, so a runner that meets a module another runner (or the admin API, or itself
//! before a restart) compiled loads it instead of compiling it again.
//!
//! Owns: [`ArtifactStore`] (where artifacts are kept: Postgres in `sweep`, see
//! `queue::PgArtifacts`; the sandbox knows nothing of it), [`Artifact`], the engine
//! fingerprint artifacts are keyed by, and the two ends: [`Sandbox::compile_sharing`]
//! (compile, keep the child's artifact) and [`Sandbox::load_artifact`] (check, then load).
//!
//! Invariants:
//! - an artifact is keyed by the module's sha256 and the fingerprint of the engine that made
//!   it ([`Sandbox::artifact_engine`]: a SHA-256 of wasmtime's
//!   `Engine::precompile_compatibility_hash` for the compile child's settings, which covers
//!   the wasmtime version, target, CPU features, compiler flags, tunables and wasm features).
//!   Another wasmtime or other settings give another fingerprint, so an engine upgrade never
//!   reads an old artifact: it compiles and stores its own;
//! - only artifacts a compile child wrote are offered to a store (an in-process compile has
//!   none), and an artifact is loaded only when its bytes hash to the sha256 stored with them,
//!   its engine is this sandbox's, and its kind is the one it was stored as; anything else is
//!   [`ArtifactRefused`], never deserialized (the safety argument is at
//!   `compiler::load_artifact`, the one `unsafe` call);
//! - a store that fails (unreachable, refused) only costs the sharing: the caller compiles,
//!   as it would without a store.

use std::fmt;
use std::hash::Hasher;

use bytes::Bytes;
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use wasmtime::Engine;

use super::compiler;
use super::module::{self, sha256_hex, CompiledModule, HandlerKind, ValidationError};
use super::{BoxError, Sandbox};

/// A compiled handler as the store keeps it.
#[derive(Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Hex SHA-256 of the module it was compiled from.
    pub module_sha256: String,
    /// The fingerprint of the engine settings it was compiled with.
    pub engine: String,
    /// Module or component.
    pub kind: HandlerKind,
    /// Bytes of the module it was compiled from.
    pub module_size: u64,
    /// wasmtime's serialized form (`Engine::precompile_module` / `precompile_component`).
    pub bytes: Bytes,
    /// Hex SHA-256 of `bytes`, computed when the child's output was read.
    pub sha256: String,
}

impl fmt::Debug for Artifact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Artifact")
            .field("module_sha256", &self.module_sha256)
            .field("engine", &self.engine)
            .field("kind", &self.kind)
            .field("bytes", &self.bytes.len())
            .field("sha256", &self.sha256)
            .finish()
    }
}

/// Where artifacts are shared between runners. Implementations only move bytes; every check
/// is the sandbox's ([`Sandbox::load_artifact`]).
pub trait ArtifactStore: fmt::Debug + Send + Sync {
    /// The artifact of `module_sha256` made by `engine`, if one is stored.
    fn load(
        &self,
        module_sha256: String,
        engine: String,
    ) -> BoxFuture<'static, Result<Option<Artifact>, BoxError>>;

    /// Stores `artifact` unless one is stored under its key already (the first writer wins);
    /// true when this one was stored.
    fn save(&self, artifact: Artifact) -> BoxFuture<'static, Result<bool, BoxError>>;

    /// Removes the artifact under `(module_sha256, engine)` if its stored hash is
    /// `artifact_sha256` (one found unsound, so the next compile's artifact can take its
    /// place; a sound one written meanwhile is left alone).
    fn discard(
        &self,
        module_sha256: String,
        engine: String,
        artifact_sha256: String,
    ) -> BoxFuture<'static, Result<(), BoxError>>;
}

/// Why a stored artifact was not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArtifactRefused {
    /// Made by another engine (the store answered for another key).
    #[error("the artifact was made by engine {found}, this runner's is {expected}")]
    Engine {
        /// This sandbox's fingerprint.
        expected: String,
        /// The artifact's.
        found: String,
    },
    /// Its bytes do not hash to the sha256 stored with them: changed since they were written.
    #[error("the artifact's bytes hash to {actual}, its record says {expected}")]
    Hash {
        /// The stored hash.
        expected: String,
        /// The hash of the bytes read.
        actual: String,
    },
    /// wasmtime refused it (header, version or kind).
    #[error("wasmtime refused the artifact")]
    Deserialize(#[source] BoxError),
    /// It loaded but does not link as a handler.
    #[error("the artifact does not link as a handler")]
    Link(#[source] ValidationError),
}

/// The fingerprint of the engine the compile child builds (`engine::base_config`), which is
/// what made every artifact this sandbox stores.
pub(crate) fn engine_fingerprint(engine: &Engine) -> String {
    let mut hasher = Sha256Hasher(Sha256::new());
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
    hex::encode(hasher.0.finalize())
}

/// A `std::hash::Hasher` that feeds SHA-256: stable across processes and Rust versions, as
/// `DefaultHasher` is not promised to be.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(first)
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

impl Sandbox {
    /// The fingerprint artifacts of this sandbox's compile child are stored under.
    pub fn artifact_engine(&self) -> &str {
        &self.inner.artifact_engine
    }

    /// [`Sandbox::compile`] (or [`Sandbox::compile_for`], with a memory limit) that also
    /// returns the compile child's artifact, keyed for an [`ArtifactStore`]; `None` when the
    /// module was compiled in process. Blocking: call it from a blocking context.
    pub fn compile_sharing(
        &self,
        bytes: &[u8],
        memory_limit_bytes: Option<u64>,
    ) -> Result<(CompiledModule, Option<Artifact>), ValidationError> {
        if let Some(limit) = memory_limit_bytes {
            module::check_initial_memory(bytes, limit)?;
        }
        let (compiled, artifact) = self.prepare_with_artifact(bytes)?;
        let artifact = artifact.map(|artifact| Artifact {
            module_sha256: compiled.sha256().to_owned(),
            engine: self.artifact_engine().to_owned(),
            kind: compiled.kind(),
            module_size: bytes.len() as u64,
            sha256: sha256_hex(&artifact),
            bytes: Bytes::from(artifact),
        });
        Ok((compiled, artifact))
    }

    /// Loads a stored artifact without compiling: refused, before anything is deserialized,
    /// unless its engine is this sandbox's and its bytes hash to its recorded sha256.
    /// Blocking (wasmtime copies and maps the image): call it from a blocking context.
    pub fn load_artifact(&self, artifact: &Artifact) -> Result<CompiledModule, ArtifactRefused> {
        if artifact.engine != self.artifact_engine() {
            return Err(ArtifactRefused::Engine {
                expected: self.artifact_engine().to_owned(),
                found: artifact.engine.clone(),
            });
        }
        let actual = sha256_hex(&artifact.bytes);
        if actual != artifact.sha256 {
            return Err(ArtifactRefused::Hash { expected: artifact.sha256.clone(), actual });
        }
        let component = artifact.kind == HandlerKind::Component;
        let compiled = compiler::load_artifact(self.engine(), &artifact.bytes, component)
            .map_err(|e| ArtifactRefused::Deserialize(e.into_boxed_dyn_error()))?;
        let size = usize::try_from(artifact.module_size).unwrap_or(usize::MAX);
        let inner = &self.inner;
        let sha256 = artifact.module_sha256.clone();
        module::link(&inner.linker, &inner.component_linker, compiled, sha256, size)
            .map_err(ArtifactRefused::Link)
    }
}

/// The compiled module for `sha256` from `store`, when it holds a sound artifact for this
/// sandbox's engine. One it holds that is refused is discarded (so the caller's compile can
/// store a sound one) and `None` returned, as for a miss or a store that failed: the caller
/// compiles.
pub async fn load_shared(
    sandbox: &Sandbox,
    store: &dyn ArtifactStore,
    sha256: &str,
) -> Option<CompiledModule> {
    let engine = sandbox.artifact_engine().to_owned();
    let artifact = match store.load(sha256.to_owned(), engine.clone()).await {
        Ok(Some(artifact)) => artifact,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(%sha256, error = %e, "reading the artifact store failed; compiling");
            return None;
        }
    };
    let started = std::time::Instant::now();
    let loader = sandbox.clone();
    let stored_hash = artifact.sha256.clone();
    let loaded = tokio::task::spawn_blocking(move || loader.load_artifact(&artifact)).await;
    match loaded {
        Ok(Ok(compiled)) => {
            let ms = started.elapsed().as_millis() as u64;
            tracing::info!(%sha256, ms, "module loaded from the artifact store");
            metrics::counter!(crate::metrics::MODULE_ARTIFACT_LOADS).increment(1);
            Some(compiled)
        }
        Ok(Err(refused)) => {
            tracing::warn!(%sha256, error = %crate::errors::error_chain(&refused),
                "stored artifact refused; compiling the module again");
            metrics::counter!(crate::metrics::MODULE_ARTIFACTS_REFUSED).increment(1);
            if let Err(e) = store.discard(sha256.to_owned(), engine, stored_hash).await {
                tracing::warn!(%sha256, error = %e, "discarding the refused artifact failed");
            }
            None
        }
        Err(join) => {
            tracing::warn!(%sha256, error = %join, "loading the stored artifact did not finish");
            None
        }
    }
}

/// Offers `artifact` to `store` (first writer wins); a failure is logged, not returned: it
/// only costs another runner a compile.
pub async fn save_shared(store: &dyn ArtifactStore, artifact: Artifact) {
    let (sha256, size) = (artifact.module_sha256.clone(), artifact.bytes.len());
    match store.save(artifact).await {
        Ok(stored) => tracing::debug!(%sha256, size, stored, "artifact offered to the store"),
        Err(e) => tracing::warn!(%sha256, error = %e, "storing the compiled artifact failed"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_is_stable_and_follows_the_settings() {
        let a = Engine::new(&super::super::engine::base_config()).unwrap();
        let b = Engine::new(&super::super::engine::base_config()).unwrap();
        assert_eq!(engine_fingerprint(&a), engine_fingerprint(&b));
        assert_eq!(engine_fingerprint(&a).len(), 64);
        let mut other = super::super::engine::base_config();
        other.consume_fuel(false);
        let c = Engine::new(&other).unwrap();
        assert_ne!(engine_fingerprint(&a), engine_fingerprint(&c));
    }
}
