//! Tenants: who may call the admin API, with which token, under which caps; and the check
//! that a tenant has a module for the task types it enqueues.
//!
//! Invariants:
//! - only the SHA-256 (hex) of a tenant's token is stored; the token itself is never written
//!   (the admin layer draws it, shows it once and passes the hash here);
//! - a tenant name is what `tasks.tenant`, `modules.tenant` and `dead_tasks.tenant` hold;
//!   names are immutable, so a tenant's rows can never change hands;
//! - caps are `None` (no cap) or positive (`max_running` may be 0: the tenant's tasks wait);
//!   the running cap is enforced by [`super::claim_batch`], the payload limit by the admin
//!   API at enqueue, the result limit by the runner (it bounds the task's stdout), the others
//!   by the admin API at upload time.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;

use super::{error::is_unique_violation, validate_tenant, InvalidTask, QueueError};

/// What a tenant may ask for. `None`: no cap beyond the runner's own maxima.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    sqlx::FromRow,
    utoipa::ToSchema,
)]
pub struct TenantCaps {
    /// Largest module the tenant may upload, in bytes.
    #[schema(required)]
    pub max_module_bytes: Option<i64>,
    /// Most fuel a module of this tenant may ask for.
    #[schema(required)]
    pub max_fuel: Option<i64>,
    /// Longest wall-clock timeout a module of this tenant may ask for.
    #[schema(required)]
    pub max_timeout_ms: Option<i64>,
    /// Most linear memory a module of this tenant may ask for.
    #[schema(required)]
    pub max_memory_bytes: Option<i64>,
    /// Most tasks of this tenant running at once across all runners.
    #[schema(required)]
    pub max_running: Option<i32>,
    /// Largest task payload the tenant may enqueue, in bytes of compact JSON (`null`: the
    /// deployment's `--max-payload-bytes`).
    #[schema(required)]
    pub max_payload_bytes: Option<i64>,
    /// Largest result (stdout) a task of the tenant may write, in bytes (`null`: the runner's
    /// `--output-bytes`); a handler that writes more fails as `output_too_large`.
    #[schema(required)]
    pub max_result_bytes: Option<i64>,
}

impl TenantCaps {
    /// Rejects zero or negative caps (`max_running` may be zero, never negative).
    pub fn validate(&self) -> Result<(), TenantError> {
        let positive = [
            ("max_module_bytes", self.max_module_bytes),
            ("max_fuel", self.max_fuel),
            ("max_timeout_ms", self.max_timeout_ms),
            ("max_memory_bytes", self.max_memory_bytes),
            ("max_payload_bytes", self.max_payload_bytes),
            ("max_result_bytes", self.max_result_bytes),
        ];
        for (field, value) in positive {
            if value.is_some_and(|v| v <= 0) {
                return Err(TenantError::BadCap { field, requirement: "greater than zero" });
            }
        }
        if self.max_running.is_some_and(|v| v < 0) {
            return Err(TenantError::BadCap { field: "max_running", requirement: "zero or more" });
        }
        Ok(())
    }
}

/// One tenant, without its token hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Tenant {
    pub name: String,
    /// Its share of the runners' slots relative to other tenants with due work (default 1).
    pub weight: i32,
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub caps: TenantCaps,
    pub created_at: DateTime<Utc>,
}

/// Why a tenant could not be created or changed. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TenantError {
    #[error("tenant {0:?} already exists")]
    Exists(String),
    #[error("tenant {0:?} not found")]
    NotFound(String),
    #[error(transparent)]
    BadName(InvalidTask),
    #[error("{field} must be {requirement}")]
    BadCap { field: &'static str, requirement: &'static str },
    #[error("weight must be between 1 and {max}, got {weight}")]
    BadWeight { weight: i32, max: i32 },
    #[error("token hash must be 64 lowercase hex digits")]
    BadTokenHash,
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl From<sqlx::Error> for TenantError {
    fn from(e: sqlx::Error) -> Self {
        TenantError::Queue(QueueError::Database(e))
    }
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Creates tenant `name`, authenticated by the token whose SHA-256 is `token_sha256`.
pub async fn create_tenant<'c, E: PgExecutor<'c>>(
    executor: E,
    name: &str,
    token_sha256: &str,
    caps: &TenantCaps,
) -> Result<Tenant, TenantError> {
    validate_tenant(name).map_err(TenantError::BadName)?;
    caps.validate()?;
    if !is_sha256_hex(token_sha256) {
        return Err(TenantError::BadTokenHash);
    }
    sqlx::query_as(CREATE_TENANT)
        .bind(name)
        .bind(token_sha256)
        .bind(caps.max_module_bytes)
        .bind(caps.max_fuel)
        .bind(caps.max_timeout_ms)
        .bind(caps.max_memory_bytes)
        .bind(caps.max_running)
        .bind(caps.max_payload_bytes)
        .bind(caps.max_result_bytes)
        .fetch_one(executor)
        .await
        .map_err(|e| {
            if is_unique_violation(&e, "tenants_pkey") {
                TenantError::Exists(name.to_owned())
            } else {
                e.into()
            }
        })
}

/// Replaces tenant `name`'s caps. A lowered `max_running` applies from the next claim (tasks
/// already running are not stopped).
pub async fn set_tenant_caps<'c, E: PgExecutor<'c>>(
    executor: E,
    name: &str,
    caps: &TenantCaps,
) -> Result<Tenant, TenantError> {
    caps.validate()?;
    let row: Option<Tenant> = sqlx::query_as(SET_CAPS)
        .bind(name)
        .bind(caps.max_module_bytes)
        .bind(caps.max_fuel)
        .bind(caps.max_timeout_ms)
        .bind(caps.max_memory_bytes)
        .bind(caps.max_running)
        .bind(caps.max_payload_bytes)
        .bind(caps.max_result_bytes)
        .fetch_optional(executor)
        .await?;
    row.ok_or_else(|| TenantError::NotFound(name.to_owned()))
}

/// A change to some of a tenant's caps: per cap, `None` leaves it as it is, `Some(None)`
/// clears it (no cap), `Some(Some(v))` sets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapsChange {
    pub max_module_bytes: Option<Option<i64>>,
    pub max_fuel: Option<Option<i64>>,
    pub max_timeout_ms: Option<Option<i64>>,
    pub max_memory_bytes: Option<Option<i64>>,
    pub max_running: Option<Option<i32>>,
    pub max_payload_bytes: Option<Option<i64>>,
    pub max_result_bytes: Option<Option<i64>>,
}

