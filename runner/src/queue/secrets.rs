//! Tenant secrets as rows: sealed values (`sweep.secrets`), their names and times, and what a
//! task's module needs of them.
//!
//! Invariants:
//! - a value reaches this module only sealed (`crate::secrets::SecretsKey::seal`), and no
//!   statement here returns a sealed value except [`task_capabilities`], the runner's read;
//! - every statement is scoped to one tenant (or, for the operator's listing, names the
//!   tenant of each row): one tenant's secret is never read for another's task;
//! - names are environment variable names (`[A-Za-z_][A-Za-z0-9_]*`, at most 128 bytes), never
//!   starting with `SWEEP_` (the runner's own variables), as the table's check says too.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;

use super::QueueError;
use crate::secrets::{Sealed, MAX_SECRETS_PER_TENANT, MAX_SECRET_NAME_LEN};

/// Why a secret name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid secret name {name:?}: {reason}")]
pub struct InvalidSecretName {
    pub name: String,
    pub reason: &'static str,
}

const RESERVED: &str = "SWEEP_ is the runner's own prefix";

impl InvalidSecretName {
    /// A well-formed name that is the runner's own (`SWEEP_...`), as opposed to a malformed one.
    pub fn is_reserved(&self) -> bool {
        self.reason == RESERVED
    }
}

/// Checks that `name` can be an environment variable the guest sees.
pub fn validate_secret_name(name: &str) -> Result<(), InvalidSecretName> {
    let refuse = |reason| Err(InvalidSecretName { name: cut(name).to_owned(), reason });
    let Some(first) = name.bytes().next() else {
        return refuse("empty");
    };
    if name.len() > MAX_SECRET_NAME_LEN {
        return refuse("longer than 128 bytes");
    }
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return refuse("starts with a letter or '_'");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return refuse("letters, digits and '_' only");
    }
    if name.len() >= 6 && name[..6].eq_ignore_ascii_case("SWEEP_") {
        return refuse(RESERVED);
    }
    Ok(())
}

fn cut(s: &str) -> &str {
    let mut end = s.len().min(MAX_SECRET_NAME_LEN + 8);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A secret without its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct SecretInfo {
    pub tenant: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What [`put_secret`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutSecret {
    /// Stored: `created` is false when it replaced a value.
    Stored { info: SecretInfo, created: bool },
    /// The tenant already holds [`MAX_SECRETS_PER_TENANT`] secrets; nothing was written.
    TooMany,
}

/// Stores (or replaces) secret `name` of `tenant`, sealed.
pub async fn put_secret<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    name: &str,
    sealed: &Sealed,
) -> Result<PutSecret, QueueError> {
    let row: Option<(String, String, DateTime<Utc>, DateTime<Utc>, bool)> = sqlx::query_as(PUT)
        .bind(tenant)
        .bind(name)
        .bind(&sealed.nonce)
        .bind(&sealed.sealed)
        .bind(&sealed.key_id)
        .bind(i64::try_from(MAX_SECRETS_PER_TENANT).unwrap_or(i64::MAX))
        .fetch_optional(executor)
        .await?;
    Ok(match row {
        Some((tenant, name, created_at, updated_at, created)) => {
            PutSecret::Stored { info: SecretInfo { tenant, name, created_at, updated_at }, created }
        }
        None => PutSecret::TooMany,
    })
}

/// The secrets of one tenant (`Some`) or of all (`None`, the operator), by tenant and name.
pub async fn list_secrets<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
) -> Result<Vec<SecretInfo>, QueueError> {
    Ok(sqlx::query_as(LIST).bind(tenant).fetch_all(executor).await?)
}

/// Deletes secret `name` of `tenant` and returns it as it was; `None` when there was none.
pub async fn delete_secret<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    name: &str,
) -> Result<Option<SecretInfo>, QueueError> {
    Ok(sqlx::query_as(DELETE).bind(tenant).bind(name).fetch_optional(executor).await?)
}

/// Those of `names` that `tenant` holds no secret for, in input order.
pub async fn missing_secrets<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    names: &[String],
) -> Result<Vec<String>, QueueError> {
    Ok(sqlx::query_scalar(MISSING).bind(tenant).bind(names).fetch_all(executor).await?)
}

/// What a runner needs to build one task's capabilities: its tenant's egress policy and HTTP
/// limit overrides, and the sealed secrets its module version names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskCapabilityRows {
    /// The tenant's allow list, canonical entries (empty: nothing allowed).
    pub allow: Vec<String>,
    pub max_requests: Option<i32>,
    pub max_response_bytes: Option<i64>,
    pub request_timeout_ms: Option<i64>,
    /// The secret names the module version asks for.
    pub wanted: Vec<String>,
    /// `(name, sealed)` of those that exist.
    pub sealed: Vec<(String, Sealed)>,
    /// Most tasks one kept instance of the version runs (`None`: fresh for every task).
    pub reuse: Option<i32>,
}

#[derive(sqlx::FromRow)]
struct CapabilityRow {
    tenant: String,
    task_type: String,
    version: i32,
    allow: Vec<String>,
    max_requests: Option<i32>,
    max_response_bytes: Option<i64>,
    request_timeout_ms: Option<i64>,
    wanted: Vec<String>,
    reuse: Option<i32>,
    names: Vec<String>,
    nonces: Vec<Vec<u8>>,
    sealed: Vec<Vec<u8>>,
    key_ids: Vec<String>,
}

