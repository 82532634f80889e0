//! Rough per-task cost of the run path, split by phase, pooled vs on-demand. Not a benchmark
//! (that lives in benches/); an ignored test to print where the time goes:
//!
//! `cargo test -p sweep --lib sandbox::cost_tests -- --ignored --nocapture`
//!
//! Measures inline `.wat` probes that isolate one cost each (an empty `_start`; ten 1-byte
//! WASI `fd_write`s; touching 17 fresh memory pages, the size of a Rust guest's initial
//! memory; the same 17 pages left untouched) and, when it has been built
//! (`scripts/build-modules.sh`), the real Rust `noop` handler. A second ignored test lists the
//! memory pages that handler leaves changed.

use std::time::{Duration, Instant};

use serde_json::json;
use wasmtime::{Store, UpdateDeadline};

use super::module::Handler;
use super::pipes::{BoundedOutput, Overflow};
use super::store::{new_store, StoreShape, StoreState, TaskLimiter};
use super::wasi::GuestWasi;
use super::{CompiledModule, Limits, Sandbox, SandboxConfig, TaskInput};

/// Runs per batch. Each figure is the fastest batch's average, which filters out time stolen
/// by other processes on a shared machine.
const ITERATIONS: u32 = 300;
const BATCHES: u32 = 10;
const WAT_NOOP: &str = r#"(module (memory 1) (func (export "_start")))"#;
const WAT_TEN_WRITES: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start") (local $i i32)
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const 1))
    (loop $l
      (drop (call $w (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 10))))))"#;
const WAT_TOUCH_17_PAGES: &str = r#"(module (memory 17)
  (func (export "_start") (local $i i32)
    (loop $l
      (i32.store (local.get $i) (i32.const 1))
      (local.set $i (i32.add (local.get $i) (i32.const 65536)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 1114112))))))"#;
/// An empty `_start` with a Rust guest's memory size (17 pages) and nothing written: what the
/// size of the memory alone costs the drop (the scan for written pages).
const WAT_17_PAGES_UNTOUCHED: &str = r#"(module (memory 17) (func (export "_start")))"#;
const RUST_NOOP: &str = "../target/wasm32-wasip1/wasm/noop.wasm";

#[derive(Clone, Copy)]
struct Phases([Duration; 5]);

const PHASE_NAMES: [&str; 5] = ["wasi ctx", "store", "instantiate", "call", "drop"];

fn micros(total: Duration) -> f64 {
    total.as_secs_f64() * 1e6 / f64::from(ITERATIONS)
}

/// One batch of hand-driven runs, timing each phase of what `Sandbox::run` does.
async fn phases(
    sandbox: &Sandbox,
    module: &CompiledModule,
    input: &TaskInput,
    limits: &Limits,
) -> wasmtime::Result<Phases> {
    let Handler::Module { pre, start } = &module.handler else {
        wasmtime::bail!("a module, not a component");
    };
    let mut p = [Duration::ZERO; 5];
    for _ in 0..ITERATIONS {
        let t0 = Instant::now();
        let stdout = BoundedOutput::new(limits.output_bytes, Overflow::Stop);
        let stderr = BoundedOutput::new(4096, Overflow::KeepTail);
        let wasi = GuestWasi::new(input, &stdout, &stderr);
        let t1 = Instant::now();
        let state = StoreState {
            wasi,
            limiter: TaskLimiter {
                memory_bytes: 1 << 26,
                memory_denied: false,
                peak_memory_bytes: 0,
                shape: StoreShape::MODULE,
            },
            deadline: t0.checked_add(limits.timeout),
            deadline_hit: false,
        };
        let mut store = Store::new(sandbox.engine(), state);
        store.limiter(|s| &mut s.limiter);
        store.set_fuel(limits.fuel)?;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|_| Ok(UpdateDeadline::Continue(1)));
        let t2 = Instant::now();
        let instance = pre.instantiate_async(&mut store).await?;
        let t3 = Instant::now();
        let start = instance
            .get_module_export(&mut store, start)
            .and_then(|e| e.into_func())
            .ok_or_else(|| wasmtime::format_err!("no _start"))?
            .typed::<(), ()>(&store)?;
        // A Rust guest ends with proc_exit(0), which surfaces as an `I32Exit` error.
        let _ = start.call_async(&mut store, ()).await;
        let t4 = Instant::now();
        drop(store);
        let t5 = Instant::now();
        for (slot, d) in p.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4]) {
            *slot += d;
        }
    }
    Ok(Phases(p))
}

