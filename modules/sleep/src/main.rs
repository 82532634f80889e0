//! `sleep` fixture: sleeps a day at a time, forever. On wasm32-wasip1 each sleep is a WASI
//! `poll_oneoff` clock wait that burns no fuel, so only a wall-clock limit can stop it.
//!
//! Payload `{"wake_on_attempt": N}` makes attempts N and later return `{"woke_on_attempt": A}`
//! at once instead: a task that hangs its runner once and then succeeds elsewhere.
//! Payload `{"sleep_ms": M}` sleeps M milliseconds and returns `{"slept_ms": M}`: a task that
//! holds its slot for a known time without using the CPU.

use std::{io::Read, time::Duration};

fn main() {
    let mut payload = String::new();
    let _ = std::io::stdin().read_to_string(&mut payload);
    let payload = serde_json::from_str::<serde_json::Value>(&payload).ok();
    let field =
        |name| payload.as_ref().and_then(|v| v.get(name)).and_then(serde_json::Value::as_u64);
    if let Some(ms) = field("sleep_ms") {
        std::thread::sleep(Duration::from_millis(ms));
        println!("{{\"slept_ms\":{ms}}}");
        return;
    }
    let wake_on = field("wake_on_attempt");
    let attempt: u64 =
        std::env::var("SWEEP_ATTEMPT").ok().and_then(|a| a.parse().ok()).unwrap_or(1);
    if wake_on.is_some_and(|n| attempt >= n) {
        println!("{{\"woke_on_attempt\":{attempt}}}");
        return;
    }
    loop {
        std::thread::sleep(Duration::from_secs(24 * 60 * 60));
    }
}
