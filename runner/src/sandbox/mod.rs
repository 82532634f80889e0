//! The WebAssembly execution layer: runs one task's handler (a preview-1 module or a WASI 0.2
//! component) in a limited instance, fresh unless its scope reuses instances, and reports a
//! typed [`Outcome`].
//!
//! Owns: the runner's one `wasmtime::Engine` (with its epoch ticker), the WASI linkers (one
//! for modules, one for components), handler validation/compilation, the module cache,
//! per-task limits, outbound HTTP under the egress policy, and outcome classification.
//! Knows nothing about Postgres: the worker feeds it bytes and inputs and records `Execution`s.
//!
//! Invariants:
//! - handlers are untrusted: every run has fuel, a wall-clock deadline, a memory ceiling and a
//!   stdout ceiling, and no filesystem, host env or args; the network only as outbound HTTP
//!   from a component, to what its `Capabilities` allow (`http`);
//! - nothing here panics or unwraps on guest behaviour or module bytes; a misbehaving guest
//!   becomes an `Outcome`, a bad module a `ValidationError`;
//! - compile once (per sha256), instantiate per task: the linker is built once per
//!   `Sandbox`, modules are kept as `InstancePre`, components as `CommandPre`, each run gets
//!   a fresh `Store`, except a component's whose scope reuses instances: it may run on one
//!   kept from an earlier task of that scope, renewed for it (`warm`).
//!
//! Files: `artifacts` (compile once per fleet: the store of compiled artifacts, the engine
//! fingerprint, the tag under the runners' key, loading a stored artifact), `capabilities`
//! (what a run is given beyond computing: egress, HTTP limits, secrets as environment; what
//! it used), `config` (settings, limits), `engine` (engine + ticker), `limits` (structural
//! limits, compile budget), `compiler` (where compiles run: child process or in process),
//! `module` (validation, compiled form), `cache` (sha256 -> compiled, bounded by bytes),
//! `store` (per-task state), `run` (one task), `warm` (component instances kept between
//! tasks of a scope that opted in), `wasi` (what a module sees), `component` (what a
//! component sees), `http` (outbound HTTP: egress checks, limits, accounting), `pipes`
//! (bounded stdio), `outcome` (classification).

mod artifacts;
mod cache;
mod capabilities;
mod compiler;
mod component;
mod config;
#[cfg(test)]
mod cost_tests;
mod engine;
mod http;
mod limits;
mod module;
mod outcome;
mod pipes;
mod run;
mod store;
mod warm;
mod wasi;
#[cfg(test)]
mod wasi_tests;

use std::fmt;
use std::sync::Arc;

use wasmtime::{Engine, Linker};

