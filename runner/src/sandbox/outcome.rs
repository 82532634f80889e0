//! What came of one task run: [`Outcome`], [`Execution`], and the pure classification that
//! turns the facts of a finished run into an `Outcome`.
//!
//! Owns: the guest exit-code contract (0 = success, [`PERMANENT_EXIT_CODE`] = permanent
//! failure, anything else = retryable) and which [`FailureKind`] each outcome is recorded as.
//!
//! Invariants:
//! - classification is structural: flags recorded by our own host code (stdout overflow,
//!   deadline hit, memory denied), then a downcast of the error to `wasmtime_wasi::I32Exit`,
//!   `wasmtime::Trap` or `wasmtime::PoolConcurrencyLimitError`. Error *text* is only ever copied
//!   into messages, never inspected;
//! - host-side flags win over the error they caused (our own trap error may be wrapped in
//!   context by wasmtime; the flag is the ground truth);
//! - an outcome's failure kind never changes once shipped: it is stored in the database.

use std::time::Duration;

use super::capabilities::Usage;
use super::pipes::tail_str;
use crate::queue::FailureKind;

/// Exit code with which a handler says "permanent failure, do not retry".
pub const PERMANENT_EXIT_CODE: i32 = 100;
/// Longest handler error message kept from stderr, in bytes.
pub const MESSAGE_MAX_BYTES: usize = 1024;
/// Longest snippet of invalid stdout quoted in an `InvalidOutput` message, in bytes.
const STDOUT_SNIPPET_BYTES: usize = 120;

/// Which trap stopped the guest (for traps that aren't limits with their own outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrapCause {
    /// A trap raised by wasm code itself (`unreachable`, out-of-bounds access, ...).
    Wasm(wasmtime::Trap),
    /// A trap raised by a host (WASI) function on the guest's behalf, e.g. a malformed call.
    Host,
}

/// The typed result of a task run.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// Exit 0; stdout parsed as JSON (empty stdout = `null`).
    Success(serde_json::Value),
    /// Non-zero exit. `message` is the tail of stderr.
    HandlerError {
        /// The exit code was [`PERMANENT_EXIT_CODE`].
        permanent: bool,
        /// The guest's exit code.
        exit_code: i32,
        /// Tail of stderr (or a stand-in when stderr was empty).
        message: String,
    },
    /// Fuel ran out.
    OutOfFuel,
    /// The wall-clock budget ran out (spinning guest stopped at an epoch tick, or a guest
    /// blocked in a host call stopped by the tokio timeout).
    Timeout,
    /// The guest tried to grow (or start with) more linear memory than its limit.
    MemoryLimit,
    /// The wasm call stack overflowed.
    StackOverflow,
    /// Any other trap.
    Trap {
        /// What trapped.
        cause: TrapCause,
        /// Human-readable description, for the error history only.
        message: String,
    },
    /// The guest wrote more than `output_bytes` to stdout and was stopped.
    OutputTooLarge,
    /// Exit 0 but stdout is not JSON. Holds the parse error and a snippet.
    InvalidOutput(String),
    /// No module is registered for the task type (produced by the worker, not the sandbox).
    ModuleMissing,
    /// The runner could not run the task; not the guest's fault.
    RunnerError(String),
    /// The instance pool had no free slot for as long as the sandbox waits for one (or the
    /// worker could not read what the task is given: see `worker::execute`). Nothing of the
    /// guest ran: the worker hands the task back to the queue without counting an attempt.
    NoCapacity(String),
    /// A cancel of the task stopped the run (see `Sandbox::run_cancellable`). Permanent: the
    /// queue ends the task `cancelled`.
    Cancelled,
    /// The module names secrets the runner could not provide (no key, another key, a secret
    /// deleted since the upload); the guest did not run (produced by the worker). Retryable:
    /// a runner with the key, or the secret set again, runs it.
    SecretsUnavailable(String),
}

impl Outcome {
    /// The kind recorded in the task's history; `None` on success.
    pub fn failure_kind(&self) -> Option<FailureKind> {
        Some(match self {
            Outcome::Success(_) => return None,
            Outcome::HandlerError { .. } => FailureKind::HandlerError,
            Outcome::OutOfFuel => FailureKind::OutOfFuel,
            Outcome::Timeout => FailureKind::Timeout,
            Outcome::MemoryLimit => FailureKind::MemoryLimit,
            Outcome::StackOverflow => FailureKind::StackOverflow,
            Outcome::Trap { .. } => FailureKind::Trap,
            Outcome::OutputTooLarge => FailureKind::OutputTooLarge,
            Outcome::InvalidOutput(_) => FailureKind::InvalidOutput,
            Outcome::ModuleMissing => FailureKind::ModuleMissing,
            Outcome::RunnerError(_) | Outcome::NoCapacity(_) => FailureKind::RunnerError,
            Outcome::Cancelled => FailureKind::Cancelled,
            Outcome::SecretsUnavailable(_) => FailureKind::SecretsUnavailable,
        })
    }

