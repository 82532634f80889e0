//! Sweep: background jobs in Postgres, each run as a sandboxed WebAssembly module.
//!
//! - [`queue`]: the task table and every SQL statement (claim, complete, retry, dead-letter).
//! - [`sandbox`]: the wasmtime engine, module cache, per-task limits and outcome classification.
//! - [`worker`]: the runner loop (claim -> run -> report), heartbeats, maintenance, shutdown.
//! - [`admin`]: the HTTP admin API (warp): modules, tasks, tenants, stats, metrics.
//! - [`secrets`]: tenant secrets sealed at rest (the deployment key) and redacted from what
//!   a task leaves behind.
//! - [`config`]: runner settings with defaults and cross-checks; [`args`]: their flags.
//! - [`alloc`]: the binaries' global allocator (mimalloc; the system one in the compile child).

pub mod admin;
pub mod alloc;
pub mod args;
pub mod config;
mod errors;
pub mod metrics;
pub mod queue;
pub mod sandbox;
pub mod secrets;
pub mod worker;