pub use artifacts::{Artifact, ArtifactRefused, ArtifactStore, SharedArtifacts, NO_KEY_NO_SHARING};
pub use cache::{ModuleCache, DEFAULT_MODULE_CACHE_BYTES};
pub use capabilities::{
    is_public, Capabilities, EgressError, EgressPolicy, HttpLimits, Usage, DEFAULT_HTTP_REQUESTS,
    DEFAULT_HTTP_REQUEST_TIMEOUT, DEFAULT_HTTP_RESPONSE_BYTES, MAX_EGRESS_ENTRIES,
    MAX_EGRESS_ENTRY_BYTES,
};
pub use compiler::{
    compile_module_main, CompileStats, CompilerKind, COMPILE_NICE, COMPILE_SUBCOMMAND,
};
pub use component::RUN_EXPORT;
pub use config::{
    ConfigError, LimitOverrides, Limits, SandboxConfig, DEFAULT_EPOCH_TICK, DEFAULT_FUEL,
    DEFAULT_MAX_CONCURRENCY, DEFAULT_MEMORY_BYTES, DEFAULT_OUTPUT_BYTES, DEFAULT_TIMEOUT, MAX_FUEL,
    MAX_MEMORY_BYTES, MAX_OUTPUT_BYTES, MAX_TIMEOUT,
};
pub use engine::AllocatorKind;
pub use limits::{
    check_structure, CompileBudget, CompileLimits, LimitExceeded, Structure, DEFAULT_COMPILE_CPU,
    DEFAULT_COMPILE_CPU_PER_CODE_MIB, DEFAULT_COMPILE_MEMORY_BYTES,
    DEFAULT_COMPILE_MEMORY_PER_CODE_MIB, DEFAULT_COMPILE_WALL, DEFAULT_MAX_CODE_BYTES,
    DEFAULT_MAX_COMPILE_CPU, DEFAULT_MAX_COMPILE_MEMORY_BYTES, DEFAULT_MAX_CONCURRENT_COMPILES,
    DEFAULT_MAX_FUNCTIONS, DEFAULT_MAX_FUNCTION_BYTES, DEFAULT_MAX_LOCALS,
};
pub use module::{
    sha256_hex, CompiledModule, HandlerKind, ModuleInfo, ValidationError, ENTRY_OVERHEAD_BYTES,
    IMAGE_OVERHEAD_DIVISOR, START_EXPORT, WASI_MODULE,
};
pub use outcome::{Execution, Outcome, TrapCause, MESSAGE_MAX_BYTES, PERMANENT_EXIT_CODE};
pub use run::{CAPACITY_WAIT, STDERR_TAIL_BYTES};
pub use store::{Reuse, TaskInput};
pub use warm::{WarmStats, IDLE_TIMEOUT};

pub(crate) use module::check_initial_memory;

use compiler::Compiler;
use component::ComponentState;
use store::StoreState;

