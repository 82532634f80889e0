//! `sleep` fixture: sleeps a day at a time, forever, ignoring its payload.
//! On wasm32-wasip1 each sleep is a WASI `poll_oneoff` clock wait that burns
//! no fuel, so only a wall-clock limit can stop it.

use std::time::Duration;

fn main() {
    loop {
        std::thread::sleep(Duration::from_secs(24 * 60 * 60));
    }
}
