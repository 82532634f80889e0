//! `permanent` fixture: a handler that fails with `Error::permanent` on any
//! JSON payload, so the process exits 100 and the task must not be retried.

use sweep_guest::Error;

fn handle(_payload: serde_json::Value) -> Result<(), Error> {
    Err(Error::permanent("the permanent fixture always fails permanently"))
}

fn main() {
    sweep_guest::run(handle)
}
