//! The two WASI layers side by side: each probe runs once through the sandbox's linker (the
//! calls `wasi` serves itself in front of wasmtime-wasi) and once through wasmtime-wasi's
//! preview 1 alone, and the guest must see the same thing both times: the same memory
//! afterwards (every errno and count a probe records, every byte it read), the same trap or
//! none, the same stdout and stderr.

use std::time::Instant;

use serde_json::json;
use wasmtime::{Linker, Module};

use super::pipes::{BoundedOutput, Overflow};
use super::store::{new_store, StoreShape, StoreState};
use super::wasi::GuestWasi;
use super::{wasi, Limits, Sandbox, SandboxConfig, TaskInput};

/// A probe module: the WASI calls under test, a memory, `$rec` to append an i32 to the
/// record at 8192, `$iov` to write an iovec, and `body` as `_start`.
fn probe(body: &str) -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $env_sizes (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $env_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_renumber" (func $fd_renumber (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_fdstat_get" (func $fdstat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 4096) "hello, stdout")
  (global $out (mut i32) (i32.const 8192))
  (func $rec (param i32)
    (i32.store (global.get $out) (local.get 0))
    (global.set $out (i32.add (global.get $out) (i32.const 4))))
  (func $iov (param $at i32) (param $buf i32) (param $len i32)
    (i32.store (local.get $at) (local.get $buf))
    (i32.store offset=4 (local.get $at) (local.get $len)))
  (func (export "_start")
    {body}))"#
    )
}

/// What a guest saw and left behind.
#[derive(Debug, PartialEq)]
struct Seen {
    /// `Err` holds whether the stop was an exit (`Some(code)`) or a trap (`None`).
    ended: Result<(), Option<i32>>,
    memory: Vec<u8>,
    stdout: Vec<u8>,
    stdout_overflowed: bool,
    stderr: Vec<u8>,
    /// Whether the full wasmtime-wasi context was built.
    full: bool,
}

/// Runs `body` with `payload` on stdin and a stdout limit of `stdout_limit` bytes, through
/// the sandbox's linker (`served`) or wasmtime-wasi's preview 1 alone.
async fn run(body: &str, payload: &[u8], stdout_limit: usize, served: bool) -> Seen {
    let sandbox = Sandbox::new(SandboxConfig { pooling: false, ..SandboxConfig::default() })
        .expect("sandbox");
    let engine = sandbox.engine();
    let mut linker: Linker<StoreState> = Linker::new(engine);
    if served {
        wasi::add_to_linker(&mut linker).expect("linker");
    } else {
        wasmtime_wasi::p1::add_to_linker_async(&mut linker, |s: &mut StoreState| s.wasi.full())
            .expect("linker");
    }
    let bytes = wat::parse_str(probe(body)).expect("probe parses");
    let module = Module::new(engine, bytes).expect("probe compiles");
    let mut input = TaskInput::new("task-7", "probe", 2, 5, &json!(null));
    input.payload = payload.to_vec();
    let stdout = BoundedOutput::new(stdout_limit, Overflow::Stop);
    let stderr = BoundedOutput::new(100, Overflow::KeepTail);
    let wasi = GuestWasi::new(&input, &stdout, &stderr);
    let mut store = new_store(engine, wasi, StoreShape::MODULE, &Limits::DEFAULT, Instant::now())
        .expect("store");
    let instance = linker.instantiate_async(&mut store, &module).await.expect("instantiate");
    let start = instance.get_typed_func::<(), ()>(&mut store, "_start").expect("_start");
    let ended = start
        .call_async(&mut store, ())
        .await
        .map_err(|e| e.downcast_ref::<wasmtime_wasi::I32Exit>().map(|exit| exit.0));
    let memory = instance.get_memory(&mut store, "memory").expect("memory");
    let memory = memory.data(&store).to_vec();
    let full = store.data().wasi.is_full();
    let (out, err) = (stdout.take(), stderr.take());
    Seen {
        ended,
        memory,
        stdout: out.bytes,
        stdout_overflowed: out.overflowed,
        stderr: err.bytes,
        full,
    }
}

