//! Sweep: background jobs in Postgres, each run as a sandboxed WebAssembly module.
//!
//! - [`queue`]: the task table and every SQL statement (claim, complete, retry, dead-letter).
//! - [`sandbox`]: the wasmtime engine, module cache, per-task limits and outcome classification.

pub mod queue;
pub mod sandbox;
