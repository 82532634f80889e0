//! Tenant secrets at rest and in what Sweep stores: the deployment's key, sealing and opening
//! a value, and redacting values out of text a task leaves behind.
//!
//! Owns: [`SecretsKey`] (read from `SWEEP_SECRETS_KEY`, or drawn by `sweep dev`), [`Sealed`]
//! (what a row of `sweep.secrets` holds), [`ArtifactKey`] (what authenticates the fleet's
//! compiled artifacts), [`Redactor`].
//!
//! Invariants:
//! - a value is sealed with XChaCha20-Poly1305 (RustCrypto's `chacha20poly1305`) under the
//!   deployment key with a fresh random 192-bit nonce, and the associated data names its
//!   tenant and secret name: a sealed row moved to another tenant or name does not open;
//! - the key is never logged or shown: `Debug` prints only its id (16 hex digits of a
//!   domain-separated SHA-256 of the key), which is also stored with each row, so a runner
//!   with another key says which key a row needs instead of failing obscurely;
//! - the deployment key is used directly only by the AEAD. Anything else keyed by it gets its
//!   own sub-key, HMAC-SHA256 of a label naming that use under the deployment key (a PRF
//!   output: it tells nothing of the key nor of the other uses). [`ArtifactKey`] is one: the
//!   HMAC-SHA256 key of compiled artifacts (`sandbox::artifacts`), held as a keyed HMAC state,
//!   so no code outside this module sees the bytes of either key;
//! - a [`Redactor`] replaces every exact occurrence of a value, and a value's partial copy at
//!   either edge of a text that was cut (a stderr tail), by `[redacted:NAME]`. It is a guard
//!   against accidents (a handler logging its request), not against a handler that means to
//!   leak what it was given: that handler could encode the value first.

use std::fmt;
use std::sync::Arc;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// The environment variable holding the key.
pub const KEY_ENV: &str = "SWEEP_SECRETS_KEY";
/// Largest secret value, in bytes.
pub const MAX_SECRET_BYTES: usize = 16 * 1024;
/// Most secrets one tenant may hold.
pub const MAX_SECRETS_PER_TENANT: usize = 100;
/// Most secrets one module may name.
pub const MAX_MODULE_SECRETS: usize = 32;
/// Longest secret name (an environment variable's name).
pub const MAX_SECRET_NAME_LEN: usize = 128;
/// The shortest partial copy at a cut edge that is redacted: fewer characters of a value
/// tell nothing useful about it, and matching them would redact ordinary text.
const MIN_EDGE_MATCH: usize = 4;
const NONCE_BYTES: usize = 24;
/// The label the artifact MAC's sub-key is derived with (see the module invariants).
const ARTIFACT_KEY_LABEL: &[u8] = b"sweep compiled artifact mac key v1";

type HmacSha256 = Hmac<Sha256>;

/// Why a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{KEY_ENV} must be 64 hex digits (a 32-byte key, e.g. the output of `openssl rand -hex 32`)"
)]
pub struct BadKey;

/// The deployment's key for tenant secrets. Cheap to clone.
#[derive(Clone)]
pub struct SecretsKey {
    cipher: Arc<XChaCha20Poly1305>,
    id: String,
    artifacts: ArtifactKey,
}

// Two keys are the same key when their ids are (a 64-bit prefix of a hash of the key).
impl PartialEq for SecretsKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for SecretsKey {}

impl fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsKey").field("id", &self.id).finish_non_exhaustive()
    }
}

/// A sealed value, as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub nonce: Vec<u8>,
    /// Ciphertext followed by its 16-byte tag.
    pub sealed: Vec<u8>,
    /// The id of the key it was sealed under.
    pub key_id: String,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealed").field("key_id", &self.key_id).finish_non_exhaustive()
    }
}

/// Why a sealed value did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("it was sealed under key {stored}, this runner's key is {ours}")]
    OtherKey { stored: String, ours: String },
    #[error("it does not open under this runner's key (altered, or moved from another row)")]
    Corrupt,
}

