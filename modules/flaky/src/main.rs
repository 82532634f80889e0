//! `flaky` fixture: payload `{"fail_times": N}`. Fails retryably (exit 1)
//! while `SWEEP_ATTEMPT <= N`, then succeeds with `{"attempt": A}`; for
//! testing retries and backoff.

use serde::{Deserialize, Serialize};
use sweep_guest::{Error, TaskContext};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    fail_times: u32,
}

#[derive(Debug, PartialEq, Serialize)]
struct Output {
    attempt: u32,
}

fn handle(input: Input, ctx: TaskContext) -> Result<Output, Error> {
    if ctx.attempt <= input.fail_times {
        return Err(Error::retryable(format!(
            "planned failure on attempt {} of the first {}",
            ctx.attempt, input.fail_times
        )));
    }
    Ok(Output { attempt: ctx.attempt })
}

fn main() {
    sweep_guest::run_with_context(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: u32) -> TaskContext {
        let mut ctx = TaskContext::default();
        ctx.attempt = n;
        ctx
    }

    #[test]
    fn fails_retryably_then_succeeds() {
        for n in 1..=2 {
            let err = handle(Input { fail_times: 2 }, attempt(n)).expect_err("planned");
            assert!(!err.is_permanent());
        }
        let ok = handle(Input { fail_times: 2 }, attempt(3)).expect("third attempt");
        assert_eq!(ok, Output { attempt: 3 });
    }

    #[test]
    fn zero_fail_times_succeeds_at_once() {
        assert!(handle(Input { fail_times: 0 }, attempt(1)).is_ok());
    }
}
