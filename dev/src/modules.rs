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

/// A valid handler shaped like the code a compiler emits for a language runtime, in bulk:
/// `functions` functions of ordinary control flow (a loop over linear memory with loads,
/// stores, a branch per iteration and a call to an earlier function), plus one large
/// function of `large_blocks` small conditional blocks, as an interpreter's dispatch loop
/// is (CPython's is one function of 417 KiB). Cranelift compiles such code at roughly the
/// rate it compiles a real runtime, far below the costly shapes of [`compile_bomb`]; tests
/// use it as the big module a compile budget must admit.
pub fn benign_runtime(functions: u32, large_blocks: u32) -> Vec<u8> {
    let mut wat = String::from(
        r#"(module (memory (export "memory") 1) (func (export "_start") (drop (call $f0 (i32.const 0) (i32.const 8))))"#,
    );
    for k in 0..functions {
        let callee = if k == 0 {
            String::new()
        } else {
            format!("(local.set $acc (i32.add (local.get $acc) (call $f{} (local.get $i) (i32.const 1))))", k / 2)
        };
        wat.push_str(&format!(
            r#"
(func $f{k} (param $p i32) (param $n i32) (result i32) (local $i i32) (local $acc i32) (local $t i64)
  (block $out
    (loop $again
      (br_if $out (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $t (i64.load (i32.and (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 3))) (i32.const 0xfff8))))
      (if (i64.gt_s (local.get $t) (i64.const {k}))
        (then (local.set $acc (i32.xor (local.get $acc) (i32.wrap_i64 (local.get $t)))))
        (else (local.set $acc (i32.add (local.get $acc) (i32.const {k})))))
      (i64.store (i32.and (i32.add (local.get $p) (i32.mul (local.get $i) (i32.const 8))) (i32.const 0xfff8))
        (i64.add (local.get $t) (i64.extend_i32_u (local.get $acc))))
      {callee}
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $again)))
  (local.get $acc))"#
        ));
    }
    wat.push_str("\n(func $dispatch (param $op i32) (result i32) (local $acc i32)");
    for b in 0..large_blocks {
        wat.push_str(&format!(
            "\n  (if (i32.eq (local.get $op) (i32.const {b})) (then (local.set $acc (i32.add (i32.load (i32.const {a})) (i32.const {b}))) (i32.store (i32.const {a}) (local.get $acc))))",
            a = (b % 1000) * 4
        ));
    }
    wat.push_str("\n  (local.get $acc))\n)");
    wat::parse_str(&wat).expect("the benign runtime-shaped module assembles")
}
