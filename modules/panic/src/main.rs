//! `panic` fixture: a handler that panics on any JSON payload. On
//! wasm32-wasip1 (panic = abort) the module traps with `unreachable` after the
//! SDK's hook writes `panicked at ...: ...` to stderr; natively it exits 101.

use sweep_guest::Error;

fn handle(_payload: serde_json::Value) -> Result<(), Error> {
    panic!("the panic fixture always panics")
}

fn main() {
    sweep_guest::run(handle)
}
