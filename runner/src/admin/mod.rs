//! The admin API: an HTTP/JSON endpoint (warp) to upload modules, enqueue and inspect tasks,
//! read queue statistics and scrape metrics, shared by several tenants.
//!
//! Owns: [`AdminState`] (store, sandbox for upload validation, settings, metrics handle),
//! [`routes`] (the whole API as one warp filter, for tests and embedding) and [`serve`] /
//! [`serve_on`] (bind and serve until a shutdown future resolves). `sweep admin` serves it
//! alone; `sweep run` serves it next to a runner.
//!
//! Files: `config` (settings), `auth` (tokens, callers, tenant scoping), `body` (size-limited
//! bodies), `json_input` (request JSON read as the OpenAPI document describes it),
//! `enqueue_input` (enqueue bodies; the batch read in one pass, errors naming index and field),
//! `capability_models` (bodies of the egress, secrets and usage routes),
//! `params` (query and path parameters, module limits), `turns` (one compile per tenant),
//! `models` (JSON bodies), `handlers/*` (one file per resource; shared helpers in
//! `handlers/mod.rs`), `filters` (route table), `openapi` (the OpenAPI document built from that
//! table), `error` (JSON errors and their envelope, the `recover`), `ui/*` (the HTML dashboard
//! at `/ui`, on the same auth and queue functions). Imports go one way: `error` <- `params`,
//! `json_input` <- `models` <- `handlers/*` <- `filters`; no handler imports another.
//!
//! Invariants:
//! - every `/v1` route but `/v1/openapi.json`, and `/metrics`, authenticates
//!   (`Authorization: Bearer <token>`); a tenant
//!   token only ever reads or writes its own tenant's rows; others answer 404 as if absent;
//! - bad input is a 4xx JSON error, never a 500 or a panic; request bodies are size-limited;
//! - database errors are logged and shown as "internal error";
//! - module validation (a compile) never runs on an async worker thread; it goes through the
//!   sandbox's compiler (structural limits, then a budgeted child process), one per tenant at
//!   a time (`turns`), and what it compiled is handed to the runner's cache when there is one.

mod auth;
mod body;
mod capability_models;
mod config;
mod enqueue_input;
mod error;
mod filters;
mod handlers;
mod json_input;
mod models;
mod openapi;
mod params;
mod turns;
mod ui;
mod wait;

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use auth::{
    create_read_only_token, create_tenant, hash_token, new_token, rotate_token, Caller, Identity,
    TOKEN_PREFIX,
};
pub use config::{
    AdminConfig, AdminConfigError, DEFAULT_ADDR, DEFAULT_MAX_BATCH,
    DEFAULT_MAX_CONCURRENT_VALIDATIONS, DEFAULT_MAX_JSON_BYTES, DEFAULT_MAX_MODULE_BYTES,
    DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_VALIDATION_TIMEOUT, MIN_OPERATOR_TOKEN_LEN,
};
pub use error::ApiError;
pub use filters::{routes, Route};
pub use openapi::{document, document_json};
pub use params::{EffectiveLimits, MAX_BACKOFF_MS};

use crate::queue::{Role, Store};
use crate::sandbox::{ModuleCache, Sandbox, SharedArtifacts};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    #[error("invalid admin API settings: {0}")]
    Config(#[from] AdminConfigError),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the listening address")]
    LocalAddr(#[source] std::io::Error),
    #[error("the admin API needs a store opened for the admin role, got {0:?}")]
    WrongRole(Role),
}

/// Everything a request needs. Cheap to clone.
#[derive(Clone)]
pub struct AdminState {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    sandbox: Sandbox,
    config: AdminConfig,
    operator_token_hash: Option<String>,
    metrics: Option<PrometheusHandle>,
    validation_slots: Arc<Semaphore>,
    compile_turns: Arc<turns::CompileTurns>,
    /// The runner's module cache, when the API is served next to a runner: an upload's
    /// compiled module goes there, so its first task does not compile it again.
    modules: Option<ModuleCache>,
    /// The fleet's compiled artifacts: an upload loads a module's from there when another
    /// runner compiled it, and stores what it compiled. None without `SWEEP_SECRETS_KEY`
    /// (`AdminConfig::secrets_key`): artifacts are shared only tagged under its sub-key.
    artifacts: Option<SharedArtifacts>,
    /// Task ends, for `GET /v1/tasks/{id}?wait=` (one LISTEN, started at the first wait).
    ends: wait::Ends,
}

impl fmt::Debug for AdminState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminState")
            .field("config", &self.inner.config)
            .field("metrics", &self.inner.metrics.is_some())
            .finish_non_exhaustive()
    }
}

