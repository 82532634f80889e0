//! Write Sweep task handlers as plain Rust functions.
//!
//! A Sweep task runs as a WebAssembly module. This crate turns a function
//! `fn(Input) -> Result<Output, Error>` into such a module, and the very same
//! binary also runs natively from a shell, which makes handlers easy to try
//! and to test.
//!
//! # The guest contract
//!
//! The contract is plain WASI, so a handler can be written in any language
//! that targets `wasm32-wasip1`; this crate is just the Rust way to follow it.
//!
//! - **Shape.** A handler is a WASI preview-1 *command*: a module exporting
//!   `_start`, built for the `wasm32-wasip1` target. It has no filesystem and
//!   no network.
//! - **Input.** The task payload (a JSON document) arrives on **stdin**. A
//!   payload that does not parse into the handler's input type is a
//!   *permanent* failure, because retrying cannot fix it.
//! - **Output.** On success the result (one JSON document) goes to **stdout**
//!   and nothing else is written there.
//! - **Logs.** Anything on **stderr** is a log. On failure the SDK writes the
//!   error message as the *final line* of stderr (line breaks inside the
//!   message are replaced by spaces), so the host can record it.
//! - **Exit code.**
//!
//!   | exit            | meaning                                        |
//!   |-----------------|------------------------------------------------|
//!   | `0`             | success; stdout holds the result               |
//!   | `100`           | permanent failure: do not retry ([`PERMANENT_FAILURE_EXIT_CODE`]) |
//!   | any other       | retryable failure (the SDK uses `1`, [`RETRYABLE_FAILURE_EXIT_CODE`]) |
//!   | trap            | retryable failure (panics, out of fuel, stack overflow, memory or time limit) |
//!
//!   On `wasm32-wasip1` a Rust panic aborts the module with a wasm
//!   `unreachable` trap (the target only supports `panic = "abort"`); the SDK
//!   first writes `panicked at <file>:<line>:<col>: <message>` as the final
//!   line of stderr. Natively a panic exits with code 101.
//! - **Environment.** The host sets `SWEEP_TASK_ID`, `SWEEP_TASK_TYPE`,
//!   `SWEEP_ATTEMPT` (1-based) and `SWEEP_MAX_ATTEMPTS`; read them with
//!   [`TaskContext::from_env`]. When they are missing (say, from a shell) the
//!   context falls back to "first attempt, unknown id".
//!
//! # Example
//!
//! A complete handler crate (`src/main.rs`; depend on `sweep-guest` and
//! `serde` with the `derive` feature):
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use sweep_guest::{Error, TaskContext};
//!
//! #[derive(Deserialize)]
//! struct Input {
//!     name: String,
//! }
//!
//! #[derive(Serialize)]
//! struct Output {
//!     greeting: String,
//!     attempt: u32,
//! }
//!
//! fn handle(input: Input, ctx: TaskContext) -> Result<Output, Error> {
//!     if input.name.is_empty() {
//!         // Retrying the same payload cannot help: give up for good.
//!         return Err(Error::permanent("name must not be empty"));
//!     }
//!     sweep_guest::log!("greeting {} on attempt {}", input.name, ctx.attempt);
//!     Ok(Output {
//!         greeting: format!("Hello, {}!", input.name),
//!         attempt: ctx.attempt,
//!     })
//! }
//!
//! fn main() {
//!     sweep_guest::run_with_context(handle)
//! }
//! ```
//!
//! Handlers that do not need the context use [`run`]:
//! `fn main() { sweep_guest::run(handle) }` with `fn handle(input: Input) -> Result<Output, Error>`.
//! [`run`] never reads the environment, which makes a small handler's start cheaper: on
//! `wasm32-wasip1` the first variable read builds the whole environment, a few microseconds
//! of a no-op task's run.
//!
//! Build it for Sweep with `cargo build --target wasm32-wasip1 --profile wasm` (the `wasm`
//! profile is defined in your crate's `Cargo.toml`: see docs/guests.md, "Rust"),
//! or try it natively: `echo '{"name":"Ada"}' | cargo run -p <crate>; echo $?`.

mod context;
mod error;
mod logging;
mod runtime;

pub use context::TaskContext;
pub use error::{Error, ErrorKind};
pub use logging::log;
pub use runtime::{run, run_with_context};

/// Exit code meaning "permanent failure, do not retry".
pub const PERMANENT_FAILURE_EXIT_CODE: i32 = 100;

/// Exit code the SDK uses for a retryable failure (any non-zero code other
/// than [`PERMANENT_FAILURE_EXIT_CODE`] means the same to the host).
pub const RETRYABLE_FAILURE_EXIT_CODE: i32 = 1;