/// Runs `body` through both layers and requires the guest to have seen the same. Returns what
/// the served layer saw, for checks of the probe itself.
async fn same(body: &str, payload: &[u8], stdout_limit: usize) -> Seen {
    let reference = run(body, payload, stdout_limit, false).await;
    let served = run(body, payload, stdout_limit, true).await;
    assert!(reference.full, "the reference runs on wasmtime-wasi's context");
    let differ = |a: &Seen, b: &Seen| {
        (&a.ended, &a.stdout, a.stdout_overflowed, &a.stderr)
            != (&b.ended, &b.stdout, b.stdout_overflowed, &b.stderr)
            || a.memory != b.memory
    };
    assert!(
        !differ(&reference, &served),
        "the guest saw different things (memory first differs at {:?}):\n  wasmtime-wasi: {:?} stdout {:?} stderr {:?} record {:?}\n  served:        {:?} stdout {:?} stderr {:?} record {:?}",
        reference.memory.iter().zip(&served.memory).position(|(a, b)| a != b).map(|at| (
            at,
            &reference.memory[at..(at + 8).min(reference.memory.len())],
            &served.memory[at..(at + 8).min(served.memory.len())]
        )),
        reference.ended,
        String::from_utf8_lossy(&reference.stdout),
        String::from_utf8_lossy(&reference.stderr),
        record(&reference),
        served.ended,
        String::from_utf8_lossy(&served.stdout),
        String::from_utf8_lossy(&served.stderr),
        record(&served),
    );
    served
}

/// The first i32s a probe recorded (enough for every probe here).
fn record(seen: &Seen) -> Vec<i32> {
    seen.memory[8192..8192 + 4 * 24]
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

const ERRNO_BADF: i32 = 8;
const ERRNO_INTR: i32 = 27;
const ERRNO_NOMEM: i32 = 48;

/// `fd_read(fd, iovs at 0, n iovecs, nread at 16)`, recording the errno and the count.
fn read(fd: i32, iovecs: i32) -> String {
    format!(
        "(call $rec (call $fd_read (i32.const {fd}) (i32.const 0) (i32.const {iovecs}) (i32.const 16)))
         (call $rec (i32.load (i32.const 16)))"
    )
}

#[tokio::test]
async fn stdin_is_read_in_short_reads_from_the_first_non_empty_buffer() {
    let mut body = String::new();
    for i in 0..5 {
        // An empty buffer first: preview 1 reads into the first non-empty one only.
        body += &format!(
            "(call $iov (i32.const 0) (i32.const 4096) (i32.const 0))
             (call $iov (i32.const 8) (i32.const {}) (i32.const 3))",
            12_000 + 4 * i
        );
        body += &read(0, 2);
    }
    let seen = same(&body, b"0123456789", 100).await;
    // 3, 3, 3, 1, then 0 at the end: errno 0 each time.
    assert_eq!(&record(&seen)[..10], &[0, 3, 0, 3, 0, 3, 0, 1, 0, 0]);
    assert_eq!(&seen.memory[12_000..12_016], b"012\x00345\x00678\x009\x00\x00\x00");
    assert!(!seen.full, "stdin alone must not build the full context");
}

#[tokio::test]
async fn an_empty_read_is_eintr_with_bytes_left_and_zero_at_the_end() {
    let body = [
        "(call $iov (i32.const 0) (i32.const 12000) (i32.const 0))".to_owned(),
        read(0, 1),
        "(call $iov (i32.const 0) (i32.const 12000) (i32.const 100))".to_owned(),
        read(0, 1),
        "(call $iov (i32.const 0) (i32.const 12000) (i32.const 0))".to_owned(),
        read(0, 1),
        read(0, 0),
    ]
    .concat();
    let seen = same(&body, b"abc", 100).await;
    assert_eq!(&record(&seen)[..8], &[ERRNO_INTR, 0, 0, 3, 0, 0, 0, 0]);
}

#[tokio::test]
async fn hostcall_fuel_bounds_the_iovec_arrays() {
    // 2^28 iovecs of 8 bytes: 2 GiB of array, past the store's hostcall fuel.
    let body = "(call $rec (call $fd_read (i32.const 0) (i32.const 0) (i32.const 0x10000000) (i32.const 16)))
                (call $rec (call $fd_write (i32.const 1) (i32.const 0) (i32.const 0x10000000) (i32.const 16)))";
    let seen = same(body, b"abc", 100).await;
    assert_eq!(&record(&seen)[..2], &[ERRNO_NOMEM, ERRNO_NOMEM]);
}

#[tokio::test]
async fn stdout_and_stderr_take_the_first_non_empty_buffer_whole() {
    let body = "(call $iov (i32.const 0) (i32.const 4096) (i32.const 0))
                (call $iov (i32.const 8) (i32.const 4096) (i32.const 5))
                (call $iov (i32.const 16) (i32.const 4103) (i32.const 6))
                (call $rec (call $fd_write (i32.const 1) (i32.const 0) (i32.const 3) (i32.const 32)))
                (call $rec (i32.load (i32.const 32)))
                (call $iov (i32.const 0) (i32.const 4096) (i32.const 13))
                (call $rec (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 32)))
                (call $rec (i32.load (i32.const 32)))
                ;; 10,000 bytes to stderr: written in 4 KiB pieces, its last 100 kept
                (call $iov (i32.const 0) (i32.const 0) (i32.const 10000))
                (call $rec (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 32)))
                (call $rec (i32.load (i32.const 32)))";
    let seen = same(body, b"", 100).await;
    assert_eq!(&record(&seen)[..6], &[0, 5, 0, 13, 0, 10_000]);
    assert_eq!(seen.stdout, b"hello");
    assert!(!seen.full);
}