impl AdminState {
    /// Checks `config` and installs the Prometheus recorder (once per process; without it,
    /// `/metrics` answers 503 and everything else works). `sandbox` validates uploads: share
    /// the runner's, or build one with `SandboxConfig { pooling: false, .. }` when serving
    /// the API alone. Its maxima bound what a module may ask for.
    ///
    /// `store` must be opened for [`Role::Admin`]: the API's reads never take the runner's
    /// connections.
    pub fn new(store: &Store, sandbox: Sandbox, config: AdminConfig) -> Result<Self, AdminError> {
        Self::build(store, sandbox, None, config)
    }

    /// [`Self::new`] for the API served next to a runner: `sandbox` is the runner's and
    /// `modules` its cache (built on that sandbox), which receives every module an upload
    /// compiled, so the runner does not compile it a second time.
    pub fn for_runner(
        store: &Store,
        sandbox: Sandbox,
        modules: ModuleCache,
        config: AdminConfig,
    ) -> Result<Self, AdminError> {
        Self::build(store, sandbox, Some(modules), config)
    }

    fn build(
        store: &Store,
        sandbox: Sandbox,
        modules: Option<ModuleCache>,
        config: AdminConfig,
    ) -> Result<Self, AdminError> {
        config.validate()?;
        if store.role() != Role::Admin {
            return Err(AdminError::WrongRole(store.role()));
        }
        let store = store.clone();
        let metrics = match crate::metrics::install() {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!(error = %e, "metrics unavailable: /metrics will answer 503");
                None
            }
        };
        let operator_token_hash = config.operator_token.as_deref().map(auth::hash_token);
        let validation_slots = Arc::new(Semaphore::new(config.max_concurrent_validations));
        let artifacts = match &config.secrets_key {
            Some(key) => Some(SharedArtifacts::new(
                Arc::new(crate::queue::PgArtifacts::new(store.clone(), None)),
                key.artifact_key(),
            )),
            None => {
                // Next to a runner, the runner says so (once per process).
                if modules.is_none() {
                    tracing::info!("{}", crate::sandbox::NO_KEY_NO_SHARING);
                }
                None
            }
        };
        Ok(AdminState {
            inner: Arc::new(Inner {
                store,
                sandbox,
                config,
                operator_token_hash,
                metrics,
                validation_slots,
                compile_turns: Arc::default(),
                artifacts,
                modules,
                ends: wait::Ends::default(),
            }),
        })
    }

    /// The admin store: pass it to the queue functions.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.inner.sandbox
    }

    pub fn config(&self) -> &AdminConfig {
        &self.inner.config
    }

    pub fn metrics(&self) -> Option<&PrometheusHandle> {
        self.inner.metrics.as_ref()
    }

    fn operator_token_hash(&self) -> Option<&str> {
        self.inner.operator_token_hash.as_deref()
    }

    fn ends(&self) -> &wait::Ends {
        &self.inner.ends
    }

    fn validation_slots(&self) -> Arc<Semaphore> {
        Arc::clone(&self.inner.validation_slots)
    }

    fn compile_turns(&self) -> &Arc<turns::CompileTurns> {
        &self.inner.compile_turns
    }

    /// The runner's module cache, when served next to a runner.
    pub fn modules(&self) -> Option<&ModuleCache> {
        self.inner.modules.as_ref()
    }

    /// The fleet's compiled artifacts, when they are shared (with a secrets key).
    pub(crate) fn artifacts(&self) -> Option<&SharedArtifacts> {
        self.inner.artifacts.as_ref()
    }
}

/// Binds `addr` and serves the API until `shutdown` resolves, then stops accepting and lets
/// requests in flight finish. Fails only if the address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AdminError> {
    let listener =
        TcpListener::bind(addr).await.map_err(|source| AdminError::Bind { addr, source })?;
    serve_on(listener, state, shutdown).await
}

/// Like [`serve`], on a listener bound by the caller (e.g. port 0 in tests).
pub async fn serve_on(
    listener: TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AdminError> {
    let local = listener.local_addr().map_err(AdminError::LocalAddr)?;
    tracing::info!(addr = %local, "admin API listening");
    warp::serve(routes(state)).incoming(listener).graceful(shutdown).run().await;
    tracing::info!(addr = %local, "admin API stopped");
    Ok(())
}
