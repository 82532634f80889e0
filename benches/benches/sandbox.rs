//! Sandbox cost per task: a fresh instance of a no-op module, run to completion, through
//! `Sandbox::run` (store + WASI state + limiter + epoch deadline + fuel, instantiate, call
//! `_start`, classify the outcome, drop the store).
//!
//! run with `cargo bench -p sweep-benches --bench sandbox` (after `scripts/build-modules.sh noop`)
//!
//! - `sandbox/<allocator>/noop`: the `noop` guest module (Rust, sweep-guest SDK: reads the
//!   payload from stdin, writes `{}`), pooled vs on-demand instance allocation;
//! - `sandbox/<allocator>/bare`: a module whose `_start` does nothing at all (the floor);
//! - `wasmtime_fuel/<allocator>/fuel_{on,off}`: a reference outside the sandbox. `Sandbox`
//!   always meters fuel (it is one of its guarantees and has no switch), so the cost of fuel
//!   is measured on a stripped-down copy of its run path built on wasmtime directly: same
//!   engine settings and pool shape, same WASI p1 context, no limiter or outcome
//!   classification. Read the on/off difference from it, not the absolute numbers.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;
use sweep::sandbox::{
    AllocatorKind, CompiledModule, Limits, Outcome, Sandbox, SandboxConfig, TaskInput,
};
use sweep_benches::{noop_wasm, runtime};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Module,
    PoolingAllocationConfig, Store,
};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::p2::pipe::{MemoryInputPipe, MemoryOutputPipe};
use wasmtime_wasi::{I32Exit, WasiCtxBuilder};

/// Each case runs on both instance allocators.
const ALLOCATORS: [(&str, bool); 2] = [("pooled", true), ("on_demand", false)];

fn sandbox(c: &mut Criterion) {
    let rt = runtime();
    let noop = noop_wasm();
    let bare = sweep_dev::modules::empty_module();
    let input = TaskInput::new("1", "noop", 1, 5, &json!({ "i": 1 }));
    let limits = Limits::DEFAULT;

    let mut group = c.benchmark_group("sandbox");
    group.throughput(Throughput::Elements(1));
    for (allocator, pooling) in ALLOCATORS {
        let sandbox =
            Sandbox::new(SandboxConfig { pooling, ..SandboxConfig::default() }).expect("sandbox");
        let expected = if pooling { AllocatorKind::Pooling } else { AllocatorKind::OnDemand };
        assert_eq!(sandbox.allocator(), expected, "{allocator}: engine fell back");
        for (name, bytes) in [("noop", &noop), ("bare", &bare)] {
            let module: CompiledModule = sandbox.compile(bytes).expect("compile");
            let first = rt.block_on(sandbox.run(&module, &input, &limits));
            assert!(matches!(first.outcome, Outcome::Success(_)), "{name}: {first:?}");
            group.bench_function(format!("{allocator}/{name}"), |b| {
                b.to_async(&rt).iter(|| sandbox.run(&module, &input, &limits))
            });
        }
    }
    group.finish();
}

struct RawState {
    wasi: WasiP1Ctx,
}

/// The sandbox's engine settings (see runner/src/sandbox/engine.rs), with fuel switchable.
fn raw_engine(pooling: bool, fuel: bool) -> Engine {
    let mut config = Config::new();
    config
        .consume_fuel(fuel)
        .epoch_interruption(true)
        .shared_memory(false)
        .wasm_memory64(false)
        .wasm_multi_memory(false);
    if pooling {
        let mut p = PoolingAllocationConfig::new();
        p.total_core_instances(16)
            .total_memories(16)
            .total_tables(16)
            .total_stacks(16)
            .total_component_instances(0)
            .max_memories_per_module(1)
            .max_tables_per_module(1)
            .max_memory_size(512 << 20)
            .decommit_batch_size(8);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(p));
    }
    Engine::new(&config).expect("engine")
}

async fn raw_run(engine: &Engine, pre: &InstancePre<RawState>, payload: &[u8], fuel: bool) {
    let wasi = WasiCtxBuilder::new()
        .stdin(MemoryInputPipe::new(payload.to_vec()))
        .stdout(MemoryOutputPipe::new(1 << 20))
        .stderr(MemoryOutputPipe::new(8 << 10))
        .env("SWEEP_TASK_ID", "1")
        .env("SWEEP_TASK_TYPE", "noop")
        .env("SWEEP_ATTEMPT", "1")
        .env("SWEEP_MAX_ATTEMPTS", "5")
        .build_p1();
    let mut store = Store::new(engine, RawState { wasi });
    if fuel {
        store.set_fuel(Limits::DEFAULT.fuel).expect("fuel");
    }
    store.set_epoch_deadline(1);
    store.epoch_deadline_async_yield_and_update(1);
    let instance = pre.instantiate_async(&mut store).await.expect("instantiate");
    let start = instance.get_typed_func::<(), ()>(&mut store, "_start").expect("_start");
    if let Err(e) = start.call_async(&mut store, ()).await {
        assert!(matches!(e.downcast_ref::<I32Exit>(), Some(I32Exit(0))), "noop failed: {e:?}");
    }
}

fn wasmtime_fuel(c: &mut Criterion) {
    let rt = runtime();
    let noop = noop_wasm();
    let payload = serde_json::to_vec(&json!({ "i": 1 })).expect("payload");
    let mut group = c.benchmark_group("wasmtime_fuel");
    group.throughput(Throughput::Elements(1));
    for (allocator, pooling) in ALLOCATORS {
        for (label, fuel) in [("fuel_on", true), ("fuel_off", false)] {
            let engine = raw_engine(pooling, fuel);
            // Drive the epoch like the sandbox's ticker does.
            let weak = engine.weak();
            std::thread::spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
            let mut linker: Linker<RawState> = Linker::new(&engine);
            p1::add_to_linker_async(&mut linker, |s: &mut RawState| &mut s.wasi).expect("linker");
            let module = Module::from_binary(&engine, &noop).expect("compile");
            let pre = linker.instantiate_pre(&module).expect("instantiate_pre");
            rt.block_on(raw_run(&engine, &pre, &payload, fuel));
            group.bench_function(format!("{allocator}/{label}"), |b| {
                b.to_async(&rt).iter(|| raw_run(&engine, &pre, &payload, fuel))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, sandbox, wasmtime_fuel);
criterion_main!(benches);
