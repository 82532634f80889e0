//! `spawn` fixture, for workflows: payload `{"enqueue": [tasks], "fail_times": N}`, both
//! optional. Fails retryably (exit 1) while `SWEEP_ATTEMPT <= N`; then succeeds with
//! `{"attempt": A, "parents": [ids], "$enqueue": [tasks]}`: the follow-up tasks it was given
//! (`$enqueue` only when there are some), and the ids of the parents whose results it was
//! handed (`$parents`, docs/guests.md), in the order it got them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sweep_guest::{Error, TaskContext};

#[derive(Debug, Deserialize)]
struct Input {
    #[serde(default)]
    enqueue: Vec<Value>,
    #[serde(default)]
    fail_times: u32,
    #[serde(default, rename = "$parents")]
    parents: Vec<Parent>,
}

#[derive(Debug, Deserialize)]
struct Parent {
    id: i64,
}

#[derive(Debug, PartialEq, Serialize)]
struct Output {
    attempt: u32,
    parents: Vec<i64>,
    #[serde(rename = "$enqueue", skip_serializing_if = "Vec::is_empty")]
    enqueue: Vec<Value>,
}

fn handle(input: Input, ctx: TaskContext) -> Result<Output, Error> {
    if ctx.attempt <= input.fail_times {
        return Err(Error::retryable(format!(
            "planned failure on attempt {} of the first {}",
            ctx.attempt, input.fail_times
        )));
    }
    Ok(Output {
        attempt: ctx.attempt,
        parents: input.parents.into_iter().map(|p| p.id).collect(),
        enqueue: input.enqueue,
    })
}

fn main() {
    sweep_guest::run_with_context(handle)
}
