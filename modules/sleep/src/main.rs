//! `sleep` fixture: sleeps a day at a time, forever. On wasm32-wasip1 each sleep is a WASI
//! `poll_oneoff` clock wait that burns no fuel, so only a wall-clock limit can stop it.
//!
//! Payload `{"wake_on_attempt": N}` makes attempts N and later return `{"woke_on_attempt": A}`
//! at once instead: a task that hangs its runner once and then succeeds elsewhere.

use std::{io::Read, time::Duration};

fn main() {
    let mut payload = String::new();
    let _ = std::io::stdin().read_to_string(&mut payload);
    let wake_on = serde_json::from_str::<serde_json::Value>(&payload)
        .ok()
        .and_then(|v| v.get("wake_on_attempt").and_then(serde_json::Value::as_u64));
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
