//! Dashboard sessions without a sessions table: the login form's token goes into a cookie
//! (hex-encoded, `HttpOnly; SameSite=Strict; Path=/ui`) and is checked on every request by
//! the API's own [`identify_token`], exactly like a bearer token. Logging out clears the
//! cookie; revoking a token ends every session made with it at the next request.
//!
//! CSRF: every page carries a token derived as HMAC-SHA256(per-process random key, SHA-256 of
//! the session token). htmx sends it as `X-CSRF-Token` (set on `<body hx-headers>`), plain
//! forms as a hidden `csrf` field; a mutation without the right one is refused. A cross-site
//! page can neither read it nor, with SameSite=Strict, send the cookie at all. A restart draws
//! a new key: open pages must reload once before they can change anything. POSTs that carry
//! an `Origin` (every browser does) must come from the host they are sent to.
//!
//! Invariants: no token is ever rendered into a page or logged; CSRF tokens compare in
//! constant time.

use sha2::{Digest, Sha256};

use crate::admin::auth::{constant_time_eq, hash_token, identify_token, Caller, Identity};
use crate::admin::error::ApiError;
use crate::admin::AdminState;

pub const COOKIE: &str = "sweep_session";
/// How long a browser keeps the cookie (the token itself does not expire).
const COOKIE_MAX_AGE_S: u32 = 12 * 3600;
/// Longest cookie value looked at (a hex-encoded token of at most 512 bytes).
const MAX_COOKIE_VALUE: usize = 1024;

/// A logged-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    pub identity: Identity,
    pub csrf: String,
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
    let token = cookie.and_then(session_token).ok_or(NoSession::Login)?;
    match identify_token(state, &token).await {
        Ok(identity) => Ok(Session { csrf: csrf_token(state.ui_key(), &token), identity }),
        Err(e) if e.status.as_u16() == 401 => Err(NoSession::Login),
        Err(e) => Err(NoSession::Failed(e)),
    }
}

/// The token inside our cookie, if the header has one that decodes.
fn session_token(header: &str) -> Option<String> {
    header.split(';').map(str::trim).find_map(|pair| {
        let value = pair.strip_prefix(COOKIE)?.strip_prefix('=')?;
        if value.len() > MAX_COOKIE_VALUE {
            return None;
        }
        let bytes = hex::decode(value).ok()?;
        String::from_utf8(bytes).ok().filter(|t| !t.is_empty())
    })
}

/// `Set-Cookie` value that logs `token` in.
pub fn login_cookie(token: &str) -> String {
    format!(
        "{COOKIE}={}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={COOKIE_MAX_AGE_S}",
        hex::encode(token.as_bytes())
    )
}

/// `Set-Cookie` value that logs out.
pub fn logout_cookie() -> String {
    format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
}

fn csrf_token(key: &[u8; 32], token: &str) -> String {
    hex::encode(hmac_sha256(key, hash_token(token).as_bytes()))
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
        let set = login_cookie("swp_abc");
        let pair = set.split(';').next().unwrap();
        assert_eq!(session_token(&format!("a=b; {pair}; c=d")), Some("swp_abc".into()));
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
        assert_eq!(session_token("sweep_session=zz"), None);
        assert_eq!(session_token("sweep_session="), None);
        assert_eq!(session_token("other=1"), None);
        assert_eq!(session_token(&format!("sweep_session={}", "a".repeat(5000))), None);
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