impl SecretsKey {
    /// Reads a key written as 64 hex digits (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<SecretsKey, BadKey> {
        let bytes = hex::decode(text.trim()).map_err(|_| BadKey)?;
        let key: [u8; 32] = bytes.try_into().map_err(|_| BadKey)?;
        Ok(SecretsKey::from_bytes(&key))
    }

    /// A fresh random key and its hex form (what `sweep dev` uses for its session).
    pub fn generate() -> (SecretsKey, String) {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        (SecretsKey::from_bytes(&key), hex::encode(key))
    }

    fn from_bytes(key: &[u8; 32]) -> SecretsKey {
        let digest =
            Sha256::new_with_prefix(b"sweep secrets key id\0").chain_update(key).finalize();
        let id = hex::encode(&digest[..8]);
        let artifacts = ArtifactKey { mac: sub_key(key, ARTIFACT_KEY_LABEL), id: id.clone() };
        SecretsKey { cipher: Arc::new(XChaCha20Poly1305::new(&(*key).into())), id, artifacts }
    }

    /// 16 hex digits naming this key (stored with each sealed value).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The key that authenticates compiled artifacts shared by the runners holding this key
    /// (a sub-key of it, see the module invariants).
    pub fn artifact_key(&self) -> ArtifactKey {
        self.artifacts.clone()
    }

    /// Seals `value` for secret `name` of `tenant`.
    pub fn seal(&self, tenant: &str, name: &str, value: &str) -> Sealed {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rng().fill_bytes(&mut nonce);
        let aad = associated_data(tenant, name);
        let payload = Payload { msg: value.as_bytes(), aad: &aad };
        // Encryption into a Vec only fails when the message is longer than the cipher's
        // limit (256 GiB); values are at most MAX_SECRET_BYTES.
        let sealed = self.cipher.encrypt(&XNonce::from(nonce), payload).unwrap_or_default();
        Sealed { nonce: nonce.to_vec(), sealed, key_id: self.id.clone() }
    }

    /// Opens a value sealed by [`SecretsKey::seal`] for the same tenant and name.
    pub fn open(&self, tenant: &str, name: &str, sealed: &Sealed) -> Result<String, OpenError> {
        if sealed.key_id != self.id {
            return Err(OpenError::OtherKey {
                stored: sealed.key_id.clone(),
                ours: self.id.clone(),
            });
        }
        let nonce = XNonce::try_from(sealed.nonce.as_slice()).map_err(|_| OpenError::Corrupt)?;
        let aad = associated_data(tenant, name);
        let payload = Payload { msg: &sealed.sealed, aad: &aad };
        let plain = self.cipher.decrypt(&nonce, payload).map_err(|_| OpenError::Corrupt)?;
        String::from_utf8(plain).map_err(|_| OpenError::Corrupt)
    }
}

/// The HMAC-SHA256 state keyed by the sub-key for `label`: HMAC-SHA256(`key`, `label`).
fn sub_key(key: &[u8; 32], label: &[u8]) -> HmacSha256 {
    let derive = keyed(key);
    let sub = derive.chain_update(label).finalize().into_bytes();
    keyed(&sub)
}

fn keyed(key: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length; `new_from_slice` only fails for MACs that do not.
    <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC key length"))
}

/// The key runners authenticate the compiled artifacts they share with (derived from the
/// deployment's [`SecretsKey`]): whoever can write the artifact store but does not hold the
/// deployment key cannot make an artifact that a runner accepts. Cheap to clone; `Debug`
/// prints only the id.
#[derive(Clone)]
pub struct ArtifactKey {
    /// HMAC-SHA256 keyed by the sub-key (the key itself is not kept).
    mac: HmacSha256,
    /// The deployment key's id ([`SecretsKey::id`]).
    id: String,
}

impl fmt::Debug for ArtifactKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArtifactKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl ArtifactKey {
    /// The id of the deployment key this one is derived from ([`SecretsKey::id`]): stored with
    /// each tag, so runners of different keys keep their rows apart.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The tag of `fields` (each framed by its length, so no two lists of fields give the same
    /// input), as 64 hex digits.
    pub fn tag(&self, fields: &[&[u8]]) -> String {
        hex::encode(self.framed(fields).finalize().into_bytes())
    }

