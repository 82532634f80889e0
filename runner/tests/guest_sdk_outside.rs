//! A handler crate of the user's own, outside Sweep's workspace, built with the guest SDK as
//! docs/guests.md tells ("Rust": a path dependency on `guest-sdk`, the `wasm` profile in the
//! crate's own manifest, `cargo build --target wasm32-wasip1 --profile wasm`), then run in the
//! sandbox. Offline: the SDK's dependencies (serde, serde_json) are the workspace's, already
//! in the registry cache.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use sweep::sandbox::{Capabilities, Limits, Outcome, TaskInput};
use sweep_dev::testing::shared_sandbox;

/// The handler crate's manifest, as docs/guests.md shows it (`{sdk}`: the SDK's path).
const MANIFEST: &str = r#"
[package]
name = "greeter"
version = "0.1.0"
edition = "2021"

[dependencies]
sweep-guest = { path = "{sdk}" }
serde = { version = "1", features = ["derive"] }

# Small, fast modules for Sweep.
[profile.wasm]
inherits = "release"
opt-level = "s"
lto = true
codegen-units = 1
debug = false
strip = true

# A crate of its own, not a member of any workspace above it.
[workspace]
"#;

const MAIN: &str = r#"
use serde::{Deserialize, Serialize};
use sweep_guest::{Error, TaskContext};

#[derive(Deserialize)]
struct Input { name: String }

#[derive(Serialize)]
struct Output { greeting: String, attempt: u32 }

fn handle(input: Input, ctx: TaskContext) -> Result<Output, Error> {
    if input.name.is_empty() {
        return Err(Error::permanent("name must not be empty"));
    }
    Ok(Output { greeting: format!("Hello, {}!", input.name), attempt: ctx.attempt })
}

fn main() { sweep_guest::run_with_context(handle) }
"#;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn a_handler_crate_outside_the_workspace_builds_and_runs() {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk").canonicalize().unwrap();
    let dir = TempDir(std::env::temp_dir().join(format!("sweep-greeter-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(dir.0.join("src")).unwrap();
    let manifest = MANIFEST.replace("{sdk}", &sdk.display().to_string());
    std::fs::write(dir.0.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(dir.0.join("src/main.rs"), MAIN).unwrap();

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = tokio::task::spawn_blocking({
        let dir = dir.0.clone();
        move || {
            Command::new(cargo)
                .args([
                    "build",
                    "--offline",
                    "--quiet",
                    "--target",
                    "wasm32-wasip1",
                    "--profile",
                    "wasm",
                ])
                .current_dir(&dir)
                .env_remove("CARGO_TARGET_DIR")
                .env_remove("RUSTFLAGS")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        built.status.success(),
        "the documented build failed outside the workspace:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let wasm = dir.0.join("target/wasm32-wasip1/wasm/greeter.wasm");
    let bytes = std::fs::read(&wasm).unwrap_or_else(|e| panic!("{}: {e}", wasm.display()));

    let sandbox = shared_sandbox(false);
    let module = sandbox.compile(&bytes).unwrap();
    let limits = Limits {
        fuel: 500_000_000,
        timeout: Duration::from_secs(10),
        memory_bytes: 16 << 20,
        output_bytes: 64 << 10,
    };
    let input = |payload: Value| TaskInput {
        task_id: "1".into(),
        task_type: "greet".into(),
        attempt: 2,
        max_attempts: 5,
        payload: serde_json::to_vec(&payload).unwrap(),
        capabilities: Capabilities::none(),
        reuse: None,
    };
    let ran = sandbox.run(&module, &input(json!({"name": "Ada"})), &limits).await;
    match ran.outcome {
        Outcome::Success(v) => assert_eq!(v, json!({"greeting": "Hello, Ada!", "attempt": 2})),
        other => panic!("expected success, got {other:?} ({})", ran.stderr),
    }
    let refused = sandbox.run(&module, &input(json!({"name": ""})), &limits).await;
    assert!(refused.outcome.is_permanent(), "{:?}", refused.outcome);
}
