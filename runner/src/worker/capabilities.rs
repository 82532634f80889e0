//! What each task is given beyond computing: its tenant's egress policy and HTTP limits and
//! its module version's secrets as environment variables, built once per (tenant, task type,
//! module version) and reused for [`WorkerConfig::capabilities_ttl`] (5 s by default).
//!
//! Why a short TTL and no invalidation: a policy or secret changes through the admin API of
//! any process, and runners share nothing but Postgres; a NOTIFY channel would need every
//! runner to LISTEN (a runner behind a transaction pooler polls instead) and would still race
//! with the read it invalidates. A TTL bounds how long a change takes to reach every runner
//! (the docs say so) at the cost of one query per module version per runner per TTL, next to
//! claims of up to a batch of tasks each: nothing. The query is one round trip
//! (`queue::task_capabilities`), run on the control runtime like every other read; a claimed
//! batch over many tenants reads all it misses in one ([`CapabilityCache::prefetch`]).
//!
//! Invariants:
//! - a task whose module names secrets runs with every one of them or not at all: without a
//!   key, with another key, or with a secret gone, it fails as `secrets_unavailable` (retried
//!   with backoff: a runner with the key, or the secret set again, runs it);
//! - what a run leaves behind (result, stderr tail, failure messages) is redacted of the
//!   values it was given before anything logs, counts or stores it ([`redact`]).
//!
//! [`WorkerConfig::capabilities_ttl`]: crate::config::WorkerConfig::capabilities_ttl

use std::sync::Arc;
use std::time::Duration;

use crate::queue::{self, ClaimedTask, Store, TenantEgress};
use crate::sandbox::{Capabilities, EgressPolicy, Execution, HttpLimits, Outcome};
use crate::secrets::{Redactor, SecretsKey, KEY_ENV};

/// What a task of one module version gets.
#[derive(Debug)]
pub(super) enum Granted {
    /// Run it with these; on a kept instance of at most `reuse` tasks, if set.
    Given { capabilities: Capabilities, redactor: Redactor, reuse: Option<u32> },
    /// Do not run it: the secrets it needs cannot be given (the message says why).
    Refused(String),
}

type Key = (String, String, i32);

/// The per-runner cache of [`Granted`] by (tenant, task type, module version).
#[derive(Clone)]
pub(super) struct CapabilityCache {
    cache: moka::future::Cache<Key, Arc<Granted>>,
    key: Option<SecretsKey>,
}

impl std::fmt::Debug for CapabilityCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapabilityCache")
            .field("entries", &self.cache.entry_count())
            .field("key", &self.key)
            .finish()
    }
}

/// Most (tenant, type, version) entries kept; past it the least used go first.
const MAX_ENTRIES: u64 = 10_000;

impl CapabilityCache {
    pub(super) fn new(key: Option<SecretsKey>, ttl: Duration) -> Self {
        let cache =
            moka::future::Cache::builder().max_capacity(MAX_ENTRIES).time_to_live(ttl).build();
        CapabilityCache { cache, key }
    }

    /// What a task of `tenant`'s `task_type` run by module `version` gets. A database error is
    /// returned (and not cached): the task fails as a runner error and is retried.
    pub(super) async fn get(
        &self,
        store: &Store,
        control: &tokio::runtime::Handle,
        tenant: &str,
        task_type: &str,
        version: i32,
    ) -> Result<Arc<Granted>, String> {
        let key = (tenant.to_owned(), task_type.to_owned(), version);
        let load = async {
            let (store, (owner, kind, version)) = (store.clone(), key.clone());
            let read = control.spawn(async move {
                queue::task_capabilities(&store, &owner, &kind, version).await
            });
            let rows = read
                .await
                .map_err(|e| format!("reading the task's capabilities did not finish: {e}"))?
                .map_err(|e| format!("reading the task's capabilities: {e}"))?;
            Ok::<_, String>(Arc::new(grant(tenant, rows, self.key.as_ref())))
        };
        self.cache.try_get_with(key.clone(), load).await.map_err(|e| (*e).clone())
    }