/// [`TaskCapabilityRows`] of a task of `(tenant, task_type)` run by module `version`, in one
/// round trip; `None` when that version does not exist.
pub async fn task_capabilities<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    task_type: &str,
    version: i32,
) -> Result<Option<TaskCapabilityRows>, QueueError> {
    let key = (tenant.to_owned(), task_type.to_owned(), version);
    let mut found = task_capabilities_many(executor, std::slice::from_ref(&key)).await?;
    Ok(found.pop().map(|(_, rows)| rows))
}

/// [`task_capabilities`] of several `(tenant, task_type, version)` at once, in one round trip:
/// each key that exists, with its rows, in no particular order.
pub async fn task_capabilities_many<'c, E: PgExecutor<'c>>(
    executor: E,
    keys: &[(String, String, i32)],
) -> Result<Vec<((String, String, i32), TaskCapabilityRows)>, QueueError> {
    let tenants: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    let task_types: Vec<&str> = keys.iter().map(|k| k.1.as_str()).collect();
    let versions: Vec<i32> = keys.iter().map(|k| k.2).collect();
    let rows: Vec<CapabilityRow> = sqlx::query_as(TASK_CAPABILITIES)
        .bind(&tenants)
        .bind(&task_types)
        .bind(&versions)
        .fetch_all(executor)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let sealed = r
                .names
                .into_iter()
                .zip(r.nonces)
                .zip(r.sealed)
                .zip(r.key_ids)
                .map(|(((name, nonce), sealed), key_id)| (name, Sealed { nonce, sealed, key_id }))
                .collect();
            let rows = TaskCapabilityRows {
                allow: r.allow,
                max_requests: r.max_requests,
                max_response_bytes: r.max_response_bytes,
                request_timeout_ms: r.request_timeout_ms,
                wanted: r.wanted,
                sealed,
                reuse: r.reuse,
            };
            ((r.tenant, r.task_type, r.version), rows)
        })
        .collect())
}

// The count and the insert are one statement: two concurrent puts of new names may both see
// 99 and store 101; the bound is against a tenant filling the table, not an exact quota.
const PUT: &str = r#"
    insert into sweep.secrets as s (tenant, name, nonce, sealed, key_id)
    select $1, $2, $3, $4, $5
    where exists (select 1 from sweep.secrets where tenant = $1 and name = $2)
       or (select count(*) from sweep.secrets where tenant = $1) < $6
    on conflict (tenant, name) do update
        set nonce = excluded.nonce, sealed = excluded.sealed, key_id = excluded.key_id,
            updated_at = now()
    returning s.tenant, s.name, s.created_at, s.updated_at, (s.xmax = 0) as created
    "#;

const LIST: &str = r#"
    select tenant, name, created_at, updated_at from sweep.secrets
    where $1::text is null or tenant = $1
    order by tenant, name
    "#;

const DELETE: &str = r#"
    delete from sweep.secrets where tenant = $1 and name = $2
    returning tenant, name, created_at, updated_at
    "#;

const MISSING: &str = r#"
    select w.name
    from unnest($2::text[]) with ordinality as w(name, ord)
    where not exists (select 1 from sweep.secrets s where s.tenant = $1 and s.name = w.name)
    group by w.name
    order by min(w.ord)
    "#;

const TASK_CAPABILITIES: &str = r#"
    select m.tenant, m.task_type, m.version,
           coalesce(e.allow, '{}'::text[]) as allow, e.max_requests, e.max_response_bytes,
           e.request_timeout_ms, m.secrets as wanted, m.reuse,
           coalesce(s.names, '{}'::text[]) as names,
           coalesce(s.nonces, '{}'::bytea[]) as nonces,
           coalesce(s.sealed, '{}'::bytea[]) as sealed,
           coalesce(s.key_ids, '{}'::text[]) as key_ids
    from unnest($1::text[], $2::text[], $3::int4[]) as k(tenant, task_type, version)
    join sweep.modules m
      on m.tenant = k.tenant and m.task_type = k.task_type and m.version = k.version
    left join sweep.tenant_egress e on e.tenant = m.tenant
    left join lateral (
        select array_agg(x.name order by x.name) as names,
               array_agg(x.nonce order by x.name) as nonces,
               array_agg(x.sealed order by x.name) as sealed,
               array_agg(x.key_id order by x.name) as key_ids
        from sweep.secrets x
        where x.tenant = m.tenant and x.name = any(m.secrets)
    ) s on true
    "#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] =
    statements![PUT, LIST, DELETE, MISSING, TASK_CAPABILITIES];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_environment_variable_names() {
        for ok in ["MAIL_API_KEY", "_x", "a1", &"K".repeat(128)] {
            assert_eq!(validate_secret_name(ok), Ok(()), "{ok}");
        }
        for (bad, reason) in [
            ("", "empty"),
            ("1KEY", "starts with a letter or '_'"),
            ("MAIL-KEY", "letters, digits and '_' only"),
            ("CLÉ", "letters, digits and '_' only"),
            ("SWEEP_TASK_ID", "SWEEP_ is the runner's own prefix"),
            ("sweep_x", "SWEEP_ is the runner's own prefix"),
        ] {
            assert_eq!(validate_secret_name(bad).map_err(|e| e.reason), Err(reason), "{bad}");
        }
        assert!(validate_secret_name(&"K".repeat(129)).is_err());
    }
}