    /// Whether `tag` (hex) is the tag of `fields`, compared in constant time; false for text
    /// that is not 32 bytes of hex.
    pub fn verify(&self, fields: &[&[u8]], tag: &str) -> bool {
        match hex::decode(tag) {
            Ok(tag) => self.framed(fields).verify_slice(&tag).is_ok(),
            Err(_) => false,
        }
    }

    fn framed(&self, fields: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        for field in fields {
            mac.update(&(field.len() as u64).to_le_bytes());
            mac.update(field);
        }
        mac
    }
}

fn associated_data(tenant: &str, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(24 + tenant.len() + name.len());
    aad.extend_from_slice(b"sweep secret v1\0");
    aad.extend_from_slice(tenant.as_bytes());
    aad.push(0);
    aad.extend_from_slice(name.as_bytes());
    aad
}

/// Replaces secret values in text and JSON by `[redacted:NAME]`. Empty when a task was given
/// no secrets, and then costs nothing.
#[derive(Clone, Default)]
pub struct Redactor {
    /// `(name, value)`, longest value first, so a value that contains another is replaced
    /// whole.
    values: Vec<(String, String)>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.values.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Redactor").field("names", &names).finish()
    }
}

impl Redactor {
    /// A redactor for these `(name, value)` pairs (empty values are skipped).
    pub fn new(pairs: &[(String, String)]) -> Redactor {
        let mut values: Vec<(String, String)> =
            pairs.iter().filter(|(_, v)| !v.is_empty()).cloned().collect();
        values.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(&b.0)));
        Redactor { values }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every value replaced, and a partial value at its start (the end of a value
    /// whose beginning was cut off) or at its end (a value cut short) too.
    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (name, value) in &self.values {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), &marker(name));
            }
        }
        for (name, value) in &self.values {
            if let Some(len) = edge_suffix(&out, value) {
                out.replace_range(..len, &marker(name));
            }
            if let Some(len) = edge_prefix(&out, value) {
                let at = out.len() - len;
                out.replace_range(at.., &marker(name));
            }
        }
        out
    }

    /// Redacts in place every string (and object key) of a JSON value.
    pub fn json(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::String(s) => {
                if self.touches(s) {
                    *s = self.text(s);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.json(v)),
            Value::Object(map) => {
                if map.keys().any(|k| self.touches(k)) {
                    let old = std::mem::take(map);
                    for (k, v) in old {
                        map.insert(self.text(&k), v);
                    }
                }
                map.values_mut().for_each(|v| self.json(v));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// Whether redacting `text` could change it (cheap check before copying).
    fn touches(&self, text: &str) -> bool {
        self.values.iter().any(|(_, v)| {
            text.contains(v.as_str())
                || edge_suffix(text, v).is_some()
                || edge_prefix(text, v).is_some()
        })
    }
}

fn marker(name: &str) -> String {
    format!("[redacted:{name}]")
}

/// The length of the longest proper suffix of `value` (at least [`MIN_EDGE_MATCH`] bytes)
/// that `text` starts with.
fn edge_suffix(text: &str, value: &str) -> Option<usize> {
    (1..value.len())
        .filter(|&i| value.is_char_boundary(i) && value.len() - i >= MIN_EDGE_MATCH)
        .map(|i| &value[i..])
        .find(|suffix| text.starts_with(suffix))
        .map(str::len)
}

/// The length of the longest proper prefix of `value` (at least [`MIN_EDGE_MATCH`] bytes)
/// that `text` ends with.
fn edge_prefix(text: &str, value: &str) -> Option<usize> {
    (MIN_EDGE_MATCH..value.len())
        .rev()
        .filter(|&i| value.is_char_boundary(i))
        .map(|i| &value[..i])
        .find(|prefix| text.ends_with(prefix))
        .map(str::len)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_parse_from_64_hex_digits_only() {
        let (key, hex) = SecretsKey::generate();
        let again = SecretsKey::parse(&format!("  {hex}\n")).unwrap();
        assert_eq!(key.id(), again.id());
        assert_eq!(key.id().len(), 16);
        assert!(!format!("{key:?}").contains(&hex));
        let (longer, not_hex) = (format!("{hex}00"), "zz".repeat(32));
        for bad in ["", "abc", &hex[..62], longer.as_str(), not_hex.as_str()] {
            assert_eq!(SecretsKey::parse(bad).map(|_| ()), Err(BadKey), "{bad:?}");
        }
    }

    #[test]
    fn a_value_opens_only_for_its_tenant_and_name_under_its_key() {
        let (key, _) = SecretsKey::generate();
        let sealed = key.seal("acme", "MAIL_API_KEY", "s3cr3t-value");
        assert_eq!(sealed.nonce.len(), 24);
        assert!(!sealed.sealed.windows(12).any(|w| w == b"s3cr3t-value"));
        assert_eq!(key.open("acme", "MAIL_API_KEY", &sealed).unwrap(), "s3cr3t-value");
        assert_eq!(key.open("other", "MAIL_API_KEY", &sealed), Err(OpenError::Corrupt));
        assert_eq!(key.open("acme", "OTHER", &sealed), Err(OpenError::Corrupt));
        let mut altered = sealed.clone();
        altered.sealed[0] ^= 1;
        assert_eq!(key.open("acme", "MAIL_API_KEY", &altered), Err(OpenError::Corrupt));
        let (other, _) = SecretsKey::generate();
        assert!(matches!(
            other.open("acme", "MAIL_API_KEY", &sealed),
            Err(OpenError::OtherKey { .. })
        ));
        // A fresh nonce each time.
        assert_ne!(key.seal("acme", "K", "v").nonce, key.seal("acme", "K", "v").nonce);
    }

    #[test]
    fn artifact_tags_verify_only_under_their_key_and_fields() {
        let (key, hex) = SecretsKey::generate();
        let artifacts = key.artifact_key();
        assert_eq!(artifacts.id(), key.id());
        assert!(!format!("{artifacts:?}").contains(&hex));
        let fields: [&[u8]; 2] = [b"module", b"code"];
        let tag = artifacts.tag(&fields);
        assert_eq!(tag.len(), 64);
        assert!(artifacts.verify(&fields, &tag));
        assert_eq!(SecretsKey::parse(&hex).unwrap().artifact_key().tag(&fields), tag);
        // The same bytes framed otherwise, other bytes, another key, a cut or bad tag.
        assert!(!artifacts.verify(&[b"modul", b"ecode"], &tag));
        assert!(!artifacts.verify(&[b"module", b"cod3"], &tag));
        assert!(!SecretsKey::generate().0.artifact_key().verify(&fields, &tag));
        for bad in ["", &tag[..62], "zz", &"0".repeat(64)] {
            assert!(!artifacts.verify(&fields, bad), "{bad:?}");
        }
        // The sub-key is not the deployment key: HMAC under the key itself differs.
        let direct = keyed(&<[u8; 32]>::try_from(hex::decode(&hex).unwrap()).unwrap());
        let mut direct = direct;
        for field in fields {
            direct.update(&(field.len() as u64).to_le_bytes());
            direct.update(field);
        }
        assert_ne!(hex::encode(direct.finalize().into_bytes()), tag);
    }

    #[test]
    fn redaction_replaces_whole_values_and_cut_edges() {
        let r = Redactor::new(&[
            ("KEY".into(), "abcdef123456".into()),
            ("LONG".into(), "xx-abcdef123456-yy".into()),
            ("EMPTY".into(), String::new()),
        ]);
        assert_eq!(r.text("key=abcdef123456 ok"), "key=[redacted:KEY] ok");
        assert_eq!(r.text("both xx-abcdef123456-yy"), "both [redacted:LONG]");
        // A tail that starts inside a value, an output cut inside one.
        assert_eq!(r.text("ef123456 then"), "[redacted:KEY] then");
        assert_eq!(r.text("sent abcdef1"), "sent [redacted:KEY]");
        // Three characters are not enough to be a copy.
        assert_eq!(r.text("456 and abc"), "456 and abc");
        assert_eq!(r.text("nothing here"), "nothing here");
        let mut v = json!({"abcdef123456": ["id abcdef123456", 5, {"k": "ok"}]});
        r.json(&mut v);
        assert_eq!(v, json!({"[redacted:KEY]": ["id [redacted:KEY]", 5, {"k": "ok"}]}));
        assert!(Redactor::default().is_empty());
        assert!(!format!("{r:?}").contains("abcdef"));
    }
}
