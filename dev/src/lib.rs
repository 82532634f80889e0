//! Sweep's development crate: everything tests and benchmarks share that must never ship in
//! the product. Tests of `runner/` and the criterion benches depend on it; `sweep-bench`
//! is its binary.
//!
//! - [`db`]: a migrated database with a store per role, built exactly as production does;
//! - [`modules`]: the Wasm modules `scripts/build-modules.sh` builds, and a minimal module;
//! - [`testing`]: test settings, a runner in-process, waiting for a task's state;
//! - [`pg`]: a Postgres server of a test's own, to stop and restart;
//! - [`fixtures`]: statements only benches and tests run (history filling, counts, resets);
//! - [`pgbouncer`]: a real PgBouncer in transaction mode in front of the test server;
//! - [`bench`]: the end-to-end benchmarks behind `sweep-bench`.

pub mod bench;
pub mod db;
pub mod fixtures;
pub mod mail;
pub mod modules;
pub mod pg;
pub mod pgbouncer;
mod servers;
pub mod testing;

pub use db::{migrated, Stores};
