//! `component-kept`: a test component whose instances runners keep between tasks (it exports
//! `wasi:cli/run` from a `cdylib`, as `component-noop` does), so tests can see what a kept
//! instance carries over and make it misbehave on a later task. Its payload's `do` says what a
//! task does:
//!
//! - `count` (the default): returns `{"calls": n}`, the tasks this instance has run, this one
//!   included: 1 on a fresh instance, more on a kept one;
//! - `spin`: loops forever (fuel, wall clock).

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

/// Lives as long as the instance: what a kept instance carries from task to task.
static CALLS: AtomicU64 = AtomicU64::new(0);

struct Kept;

impl wasip2::exports::cli::run::Guest for Kept {
    fn run() -> Result<(), ()> {
        let calls = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
        let mut text = String::new();
        let _ = std::io::stdin().read_to_string(&mut text);
        let payload: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if payload["do"] == "spin" {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        println!("{}", json!({ "calls": calls }));
        Ok(())
    }
}

wasip2::cli::command::export!(Kept);
