//! The Wasm modules tests and benches run: those `scripts/build-modules.sh` builds for
//! `wasm32-wasip1`, the components it builds for `wasm32-wasip2`, and the smallest valid
//! handler.

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

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Where `scripts/build-modules.sh` puts the modules.
pub fn modules_dir() -> PathBuf {
    target_dir().join("wasm32-wasip1/wasm")
}

/// Where `scripts/build-modules.sh` puts the components (crates under `components/`).
pub fn components_dir() -> PathBuf {
    target_dir().join("wasm32-wasip2/wasm")
}

/// The bytes of component `name` built by `scripts/build-modules.sh`.
pub fn component_bytes(name: &str) -> Vec<u8> {
    let path = components_dir().join(format!("{name}.wasm"));
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/build-modules.sh", path.display()))
}

/// The bytes of module `name` built by `scripts/build-modules.sh`.
pub fn module_bytes(name: &str) -> Vec<u8> {
    let path = modules_dir().join(format!("{name}.wasm"));
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/build-modules.sh", path.display()))
}

/// A valid handler (`memory`, an empty `_start`) that defines `functions` functions in all and
/// at most `code_bytes` bytes of code (the code section): small functions of straight-line
/// arithmetic, each calling the one before, the shape whose compile costs most per byte.
/// With the structural limits' values it is the costliest module they admit (see
/// `sweep-bench compile`). Encoded directly: the text of 8 MiB of code would be ~50 MB.
pub fn compile_bomb(functions: u32, code_bytes: u64) -> Vec<u8> {
    let fillers = functions.saturating_sub(1).max(1);
    let start = fillers;
    // Per filler: local declarations (1), `local.get 0` twice (4), `call k-1` (up to 4),
    // `i32.add` (1), `end` (1), its size prefix (up to 3), then 3 bytes per
    // `i32.const 1; i32.add`.
    let budget = code_bytes.saturating_sub(16) / u64::from(fillers + 1);
    let adds = usize::try_from(budget.saturating_sub(14) / 3).unwrap_or(0);

    let mut code = Vec::new();
    leb(&mut code, u64::from(fillers) + 1);
    for k in 0..fillers {
        let mut body = vec![0x00, 0x20, 0x00]; // no locals; local.get 0
        if k > 0 {
            body.extend([0x20, 0x00, 0x10]); // local.get 0; call k-1
            leb(&mut body, u64::from(k - 1));
            body.push(0x6a); // i32.add: the argument and the callee's result
        }
        for _ in 0..adds {
            body.extend([0x41, 0x01, 0x6a]); // i32.const 1; i32.add
        }
        body.push(0x0b);
        leb(&mut code, body.len() as u64);
        code.extend(body);
    }
    code.extend([0x02, 0x00, 0x0b]); // _start: no locals, end

    let mut m = b"\0asm\x01\0\0\0".to_vec();
    // Types: 0 = (i32) -> i32, 1 = () -> ().
    section(&mut m, 1, &[0x02, 0x60, 0x01, 0x7f, 0x01, 0x7f, 0x60, 0x00, 0x00]);
    let mut funcs = Vec::new();
    leb(&mut funcs, u64::from(fillers) + 1);
    funcs.extend(std::iter::repeat_n(0x00, fillers as usize));
    funcs.push(0x01);
    section(&mut m, 3, &funcs);
    section(&mut m, 5, &[0x01, 0x00, 0x01]); // one memory, min 1 page
    let mut exports = vec![0x02];
    exports.extend([0x06]);
    exports.extend(b"memory");
    exports.extend([0x02, 0x00]);
    exports.extend([0x06]);
    exports.extend(b"_start");
    exports.push(0x00);
    leb(&mut exports, u64::from(start));
    section(&mut m, 7, &exports);
    section(&mut m, 10, &code);
    m
}

fn section(module: &mut Vec<u8>, id: u8, contents: &[u8]) {
    module.push(id);
    leb(module, contents.len() as u64);
    module.extend_from_slice(contents);
}

fn leb(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}
