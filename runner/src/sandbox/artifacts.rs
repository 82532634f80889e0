//! Compile once per fleet: the artifacts compile children write are kept where every runner
//! finds them, so a runner that meets a module another runner (or the admin API, or itself
//! before a restart) compiled loads it instead of compiling it again.
//!
//! Owns: [`ArtifactStore`] (where artifacts are kept: Postgres in `sweep`, see
//! `queue::PgArtifacts`; the sandbox knows nothing of it), [`Artifact`], the engine
//! fingerprint artifacts are keyed by, the tag that authenticates them, and the two ends:
//! [`Sandbox::compile_sharing`] (compile, tag the child's artifact) and
//! [`Sandbox::load_artifact`] (check, then load), which [`SharedArtifacts`] puts together.
//!
//! Invariants:
//! - an artifact is keyed by the module's sha256, the fingerprint of the engine that made
//!   it ([`Sandbox::artifact_engine`]: a SHA-256 of wasmtime's
//!   `Engine::precompile_compatibility_hash` for the compile child's settings, which covers
//!   the wasmtime version, target, CPU features, compiler flags, tunables and wasm features)
//!   and the id of the key that tagged it. Another wasmtime or other settings give another
//!   fingerprint, so an engine upgrade never reads an old artifact: it compiles and stores
//!   its own; runners of another deployment key never read each other's;
//! - the store is not trusted: whoever can write it can write any bytes and any hash. Every
//!   artifact offered to it carries a tag, HMAC-SHA256 under the runners' [`ArtifactKey`] (a
//!   sub-key of `SWEEP_SECRETS_KEY`, which the database never holds) of the module's sha256,
//!   the engine fingerprint, the kind, the module's size and the artifact's bytes; only
//!   artifacts a compile child wrote are tagged (an in-process compile has none);
//! - an artifact is loaded only when its engine is this sandbox's, its key id is the key's
//!   and its tag verifies (in constant time) over what was read; anything else is
//!   [`ArtifactRefused`], never deserialized (the safety argument is at
//!   `compiler::load_artifact`, the one `unsafe` call). The tag covers the bytes, so it also
//!   catches what the plain sha256 recorded with them was for: bytes changed or cut short on
//!   the way (that sha256 is kept to tell such damage from a forgery, and to name a row);
//! - without a key there is no sharing: a runner (or admin API) whose deployment has no
//!   `SWEEP_SECRETS_KEY` builds no [`SharedArtifacts`], so it neither loads nor stores
//!   artifacts and compiles for itself;
//! - a store that fails (unreachable, refused) only costs the sharing: the caller compiles,
//!   as it would without a store.

use std::fmt;
use std::hash::Hasher;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use wasmtime::Engine;

use super::compiler;
use super::module::{self, sha256_hex, CompiledModule, HandlerKind, ValidationError};
use super::{BoxError, Sandbox};
use crate::secrets::ArtifactKey;

/// The first field of every artifact tag: what the tag is of, and its layout's version.
const TAG_DOMAIN: &[u8] = b"sweep compiled artifact v1";

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
    /// The id of the key that tagged it ([`ArtifactKey::id`]).
    pub key_id: String,
    /// Hex HMAC-SHA256 under that key of the module sha256, engine, kind, module size and
    /// bytes ([`Artifact::tag_fields`]).
    pub mac: String,
}

impl Artifact {
    /// The artifact `bytes` a compile child wrote for a module, tagged under `key`.
    fn tagged(
        module: &CompiledModule,
        engine: &str,
        module_size: u64,
        bytes: Vec<u8>,
        key: &ArtifactKey,
    ) -> Artifact {
        let mut artifact = Artifact {
            module_sha256: module.sha256().to_owned(),
            engine: engine.to_owned(),
            kind: module.kind(),
            module_size,
            sha256: sha256_hex(&bytes),
            bytes: Bytes::from(bytes),
            key_id: key.id().to_owned(),
            mac: String::new(),
        };
        let size = module_size.to_le_bytes();
        artifact.mac = key.tag(&artifact.tag_fields(&size));
        artifact
    }

