//! Who is calling: bearer tokens, the operator, tenants, and which tenant a request acts on.
//!
//! Owns: token minting, rotation and hashing, the [`authenticate`] filter, [`Caller`] and its scoping
//! rules.
//!
//! Invariants:
//! - tokens are compared by their SHA-256, never stored or logged in clear; the operator
//!   token is compared in constant time;
//! - a tenant caller is scoped to its own name on every route; naming another tenant is
//!   refused (403 `tenant_not_allowed`), and another tenant's rows answer 404 (the queue functions filter by tenant);
//! - only the operator may name a tenant (`?tenant=NAME`); without one, the operator writes
//!   to the `default` tenant and reads across all tenants;
//! - a read-only token (see `queue::tokens`) acts as its tenant on `GET`/`HEAD` routes and
//!   gets 403 `read_only` on every other method, before the handler runs. The dashboard
//!   resolves its session's token hash with the same [`identify_hash`].

use rand::RngCore;
use sqlx::PgExecutor;
use warp::http::{HeaderMap, Method, StatusCode};
use warp::{Filter, Rejection};

use super::error::ApiError;
use super::AdminState;
use crate::queue::{self, Tenant, TenantCaps, DEFAULT_TENANT};
use crate::sandbox::sha256_hex;

/// Prefix of every tenant token, so a leaked one is recognisable.
pub const TOKEN_PREFIX: &str = "swp_";
/// Longest `Authorization` value looked at.
const MAX_TOKEN_LEN: usize = 512;

/// A new random token (32 bytes from the thread-local CSPRNG, seeded by the OS; hex) and its
/// SHA-256, the only part stored.
pub fn new_token() -> (String, String) {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let token = format!("{TOKEN_PREFIX}{}", hex::encode(bytes));
    let hash = hash_token(&token);
    (token, hash)
}

/// The stored form of a token.
pub fn hash_token(token: &str) -> String {
    sha256_hex(token.as_bytes())
}

/// Creates tenant `name` with `caps` and returns it with its token. The token is shown to
/// the caller once and cannot be recovered: only its hash is stored.
pub async fn create_tenant<'c>(
    pool: impl PgExecutor<'c>,
    name: &str,
    caps: &TenantCaps,
) -> Result<(Tenant, String), queue::TenantError> {
    let (token, hash) = new_token();
    let tenant = queue::create_tenant(pool, name, &hash, caps).await?;
    Ok((tenant, token))
}

/// Gives existing tenant `name` a new token and returns it; the old one stops working. Like
/// a new tenant's, the token is shown once: only its hash is stored.
pub async fn rotate_token<'c>(
    pool: impl PgExecutor<'c>,
    name: &str,
) -> Result<(Tenant, String), queue::TenantError> {
    let (token, hash) = new_token();
    let tenant = queue::set_tenant_token(pool, name, &hash).await?;
    Ok((tenant, token))
}

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Operator,
    Tenant(Tenant),
}

impl Caller {
    /// The tenant this caller's reads are limited to; `None` for the operator (all tenants).
    pub fn scope(&self) -> Option<&str> {
        match self {
            Caller::Operator => None,
            Caller::Tenant(t) => Some(&t.name),
        }
    }

    /// The tenant scope of a read, given the request's `?tenant=` (operator only).
    pub fn read_scope(&self, requested: Option<&str>) -> Result<Option<String>, ApiError> {
        match (self, requested) {
            (Caller::Operator, None) => Ok(None),
            (Caller::Operator, Some(name)) => {
                queue::validate_tenant(name)
                    .map_err(|e| ApiError::bad_request("invalid_tenant", e.to_string()))?;
                Ok(Some(name.to_owned()))
            }
            (Caller::Tenant(t), requested) => {
                check_own(t, requested)?;
                Ok(Some(t.name.clone()))
            }
        }
    }

    /// The tenant a write acts on, with its caps (`None` for a tenant without a row, i.e.
    /// `default`). Operators name it with `?tenant=` (default: `default`); the tenant must
    /// exist.
    pub async fn write_target<'c>(
        &self,
        pool: impl PgExecutor<'c>,
        requested: Option<&str>,
    ) -> Result<(String, TenantCaps), ApiError> {
        match self {
            Caller::Tenant(t) => {
                check_own(t, requested)?;
                Ok((t.name.clone(), t.caps))
            }
            Caller::Operator => {
                let name = requested.unwrap_or(DEFAULT_TENANT);
                queue::validate_tenant(name)
                    .map_err(|e| ApiError::bad_request("invalid_tenant", e.to_string()))?;
                match queue::get_tenant(pool, name).await? {
                    Some(t) => Ok((t.name, t.caps)),
                    None if name == DEFAULT_TENANT => Ok((name.to_owned(), TenantCaps::default())),
                    None => Err(ApiError::not_found(format!("tenant {name:?} not found"))),
                }
            }
        }
    }
}

