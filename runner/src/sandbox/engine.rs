//! The runner's single `wasmtime::Engine` and its epoch ticker.
//!
//! Owns: the wasmtime `Config` (fuel, epoch interruption, wasm features a handler may use),
//! the choice between the pooling and the on-demand instance allocator, and the ticker thread.
//!
//! Invariants:
//! - fuel metering and epoch interruption are always on: every store relies on both;
//! - wasm features that would sidestep the memory limiter (shared memories/threads, 64-bit
//!   memories, multiple memories) are off, so one `ResourceLimiter` sees every byte;
//! - the pool has exactly `max_concurrency` memory, stack and component slots, each memory
//!   slot bounded by `maxima.memory_bytes`, and enough core instance and table slots for
//!   that many components; if the pool cannot be set up (e.g. the address space
//!   is capped), we fall back to on-demand allocation with a warning rather than fail;
//! - the ticker thread holds only an [`EngineWeak`] and exits within one tick after the last
//!   `Engine` clone is dropped.

use std::fmt;
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::{
    Config, Engine, EngineWeak, InstanceAllocationStrategy, PoolingAllocationConfig,
    WasmBacktraceDetails,
};

use super::config::SandboxConfig;
use super::store::COMPONENT_CORE_INSTANCES;
use super::SandboxError;

/// Pool slots whose memory is reset together (measured: ~0.7 µs/task saved on a no-op task).
const DECOMMIT_BATCH: usize = 8;

/// Linear memory (and table, fiber stack) kept resident in a freed pool slot where the kernel
/// can say which pages a task touched (`PAGEMAP_SCAN`, Linux 6.7+): only those are reset, by
/// `memset`, so the next task in the slot takes no page faults for them and the slot needs no
/// `madvise`. A Rust guest touches its stack below 1 MiB plus its data and heap above.
/// Measured on the Rust SDK no-op: runner system time per task 36-38 µs down to 15-21 µs.
const KEEP_RESIDENT: usize = 2 << 20;

/// Which instance allocator the engine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorKind {
    /// Pre-reserved slots reused across tasks (fast instantiation, bounded concurrency).
    Pooling,
    /// Fresh mmaps per instance.
    OnDemand,
}

impl fmt::Display for AllocatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AllocatorKind::Pooling => "pooling",
            AllocatorKind::OnDemand => "on-demand",
        })
    }
}

/// Builds the engine; tries pooling first when `config.pooling` is set.
pub(crate) fn build_engine(
    config: &SandboxConfig,
) -> Result<(Engine, AllocatorKind), SandboxError> {
    // What the runner's engine adds to the compile settings: how it instantiates.
    let mut runtime = base_config();
    runtime.memory_init_cow(config.memory_images);
    if config.pooling {
        let mut wasm_config = runtime.clone();
        wasm_config
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pooling_config(config)));
        match Engine::new(&wasm_config) {
            Ok(engine) => return Ok((engine, AllocatorKind::Pooling)),
            Err(error) => tracing::warn!(
                error = %format!("{error:#}"),
                max_concurrency = config.max_concurrency,
                "pooling allocator unavailable; falling back to on-demand instance allocation"
            ),
        }
    }
    let engine =
        Engine::new(&runtime).map_err(|e| SandboxError::Engine(e.into_boxed_dyn_error()))?;
    Ok((engine, AllocatorKind::OnDemand))
}

/// The engine settings every compile uses: the runner's engine and the compiler child's
/// (`compiler`), so an artifact the child writes loads into the runner's engine.
pub(crate) fn base_config() -> Config {
    let mut c = Config::new();
    c.consume_fuel(true)
        .epoch_interruption(true)
        // Wasm threads are compiled out (no `threads` crate feature); keep shared memories off.
        .shared_memory(false)
        .wasm_memory64(false)
        .wasm_multi_memory(false)
        // Explicit, so the engine doesn't depend on WASMTIME_BACKTRACE_DETAILS in the env.
        .wasm_backtrace_details(WasmBacktraceDetails::Disable);
    c
}

