//! The handler error: a message plus whether retrying could help.
//!
//! Invariant: every [`Error`] maps to exactly one exit code, so the host's
//! retry decision is made here, in one place ([`Error::exit_code`]).

use std::fmt;

use crate::{PERMANENT_FAILURE_EXIT_CODE, RETRYABLE_FAILURE_EXIT_CODE};

/// Whether a failed attempt is worth retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Something transient went wrong; the host retries with backoff while
    /// attempts remain.
    Retryable,
    /// Retrying cannot help (bad input, unsupported request); the host moves
    /// the task to the dead-letter table at once.
    Permanent,
}

/// Why a handler failed, as returned from a handler function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// A failure that may succeed on a later attempt.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Retryable, message)
    }

    /// A failure that will not go away by retrying (exit code 100).
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Permanent, message)
    }

    /// An error of the given kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }

    /// Whether the host should retry.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// True for [`ErrorKind::Permanent`].
    pub fn is_permanent(&self) -> bool {
        self.kind == ErrorKind::Permanent
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The process exit code that reports this error to the host.
    pub fn exit_code(&self) -> i32 {
        match self.kind {
            ErrorKind::Retryable => RETRYABLE_FAILURE_EXIT_CODE,
            ErrorKind::Permanent => PERMANENT_FAILURE_EXIT_CODE,
        }
    }

    /// The message prefixed with `context: `, keeping the kind.
    pub fn context(self, context: impl fmt::Display) -> Self {
        Self { kind: self.kind, message: format!("{context}: {}", self.message) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// JSON that does not fit the expected shape is a permanent failure: the
/// same bytes will not parse next time either. Only an I/O error while
/// reading or writing JSON is retryable.
impl From<serde_json::Error> for Error {
    fn from(err: serde_json::Error) -> Self {
        let kind = match err.classify() {
            serde_json::error::Category::Io => ErrorKind::Retryable,
            serde_json::error::Category::Syntax
            | serde_json::error::Category::Data
            | serde_json::error::Category::Eof => ErrorKind::Permanent,
        };
        Self::new(kind, err.to_string())
    }
}

/// I/O errors are treated as transient.
impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Self {
        Self::retryable(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_map_to_exit_codes() {
        let retry = Error::retryable("db busy");
        assert_eq!(retry.kind(), ErrorKind::Retryable);
        assert!(!retry.is_permanent());
        assert_eq!(retry.exit_code(), 1);

        let perm = Error::permanent("bad input");
        assert!(perm.is_permanent());
        assert_eq!(perm.exit_code(), 100);
        assert_eq!(perm.exit_code(), PERMANENT_FAILURE_EXIT_CODE);
    }

    #[test]
    fn retryable_code_is_neither_success_nor_permanent() {
        assert_ne!(RETRYABLE_FAILURE_EXIT_CODE, 0);
        assert_ne!(RETRYABLE_FAILURE_EXIT_CODE, PERMANENT_FAILURE_EXIT_CODE);
    }

    #[test]
    fn display_is_the_message() {
        assert_eq!(Error::permanent("nope").to_string(), "nope");
        assert_eq!(Error::retryable("later").message(), "later");
    }

    #[test]
    fn context_prefixes_and_keeps_kind() {
        let err = Error::permanent("missing field").context("payload");
        assert_eq!(err.to_string(), "payload: missing field");
        assert!(err.is_permanent());
    }

    #[test]
    fn json_syntax_and_shape_errors_are_permanent() {
        let syntax = serde_json::from_str::<u32>("{not json").expect_err("bad syntax");
        assert!(Error::from(syntax).is_permanent());

        let shape = serde_json::from_str::<u32>("\"text\"").expect_err("wrong type");
        let err = Error::from(shape);
        assert!(err.is_permanent());
        assert!(err.message().contains("invalid type"), "{err}");

        let eof = serde_json::from_str::<u32>("").expect_err("empty");
        assert!(Error::from(eof).is_permanent());
    }

    #[test]
    fn json_io_errors_are_retryable() {
        struct Broken;
        impl std::io::Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("pipe broke"))
            }
        }
        let io = serde_json::from_reader::<_, u32>(Broken).expect_err("io");
        assert_eq!(Error::from(io).kind(), ErrorKind::Retryable);
    }

    #[test]
    fn io_errors_are_retryable() {
        let err = Error::from(std::io::Error::other("disk hiccup"));
        assert_eq!(err.kind(), ErrorKind::Retryable);
        assert_eq!(err.to_string(), "disk hiccup");
    }
}
