//! Rough per-task cost of the run path, split by phase, pooled vs on-demand. Not a benchmark
//! (that lives in benches/); an ignored test to print where the time goes:
//!
//! `cargo test -p sweep --lib sandbox::cost_tests -- --ignored --nocapture`

use std::time::{Duration, Instant};

use serde_json::json;
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::WasiCtxBuilder;

use super::pipes::{BoundedOutput, Overflow};
use super::store::{new_store, StoreState, TaskLimiter};
use super::{Limits, Outcome, Sandbox, SandboxConfig, TaskInput};

const ITERATIONS: u32 = 3000;
const NOOP: &str = r#"(module (memory 1) (func (export "_start")))"#;

#[derive(Default)]
struct Phases {
    wasi_ctx: Duration,
    store: Duration,
    instantiate: Duration,
    call: Duration,
    drop: Duration,
}

fn per_task(total: Duration) -> f64 {
    total.as_secs_f64() * 1e6 / f64::from(ITERATIONS)
}

async fn measure(sandbox: &Sandbox) -> wasmtime::Result<()> {
    let module = sandbox.compile(&wat::parse_str(NOOP)?)?;
    let input = TaskInput::new("id", "noop", 1, 3, &json!({"n": 1}));
    let limits = Limits::DEFAULT;

    // Warm up (pool slots, lazy inits).
    for _ in 0..200 {
        let exec = sandbox.run(&module, &input, &limits).await;
        wasmtime::ensure!(exec.outcome == Outcome::Success(json!(null)), "{exec:?}");
    }

    let start = Instant::now();
    for _ in 0..ITERATIONS {
        let _ = sandbox.run(&module, &input, &limits).await;
    }
    let whole = start.elapsed();

    let mut p = Phases::default();
    for _ in 0..ITERATIONS {
        let t = Instant::now();
        let stdout = BoundedOutput::new(limits.output_bytes, Overflow::Stop);
        let stderr = BoundedOutput::new(4096, Overflow::KeepTail);
        let wasi = WasiCtxBuilder::new()
            .stdin(MemoryInputPipe::new(input.payload.clone()))
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .env("SWEEP_TASK_ID", &input.task_id)
            .env("SWEEP_TASK_TYPE", &input.task_type)
            .env("SWEEP_ATTEMPT", input.attempt.to_string())
            .env("SWEEP_MAX_ATTEMPTS", input.max_attempts.to_string())
            .build_p1();
        let t1 = Instant::now();
        let mut store = Store::new(
            sandbox.engine(),
            StoreState {
                wasi,
                limiter: TaskLimiter { memory_bytes: 1 << 26, memory_denied: false },
                deadline: t + limits.timeout,
                deadline_hit: false,
            },
        );
        store.limiter(|s| &mut s.limiter);
        store.set_fuel(limits.fuel)?;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|_| Ok(UpdateDeadline::Continue(1)));
        let t2 = Instant::now();
        let instance = module.pre.instantiate_async(&mut store).await?;
        let t3 = Instant::now();
        let f = instance
            .get_module_export(&mut store, &module.start)
            .and_then(|e| e.into_func())
            .ok_or_else(|| wasmtime::format_err!("no _start"))?
            .typed::<(), ()>(&store)?;
        f.call_async(&mut store, ()).await?;
        let t4 = Instant::now();
        drop(store);
        let t5 = Instant::now();
        p.wasi_ctx += t1 - t;
        p.store += t2 - t1;
        p.instantiate += t3 - t2;
        p.call += t4 - t3;
        p.drop += t5 - t4;
    }

    // The store as `run` builds it, for comparison with the hand-built one above.
    let t = Instant::now();
    for _ in 0..ITERATIONS {
        let out = BoundedOutput::new(limits.output_bytes, Overflow::Stop);
        let err = BoundedOutput::new(4096, Overflow::KeepTail);
        drop(new_store(sandbox.engine(), &input, &limits, t, &out, &err)?);
    }
    let new_store_cost = t.elapsed();

    println!(
        "{:>9}: run() {:6.2} µs/task | wasi ctx {:5.2} store {:5.2} instantiate {:5.2} \
         call {:5.2} drop {:5.2} | new_store()+drop {:5.2}",
        sandbox.allocator().to_string(),
        per_task(whole),
        per_task(p.wasi_ctx),
        per_task(p.store),
        per_task(p.instantiate),
        per_task(p.call),
        per_task(p.drop),
        per_task(new_store_cost),
    );
    Ok(())
}

#[test]
#[ignore = "prints timings; run with --ignored --nocapture"]
fn noop_task_cost_pooled_vs_on_demand() -> wasmtime::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    for pooling in [true, false] {
        let sandbox = Sandbox::new(SandboxConfig { pooling, ..SandboxConfig::default() })?;
        rt.block_on(measure(&sandbox))?;
    }
    Ok(())
}
