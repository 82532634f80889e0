//! Extra tenant tokens (`tenant_tokens`): read-only tokens that see what the
//! tenant's main token sees and change nothing, and the lookup that resolves any token hash
//! to its tenant and access.
//!
//! Invariants: only SHA-256 hex digests are stored (the admin layer draws and shows the token
//! once); a read-only token belongs to exactly one existing tenant and dies with it.

use sqlx::PgExecutor;

use super::{tenants::TenantError, QueueError, Tenant};

/// A token's tenant and whether the token may only read.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TokenTenant {
    #[sqlx(flatten)]
    pub tenant: Tenant,
    pub read_only: bool,
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Adds a read-only token (its SHA-256) to tenant `name`. `NotFound` when the tenant has no row.
pub async fn add_read_only_token<'c, E: PgExecutor<'c>>(
    executor: E,
    name: &str,
    token_sha256: &str,
) -> Result<(), TenantError> {
    if !is_sha256_hex(token_sha256) {
        return Err(TenantError::BadTokenHash);
    }
    let added =
        sqlx::query(ADD_READ_ONLY_TOKEN).bind(name).bind(token_sha256).execute(executor).await?;
    if added.rows_affected() == 0 {
        return Err(TenantError::NotFound(name.to_owned()));
    }
    Ok(())
}

/// The tenant whose main token (`read_only = false`) or read-only token hashes to
/// `token_sha256`, if any.
pub async fn token_tenant<'c, E: PgExecutor<'c>>(
    executor: E,
    token_sha256: &str,
) -> Result<Option<TokenTenant>, QueueError> {
    Ok(sqlx::query_as(TOKEN_TENANT).bind(token_sha256).fetch_optional(executor).await?)
}

const ADD_READ_ONLY_TOKEN: &str = r#"
    insert into sweep.tenant_tokens (token_sha256, tenant, read_only)
    select $2, name, true from sweep.tenants where name = $1
    "#;

const TOKEN_TENANT: &str = r#"
    select name, weight, max_module_bytes, max_fuel, max_timeout_ms, max_memory_bytes,
           max_running, max_payload_bytes, max_result_bytes, created_at, false as read_only
    from sweep.tenants where token_sha256 = $1
    union all
    select t.name, t.weight, t.max_module_bytes, t.max_fuel, t.max_timeout_ms,
           t.max_memory_bytes, t.max_running, t.max_payload_bytes, t.max_result_bytes,
           t.created_at, k.read_only
    from sweep.tenant_tokens k join sweep.tenants t on t.name = k.tenant
    where k.token_sha256 = $1
    limit 1
    "#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![ADD_READ_ONLY_TOKEN, TOKEN_TENANT];
