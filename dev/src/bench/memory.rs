//! `sweep-bench memory` and `sweep-bench module-footprint`: what compiled modules cost a runner.
//!
//! - `memory`: registers `--types` x `--versions` distinct module versions (tiny modules
//!   that differ by a constant), one version of every type at a time, and runs one task per
//!   version on one runner in this process; then reports the process's resident set
//!   (`VmRSS`, and its peak `VmHWM`, from /proc/self/status) next to the module cache's bound.
//!   The figure includes this driver (its Postgres pool and the bytes it registers), so it is
//!   an upper bound on the runner's own.
//! - `module-footprint`: compiles `--modules` distinct tiny modules (or tagged copies of
//!   `--module FILE`) into an unbounded module
//!   cache and holds them; the resident set's growth per module, less the module's compiled
//!   image in pages, is the per-entry overhead the cache weighs every entry with
//!   (`sandbox::ENTRY_OVERHEAD_BYTES`).

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;
use sweep::{
    args::WorkerArgs,
    queue::{self, ModuleSettings, NewTask},
    sandbox::{sha256_hex, ModuleCache, Sandbox, ENTRY_OVERHEAD_BYTES, IMAGE_OVERHEAD_DIVISOR},
    worker::Worker,
};
use tokio::{sync::oneshot, time::Instant};

use super::fresh_database;
use crate::{
    fixtures,
    modules::{distinct_module, with_distinct_tag},
};

#[derive(Debug, clap::Args)]
pub struct MemoryArgs {
    /// Task types, each run with every version in turn.
    #[arg(long = "types", default_value_t = 100)]
    pub types: usize,
    /// Versions registered (and one task run) per task type.
    #[arg(long, default_value_t = 100)]
    pub versions: usize,
    #[command(flatten)]
    pub worker: WorkerArgs,
}

#[derive(Debug, clap::Args)]
pub struct FootprintArgs {
    /// Distinct modules to compile and hold.
    #[arg(long, default_value_t = 5000)]
    pub modules: usize,
    /// Compile with the on-demand allocator's engine instead of the pooling one.
    #[arg(long)]
    pub no_pooling: bool,
    /// Copies of this module (each with a distinct custom section) instead of tiny ones.
    #[arg(long)]
    pub module: Option<std::path::PathBuf>,
}

/// The resident set and its peak, in bytes, from /proc/self/status.
#[derive(Debug, Clone, Copy)]
struct Rss {
    now: u64,
    peak: u64,
}

fn rss() -> anyhow::Result<Rss> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/self/status"))?;
        let kib: u64 = line
            .trim_start_matches(name)
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .with_context(|| format!("reading {line:?}"))?;
        Ok(kib * 1024)
    };
    Ok(Rss { now: field("VmRSS:")?, peak: field("VmHWM:")? })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

pub async fn memory(url: &str, args: &MemoryArgs) -> anyhow::Result<()> {
    if args.types == 0 || args.versions == 0 {
        bail!("--types and --versions must be at least 1");
    }
    let store = fresh_database(url).await?;
    let pool = store.pool();
    let config = args.worker.to_config();
    let worker = Worker::new(&store, config.clone())?;
    let cache = worker.modules().clone();
    let before = rss()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let runner = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));

    let total = args.types * args.versions;
    let started = Instant::now();
    let mut peak_weight = 0;
    for version in 0..args.versions {
        let mut tasks = Vec::with_capacity(args.types);
        for t in 0..args.types {
            let bytes = distinct_module((version * args.types + t) as u64);
            let task_type = format!("m{t}");
            queue::register_module(
                pool,
                queue::DEFAULT_TENANT,
                &task_type,
                &sha256_hex(&bytes),
                &bytes,
                &ModuleSettings::default(),
            )
            .await?;
            tasks.push(NewTask::new(task_type, json!({ "version": version })));
        }
        queue::enqueue_many(pool, &tasks).await?;
        // Each task must run with the version active now: wait before the next is registered.
        while fixtures::any_unfinished(pool).await? {
            if runner.is_finished() {
                bail!("the runner stopped early");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cache.settle().await;
        peak_weight = peak_weight.max(cache.weighted_bytes());
        if (version + 1) % 10 == 0 {
            let now = rss()?;
            println!(
                "{:>6} versions run: VmRSS {:.1} MiB, cache {} entries / {:.1} MiB",
                (version + 1) * args.types,
                mib(now.now),
                cache.len(),
                mib(cache.weighted_bytes())
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let after = rss()?;
    let _ = stop.send(());
    runner.await??;
    let (succeeded, versions_run) = fixtures::succeeded_and_versions(pool).await?;
    if usize::try_from(succeeded)? != total || usize::try_from(versions_run)? != total {
        bail!("{succeeded} tasks succeeded on {versions_run} versions; expected {total} of each");
    }
    println!(
        "{total} distinct module versions registered and run, one task each, in {secs:.1}s \
         (concurrency {})",
        config.concurrency
    );
    println!(
        "module cache: bound {:.0} MiB, held {} entries / {:.1} MiB at the end, at most {:.1} MiB \
         after any round",
        mib(cache.max_bytes()),
        cache.len(),
        mib(cache.weighted_bytes()),
        mib(peak_weight)
    );
    println!(
        "process RSS: {:.1} MiB with the runner started and idle, {:.1} MiB after (VmRSS), peak \
         {:.1} MiB (VmHWM)",
        mib(before.now),
        mib(after.now),
        mib(after.peak)
    );
    Ok(())
}

pub async fn footprint(args: &FootprintArgs) -> anyhow::Result<()> {
    if args.modules == 0 {
        bail!("--modules must be at least 1");
    }
    let sandbox = Sandbox::new(sweep::sandbox::SandboxConfig {
        pooling: !args.no_pooling,
        ..sweep::sandbox::SandboxConfig::default()
    })?;
    let cache = ModuleCache::with_max_bytes(sandbox.clone(), u64::MAX);
    let base = match &args.module {
        Some(path) => Some(std::fs::read(path).with_context(|| format!("reading {path:?}"))?),
        None => None,
    };
    let module = |n: u64| match &base {
        Some(bytes) => with_distinct_tag(bytes, n),
        None => distinct_module(n),
    };
    // Warm up: the first compiles build the engine's shared state (type registry, linker
    // caches, thread pools), which is not per module.
    for n in 0..50 {
        cache.insert(module(u64::MAX - n)).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    cache.settle().await;
    let before = rss()?;
    let mut image_pages = 0u64;
    let mut images = 0u64;
    for n in 0..args.modules {
        let m = cache.insert(module(n as u64)).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        images += m.image_bytes() as u64;
        image_pages += m.image_bytes().div_ceil(4096) as u64 * 4096;
    }
    cache.settle().await;
    let after = rss()?;
    let n = args.modules as u64;
    let per_module = after.now.saturating_sub(before.now) / n;
    let overhead = per_module.saturating_sub(image_pages / n);
    let weighed = (image_pages / n) / IMAGE_OVERHEAD_DIVISOR as u64 + ENTRY_OVERHEAD_BYTES as u64;
    println!(
        "{n} distinct modules compiled and held: RSS {:.1} -> {:.1} MiB, {per_module} bytes per \
         module",
        mib(before.now),
        mib(after.now)
    );
    println!(
        "compiled image: {} bytes on average ({} in whole pages); measured overhead beyond the \
         image: {overhead} bytes per entry (the cache weighs this overhead as {weighed})",
        images / n,
        image_pages / n
    );
    Ok(())
}