    /// The outcome's name for logs and the `kind` metric label: the failure kind, or
    /// `success`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::NoCapacity(_) => "no_capacity",
            _ => self.failure_kind().map_or("success", FailureKind::as_str),
        }
    }

    /// True only for [`Outcome::Success`].
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Success(_))
    }

    /// True when the failure must not be retried: the handler exited with
    /// [`PERMANENT_EXIT_CODE`], or its result passed the output limit (the limit is the
    /// tenant's or the runner's, fixed for the task, and a guest has no input but its payload:
    /// another attempt would write as much again), or a cancel stopped it. Every other failure
    /// is retryable (the worker decides what to do with `ModuleMissing`).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Outcome::HandlerError { permanent: true, .. }
                | Outcome::OutputTooLarge
                | Outcome::Cancelled
        )
    }

    /// One-line description for the error history (`None` on success).
    pub fn message(&self) -> Option<String> {
        let text = match self {
            Outcome::Success(_) => return None,
            Outcome::HandlerError { message, .. } => message.clone(),
            Outcome::OutOfFuel => "fuel exhausted".to_owned(),
            Outcome::Timeout => "wall-clock timeout exceeded".to_owned(),
            Outcome::MemoryLimit => "memory limit exceeded".to_owned(),
            Outcome::StackOverflow => "call stack exhausted".to_owned(),
            Outcome::Trap { message, .. } => message.clone(),
            Outcome::OutputTooLarge => "stdout exceeded the output limit".to_owned(),
            Outcome::InvalidOutput(msg) => msg.clone(),
            Outcome::ModuleMissing => "no module registered for this task type".to_owned(),
            Outcome::RunnerError(msg)
            | Outcome::NoCapacity(msg)
            | Outcome::SecretsUnavailable(msg) => msg.clone(),
            Outcome::Cancelled => "cancelled while running: the instance was stopped".to_owned(),
        };
        Some(text)
    }
}

/// Everything the worker needs to report a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    /// What happened.
    pub outcome: Outcome,
    /// The last bytes of the guest's stderr (bounded; see `STDERR_TAIL_BYTES`).
    pub stderr: String,
    /// Older stderr was dropped to keep `stderr` bounded.
    pub stderr_truncated: bool,
    /// Wall-clock time from the start of `run` to the end (store teardown included).
    pub duration: Duration,
    /// What the run used: fuel (instantiation included), peak memory, HTTP requests and
    /// bytes. Zero for a run that never started.
    pub usage: Usage,
    /// The run used an instance an earlier task of its version left (`reuse`).
    pub on_kept_instance: bool,
}

impl Execution {
    /// The text to record in the error history: the outcome's message, plus the stderr tail
    /// for failures whose message doesn't already come from stderr (a Rust panic message
    /// before an `unreachable` trap, say). `None` on success.
    pub fn failure_message(&self) -> Option<String> {
        let msg = self.outcome.message()?;
        let from_stderr = matches!(self.outcome, Outcome::HandlerError { .. });
        let tail = tail_str(self.stderr.trim_end(), MESSAGE_MAX_BYTES);
        if from_stderr || tail.is_empty() {
            Some(msg)
        } else {
            Some(format!("{msg}; stderr: {tail}"))
        }
    }
}

/// How the guest call ended, as seen by the host.
#[derive(Debug)]
pub(crate) enum Ending {
    /// `_start` returned normally.
    Returned,
    /// Instantiation failed.
    InstantiateFailed(wasmtime::Error),
    /// The `_start` call failed (trap, exit, host error).
    CallFailed(wasmtime::Error),
    /// The tokio timeout fired while the guest was suspended in a host call.
    Elapsed,
    /// A cancel stopped the run (the instance was dropped wherever the guest was).
    Cancelled,
}

/// Facts collected after a run, input of [`classify`].
#[derive(Debug)]
pub(crate) struct RunFacts<'a> {
    pub ending: Ending,
    pub stdout: &'a [u8],
    pub stdout_overflowed: bool,
    pub deadline_hit: bool,
    pub memory_denied: bool,
    pub stderr_tail: &'a str,
}

