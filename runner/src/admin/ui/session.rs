//! Dashboard sessions, kept on the server (`queue::sessions`): logging in with an API token
//! draws a random session id (32 bytes from the OS-seeded CSPRNG); the cookie holds that id
//! (hex, `HttpOnly; SameSite=Strict; Path=/ui`), never the token, and the database keeps the
//! SHA-256 of the id, the SHA-256 of the token and the expiry ([`SESSION_TTL`]). Every request
//! looks the session up and checks the token hash as the API checks a bearer token
//! ([`identify_hash`]): a token rotated or removed ends its sessions at once. Logging out
//! deletes the session.
//!
//! CSRF: every page carries a token derived from the session id (HMAC-SHA256 keyed with the
//! id), which a cross-site page can neither read nor compute; htmx sends it as
//! `X-CSRF-Token` (set on `<body hx-headers>`), plain forms as a hidden `csrf` field; a
//! mutation without the right one is refused. With SameSite=Strict a cross-site page cannot
//! send the cookie at all. POSTs that carry an `Origin` (every browser does) must come from the
//! host they are sent to. Sessions and CSRF tokens survive a restart and work behind a load
//! balancer (nothing is per process).
//!
//! Invariants: no token or session id is ever rendered into a page, stored in clear or
//! logged; CSRF tokens compare in constant time.

use sha2::{Digest, Sha256};

use std::time::Duration;

use rand::RngCore;

use crate::admin::auth::{constant_time_eq, hash_token, identify_hash, Caller, Identity};
use crate::admin::error::ApiError;
use crate::admin::AdminState;
use crate::queue;

pub const COOKIE: &str = "sweep_session";
/// How long a session lasts from its login (the cookie's `Max-Age` too).
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Length of a session id in the cookie: 32 random bytes, hex.
const SESSION_ID_LEN: usize = 64;

/// A logged-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    pub identity: Identity,
    pub csrf: String,
    /// The SHA-256 of the session id: what logging out deletes.
    pub id_sha256: String,
}

impl Session {
    pub fn caller(&self) -> &Caller {
        &self.identity.caller
    }
    pub fn read_only(&self) -> bool {
        self.identity.read_only
    }
    pub fn is_operator(&self) -> bool {
        matches!(self.identity.caller, Caller::Operator)
    }
    /// Who is logged in, for the header.
    pub fn label(&self) -> String {
        let who = match &self.identity.caller {
            Caller::Operator => "operator".to_owned(),
            Caller::Tenant(t) => format!("tenant {}", t.name),
        };
        if self.read_only() {
            format!("{who} (read-only)")
        } else {
            who
        }
    }
}

/// Why a request has no usable session.
#[derive(Debug)]
pub enum NoSession {
    /// No cookie, or one whose token no longer works: log in (again).
    Login,
    Failed(ApiError),
}

/// The session named by the `Cookie` header.
pub async fn from_cookie(state: &AdminState, cookie: Option<&str>) -> Result<Session, NoSession> {
    let id = cookie.and_then(session_id).ok_or(NoSession::Login)?;
    let id_sha256 = hash_token(&id);
    let found = queue::find_ui_session(state.store(), &id_sha256)
        .await
        .map_err(|e| NoSession::Failed(e.into()))?;
    let Some(found) = found else { return Err(NoSession::Login) };
    match identify_hash(state, &found.token_sha256).await {
        Ok(identity) => Ok(Session { csrf: csrf_token(&id), identity, id_sha256 }),
        Err(e) if e.status.as_u16() == 401 => Err(NoSession::Login),
        Err(e) => Err(NoSession::Failed(e)),
    }
}

/// Opens a session for `token` (already checked) and returns the `Set-Cookie` value.
pub async fn open(state: &AdminState, token: &str) -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let id = hex::encode(bytes);
    queue::open_ui_session(state.store(), &hash_token(&id), &hash_token(token), SESSION_TTL)
        .await?;
    Ok(login_cookie(&id))
}

/// Ends `session` (logging out).
pub async fn close(state: &AdminState, session: &Session) -> Result<(), ApiError> {
    Ok(queue::close_ui_session(state.store(), &session.id_sha256).await?)
}