#[tokio::test]
async fn stdout_past_its_limit_traps() {
    let body = "(call $iov (i32.const 0) (i32.const 4096) (i32.const 13))
                (call $rec (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 32)))
                (call $rec (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 32)))
                (call $rec (i32.const 99))";
    let seen = same(body, b"", 20).await;
    assert_eq!(seen.ended, Err(None));
    assert!(seen.stdout_overflowed);
    assert_eq!(&record(&seen)[..2], &[0, 0], "the second write never returned");
}

#[tokio::test]
async fn bad_pointers_trap() {
    let traps = [
        // the iovec array runs past the memory
        "(call $rec (call $fd_read (i32.const 0) (i32.const 65532) (i32.const 1) (i32.const 16)))",
        // a misaligned iovec array
        "(call $iov (i32.const 4) (i32.const 12000) (i32.const 4))
         (call $rec (call $fd_read (i32.const 0) (i32.const 2) (i32.const 1) (i32.const 16)))",
        // the buffer runs past the memory
        "(call $iov (i32.const 0) (i32.const 65530) (i32.const 100))
         (call $rec (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 16)))",
        // the count's pointer is past the memory
        "(call $iov (i32.const 0) (i32.const 12000) (i32.const 2))
         (call $rec (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 65536)))",
        // output from past the memory
        "(call $iov (i32.const 0) (i32.const 65530) (i32.const 100))
         (call $rec (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))",
        // environment strings past the memory
        "(call $rec (call $env_get (i32.const 0) (i32.const 65530)))",
        // environment counts past the memory, one pointer and then the other
        "(call $rec (call $env_sizes (i32.const 0) (i32.const 65536)))",
        "(call $rec (call $env_sizes (i32.const 65536) (i32.const 0)))",
    ];
    for (i, body) in traps.iter().enumerate() {
        let seen = same(body, b"payload", 100).await;
        assert_eq!(seen.ended, Err(None), "probe {i} should trap");
    }
    // At the end of stdin nothing is copied, but the buffer is still looked at: whatever
    // wasmtime-wasi does with one past the memory, the served layer does too.
    same(
        "(call $iov (i32.const 0) (i32.const 70000) (i32.const 2))
         (call $rec (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 16)))",
        b"",
        100,
    )
    .await;
}

#[tokio::test]
async fn the_environment_is_the_four_sweep_variables() {
    let body = "(call $rec (call $env_sizes (i32.const 16) (i32.const 20)))
                (call $rec (i32.load (i32.const 16)))
                (call $rec (i32.load (i32.const 20)))
                (call $rec (call $env_get (i32.const 100) (i32.const 12000)))";
    let seen = same(body, b"", 100).await;
    let size =
        "SWEEP_TASK_ID=task-7\0SWEEP_TASK_TYPE=probe\0SWEEP_ATTEMPT=2\0SWEEP_MAX_ATTEMPTS=5\0";
    assert_eq!(&record(&seen)[..4], &[0, 4, size.len() as i32, 0]);
    assert_eq!(&seen.memory[12_000..12_000 + size.len()], size.as_bytes());
    assert!(!seen.full);
}