/// Turns the facts of a run into an [`Outcome`]. Pure; see the module invariants.
pub(crate) fn classify(facts: RunFacts<'_>) -> Outcome {
    // We stopped it ourselves: nothing it did after that counts.
    if matches!(facts.ending, Ending::Cancelled) {
        return Outcome::Cancelled;
    }
    if facts.stdout_overflowed {
        return Outcome::OutputTooLarge;
    }
    if facts.deadline_hit {
        return Outcome::Timeout;
    }
    let (error, instantiating) = match facts.ending {
        Ending::Returned => return exited(0, facts.stdout, facts.stderr_tail),
        Ending::Elapsed => return Outcome::Timeout,
        Ending::Cancelled => return Outcome::Cancelled,
        Ending::InstantiateFailed(e) => (e, true),
        Ending::CallFailed(e) => (e, false),
    };
    if facts.memory_denied {
        return Outcome::MemoryLimit;
    }
    if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return exited(exit.0, facts.stdout, facts.stderr_tail);
    }
    if let Some(trap) = error.downcast_ref::<wasmtime::Trap>() {
        return match *trap {
            wasmtime::Trap::OutOfFuel => Outcome::OutOfFuel,
            wasmtime::Trap::StackOverflow => Outcome::StackOverflow,
            wasmtime::Trap::Interrupt => Outcome::Timeout,
            other => Outcome::Trap { cause: TrapCause::Wasm(other), message: other.to_string() },
        };
    }
    if error.is::<wasmtime::PoolConcurrencyLimitError>() {
        return Outcome::NoCapacity(format!("no free instance slot: {error:#}"));
    }
    if instantiating {
        return Outcome::RunnerError(format!("failed to instantiate module: {error:#}"));
    }
    Outcome::Trap { cause: TrapCause::Host, message: format!("{error:#}") }
}