fn pooling_config(config: &SandboxConfig) -> PoolingAllocationConfig {
    let slots = config.max_concurrency;
    // validate() caps maxima.memory_bytes at 4 GiB, which fits usize on 64-bit targets.
    let max_memory = usize::try_from(config.maxima.memory_bytes).unwrap_or(usize::MAX);
    // A component is several core instances, each with at most one table, and one memory
    // (see `store::StoreShape`): enough core instance and table slots for every task to be
    // a component, and one memory per task whatever it is.
    let per_component = u32::try_from(COMPONENT_CORE_INSTANCES).unwrap_or(u32::MAX);
    let mut p = PoolingAllocationConfig::new();
    p.total_core_instances(slots.saturating_mul(per_component))
        .total_memories(slots)
        .total_tables(slots.saturating_mul(per_component))
        .total_stacks(slots)
        .total_component_instances(slots)
        .max_core_instances_per_component(per_component)
        .max_tables_per_component(per_component)
        .max_memories_per_component(1)
        .max_memories_per_module(1)
        .max_tables_per_module(1)
        .max_memory_size(max_memory)
        // Return freed slots' memory to the OS in batches (one madvise pass per batch
        // instead of per task); wasmtime flushes early if it needs a queued slot.
        .decommit_batch_size(DECOMMIT_BATCH.min(usize::try_from(slots).unwrap_or(1)));
    // Without the scan, keeping memory resident means a `memset` of the whole kept size on
    // every free, which costs more than the faults it saves: leave the default there.
    if pagemap_scan_supported() {
        p.pagemap_scan(wasmtime::Enabled::Yes)
            .linear_memory_keep_resident(KEEP_RESIDENT)
            .table_keep_resident(64 << 10)
            .async_stack_keep_resident(64 << 10);
    }
    p
}

/// Whether the running kernel has the `PAGEMAP_SCAN` ioctl (Linux 6.7 and later).
fn pagemap_scan_supported() -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    kernel_at_least(&release, (6, 7))
}

fn kernel_at_least(release: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Starts the thread that bumps the engine's epoch every `tick`. It exits on its own once
/// the engine is gone; the handle is only useful to tests that wait for that.
pub(crate) fn spawn_epoch_ticker(
    engine: &Engine,
    tick: Duration,
) -> Result<JoinHandle<()>, SandboxError> {
    let weak: EngineWeak = engine.weak();
    std::thread::Builder::new()
        .name("sweep-epoch-ticker".to_owned())
        .spawn(move || loop {
            std::thread::sleep(tick);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => break,
            }
        })
        .map_err(SandboxError::Ticker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare_by_major_then_minor() {
        assert!(kernel_at_least("6.18.44-fc-v1045\n", (6, 7)));
        assert!(kernel_at_least("6.7.0", (6, 7)));
        assert!(!kernel_at_least("6.6.30-generic", (6, 7)));
        assert!(!kernel_at_least("5.15.0", (6, 7)));
        assert!(kernel_at_least("7.0", (6, 7)));
        assert!(!kernel_at_least("garbage", (6, 7)));
    }

    #[test]
    fn on_demand_engine_builds() -> anyhow::Result<()> {
        let config = SandboxConfig { pooling: false, ..SandboxConfig::default() };
        let (_engine, kind) = build_engine(&config)?;
        assert_eq!(kind, AllocatorKind::OnDemand);
        Ok(())
    }

    #[test]
    fn ticker_exits_when_engine_dropped() -> anyhow::Result<()> {
        let (engine, _) =
            build_engine(&SandboxConfig { pooling: false, ..SandboxConfig::default() })?;
        let handle = spawn_epoch_ticker(&engine, Duration::from_millis(1))?;
        drop(engine);
        // Joining is the event: it returns once the thread noticed the engine is gone.
        handle.join().map_err(|_| anyhow::anyhow!("ticker thread panicked"))?;
        Ok(())
    }
}