    /// What the tag is computed over, each field framed by its length (`ArtifactKey::tag`).
    /// `size` holds the module size's bytes.
    fn tag_fields<'a>(&'a self, size: &'a [u8; 8]) -> [&'a [u8]; 6] {
        [
            TAG_DOMAIN,
            self.module_sha256.as_bytes(),
            self.engine.as_bytes(),
            self.kind.as_str().as_bytes(),
            size,
            &self.bytes,
        ]
    }
}

impl fmt::Debug for Artifact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Artifact")
            .field("module_sha256", &self.module_sha256)
            .field("engine", &self.engine)
            .field("kind", &self.kind)
            .field("bytes", &self.bytes.len())
            .field("sha256", &self.sha256)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// Where artifacts are shared between runners. Implementations only move bytes; every check
/// is the sandbox's ([`Sandbox::load_artifact`]).
pub trait ArtifactStore: fmt::Debug + Send + Sync {
    /// The artifact of `module_sha256` made by `engine` and tagged under key `key_id`, if one
    /// is stored.
    fn load(
        &self,
        module_sha256: String,
        engine: String,
        key_id: String,
    ) -> BoxFuture<'static, Result<Option<Artifact>, BoxError>>;

    /// Stores `artifact` unless one is stored under its key already (the first writer wins);
    /// true when this one was stored.
    fn save(&self, artifact: Artifact) -> BoxFuture<'static, Result<bool, BoxError>>;

    /// Removes the artifact under `refused`'s key if it still holds `refused`'s hash and tag
    /// (one found unsound, so the next compile's artifact can take its place; a sound one
    /// written meanwhile is left alone).
    fn discard(&self, refused: Artifact) -> BoxFuture<'static, Result<(), BoxError>>;
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
    /// Tagged under another deployment key (the store answered for another key).
    #[error("the artifact was tagged under key {found}, this runner's is {expected}")]
    OtherKey {
        /// This runner's key id.
        expected: String,
        /// The artifact's.
        found: String,
    },
    /// Its tag does not verify and its bytes do not hash to the sha256 stored with them:
    /// changed since they were written.
    #[error("the artifact's bytes hash to {actual}, its record says {expected}")]
    Hash {
        /// The stored hash.
        expected: String,
        /// The hash of the bytes read.
        actual: String,
    },
    /// Its tag does not verify under this runner's key though its bytes match their sha256:
    /// not what a runner holding the key stored (written or rewritten by something else).
    #[error("the artifact's tag does not verify under this runner's key; it was not stored by a runner of this deployment")]
    Mac,
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
    /// returns the compile child's artifact, keyed for an [`ArtifactStore`] and tagged under
    /// `key`; `None` when the module was compiled in process or no key was given. Blocking:
    /// call it from a blocking context.
    pub fn compile_sharing(
        &self,
        bytes: &[u8],
        memory_limit_bytes: Option<u64>,
        key: Option<&ArtifactKey>,
    ) -> Result<(CompiledModule, Option<Artifact>), ValidationError> {
        if let Some(limit) = memory_limit_bytes {
            module::check_initial_memory(bytes, limit)?;
        }
        let (compiled, artifact) = self.prepare_with_artifact(bytes)?;
        let artifact = match (artifact, key) {
            (Some(artifact), Some(key)) => Some(Artifact::tagged(
                &compiled,
                self.artifact_engine(),
                bytes.len() as u64,
                artifact,
                key,
            )),
            _ => None,
        };
        Ok((compiled, artifact))
    }