/// The outcome of a guest that exited with `code` (returning from `_start` is code 0).
fn exited(code: i32, stdout: &[u8], stderr_tail: &str) -> Outcome {
    if code != 0 {
        let tail = tail_str(stderr_tail.trim_end(), MESSAGE_MAX_BYTES);
        let message = if tail.is_empty() {
            format!("handler exited with code {code}")
        } else {
            tail.to_owned()
        };
        return Outcome::HandlerError {
            permanent: code == PERMANENT_EXIT_CODE,
            exit_code: code,
            message,
        };
    }
    let trimmed = stdout.trim_ascii();
    if trimmed.is_empty() {
        return Outcome::Success(serde_json::Value::Null);
    }
    match serde_json::from_slice(trimmed) {
        Ok(value) => Outcome::Success(value),
        Err(e) => {
            let snippet =
                String::from_utf8_lossy(&trimmed[..trimmed.len().min(STDOUT_SNIPPET_BYTES)]);
            Outcome::InvalidOutput(format!("stdout is not valid JSON ({e}): {snippet:?}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn facts(ending: Ending) -> RunFacts<'static> {
        RunFacts {
            ending,
            stdout: b"",
            stdout_overflowed: false,
            deadline_hit: false,
            memory_denied: false,
            stderr_tail: "",
        }
    }

    fn call_failed(e: impl std::error::Error + Send + Sync + 'static) -> Ending {
        Ending::CallFailed(wasmtime::Error::new(e))
    }

    #[test]
    fn returned_with_json_is_success() {
        let f = RunFacts { stdout: b" {\"n\": 3}\n", ..facts(Ending::Returned) };
        assert_eq!(classify(f), Outcome::Success(json!({"n": 3})));
    }

    #[test]
    fn empty_stdout_is_null() {
        assert_eq!(classify(facts(Ending::Returned)), Outcome::Success(serde_json::Value::Null));
    }

    #[test]
    fn non_json_stdout_is_invalid_output() {
        let f = RunFacts { stdout: b"hello", ..facts(Ending::Returned) };
        let out = classify(f);
        assert_eq!(out.failure_kind(), Some(FailureKind::InvalidOutput));
        assert!(!out.is_permanent());
    }

    #[test]
    fn exit_zero_via_proc_exit_is_success() {
        let f = RunFacts { stdout: b"[1]", ..facts(call_failed(wasmtime_wasi::I32Exit(0))) };
        assert_eq!(classify(f), Outcome::Success(json!([1])));
    }

    #[test]
    fn exit_codes_map_to_handler_errors() {
        let f = RunFacts {
            stderr_tail: "log line\nboom: bad input\n",
            ..facts(call_failed(wasmtime_wasi::I32Exit(100)))
        };
        let out = classify(f);
        assert!(out.is_permanent());
        assert_eq!(out.message().as_deref(), Some("log line\nboom: bad input"));
        let out = classify(facts(call_failed(wasmtime_wasi::I32Exit(1))));
        assert_eq!(
            out,
            Outcome::HandlerError {
                permanent: false,
                exit_code: 1,
                message: "handler exited with code 1".into()
            }
        );
    }

    #[test]
    fn traps_map_by_code() {
        let t = |trap| classify(facts(call_failed(trap)));
        assert_eq!(t(wasmtime::Trap::OutOfFuel), Outcome::OutOfFuel);
        assert_eq!(t(wasmtime::Trap::StackOverflow), Outcome::StackOverflow);
        assert_eq!(t(wasmtime::Trap::Interrupt), Outcome::Timeout);
        let out = t(wasmtime::Trap::UnreachableCodeReached);
        assert!(matches!(
            out,
            Outcome::Trap { cause: TrapCause::Wasm(wasmtime::Trap::UnreachableCodeReached), .. }
        ));
        assert_eq!(out.failure_kind(), Some(FailureKind::Trap));
    }

    #[test]
    fn trap_found_under_context() {
        let e = wasmtime::Error::new(wasmtime::Trap::OutOfFuel).context("while running _start");
        assert_eq!(classify(facts(Ending::CallFailed(e))), Outcome::OutOfFuel);
    }

    #[test]
    fn host_flags_win_over_the_error() {
        let unreachable = || call_failed(wasmtime::Trap::UnreachableCodeReached);
        let f = RunFacts { stdout_overflowed: true, ..facts(unreachable()) };
        assert_eq!(classify(f), Outcome::OutputTooLarge);
        let f = RunFacts { deadline_hit: true, ..facts(unreachable()) };
        assert_eq!(classify(f), Outcome::Timeout);
        let f = RunFacts { memory_denied: true, ..facts(unreachable()) };
        assert_eq!(classify(f), Outcome::MemoryLimit);
        assert_eq!(classify(facts(Ending::Elapsed)), Outcome::Timeout);
    }

    #[test]
    fn a_cancel_wins_over_what_the_guest_did() {
        let f =
            RunFacts { stdout_overflowed: true, deadline_hit: true, ..facts(Ending::Cancelled) };
        assert_eq!(classify(f), Outcome::Cancelled);
        assert_eq!(Outcome::Cancelled.failure_kind(), Some(FailureKind::Cancelled));
        assert!(Outcome::Cancelled.is_permanent());
    }

    #[test]
    fn unknown_errors_split_by_phase() {
        let msg = || wasmtime::Error::msg("something odd");
        let out = classify(facts(Ending::CallFailed(msg())));
        assert!(matches!(out, Outcome::Trap { cause: TrapCause::Host, .. }));
        let out = classify(facts(Ending::InstantiateFailed(msg())));
        assert_eq!(out.failure_kind(), Some(FailureKind::RunnerError));
    }

    #[test]
    fn kinds_are_stable() {
        let all = [
            (Outcome::Success(json!(null)), None),
            (Outcome::OutOfFuel, Some(FailureKind::OutOfFuel)),
            (Outcome::Timeout, Some(FailureKind::Timeout)),
            (Outcome::MemoryLimit, Some(FailureKind::MemoryLimit)),
            (Outcome::StackOverflow, Some(FailureKind::StackOverflow)),
            (Outcome::OutputTooLarge, Some(FailureKind::OutputTooLarge)),
            (Outcome::InvalidOutput(String::new()), Some(FailureKind::InvalidOutput)),
            (Outcome::ModuleMissing, Some(FailureKind::ModuleMissing)),
            (Outcome::Cancelled, Some(FailureKind::Cancelled)),
        ];
        for (outcome, kind) in all {
            assert_eq!(outcome.failure_kind(), kind);
            assert_eq!(outcome.is_success(), kind.is_none());
            assert_eq!(outcome.message().is_none(), kind.is_none());
            let permanent =
                matches!(kind, Some(FailureKind::OutputTooLarge | FailureKind::Cancelled));
            assert_eq!(outcome.is_permanent(), permanent, "{kind:?}");
        }
    }

    #[test]
    fn failure_message_appends_stderr_for_traps() {
        let exec = Execution {
            outcome: Outcome::Trap {
                cause: TrapCause::Wasm(wasmtime::Trap::UnreachableCodeReached),
                message: "wasm trap: unreachable".into(),
            },
            stderr: "panicked at src/main.rs:3:5\n".into(),
            stderr_truncated: false,
            duration: Duration::ZERO,
            usage: Usage::default(),
            on_kept_instance: false,
        };
        assert_eq!(
            exec.failure_message().as_deref(),
            Some("wasm trap: unreachable; stderr: panicked at src/main.rs:3:5")
        );
    }
}
