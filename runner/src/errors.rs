//! Error text for logs, API messages and stored failure reasons.
//!
//! Owns: [`error_chain`]. Invariant: an error's sources are part of its text, so a cause
//! wrapped by a layer that only says "invalid module" or "database error" is never lost.

/// `e` and its sources, `: `-separated.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
