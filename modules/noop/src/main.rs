//! `noop`: accepts any JSON payload and returns `{}`; the benchmark baseline
//! for per-task overhead, so it does as little as the contract allows.

use serde::de::IgnoredAny;
use serde::Serialize;
use sweep_guest::Error;

/// Serialises as `{}`.
#[derive(Debug, Serialize)]
struct Empty {}

fn handle(_payload: IgnoredAny) -> Result<Empty, Error> {
    Ok(Empty {})
}

fn main() {
    sweep_guest::run(handle)
}