impl CapsChange {
    /// The caps that are set by this change, checked as [`TenantCaps::validate`] checks them.
    fn validate(&self) -> Result<(), TenantError> {
        let set = |v: Option<Option<i64>>| v.flatten();
        TenantCaps {
            max_module_bytes: set(self.max_module_bytes),
            max_fuel: set(self.max_fuel),
            max_timeout_ms: set(self.max_timeout_ms),
            max_memory_bytes: set(self.max_memory_bytes),
            max_running: self.max_running.flatten(),
            max_payload_bytes: set(self.max_payload_bytes),
            max_result_bytes: set(self.max_result_bytes),
        }
        .validate()
    }
}

/// Applies `change` to tenant `name`'s caps in one statement (two concurrent changes of
/// different caps both hold) and returns the tenant as it now is.
pub async fn change_tenant_caps<'c, E: PgExecutor<'c>>(
    executor: E,
    name: &str,
    change: &CapsChange,
) -> Result<Tenant, TenantError> {
    change.validate()?;
    let row: Option<Tenant> = sqlx::query_as(CHANGE_CAPS)
        .bind(name)
        .bind(change.max_module_bytes.is_some())
        .bind(change.max_module_bytes.flatten())
        .bind(change.max_fuel.is_some())
        .bind(change.max_fuel.flatten())
        .bind(change.max_timeout_ms.is_some())
        .bind(change.max_timeout_ms.flatten())
        .bind(change.max_memory_bytes.is_some())
        .bind(change.max_memory_bytes.flatten())
        .bind(change.max_running.is_some())
        .bind(change.max_running.flatten())
        .bind(change.max_payload_bytes.is_some())
        .bind(change.max_payload_bytes.flatten())
        .bind(change.max_result_bytes.is_some())
        .bind(change.max_result_bytes.flatten())
        .fetch_optional(executor)
        .await?;
    row.ok_or_else(|| TenantError::NotFound(name.to_owned()))
}

/// Highest tenant weight (`tenants_weight_range`).
pub const MAX_WEIGHT: i32 = 10_000;

/// Sets tenant `name`'s fair-share weight (1 to [`MAX_WEIGHT`]). Applies from the next claim;
/// tasks already running keep their slots.
pub async fn set_tenant_weight<'c, E: PgExecutor<'c>>(
    executor: E,
    name: &str,
    weight: i32,
) -> Result<Tenant, TenantError> {
    if !(1..=MAX_WEIGHT).contains(&weight) {
        return Err(TenantError::BadWeight { weight, max: MAX_WEIGHT });
    }
    // The claim reads each queue's copy of the weight (one table, no join).
    let row: Option<Tenant> =
        sqlx::query_as(SET_WEIGHT).bind(name).bind(weight).fetch_optional(executor).await?;
    row.ok_or_else(|| TenantError::NotFound(name.to_owned()))
}

/// Replaces tenant `name`'s token by the one whose SHA-256 is `token_sha256`; the old token
/// stops working with this statement.
pub async fn set_tenant_token<'c, E: PgExecutor<'c>>(
    executor: E,
    name: &str,
    token_sha256: &str,
) -> Result<Tenant, TenantError> {
    if !is_sha256_hex(token_sha256) {
        return Err(TenantError::BadTokenHash);
    }
    let row: Option<Tenant> =
        sqlx::query_as(SET_TOKEN).bind(name).bind(token_sha256).fetch_optional(executor).await?;
    row.ok_or_else(|| TenantError::NotFound(name.to_owned()))
}

