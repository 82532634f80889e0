//! A tenant's egress policy as a row (`sweep.tenant_egress`): the hosts its handlers may send
//! HTTP requests to and its overrides of the deployment's HTTP limits.
//!
//! Invariants: entries arrive here already parsed and in canonical form (the admin API runs
//! them through `sandbox::EgressPolicy::parse`; this module does not judge them again); a
//! tenant without a row allows nothing and uses the deployment's limits; overrides are
//! `None` (the default) or in range (`max_requests`, `max_response_bytes` zero or more,
//! `request_timeout_ms` positive, as the table's check says).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::QueueError;
use crate::sandbox::HttpLimits;

/// A tenant's policy as stored. `None` overrides: the deployment's default.
#[derive(Debug, Clone, PartialEq, Eq, Default, sqlx::FromRow)]
pub struct TenantEgress {
    pub tenant: String,
    pub allow: Vec<String>,
    pub max_requests: Option<i32>,
    pub max_response_bytes: Option<i64>,
    pub request_timeout_ms: Option<i64>,
    /// When it was last set; `None` for a tenant that never had one.
    pub updated_at: Option<DateTime<Utc>>,
}

impl TenantEgress {
    /// The HTTP limits the tenant's tasks run under: each override that is set, else the
    /// deployment's default.
    pub fn http_limits(&self, defaults: HttpLimits) -> HttpLimits {
        HttpLimits {
            max_requests: self
                .max_requests
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(defaults.max_requests),
            max_response_bytes: self
                .max_response_bytes
                .and_then(|v| u64::try_from(v).ok())
                .unwrap_or(defaults.max_response_bytes),
            request_timeout: self
                .request_timeout_ms
                .and_then(|v| u64::try_from(v).ok())
                .filter(|&v| v > 0)
                .map_or(defaults.request_timeout, Duration::from_millis),
        }
    }
}

/// The policy of `tenant` (allow nothing, default limits, when it never had one).
pub async fn get_egress<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
) -> Result<TenantEgress, QueueError> {
    let row: Option<TenantEgress> =
        sqlx::query_as(GET).bind(tenant).fetch_optional(executor).await?;
    Ok(row.unwrap_or_else(|| TenantEgress { tenant: tenant.to_owned(), ..Default::default() }))
}

/// Replaces `egress.tenant`'s policy (allow list and overrides together) and returns it as
/// stored.
pub async fn set_egress<'c, E: PgExecutor<'c>>(
    executor: E,
    egress: &TenantEgress,
) -> Result<TenantEgress, QueueError> {
    Ok(sqlx::query_as(SET)
        .bind(&egress.tenant)
        .bind(&egress.allow)
        .bind(egress.max_requests)
        .bind(egress.max_response_bytes)
        .bind(egress.request_timeout_ms)
        .fetch_one(executor)
        .await?)
}

const GET: &str = r#"
    select tenant, allow, max_requests, max_response_bytes, request_timeout_ms, updated_at
    from sweep.tenant_egress where tenant = $1
    "#;

const SET: &str = r#"
    insert into sweep.tenant_egress as e
        (tenant, allow, max_requests, max_response_bytes, request_timeout_ms)
    values ($1, $2, $3, $4, $5)
    on conflict (tenant) do update
        set allow = excluded.allow, max_requests = excluded.max_requests,
            max_response_bytes = excluded.max_response_bytes,
            request_timeout_ms = excluded.request_timeout_ms, updated_at = now()
    returning e.tenant, e.allow, e.max_requests, e.max_response_bytes, e.request_timeout_ms,
              e.updated_at
    "#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![GET, SET];