/// The session id inside our cookie, if the header has one of the right shape.
fn session_id(header: &str) -> Option<String> {
    header.split(';').map(str::trim).find_map(|pair| {
        let value = pair.strip_prefix(COOKIE)?.strip_prefix('=')?;
        let hex = value.len() == SESSION_ID_LEN
            && value.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        hex.then(|| value.to_owned())
    })
}

/// `Set-Cookie` value that holds session `id`.
fn login_cookie(id: &str) -> String {
    format!("{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}", SESSION_TTL.as_secs())
}

/// `Set-Cookie` value that logs out.
pub fn logout_cookie() -> String {
    format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// The CSRF token of session `id`: HMAC-SHA256 keyed with the id's bytes.
fn csrf_token(id: &str) -> String {
    let mut key = [0u8; 32];
    if hex::decode_to_slice(id, &mut key).is_err() {
        key = Sha256::digest(id.as_bytes()).into();
    }
    hex::encode(hmac_sha256(&key, b"sweep dashboard csrf"))
}

/// Whether a mutation carries this session's CSRF token (header or form field).
pub fn csrf_ok(session: &Session, header: Option<&str>, field: Option<&str>) -> bool {
    [header, field]
        .into_iter()
        .flatten()
        .any(|given| constant_time_eq(given.as_bytes(), session.csrf.as_bytes()))
}

/// A POST's `Origin` (when sent) names the host it was sent to.
pub fn origin_ok(origin: Option<&str>, host: Option<&str>) -> bool {
    match (origin, host) {
        (None, _) => true,
        (Some(origin), Some(host)) => {
            let after_scheme = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            after_scheme.trim_end_matches('/').eq_ignore_ascii_case(host)
        }
        (Some(_), None) => false,
    }
}

/// HMAC-SHA256 (RFC 2104) with a key of at most one block.
fn hmac_sha256(key: &[u8; 32], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut padded = [0u8; BLOCK];
    padded[..key.len()].copy_from_slice(key);
    let inner_key: Vec<u8> = padded.iter().map(|b| b ^ 0x36).collect();
    let outer_key: Vec<u8> = padded.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new().chain_update(&inner_key).chain_update(message).finalize();
    let outer = Sha256::new().chain_update(&outer_key).chain_update(inner).finalize();
    let mut out = [0u8; 32];
    out.copy_from_slice(&outer);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2_shape() {
        // RFC 4231 test case 2 uses the 4-byte key "Jefe"; zero-padding to 32 bytes is the
        // same key for HMAC (keys are zero-padded to the block size).
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            hex::encode(hmac_sha256(&key, b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn cookies_round_trip_and_junk_is_no_session() {
        let id = "ab".repeat(32);
        let set = login_cookie(&id);
        let pair = set.split(';').next().unwrap();
        assert_eq!(session_id(&format!("a=b; {pair}; c=d")), Some(id.clone()));
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
        assert_eq!(session_id("sweep_session=zz"), None);
        assert_eq!(session_id("sweep_session="), None);
        assert_eq!(session_id("other=1"), None);
        assert_eq!(session_id(&format!("sweep_session={}", "a".repeat(5000))), None);
        assert_eq!(session_id(&format!("sweep_session={}", "A".repeat(64))), None);
        // The CSRF token is the session's, and is not the id.
        assert_eq!(csrf_token(&id), csrf_token(&id));
        assert_ne!(csrf_token(&id), csrf_token(&"cd".repeat(32)));
        assert!(!csrf_token(&id).contains(&id));
    }

    #[test]
    fn origins_must_match_the_host() {
        assert!(origin_ok(None, Some("x:1")));
        assert!(origin_ok(Some("http://127.0.0.1:7070"), Some("127.0.0.1:7070")));
        assert!(!origin_ok(Some("http://evil.example"), Some("127.0.0.1:7070")));
        assert!(!origin_ok(Some("null"), Some("127.0.0.1:7070")));
        assert!(!origin_ok(Some("http://a"), None));
    }
}