pub async fn get_tenant<'c, E: PgExecutor<'c>>(
    executor: E,
    name: &str,
) -> Result<Option<Tenant>, QueueError> {
    Ok(sqlx::query_as(GET_TENANT).bind(name).fetch_optional(executor).await?)
}

/// Every tenant, by name.
pub async fn list_tenants<'c, E: PgExecutor<'c>>(executor: E) -> Result<Vec<Tenant>, QueueError> {
    Ok(sqlx::query_as(LIST_TENANTS).fetch_all(executor).await?)
}

/// Those of `task_types` for which `tenant` has no active module and none compiling, in input
/// order, without repeats. Enqueueing such a type would only fill the dead-letter table (tasks
/// of a type whose first module is compiling wait for it: queue/compiling.rs).
pub async fn missing_modules<'c, E: PgExecutor<'c>>(
    executor: E,
    tenant: &str,
    task_types: &[String],
) -> Result<Vec<String>, QueueError> {
    Ok(sqlx::query_scalar(MISSING_MODULES)
        .bind(tenant)
        .bind(task_types)
        .fetch_all(executor)
        .await?)
}

const CREATE_TENANT: &str = r#"
    insert into sweep.tenants (name, token_sha256, max_module_bytes, max_fuel, max_timeout_ms,
                         max_memory_bytes, max_running, max_payload_bytes, max_result_bytes)
    values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    returning name, weight, max_module_bytes, max_fuel, max_timeout_ms,
              max_memory_bytes, max_running, max_payload_bytes, max_result_bytes, created_at
    "#;

const SET_CAPS: &str = r#"
    update sweep.tenants
    set max_module_bytes = $2, max_fuel = $3, max_timeout_ms = $4, max_memory_bytes = $5,
        max_running = $6, max_payload_bytes = $7, max_result_bytes = $8
    where name = $1
    returning name, weight, max_module_bytes, max_fuel, max_timeout_ms,
              max_memory_bytes, max_running, max_payload_bytes, max_result_bytes, created_at
    "#;

const SET_WEIGHT: &str = r#"
    with changed as (
        update sweep.tenants set weight = $2 where name = $1
        returning name, weight, max_module_bytes, max_fuel, max_timeout_ms,
                  max_memory_bytes, max_running, max_payload_bytes, max_result_bytes, created_at
    ),
    copied as (
        update sweep.queues set weight = $2 where tenant = (select name from changed)
    )
    select * from changed
    "#;

const GET_TENANT: &str = r#"
    select name, weight, max_module_bytes, max_fuel, max_timeout_ms, max_memory_bytes,
           max_running, max_payload_bytes, max_result_bytes, created_at
    from sweep.tenants where name = $1
    "#;

const LIST_TENANTS: &str = r#"
    select name, weight, max_module_bytes, max_fuel, max_timeout_ms, max_memory_bytes,
           max_running, max_payload_bytes, max_result_bytes, created_at
    from sweep.tenants order by name
    "#;

const MISSING_MODULES: &str = r#"
    select t.task_type
    from unnest($2::text[]) with ordinality as t(task_type, ord)
    where not exists (
        select 1 from sweep.active_modules a where a.tenant = $1 and a.task_type = t.task_type
    ) and not exists (
        select 1 from sweep.modules m
        where m.tenant = $1 and m.task_type = t.task_type and m.compile_state = 'compiling'
    )
    group by t.task_type
    order by min(t.ord)
    "#;

const CHANGE_CAPS: &str = r#"
    update sweep.tenants
    set max_module_bytes = case when $2 then $3 else max_module_bytes end,
        max_fuel = case when $4 then $5 else max_fuel end,
        max_timeout_ms = case when $6 then $7 else max_timeout_ms end,
        max_memory_bytes = case when $8 then $9 else max_memory_bytes end,
        max_running = case when $10 then $11 else max_running end,
        max_payload_bytes = case when $12 then $13 else max_payload_bytes end,
        max_result_bytes = case when $14 then $15 else max_result_bytes end
    where name = $1
    returning name, weight, max_module_bytes, max_fuel, max_timeout_ms,
              max_memory_bytes, max_running, max_payload_bytes, max_result_bytes, created_at
    "#;

const SET_TOKEN: &str = r#"
    update sweep.tenants set token_sha256 = $2 where name = $1
    returning name, weight, max_module_bytes, max_fuel, max_timeout_ms,
              max_memory_bytes, max_running, max_payload_bytes, max_result_bytes, created_at
    "#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![
    CREATE_TENANT,
    CHANGE_CAPS,
    SET_TOKEN,
    SET_CAPS,
    SET_WEIGHT,
    GET_TENANT,
    LIST_TENANTS,
    MISSING_MODULES
];