fn check_own(t: &Tenant, requested: Option<&str>) -> Result<(), ApiError> {
    match requested {
        // An authorization refusal, not malformed input: the same request is fine from the
        // operator.
        Some(name) if name != t.name => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "tenant_not_allowed",
            "only the operator may name a tenant; your token already selects yours",
        )),
        _ => Ok(()),
    }
}

/// Who a token speaks for, and whether it may change anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub caller: Caller,
    pub read_only: bool,
}

/// Extracts the [`Caller`] from `Authorization: Bearer <token>`, or rejects with 401 (no or
/// bad token) or 403 `read_only` (a read-only token on anything but `GET`/`HEAD`).
pub fn authenticate(
    state: AdminState,
) -> impl Filter<Extract = (Caller,), Error = Rejection> + Clone {
    warp::method().and(warp::header::headers_cloned()).and_then(
        move |method: Method, headers: HeaderMap| {
            let state = state.clone();
            async move {
                let identity = identify(&state, &headers).await.map_err(ApiError::reject)?;
                if identity.read_only && !is_read(&method) {
                    return Err(read_only_refusal().reject());
                }
                Ok(identity.caller)
            }
        },
    )
}

/// Methods a read-only token may use.
pub fn is_read(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

pub fn read_only_refusal() -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "read_only", "this token can read but not change anything")
}

async fn identify(state: &AdminState, headers: &HeaderMap) -> Result<Identity, ApiError> {
    let Some(value) = headers.get(warp::http::header::AUTHORIZATION) else {
        return Err(ApiError::unauthorized("missing Authorization: Bearer <token> header"));
    };
    let token = value
        .to_str()
        .ok()
        .filter(|v| v.len() <= MAX_TOKEN_LEN)
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::unauthorized("expected Authorization: Bearer <token>"))?;
    identify_token(state, token).await
}

/// The identity behind `token` (operator, tenant, read-only tenant), or 401.
pub async fn identify_token(state: &AdminState, token: &str) -> Result<Identity, ApiError> {
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(ApiError::unauthorized("invalid token"));
    }
    identify_hash(state, &hash_token(token)).await
}

/// The identity behind the token whose SHA-256 is `hash` (a dashboard session keeps only
/// that), or 401: a token rotated or removed since answers 401.
pub async fn identify_hash(state: &AdminState, hash: &str) -> Result<Identity, ApiError> {
    if let Some(operator) = state.operator_token_hash() {
        if constant_time_eq(hash.as_bytes(), operator.as_bytes()) {
            return Ok(Identity { caller: Caller::Operator, read_only: false });
        }
    }
    match queue::token_tenant(state.store(), hash).await? {
        Some(t) => Ok(Identity { caller: Caller::Tenant(t.tenant), read_only: t.read_only }),
        None => Err(ApiError::unauthorized("invalid token")),
    }
}

/// Creates a read-only token for tenant `name` and returns it (shown once; only its hash is
/// stored).
pub async fn create_read_only_token<'c>(
    pool: impl PgExecutor<'c>,
    name: &str,
) -> Result<String, queue::TenantError> {
    let (token, hash) = new_token();
    queue::add_read_only_token(pool, name, &hash).await?;
    Ok(token)
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_prefixed_and_hash_to_what_is_stored() {
        let (a, hash_a) = new_token();
        let (b, _) = new_token();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 64);
        assert_eq!(hash_token(&a), hash_a);
        assert_eq!(hash_a.len(), 64);
    }

    #[test]
    fn constant_time_eq_compares_whole_values() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn tenants_cannot_name_another_tenant() {
        let t = Tenant {
            name: "acme".into(),
            weight: 1,
            caps: TenantCaps::default(),
            created_at: chrono::Utc::now(),
        };
        let caller = Caller::Tenant(t);
        assert_eq!(caller.read_scope(None), Ok(Some("acme".into())));
        assert_eq!(caller.read_scope(Some("acme")), Ok(Some("acme".into())));
        assert_eq!(caller.read_scope(Some("other")).map_err(|e| e.code), Err("tenant_not_allowed"));
        assert_eq!(Caller::Operator.read_scope(None), Ok(None));
        assert_eq!(Caller::Operator.read_scope(Some("x")), Ok(Some("x".into())));
        assert!(Caller::Operator.read_scope(Some("bad name")).is_err());
    }
}
