//! The fleet's compiled artifacts (`sweep.compiled_artifacts`, migration 0006): what a compile
//! child made of a module, keyed by the module's sha256, the engine fingerprint and the id of
//! the deployment key that tagged it, so every runner of that key loads what one compiled.
//!
//! Owns: the statements on that table and [`PgArtifacts`], the sandbox's `ArtifactStore` over
//! a [`Store`].
//!
//! Invariants:
//! - a row is written once per key (`on conflict do nothing`: the first writer wins; equal
//!   keys compile to equal artifacts) and only from an artifact a compile child wrote
//!   (`sandbox::Sandbox::compile_sharing`), with its tag; nothing here checks, tags or loads
//!   an artifact, the sandbox does (`Sandbox::load_artifact`, which trusts no row);
//! - a row is removed when the sandbox refused it (only if it still holds the refused
//!   hash and tag), when no registered module has its sha256 any more, or when its engine or
//!   key is not the pruning runner's and it is older than the retention given
//!   ([`prune_artifacts`]): after an engine upgrade (or a new key), the old rows outlive a
//!   rolling deploy, then go;
//! - with a runtime handle, every statement runs on that runtime (the runner's control
//!   runtime: no connection is driven by the threads guests keep busy).

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use sqlx::PgExecutor;

use super::{sql_millis, QueueError, Store};
use crate::sandbox::{Artifact, ArtifactStore, BoxError, HandlerKind};

/// The artifact of `module_sha256` made by `engine` and tagged under key `key_id`, as stored
/// (unchecked).
pub async fn load_artifact<'c, E: PgExecutor<'c>>(
    executor: E,
    module_sha256: &str,
    engine: &str,
    key_id: &str,
) -> Result<Option<Artifact>, QueueError> {
    let row: Option<(String, i64, Vec<u8>, String, String)> = sqlx::query_as(LOAD)
        .bind(module_sha256)
        .bind(engine)
        .bind(key_id)
        .fetch_optional(executor)
        .await?;
    let Some((kind, module_size, bytes, sha256, mac)) = row else { return Ok(None) };
    let kind = match kind.as_str() {
        "module" => HandlerKind::Module,
        "component" => HandlerKind::Component,
        other => return Err(QueueError::Corrupt(format!("artifact of unknown kind {other:?}"))),
    };
    Ok(Some(Artifact {
        module_sha256: module_sha256.to_owned(),
        engine: engine.to_owned(),
        kind,
        module_size: u64::try_from(module_size).unwrap_or(0),
        bytes: Bytes::from(bytes),
        sha256,
        key_id: key_id.to_owned(),
        mac,
    }))
}

/// Stores `artifact` unless its key is taken; true when it was stored.
pub async fn save_artifact<'c, E: PgExecutor<'c>>(
    executor: E,
    artifact: &Artifact,
) -> Result<bool, QueueError> {
    let done = sqlx::query(SAVE)
        .bind(&artifact.module_sha256)
        .bind(&artifact.engine)
        .bind(artifact.kind.as_str())
        .bind(i64::try_from(artifact.module_size).unwrap_or(i64::MAX))
        .bind(&artifact.bytes[..])
        .bind(&artifact.sha256)
        .bind(&artifact.key_id)
        .bind(&artifact.mac)
        .execute(executor)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Removes the row `refused` was read from if it still records `refused`'s hash and tag.
pub async fn discard_artifact<'c, E: PgExecutor<'c>>(
    executor: E,
    refused: &Artifact,
) -> Result<bool, QueueError> {
    let done = sqlx::query(DISCARD)
        .bind(&refused.module_sha256)
        .bind(&refused.engine)
        .bind(&refused.key_id)
        .bind(&refused.sha256)
        .bind(&refused.mac)
        .execute(executor)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes the artifacts no registered module needs, and those of engines other than `engine`
/// or (given a `key_id`) of other keys, written more than `others_after` ago. Returns how many
/// went.
pub async fn prune_artifacts<'c, E: PgExecutor<'c>>(
    executor: E,
    engine: &str,
    key_id: Option<&str>,
    others_after: Duration,
) -> Result<u64, QueueError> {
    let done = sqlx::query(PRUNE)
        .bind(engine)
        .bind(sql_millis(others_after))
        .bind(key_id)
        .execute(executor)
        .await?;
    Ok(done.rows_affected())
}

/// The sandbox's [`ArtifactStore`] over a [`Store`].
#[derive(Debug, Clone)]
pub struct PgArtifacts {
    store: Store,
    runtime: Option<tokio::runtime::Handle>,
}

impl PgArtifacts {
    /// Artifacts in `store`'s database; statements run on `runtime` when given (a runner's
    /// control runtime), else on whichever runtime polls them.
    pub fn new(store: Store, runtime: Option<tokio::runtime::Handle>) -> Self {
        PgArtifacts { store, runtime }
    }

    fn run<T, F>(&self, work: F) -> BoxFuture<'static, Result<T, BoxError>>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, QueueError>> + Send + 'static,
    {
        match &self.runtime {
            Some(runtime) => {
                let spawned = runtime.spawn(work);
                Box::pin(async move {
                    match spawned.await {
                        Ok(done) => done.map_err(BoxError::from),
                        Err(join) => Err(BoxError::from(join)),
                    }
                })
            }
            None => Box::pin(async move { work.await.map_err(BoxError::from) }),
        }
    }
}

impl ArtifactStore for PgArtifacts {
    fn load(
        &self,
        module_sha256: String,
        engine: String,
        key_id: String,
    ) -> BoxFuture<'static, Result<Option<Artifact>, BoxError>> {
        let store = self.store.clone();
        self.run(async move { load_artifact(&store, &module_sha256, &engine, &key_id).await })
    }

    fn save(&self, artifact: Artifact) -> BoxFuture<'static, Result<bool, BoxError>> {
        let store = self.store.clone();
        self.run(async move { save_artifact(&store, &artifact).await })
    }

    fn discard(&self, refused: Artifact) -> BoxFuture<'static, Result<(), BoxError>> {
        let store = self.store.clone();
        self.run(async move { discard_artifact(&store, &refused).await.map(|_| ()) })
    }
}

const LOAD: &str = r#"
    select kind, module_size, artifact, artifact_sha256, artifact_mac
    from sweep.compiled_artifacts
    where module_sha256 = $1 and engine = $2 and key_id = $3
"#;

const SAVE: &str = r#"
    insert into sweep.compiled_artifacts
        (module_sha256, engine, kind, module_size, artifact, artifact_sha256, key_id,
         artifact_mac)
    values ($1, $2, $3, $4, $5, $6, $7, $8)
    on conflict (module_sha256, engine, key_id) do nothing
"#;

const DISCARD: &str = r#"
    delete from sweep.compiled_artifacts
    where module_sha256 = $1 and engine = $2 and key_id = $3
      and artifact_sha256 = $4 and artifact_mac = $5
"#;

const PRUNE: &str = r#"
    delete from sweep.compiled_artifacts a
    where ((a.engine <> $1 or a.key_id <> $3::text)
           and a.created_at < now() - make_interval(secs => $2::float8 / 1000))
       or not exists (select 1 from sweep.modules m where m.sha256 = a.module_sha256)
"#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![LOAD, SAVE, DISCARD, PRUNE];
