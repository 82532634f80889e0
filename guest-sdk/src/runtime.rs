//! The entry points: read the payload, call the handler, report the outcome.
//!
//! Invariants: stdout carries the result and nothing else, and only on
//! success; on failure the error message is the final line of stderr; the
//! exit code is decided only by [`Error::exit_code`]. The process-touching
//! shell (`run_main`) is kept thin so the logic ([`execute`],
//! [`report`]) can be unit-tested natively against in-memory buffers.

use std::io::{Read, Write};
use std::panic::{Location, PanicHookInfo};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{Error, TaskContext};

/// Runs `handler` as the whole program and ends it with the contract's code: on success it
/// returns (so `main` returns and the instance ends without `proc_exit`, which the host
/// handles as an error path), otherwise it exits with the failure's code.
///
/// ```no_run
/// fn handle(n: u64) -> Result<u64, sweep_guest::Error> {
///     n.checked_mul(2).ok_or_else(|| sweep_guest::Error::permanent("too big"))
/// }
///
/// fn main() {
///     sweep_guest::run(handle)
/// }
/// ```
pub fn run<I, O, F>(handler: F)
where
    I: DeserializeOwned,
    O: Serialize,
    F: FnOnce(I) -> Result<O, Error>,
{
    // No context, so the environment is never read: the first read makes wasi-libc build the
    // whole `environ`, the costliest part of a small handler's start (figures: CHANGELOG.md).
    run_main(handler)
}

/// Like [`run`], but the handler also receives the [`TaskContext`]
/// (task id, type, attempt number) read from the environment.
pub fn run_with_context<I, O, F>(handler: F)
where
    I: DeserializeOwned,
    O: Serialize,
    F: FnOnce(I, TaskContext) -> Result<O, Error>,
{
    let ctx = TaskContext::from_env();
    run_main(|input| handler(input, ctx))
}

/// The process-touching shell both entry points share.
fn run_main<I, O>(handler: impl FnOnce(I) -> Result<O, Error>)
where
    I: DeserializeOwned,
    O: Serialize,
{
    std::panic::set_hook(Box::new(log_panic));
    let mut payload = Vec::new();
    let result = match std::io::stdin().lock().read_to_end(&mut payload) {
        Ok(_) => execute(&payload, handler),
        Err(err) => {
            Err(Error::retryable(format!("cannot read the task payload from stdin: {err}")))
        }
    };
    let code = report(result, &mut std::io::stdout().lock(), &mut std::io::stderr().lock());
    if code != 0 {
        // `exit` skips destructors; `report` has already flushed stdout and stderr.
        std::process::exit(code)
    }
}

