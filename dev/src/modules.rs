//! The Wasm modules tests and benches run: those `scripts/build-modules.sh` builds for
//! `wasm32-wasip1`, and the smallest valid handler.

use std::path::PathBuf;

/// The smallest valid handler: exports memory and an empty `_start`. Its per-task cost is the
/// sandbox's floor.
pub const EMPTY_MODULE_WAT: &str =
    r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

/// [`EMPTY_MODULE_WAT`] assembled.
pub fn empty_module() -> Vec<u8> {
    wat::parse_str(EMPTY_MODULE_WAT).expect("the empty module assembles")
}

/// A handler like [`EMPTY_MODULE_WAT`] whose bytes (so sha256) differ for every `n`: it also
/// exports the global `version` holding `n`. For tests and benches that need many distinct
/// module versions.
pub fn distinct_module(n: u64) -> Vec<u8> {
    let wat = format!(
        r#"(module (memory (export "memory") 1) (global (export "version") i64 (i64.const {n}))
             (func (export "_start")))"#
    );
    wat::parse_str(wat).expect("the distinct module assembles")
}

/// `bytes` (a module) with a custom section holding `n` appended: a module that compiles and
/// runs exactly as `bytes` does, with another sha256 for every `n`.
pub fn with_distinct_tag(bytes: &[u8], n: u64) -> Vec<u8> {
    const NAME: &[u8] = b"sweep-tag";
    let mut payload = vec![NAME.len() as u8];
    payload.extend_from_slice(NAME);
    payload.extend_from_slice(&n.to_le_bytes());
    let mut out = bytes.to_vec();
    out.push(0); // custom section
    out.push(payload.len() as u8); // under 128 bytes: one LEB128 byte
    out.extend_from_slice(&payload);
    out
}

/// Where `scripts/build-modules.sh` puts the modules.
pub fn modules_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("wasm32-wasip1/wasm")
}

/// The bytes of module `name` built by `scripts/build-modules.sh`.
pub fn module_bytes(name: &str) -> Vec<u8> {
    let path = modules_dir().join(format!("{name}.wasm"));
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/build-modules.sh", path.display()))
}