/// A boxed error source (wasmtime's own error type is not a `std::error::Error`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Failures of the sandbox itself (not of a guest: those are [`Outcome`]s).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The configuration did not validate.
    #[error("invalid sandbox configuration")]
    Config(#[from] ConfigError),
    /// The wasmtime engine could not be created.
    #[error("failed to create the wasmtime engine")]
    Engine(#[source] BoxError),
    /// The WASI imports could not be added to the linker.
    #[error("failed to set up the WASI linker")]
    Linker(#[source] BoxError),
    /// The epoch ticker thread could not be started.
    #[error("failed to start the epoch ticker thread")]
    Ticker(#[source] std::io::Error),
    /// The module was rejected.
    #[error("invalid module")]
    Invalid(#[from] ValidationError),
    /// Loading module bytes for the cache failed.
    #[error("failed to load module {sha256}")]
    Load {
        /// The requested module.
        sha256: String,
        /// Why loading failed.
        #[source]
        source: BoxError,
    },
    /// The loaded bytes don't hash to the requested key.
    #[error("module bytes hash to {actual}, expected {expected}")]
    HashMismatch {
        /// The requested key.
        expected: String,
        /// The hash of the loaded bytes.
        actual: String,
    },
    /// The blocking compile task died (panicked or was cancelled at shutdown).
    #[error("module compilation task failed")]
    CompileTask(#[source] tokio::task::JoinError),
}

/// The runner's sandbox: one engine, one linker, shared by all tasks. Cheap to clone.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    linker: Linker<StoreState>,
    component_linker: wasmtime::component::Linker<ComponentState>,
    allocator: AllocatorKind,
    compiler: Compiler,
    config: SandboxConfig,
    /// The fingerprint of the compile child's engine settings (see `artifacts`).
    artifact_engine: String,
    /// Component instances kept between tasks of scopes that reuse them.
    warm: Arc<warm::WarmPool>,
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox")
            .field("allocator", &self.inner.allocator)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Validates `config`, builds the engine (pooling, falling back to on-demand), the WASI
    /// linker, and starts the epoch ticker thread. Does not need a tokio runtime.
    pub fn new(config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        config.validate()?;
        let (engine, allocator) = engine::build_engine(&config)?;
        let mut linker = Linker::new(&engine);
        wasi::add_to_linker(&mut linker)
            .map_err(|e| SandboxError::Linker(e.into_boxed_dyn_error()))?;
        let mut component_linker = wasmtime::component::Linker::new(&engine);
        component::add_to_linker(&mut component_linker)
            .map_err(|e| SandboxError::Linker(e.into_boxed_dyn_error()))?;
        // Detached: the thread ends by itself once the last engine clone is dropped.
        let _ticker = engine::spawn_epoch_ticker(&engine, config.epoch_tick)?;
        tracing::info!(%allocator, max_concurrency = config.max_concurrency, "sandbox ready");
        let compiler = Compiler::new(config.compiler.clone(), config.compile);
        // The child's engine, not this one: its settings are what made the artifacts (this
        // engine may add pooling, which artifacts do not depend on).
        let child_engine = Engine::new(&engine::base_config())
            .map_err(|e| SandboxError::Engine(e.into_boxed_dyn_error()))?;
        let artifact_engine = artifacts::engine_fingerprint(&child_engine);
        let inner = Inner {
            engine,
            linker,
            component_linker,
            allocator,
            compiler,
            config,
            artifact_engine,
            warm: Arc::default(),
        };
        Ok(Sandbox { inner: Arc::new(inner) })
    }

    /// Which instance allocator is in use.
    pub fn allocator(&self) -> AllocatorKind {
        self.inner.allocator
    }

    /// The configuration this sandbox was built with.
    pub fn config(&self) -> &SandboxConfig {
        &self.inner.config
    }

    /// The shared engine.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// What the pool of kept component instances did so far (see [`Reuse`]).
    pub fn warm_stats(&self) -> WarmStats {
        self.inner.warm.stats()
    }

    /// Kept component instances idle now.
    pub fn warm_idle(&self) -> usize {
        self.inner.warm.idle()
    }

    /// Checks `bytes` against the guest contract (by compiling it) and describes it.
    /// CPU-heavy: from async code, call it inside `spawn_blocking`.
    pub fn validate_module(&self, bytes: &[u8]) -> Result<ModuleInfo, ValidationError> {
        self.prepare(bytes).map(|m| m.info().clone())
    }

    /// [`Self::validate_module`] for a module that will run with at most `memory_limit_bytes`
    /// of linear memory: one whose memory starts larger is refused before compiling, as
    /// [`ValidationError::MemoryTooLarge`].
    pub fn validate_module_for(
        &self,
        bytes: &[u8],
        memory_limit_bytes: u64,
    ) -> Result<ModuleInfo, ValidationError> {
        self.compile_for(bytes, memory_limit_bytes).map(|m| m.info().clone())
    }

    /// Validates and compiles `bytes` into a module ready to run. CPU-heavy: from async code,
    /// prefer [`ModuleCache::get_or_compile`], which runs this on the blocking pool.
    pub fn compile(&self, bytes: &[u8]) -> Result<CompiledModule, SandboxError> {
        Ok(self.prepare(bytes)?)
    }

    /// [`Self::compile`] for a module that will run with at most `memory_limit_bytes` (see
    /// [`Self::validate_module_for`]): what an upload compiles and hands to the module cache.
    pub fn compile_for(
        &self,
        bytes: &[u8],
        memory_limit_bytes: u64,
    ) -> Result<CompiledModule, ValidationError> {
        module::check_initial_memory(bytes, memory_limit_bytes)?;
        self.prepare(bytes)
    }

    /// Compiles started by this sandbox so far (past the structural limits), on any path.
    pub fn compiles(&self) -> u64 {
        self.inner.compiler.compiles()
    }

    /// The structural limits and compile budget modules are held to.
    pub fn compile_limits(&self) -> &CompileLimits {
        self.inner.compiler.limits()
    }

    fn prepare(&self, bytes: &[u8]) -> Result<CompiledModule, ValidationError> {
        self.prepare_with_artifact(bytes).map(|(compiled, _artifact)| compiled)
    }

    fn prepare_with_artifact(
        &self,
        bytes: &[u8],
    ) -> Result<(CompiledModule, Option<Vec<u8>>), ValidationError> {
        let inner = &self.inner;
        module::prepare(&inner.linker, &inner.component_linker, &inner.compiler, bytes)
    }
}
