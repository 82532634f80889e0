//! Logging to stderr, the guest's log channel.
//!
//! Stdout is reserved for the result, so logs must never go there. Logging
//! never fails the handler: a write error on stderr is ignored.

use std::fmt::Display;
use std::io::Write;

/// Writes one log line to stderr.
///
/// ```
/// sweep_guest::log("starting");
/// ```
pub fn log(message: impl Display) {
    let _ = writeln!(std::io::stderr().lock(), "{message}");
}

/// Writes one formatted log line to stderr, like `eprintln!`.
///
/// ```
/// let n = 3;
/// sweep_guest::log!("processed {n} items");
/// ```
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log(::std::format_args!($($arg)*))
    };
}