/// Parses the payload, calls the handler and serialises its result.
fn execute<I, O, F>(payload: &[u8], handler: F) -> Result<Vec<u8>, Error>
where
    I: DeserializeOwned,
    O: Serialize,
    F: FnOnce(I) -> Result<O, Error>,
{
    let input = serde_json::from_slice(payload)
        .map_err(|err| Error::from(err).context("invalid task payload"))?;
    let output = handler(input)?;
    let mut bytes = serde_json::to_vec(&output)
        .map_err(|err| Error::from(err).context("cannot serialize the result"))?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Writes the outcome to stdout or stderr and returns the exit code.
fn report(result: Result<Vec<u8>, Error>, stdout: &mut impl Write, stderr: &mut impl Write) -> i32 {
    let err = match result {
        Ok(bytes) => match stdout.write_all(&bytes).and_then(|()| stdout.flush()) {
            Ok(()) => return 0,
            Err(err) => Error::retryable(format!("cannot write the result to stdout: {err}")),
        },
        Err(err) => err,
    };
    let line = if err.message().trim().is_empty() {
        format!("{:?} failure", err.kind()).to_lowercase()
    } else {
        one_line(err.message())
    };
    let _ = writeln!(stderr, "{line}");
    let _ = stderr.flush();
    err.exit_code()
}

/// The panic hook: one line on stderr, so the host can record it. On
/// wasm32-wasip1 the module then traps (`unreachable`); natively it exits 101.
fn log_panic(info: &PanicHookInfo<'_>) {
    crate::log(panic_line(info.location(), info.payload_as_str()));
}

fn panic_line(location: Option<&Location<'_>>, message: Option<&str>) -> String {
    let message = one_line(message.unwrap_or("non-string panic payload"));
    match location {
        Some(location) => format!("panicked at {location}: {message}"),
        None => format!("panicked: {message}"),
    }
}

fn one_line(text: &str) -> String {
    text.trim().replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Input {
        n: i64,
    }

    fn double(input: Input, _: TaskContext) -> Result<i64, Error> {
        match input.n {
            n if n < 0 => Err(Error::permanent("n must not be negative")),
            0 => Err(Error::retryable("zero: try\nagain later")),
            n => Ok(n * 2),
        }
    }

    fn outcome(payload: &str) -> (i32, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let result = execute(payload.as_bytes(), |input| double(input, TaskContext::default()));
        let code = report(result, &mut out, &mut err);
        let text = |b: Vec<u8>| String::from_utf8(b).expect("utf-8");
        (code, text(out), text(err))
    }

    #[test]
    fn success_writes_result_only_to_stdout() {
        assert_eq!(outcome(r#"{"n": 21}"#), (0, "42\n".into(), String::new()));
    }

    #[test]
    fn permanent_error_exits_100_with_message_on_stderr() {
        let (code, out, err) = outcome(r#"{"n": -1}"#);
        assert_eq!(code, crate::PERMANENT_FAILURE_EXIT_CODE);
        assert_eq!(out, "");
        assert_eq!(err, "n must not be negative\n");
    }

    #[test]
    fn retryable_error_exits_1_as_a_single_line() {
        let (code, out, err) = outcome(r#"{"n": 0}"#);
        assert_eq!(code, crate::RETRYABLE_FAILURE_EXIT_CODE);
        assert_eq!(out, "");
        assert_eq!(err, "zero: try again later\n");
    }

    #[test]
    fn malformed_payload_is_permanent_and_says_so() {
        for payload in ["{not json", "", r#"{"m": 1}"#, r#"{"n": "x"}"#, "{\"n\":1} 2"] {
            let (code, out, err) = outcome(payload);
            assert_eq!(code, 100, "payload {payload:?}");
            assert_eq!(out, "");
            assert!(err.starts_with("invalid task payload: "), "{err}");
            assert_eq!(err.lines().count(), 1);
        }
    }

    #[test]
    fn unserializable_result_is_permanent() {
        let mut map = std::collections::HashMap::new();
        map.insert((1, 2), "tuple keys are not JSON");
        let result = execute(b"null", |(): ()| Ok::<_, Error>(map));
        let err = result.expect_err("cannot serialize");
        assert_eq!(err.kind(), ErrorKind::Permanent);
        assert!(err.message().starts_with("cannot serialize the result"));
    }

    #[test]
    fn failed_stdout_write_is_retryable() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut err = Vec::new();
        let code = report(Ok(b"{}\n".to_vec()), &mut Closed, &mut err);
        assert_eq!(code, 1);
        assert!(String::from_utf8_lossy(&err).starts_with("cannot write the result"));
    }

    #[test]
    fn empty_message_still_leaves_a_line() {
        let mut err = Vec::new();
        assert_eq!(report(Err(Error::permanent(" ")), &mut Vec::new(), &mut err), 100);
        assert_eq!(err, b"permanent failure\n");
    }

    #[test]
    fn panic_line_is_one_line() {
        let here = Location::caller();
        let line = panic_line(Some(here), Some("index out of bounds\nlen is 3"));
        assert!(line.starts_with("panicked at "), "{line}");
        assert!(line.ends_with(": index out of bounds len is 3"), "{line}");
        assert_eq!(panic_line(None, None), "panicked: non-string panic payload");
    }
}