    /// Loads, in one round trip on `conn`, what the tasks of a claimed batch get, for every
    /// (tenant, task type, version) among them that the cache does not hold, so that their
    /// [`CapabilityCache::get`] finds it. A batch over many tenants would otherwise send one
    /// read per tenant on its tasks' way to their start: at 10,000 tenants with due work,
    /// one read per two tasks. Fewer than two missing: left to `get`. A database error only
    /// costs the batch: each task then reads its own.
    pub(super) async fn prefetch<'c, E: sqlx::PgExecutor<'c>>(
        &self,
        conn: E,
        tasks: &[ClaimedTask],
    ) {
        // Distinct keys first, borrowed: a batch of one queue (the common case) is one key,
        // and a key is owned only to ask the cache for it.
        let mut keys: Vec<(&str, &str, i32)> = tasks
            .iter()
            .filter_map(|t| {
                Some((t.tenant.as_str(), t.task_type.as_str(), t.module.as_ref()?.version))
            })
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let missing: Vec<Key> = keys
            .into_iter()
            .map(|(tenant, task_type, version)| (tenant.to_owned(), task_type.to_owned(), version))
            .filter(|key| !self.cache.contains_key(key))
            .collect();
        if missing.len() < 2 {
            return;
        }
        match queue::task_capabilities_many(conn, &missing).await {
            Ok(found) => {
                for (key, rows) in found {
                    let granted = grant(&key.0, Some(rows), self.key.as_ref());
                    self.cache.insert(key, Arc::new(granted)).await;
                }
            }
            Err(e) => tracing::debug!(error = %e, "reading a batch's capabilities failed"),
        }
    }
}

/// Builds what a task gets from the rows, opening its secrets with `key`.
fn grant(
    tenant: &str,
    rows: Option<queue::TaskCapabilityRows>,
    key: Option<&SecretsKey>,
) -> Granted {
    let Some(rows) = rows else {
        // The version is gone (modules are never deleted, so this is not expected): nothing.
        return Granted::Given {
            capabilities: Capabilities::none(),
            redactor: Redactor::default(),
            reuse: None,
        };
    };
    let egress = EgressPolicy::parse(&rows.allow).unwrap_or_else(|e| {
        // Entries are stored as the parser wrote them; a row edited by hand to something it
        // refuses allows nothing rather than something.
        tracing::warn!(%tenant, error = %e, "stored egress policy does not parse: allowing nothing");
        EgressPolicy::deny_all()
    });
    let limits = TenantEgress {
        max_requests: rows.max_requests,
        max_response_bytes: rows.max_response_bytes,
        request_timeout_ms: rows.request_timeout_ms,
        ..TenantEgress::default()
    };
    let http = limits.http_limits(HttpLimits::DEFAULT);
    let mut env = Vec::with_capacity(rows.wanted.len());
    if !rows.wanted.is_empty() {
        let Some(key) = key else {
            return Granted::Refused(format!(
                "the module needs secrets ({}) and this runner has no {KEY_ENV}",
                rows.wanted.join(", ")
            ));
        };
        for name in &rows.wanted {
            let Some((_, sealed)) = rows.sealed.iter().find(|(n, _)| n == name) else {
                return Granted::Refused(format!(
                    "the module needs secret {name}, which does not exist (deleted since the \
                     upload?); set it with PUT /v1/secrets/{name}"
                ));
            };
            match key.open(tenant, name, sealed) {
                Ok(value) => env.push((name.clone(), value)),
                Err(e) => return Granted::Refused(format!("secret {name} cannot be opened: {e}")),
            }
        }
    }
    let redactor = Redactor::new(&env);
    let capabilities = Capabilities { egress: Arc::new(egress), http, env };
    // One task per instance is a fresh instance per task: no pool needed.
    let reuse = rows.reuse.and_then(|n| u32::try_from(n).ok()).filter(|&n| n > 1);
    Granted::Given { capabilities, redactor, reuse }
}