    /// Loads a stored artifact without compiling: refused, before anything is deserialized,
    /// unless its engine is this sandbox's and its tag verifies under `key` over everything
    /// read. Blocking (the tag reads every byte; wasmtime copies and maps the image): call it
    /// from a blocking context.
    pub fn load_artifact(
        &self,
        artifact: &Artifact,
        key: &ArtifactKey,
    ) -> Result<CompiledModule, ArtifactRefused> {
        if artifact.engine != self.artifact_engine() {
            return Err(ArtifactRefused::Engine {
                expected: self.artifact_engine().to_owned(),
                found: artifact.engine.clone(),
            });
        }
        if artifact.key_id != key.id() {
            return Err(ArtifactRefused::OtherKey {
                expected: key.id().to_owned(),
                found: artifact.key_id.clone(),
            });
        }
        let size = artifact.module_size.to_le_bytes();
        if !key.verify(&artifact.tag_fields(&size), &artifact.mac) {
            // Only to say which: damage on the way, or a row written by something else.
            let actual = sha256_hex(&artifact.bytes);
            if actual != artifact.sha256 {
                return Err(ArtifactRefused::Hash { expected: artifact.sha256.clone(), actual });
            }
            return Err(ArtifactRefused::Mac);
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

/// Sharing compiled artifacts: a store and the key that tags and checks what goes through
/// it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SharedArtifacts {
    store: Arc<dyn ArtifactStore>,
    key: ArtifactKey,
}

impl SharedArtifacts {
    /// Artifacts kept in `store`, tagged and checked with `key`.
    pub fn new(store: Arc<dyn ArtifactStore>, key: ArtifactKey) -> Self {
        SharedArtifacts { store, key }
    }

    /// The key artifacts are tagged with (pass it to [`Sandbox::compile_sharing`]).
    pub fn key(&self) -> &ArtifactKey {
        &self.key
    }

    /// The compiled module for `sha256`, when the store holds a sound artifact for
    /// `sandbox`'s engine and this key. One it holds that is refused is discarded (so the
    /// caller's compile can store a sound one) and `None` returned, as for a miss or a store
    /// that failed: the caller compiles.
    pub async fn load(&self, sandbox: &Sandbox, sha256: &str) -> Option<CompiledModule> {
        let engine = sandbox.artifact_engine().to_owned();
        let key_id = self.key.id().to_owned();
        let artifact = match self.store.load(sha256.to_owned(), engine, key_id).await {
            Ok(Some(artifact)) => artifact,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(%sha256, error = %e, "reading the artifact store failed; compiling");
                return None;
            }
        };
        let started = std::time::Instant::now();
        let (loader, key, read) = (sandbox.clone(), self.key.clone(), artifact.clone());
        let loaded = tokio::task::spawn_blocking(move || loader.load_artifact(&read, &key)).await;
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
                if let Err(e) = self.store.discard(artifact).await {
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

    /// Offers `artifact` to the store (first writer wins); a failure is logged, not returned:
    /// it only costs another runner a compile.
    pub async fn save(&self, artifact: Artifact) {
        let (sha256, size) = (artifact.module_sha256.clone(), artifact.bytes.len());
        match self.store.save(artifact).await {
            Ok(stored) => tracing::debug!(%sha256, size, stored, "artifact offered to the store"),
            Err(e) => tracing::warn!(%sha256, error = %e, "storing the compiled artifact failed"),
        }
    }
}

/// Logged once by a runner or admin API started without `SWEEP_SECRETS_KEY`.
pub const NO_KEY_NO_SHARING: &str = "compiled modules are not shared with the fleet: sharing \
    needs SWEEP_SECRETS_KEY (artifacts are authenticated under a key derived from it); this \
    process compiles every module it runs for itself";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sandbox::SandboxConfig;
    use crate::secrets::SecretsKey;

    const NOOP: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;
    const TRAP: &str =
        r#"(module (memory (export "memory") 1) (func (export "_start") unreachable))"#;

    /// What a compile child would write for `wat`, tagged under `key` as `compile_sharing`
    /// tags it (the lib tests have no `sweep` binary to run the child).
    fn tagged(sandbox: &Sandbox, key: &ArtifactKey, wat: &str) -> Artifact {
        let module = wat::parse_str(wat).unwrap();
        let child = Engine::new(&super::super::engine::base_config()).unwrap();
        let bytes = child.precompile_module(&module).unwrap();
        let compiled = sandbox.compile(&module).unwrap();
        Artifact::tagged(&compiled, sandbox.artifact_engine(), module.len() as u64, bytes, key)
    }

    #[test]
    fn only_an_artifact_whose_tag_verifies_under_the_key_is_loaded() {
        let sandbox =
            Sandbox::new(SandboxConfig { pooling: false, ..SandboxConfig::default() }).unwrap();
        let (deployment, _) = SecretsKey::generate();
        let key = deployment.artifact_key();
        let noop = tagged(&sandbox, &key, NOOP);
        let loaded = sandbox.load_artifact(&noop, &key).unwrap();
        assert_eq!(loaded.sha256(), noop.module_sha256);

        let refused = |artifact: &Artifact, key: &ArtifactKey| {
            sandbox.load_artifact(artifact, key).map(|_| ()).unwrap_err()
        };
        // Damage: bytes changed, recorded hash kept.
        let mut damaged = noop.clone();
        let mut bytes = damaged.bytes.to_vec();
        bytes[200] ^= 0xff;
        damaged.bytes = Bytes::from(bytes);
        assert!(matches!(refused(&damaged, &key), ArtifactRefused::Hash { .. }));
        // Forgery: another module's genuine artifact with its hash (and its own valid tag)
        // under noop's name; any one field of the row rewritten; no tag or a cut one.
        let trap = tagged(&sandbox, &key, TRAP);
        assert!(sandbox.load_artifact(&trap, &key).is_ok());
        let mut forged = trap.clone();
        forged.module_sha256 = noop.module_sha256.clone();
        assert!(matches!(refused(&forged, &key), ArtifactRefused::Mac));
        let mut forged = noop.clone();
        (forged.bytes, forged.sha256) = (trap.bytes.clone(), trap.sha256.clone());
        assert!(matches!(refused(&forged, &key), ArtifactRefused::Mac));
        let mut forged = noop.clone();
        forged.module_size += 1;
        assert!(matches!(refused(&forged, &key), ArtifactRefused::Mac));
        let mut forged = noop.clone();
        forged.kind = HandlerKind::Component;
        assert!(matches!(refused(&forged, &key), ArtifactRefused::Mac));
        for mac in [String::new(), noop.mac[..62].to_owned(), "00".repeat(32)] {
            let forged = Artifact { mac, ..noop.clone() };
            assert!(matches!(refused(&forged, &key), ArtifactRefused::Mac));
        }
        // Another deployment's key: its id is not ours; claiming ours, its tag fails.
        let (theirs, _) = SecretsKey::generate();
        let other = tagged(&sandbox, &theirs.artifact_key(), NOOP);
        assert!(matches!(refused(&other, &key), ArtifactRefused::OtherKey { .. }));
        let relabelled = Artifact { key_id: key.id().to_owned(), ..other };
        assert!(matches!(refused(&relabelled, &key), ArtifactRefused::Mac));
        // Another engine.
        let older = Artifact { engine: "an-older-wasmtime".into(), ..noop.clone() };
        assert!(matches!(refused(&older, &key), ArtifactRefused::Engine { .. }));
    }

    #[test]
    fn nothing_is_tagged_for_sharing_without_a_key_or_a_child() {
        let sandbox =
            Sandbox::new(SandboxConfig { pooling: false, ..SandboxConfig::default() }).unwrap();
        let key = SecretsKey::generate().0.artifact_key();
        let module = wat::parse_str(NOOP).unwrap();
        // In process: there is no child artifact to share, key or not.
        assert!(sandbox.compile_sharing(&module, None, Some(&key)).unwrap().1.is_none());
        assert!(sandbox.compile_sharing(&module, None, None).unwrap().1.is_none());
    }

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
