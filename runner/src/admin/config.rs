//! Admin API settings: plain struct, `DEFAULT_*` constants, `validate()`. The CLI fills it
//! from flags and environment once; nothing here reads the environment.
//!
//! Invariant: the operator token never appears in `Debug` output or logs.

use std::fmt;
use std::time::Duration;

use crate::secrets::SecretsKey;

/// Where `sweep admin` and `sweep run` serve the API unless told otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7070";
/// Largest module upload, before any tenant cap (`max_module_bytes`, which may lower it):
/// room for a handler with a language runtime inside (a componentize-py component is about
/// 18.5 MB, a componentize-js one about 10 MB) and the libraries it brings.
pub const DEFAULT_MAX_MODULE_BYTES: usize = 64 * 1024 * 1024;
/// Largest JSON request body (a batch of tasks included).
pub const DEFAULT_MAX_JSON_BYTES: usize = 8 * 1024 * 1024;
/// Largest task payload (compact JSON) a tenant without a limit of its own may enqueue.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// Most tasks in one `POST /v1/tasks/batch`.
pub const DEFAULT_MAX_BATCH: usize = 10_000;
/// Longest an upload's validation (a full compile) may take before it is refused.
pub const DEFAULT_VALIDATION_TIMEOUT: Duration = Duration::from_secs(30);
/// Uploads validated at once; more wait their turn (compiles are CPU-bound).
pub const DEFAULT_MAX_CONCURRENT_VALIDATIONS: usize = 2;
/// Shortest operator token accepted.
pub const MIN_OPERATOR_TOKEN_LEN: usize = 16;

#[derive(Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Bearer token that acts as the operator (every tenant, `/metrics`). `None`: no operator
    /// access over HTTP.
    pub operator_token: Option<String>,
    pub max_module_bytes: usize,
    pub max_json_bytes: usize,
    /// Payload limit for tenants whose `max_payload_bytes` is null.
    pub max_payload_bytes: usize,
    pub max_batch: usize,
    pub validation_timeout: Duration,
    pub max_concurrent_validations: usize,
    /// The key tenant secrets are sealed under (`SWEEP_SECRETS_KEY`). `None`: secrets cannot
    /// be set (503); listing and deleting them still work.
    pub secrets_key: Option<SecretsKey>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            operator_token: None,
            max_module_bytes: DEFAULT_MAX_MODULE_BYTES,
            max_json_bytes: DEFAULT_MAX_JSON_BYTES,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_batch: DEFAULT_MAX_BATCH,
            validation_timeout: DEFAULT_VALIDATION_TIMEOUT,
            max_concurrent_validations: DEFAULT_MAX_CONCURRENT_VALIDATIONS,
            secrets_key: None,
        }
    }
}

impl fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminConfig")
            .field("operator_token", &self.operator_token.as_ref().map(|_| "<redacted>"))
            .field("max_module_bytes", &self.max_module_bytes)
            .field("max_json_bytes", &self.max_json_bytes)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("max_batch", &self.max_batch)
            .field("validation_timeout", &self.validation_timeout)
            .field("max_concurrent_validations", &self.max_concurrent_validations)
            .field("secrets_key", &self.secrets_key.as_ref().map(SecretsKey::id))
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdminConfigError {
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    #[error("the operator token must be at least {MIN_OPERATOR_TOKEN_LEN} characters")]
    WeakOperatorToken,
    #[error("the operator token must be printable ASCII without spaces")]
    OperatorTokenCharacters,
}

impl AdminConfig {
    pub fn validate(&self) -> Result<(), AdminConfigError> {
        for (name, value) in [
            ("max_module_bytes", self.max_module_bytes),
            ("max_json_bytes", self.max_json_bytes),
            ("max_payload_bytes", self.max_payload_bytes),
            ("max_batch", self.max_batch),
            ("max_concurrent_validations", self.max_concurrent_validations),
        ] {
            if value == 0 {
                return Err(AdminConfigError::Zero(name));
            }
        }
        if self.validation_timeout.is_zero() {
            return Err(AdminConfigError::Zero("validation_timeout"));
        }
        if let Some(token) = &self.operator_token {
            if token.len() < MIN_OPERATOR_TOKEN_LEN {
                return Err(AdminConfigError::WeakOperatorToken);
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(AdminConfigError::OperatorTokenCharacters);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_checks_catch_bad_values() {
        assert_eq!(AdminConfig::default().validate(), Ok(()));
        let c = AdminConfig { max_batch: 0, ..AdminConfig::default() };
        assert_eq!(c.validate(), Err(AdminConfigError::Zero("max_batch")));
        let c = AdminConfig { operator_token: Some("short".into()), ..AdminConfig::default() };
        assert_eq!(c.validate(), Err(AdminConfigError::WeakOperatorToken));
        let c = AdminConfig {
            operator_token: Some("a token with spaces in it".into()),
            ..AdminConfig::default()
        };
        assert_eq!(c.validate(), Err(AdminConfigError::OperatorTokenCharacters));
    }

    #[test]
    fn debug_hides_the_operator_token() {
        let c = AdminConfig {
            operator_token: Some("super-secret-operator-token".into()),
            ..AdminConfig::default()
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("super-secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }
}