/// Replaces the given secret values in everything `execution` carries out of the run: the
/// result, the stderr tail and the failure messages.
pub(super) fn redact(execution: &mut Execution, redactor: &Redactor) {
    if redactor.is_empty() {
        return;
    }
    execution.stderr = redactor.text(&execution.stderr);
    match &mut execution.outcome {
        Outcome::Success(value) => redactor.json(value),
        Outcome::HandlerError { message, .. }
        | Outcome::Trap { message, .. }
        | Outcome::InvalidOutput(message)
        | Outcome::RunnerError(message)
        | Outcome::NoCapacity(message)
        | Outcome::SecretsUnavailable(message) => *message = redactor.text(message),
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::queue::TaskCapabilityRows;

    fn rows(wanted: &[&str], sealed: Vec<(String, crate::secrets::Sealed)>) -> TaskCapabilityRows {
        TaskCapabilityRows {
            allow: vec!["127.0.0.1:8025".into()],
            max_requests: Some(3),
            wanted: wanted.iter().map(|s| s.to_string()).collect(),
            sealed,
            ..TaskCapabilityRows::default()
        }
    }

    #[test]
    fn secrets_are_given_all_or_refused_with_the_reason() {
        let (key, _) = SecretsKey::generate();
        let sealed = vec![("API_KEY".to_owned(), key.seal("acme", "API_KEY", "k-123456"))];
        match grant("acme", Some(rows(&["API_KEY"], sealed.clone())), Some(&key)) {
            Granted::Given { capabilities, redactor, reuse } => {
                assert_eq!(reuse, None);
                assert_eq!(capabilities.env, [("API_KEY".to_owned(), "k-123456".to_owned())]);
                assert_eq!(capabilities.http.max_requests, 3);
                assert_eq!(
                    capabilities.http.max_response_bytes,
                    HttpLimits::DEFAULT.max_response_bytes
                );
                assert!(capabilities.egress.allows_host("127.0.0.1", 8025));
                assert_eq!(redactor.text("key k-123456"), "key [redacted:API_KEY]");
            }
            Granted::Refused(why) => panic!("refused: {why}"),
        }
        let refused = |g: Granted| match g {
            Granted::Refused(why) => why,
            Granted::Given { .. } => panic!("given"),
        };
        assert!(refused(grant("acme", Some(rows(&["API_KEY"], sealed.clone())), None))
            .contains(KEY_ENV));
        assert!(refused(grant(
            "acme",
            Some(rows(&["API_KEY", "OTHER"], sealed.clone())),
            Some(&key)
        ))
        .contains("secret OTHER, which does not exist"));
        // Sealed for another tenant: does not open for this one.
        assert!(refused(grant("intruder", Some(rows(&["API_KEY"], sealed.clone())), Some(&key)))
            .contains("cannot be opened"));
        let (other_key, _) = SecretsKey::generate();
        assert!(refused(grant("acme", Some(rows(&["API_KEY"], sealed)), Some(&other_key)))
            .contains("sealed under key"));
        // No secrets named: no key needed.
        assert!(matches!(grant("acme", Some(rows(&[], vec![])), None), Granted::Given { .. }));
        let reusing = TaskCapabilityRows { reuse: Some(50), ..rows(&[], vec![]) };
        assert!(matches!(
            grant("acme", Some(reusing), None),
            Granted::Given { reuse: Some(50), .. }
        ));
        let fresh = TaskCapabilityRows { reuse: Some(1), ..rows(&[], vec![]) };
        assert!(matches!(grant("acme", Some(fresh), None), Granted::Given { reuse: None, .. }));
    }

    #[test]
    fn redaction_reaches_results_stderr_and_messages() {
        let redactor = Redactor::new(&[("K".to_owned(), "s3cr3t-v4lue".to_owned())]);
        let mut e = Execution {
            outcome: Outcome::HandlerError {
                permanent: false,
                exit_code: 1,
                message: "auth s3cr3t-v4lue failed".into(),
            },
            stderr: "sending s3cr3t-v4lue\n".into(),
            stderr_truncated: false,
            duration: Duration::ZERO,
            usage: crate::sandbox::Usage::default(),
            on_kept_instance: false,
        };
        redact(&mut e, &redactor);
        assert_eq!(e.stderr, "sending [redacted:K]\n");
        assert_eq!(e.outcome.message().unwrap(), "auth [redacted:K] failed");
        e.outcome = Outcome::Success(serde_json::json!({"echo": "s3cr3t-v4lue"}));
        redact(&mut e, &redactor);
        assert_eq!(e.outcome, Outcome::Success(serde_json::json!({"echo": "[redacted:K]"})));
    }
}