async fn measure(sandbox: &Sandbox, name: &str, bytes: &[u8]) -> wasmtime::Result<()> {
    let module = sandbox.compile(bytes)?;
    let input = TaskInput::new("id", "noop", 1, 3, &json!({"n": 1}));
    let limits = Limits::DEFAULT;

    for _ in 0..200 {
        let exec = sandbox.run(&module, &input, &limits).await;
        wasmtime::ensure!(exec.outcome.is_success(), "{exec:?}");
    }
    let mut whole = Duration::MAX;
    let mut best = Phases([Duration::MAX; 5]);
    for _ in 0..BATCHES {
        let start = Instant::now();
        for _ in 0..ITERATIONS {
            let _ = sandbox.run(&module, &input, &limits).await;
        }
        whole = whole.min(start.elapsed());
        let batch = phases(sandbox, &module, &input, &limits).await?;
        for (b, d) in best.0.iter_mut().zip(batch.0) {
            *b = (*b).min(d);
        }
    }
    let split: Vec<String> = PHASE_NAMES
        .iter()
        .zip(best.0)
        .map(|(name, d)| format!("{name} {:6.2}", micros(d)))
        .collect();
    println!(
        "{:>9} {name:>9}: run() {:7.2} µs/task | {}",
        sandbox.allocator().to_string(),
        micros(whole),
        split.join("  ")
    );
    Ok(())
}

#[test]
#[ignore = "prints timings; run with --ignored --nocapture"]
fn noop_task_cost_pooled_vs_on_demand() -> wasmtime::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut modules = vec![
        ("wat noop", wat::parse_str(WAT_NOOP)?),
        ("10 writes", wat::parse_str(WAT_TEN_WRITES)?),
        ("17 pages", wat::parse_str(WAT_TOUCH_17_PAGES)?),
        ("17 kept", wat::parse_str(WAT_17_PAGES_UNTOUCHED)?),
    ];
    match std::fs::read(RUST_NOOP) {
        Ok(bytes) => modules.push(("rust noop", bytes)),
        Err(e) => println!("skipping the Rust noop ({RUST_NOOP}: {e})"),
    }
    for pooling in [true, false] {
        let sandbox = Sandbox::new(SandboxConfig { pooling, ..SandboxConfig::default() })?;
        for (name, bytes) in &modules {
            rt.block_on(measure(&sandbox, name, bytes))?;
        }
    }
    Ok(())
}

/// Which 4 KiB pages of linear memory a run of the Rust no-op leaves changed (the pages the
/// pooling allocator must reset when the store is dropped), as ranges of page numbers.
/// A lower bound: a page written back with the bytes it had does not show.
#[test]
#[ignore = "prints the pages a guest changes; run with --ignored --nocapture"]
fn pages_the_rust_noop_changes() -> wasmtime::Result<()> {
    const PAGE: usize = 4096;
    let Ok(bytes) = std::fs::read(RUST_NOOP) else {
        println!("skipping: {RUST_NOOP} is not built");
        return Ok(());
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let sandbox = Sandbox::new(SandboxConfig { pooling: false, ..SandboxConfig::default() })?;
    let module = sandbox.compile(&bytes)?;
    let input = TaskInput::new("id", "noop", 1, 3, &json!({"n": 1}));
    rt.block_on(async {
        let stdout = BoundedOutput::new(1 << 20, Overflow::Stop);
        let stderr = BoundedOutput::new(4096, Overflow::KeepTail);
        let limits = Limits::DEFAULT;
        let Handler::Module { pre, .. } = &module.handler else {
            wasmtime::bail!("a module, not a component");
        };
        let wasi = GuestWasi::new(&input, &stdout, &stderr);
        let mut store =
            new_store(sandbox.engine(), wasi, StoreShape::MODULE, &limits, Instant::now())?;
        let instance = pre.instantiate_async(&mut store).await?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| wasmtime::format_err!("no memory"))?;
        let before = memory.data(&store).to_vec();
        let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
        // A Rust guest ends with proc_exit(0), which surfaces as an `I32Exit` error.
        if let Err(e) = start.call_async(&mut store, ()).await {
            let exit = e.downcast_ref::<wasmtime_wasi::I32Exit>().map(|exit| exit.0);
            wasmtime::ensure!(exit == Some(0), "the noop failed: {e:#}");
        }
        let after = memory.data(&store);
        let changed: Vec<usize> = after
            .chunks(PAGE)
            .enumerate()
            .filter(|(i, page)| match before.get(i * PAGE..(i + 1) * PAGE) {
                Some(old) => old != *page,
                None => page.iter().any(|&b| b != 0),
            })
            .map(|(i, _)| i)
            .collect();
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for &page in &changed {
            match ranges.last_mut() {
                Some((_, end)) if *end + 1 == page => *end = page,
                _ => ranges.push((page, page)),
            }
        }
        let ranges: Vec<String> = ranges.iter().map(|(a, b)| format!("{a}-{b}")).collect();
        println!(
            "rust noop: {} of {} pages changed ({} KiB of memory before the run, {} after): {}",
            changed.len(),
            after.len() / PAGE,
            before.len() / 1024,
            after.len() / 1024,
            ranges.join(", ")
        );
        Ok(())
    })
}