#[tokio::test]
async fn stdio_descriptors_and_arguments_are_described_as_wasmtime_wasi_does() {
    let body = "(call $rec (call $fdstat (i32.const 0) (i32.const 200)))
                (call $rec (call $fdstat (i32.const 1) (i32.const 224)))
                (call $rec (call $fdstat (i32.const 2) (i32.const 248)))
                (call $rec (call $args_sizes (i32.const 16) (i32.const 20)))
                (call $rec (i32.load (i32.const 16)))
                (call $rec (i32.load (i32.const 20)))
                (call $rec (call $args_get (i32.const 65536) (i32.const 70000)))";
    let seen = same(body, b"", 100).await;
    assert_eq!(&record(&seen)[..7], &[0, 0, 0, 0, 0, 0, 0]);
    assert!(!seen.full, "describing stdio must not build the full context");
    // Another descriptor is the full context's to describe (it has none).
    let seen = same("(call $rec (call $fdstat (i32.const 3) (i32.const 200)))", b"", 100).await;
    assert_eq!(record(&seen)[0], ERRNO_BADF);
    for body in [
        "(call $rec (call $fdstat (i32.const 1) (i32.const 65530)))",
        "(call $rec (call $fdstat (i32.const 1) (i32.const 201)))",
        "(call $rec (call $args_sizes (i32.const 65536) (i32.const 0)))",
    ] {
        assert_eq!(same(body, b"", 100).await.ended, Err(None), "{body} should trap");
    }
}

#[tokio::test]
async fn exit_codes_are_wasmtime_wasis() {
    let seen = same("(call $exit (i32.const 0))", b"", 100).await;
    assert_eq!(seen.ended, Err(Some(0)));
    assert!(!seen.full, "exiting must not build the full context");
    assert_eq!(same("(call $exit (i32.const 3))", b"", 100).await.ended, Err(Some(3)));
    assert_eq!(same("(call $exit (i32.const 126))", b"", 100).await.ended, Err(None));
}

#[tokio::test]
async fn other_descriptors_and_calls_go_to_the_full_context() {
    let body = [
        "(call $iov (i32.const 0) (i32.const 12000) (i32.const 2))".to_owned(),
        read(0, 1),
        // a call served only by wasmtime-wasi: the full context starts where stdin was left
        "(call $rec (call $fdstat (i32.const 0) (i32.const 200)))".to_owned(),
        "(call $iov (i32.const 0) (i32.const 12002) (i32.const 100))".to_owned(),
        read(0, 1),
        read(1, 1),
        read(3, 1),
        "(call $rec (call $fd_write (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 16)))
         (call $rec (call $fd_write (i32.const 7) (i32.const 0) (i32.const 1) (i32.const 16)))"
            .to_owned(),
        // stderr renumbered onto stdout, then stdin closed
        "(call $rec (call $fd_renumber (i32.const 2) (i32.const 1)))
         (call $iov (i32.const 0) (i32.const 4096) (i32.const 5))
         (call $rec (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))
         (call $rec (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 16)))
         (call $rec (call $fd_close (i32.const 0)))"
            .to_owned(),
        read(0, 1),
    ]
    .concat();
    let seen = same(&body, b"abcdef", 100).await;
    let r = record(&seen);
    assert_eq!(&r[..2], &[0, 2]);
    assert_eq!(&r[3..5], &[0, 4], "the rest of stdin, after the first two bytes");
    assert_eq!(&seen.memory[12_000..12_006], b"abcdef");
    assert_eq!(&[r[5], r[7], r[9], r[10]], &[ERRNO_BADF; 4]);
    assert_eq!(&r[11..16], &[0, 0, ERRNO_BADF, 0, ERRNO_BADF], "renumber, writes, close, read");
    assert_eq!(seen.stderr, b"hello", "fd 1 is stderr after the renumbering");
    assert!(seen.full);
}
