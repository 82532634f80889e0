//! `sweep-bench`: end-to-end benchmarks of a real runner on a fresh database.
//!
//! - `throughput`: bulk-enqueue N no-op tasks, run one runner until they are drained, report
//!   tasks/s and enqueue-to-start latency percentiles.
//! - `latency`: enqueue one task at a time at a fixed rate into an idle queue, through a pool
//!   of the bench's own as an application would, and report the latency distribution from the
//!   enqueue statement's start and from its commit (the NOTIFY path) to the attempt's start.
//!
//! - `enqueue`: bulk enqueue throughput through the library (COPY and INSERT) and the admin
//!   API's batch route, no runner (see `bench/enqueue.rs`).
//! - `fairness`: tenants and task types sharing one runner (see `bench/fairness.rs`).
//! - `workflow`: a 3-level workflow's drain against independent tasks, and a completion's
//!   follow-ups against a bulk enqueue (see `bench/workflow.rs`).
//! - `compile`: the costliest module the compile limits admit, against a `sweep run`
//!   process (see `bench/compile.rs`).
//! - `claim-scale`: the fair claim's cost against the number of due tenants (see
//!   `bench/claim_scale.rs`).
//! - `stats`: `GET /v1/stats` latency against 10 million finished tasks (see
//!   `bench/stats.rs`).
//! - `memory`, `module-footprint`: a runner's memory with 10,000 module versions run, and
//!   what one compiled module costs (see `bench/memory.rs`).
//!
//! Latencies are measured in the database's own clock (`started_at - run_at`), so client and
//! server clocks never mix. Every task runs in a fresh Wasm instance with every limit on.

use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sqlx::{migrate::MigrateDatabase, PgPool, Postgres};
use sweep::{
    queue::{self, ModuleSettings, NewTask, Role, Store},
    sandbox::sha256_hex,
    worker::Worker,
};
use tokio::{sync::oneshot, time::Instant};

use sweep::args::{default_components_dir, default_modules_dir, WorkerArgs};

use crate::fixtures;

pub mod claim_scale;
pub mod compile;
pub mod cpu;
pub mod delayed;
pub mod enqueue;
pub mod fairness;
pub mod memory;
pub mod stats;
pub mod workflow;

#[derive(Debug, clap::Parser)]
#[command(
    name = "sweep-bench",
    about = "End-to-end benchmarks of a Sweep runner on a fresh database"
)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub mode: BenchMode,
    /// The benchmark's own database: dropped and created afresh on every run.
    #[arg(
        long,
        global = true,
        env = "SWEEP_BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/sweep_bench_e2e"
    )]
    pub database_url: String,
    /// Where the built Wasm modules are (see scripts/build-modules.sh).
    #[arg(long, global = true, default_value_os_t = default_modules_dir())]
    pub modules_dir: PathBuf,
    /// Where the built WASI 0.2 components are (`--guest component`).
    #[arg(long, global = true, default_value_os_t = default_components_dir())]
    pub components_dir: PathBuf,
    /// The raw SQL ceiling in jobs/s (from shared/bench/sql-limit.sh), to print a ratio.
    #[arg(long, global = true)]
    pub sql_limit: Option<f64>,
    /// Which no-op guest every task runs.
    #[arg(long, global = true, value_enum, default_value_t = Guest::Rust)]
    pub guest: Guest,
    /// Upload the guest with `reuse` (a component: each kept instance runs up to this many
    /// tasks; 1: a fresh instance for every task). Default: as an upload through the API.
    #[arg(long, global = true)]
    pub reuse: Option<i32>,
}

/// The no-op guests `sweep-bench` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Guest {
    /// modules/noop: the Rust SDK handler (reads its payload, writes `{}`).
    Rust,
    /// An empty `_start`: the floor of the sandbox's per-task cost.
    Bare,
    /// components/component-noop: the same work as `rust` as a WASI 0.2 component.
    Component,
    /// guests/python-hello (componentize-py): reads its payload, writes a greeting.
    Python,
    /// guests/js-hello (componentize-js): the same in JavaScript.
    Js,
}

#[derive(Debug, clap::Subcommand)]
pub enum BenchMode {
    /// Drain a pre-filled queue of no-op tasks.
    Throughput {
        /// Tasks to enqueue and drain.
        #[arg(long, default_value_t = 100_000)]
        tasks: usize,
        /// Finished tasks to keep in the table before the run (history the claim path must
        /// not slow down with).
        #[arg(long, default_value_t = 0)]
        retained: usize,
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// Wake-up latency: one task at a time into an idle queue.
    Latency {
        /// Tasks to enqueue.
        #[arg(long, default_value_t = 2000)]
        tasks: usize,
        /// Enqueues per second.
        #[arg(long, default_value_t = 200)]
        rate: u32,
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// Bulk enqueue throughput: the library's COPY and INSERT paths and the API's batch route.
    Enqueue(enqueue::EnqueueArgs),
    /// Tenants sharing a runner: noisy neighbour, weighted shares, cost with 1,000 tenants,
    /// control-plane latency with every slot spinning.
    Fairness(fairness::FairnessArgs),
    /// The costliest module the compile limits admit, uploaded to a `sweep run` process: its
    /// compile time and memory, the runner's RSS, `/healthz` latency meanwhile.
    Compile(compile::CompileArgs),
    /// A runner's resident memory after running one task on each of 10,000 distinct module
    /// versions, with its module cache bound (--module-cache-mb).
    Memory(memory::MemoryArgs),
    /// What one compiled module costs in resident memory beyond its compiled image.
    ModuleFootprint(memory::FootprintArgs),
    /// Workflow overhead: a 3-level workflow's drain against as many independent tasks, and
    /// a completion's follow-ups against a bulk enqueue (ratios in one run).
    Workflow(workflow::WorkflowArgs),
    /// The fair claim's cost against the number of due tenants (claims rolled back).
    ClaimScale(claim_scale::ClaimScaleArgs),
    /// `GET /v1/stats` latency against a long retained history.
    Stats(stats::StatsArgs),
}

const ENQUEUE_CHUNK: usize = 10_000;

pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let url = &args.database_url;
    let mode = match args.mode {
        BenchMode::Fairness(fair) => {
            return fairness::fairness(url, &args.modules_dir, &fair).await
        }
        BenchMode::Compile(compile) => return compile::compile(url, &compile).await,
        BenchMode::Memory(memory) => return memory::memory(url, &memory).await,
        BenchMode::ModuleFootprint(footprint) => return memory::footprint(&footprint).await,
        BenchMode::ClaimScale(scale) => return claim_scale::claim_scale(url, &scale).await,
        BenchMode::Stats(stats) => return stats::stats(url, &stats).await,
        mode => mode,
    };
    let store = fresh_database(url).await?;
    let pool = store.pool();
    let noop = match args.guest {
        Guest::Rust => std::fs::read(args.modules_dir.join("noop.wasm"))
            .context("reading noop.wasm (run scripts/build-modules.sh first)")?,
        Guest::Bare => crate::modules::empty_module(),
        Guest::Component => std::fs::read(args.components_dir.join("component-noop.wasm"))
            .context("reading component-noop.wasm (run scripts/build-modules.sh first)")?,
        Guest::Python => std::fs::read(args.components_dir.join("python-hello.wasm"))
            .context("reading python-hello.wasm (run scripts/build-modules.sh first)")?,
        Guest::Js => std::fs::read(args.components_dir.join("js-hello.wasm"))
            .context("reading js-hello.wasm (run scripts/build-modules.sh first)")?,
    };
    queue::register_module_with(
        pool,
        queue::DEFAULT_TENANT,
        "noop",
        &sha256_hex(&noop),
        &noop,
        &ModuleSettings::default(),
        &queue::UploadOptions {
            reuse: queue::upload_reuse(&noop, args.reuse),
            ..queue::UploadOptions::default()
        },
    )
    .await?;
    match mode {
        BenchMode::Throughput { tasks, retained, worker } => {
            throughput(&store, &noop, tasks, retained, &worker, args.sql_limit).await
        }
        BenchMode::Latency { tasks, rate, worker } => {
            latency(&store, url, tasks, rate, &worker).await
        }
        BenchMode::Enqueue(args) => enqueue::enqueue(&store, url, &args).await,
        BenchMode::Workflow(args) => workflow::workflow(&store, &args).await,
        BenchMode::Fairness(fair) => fairness::fairness(url, &args.modules_dir, &fair).await,
        BenchMode::Compile(compile) => compile::compile(url, &compile).await,
        BenchMode::Memory(memory) => memory::memory(url, &memory).await,
        BenchMode::ModuleFootprint(footprint) => memory::footprint(&footprint).await,
        BenchMode::ClaimScale(scale) => claim_scale::claim_scale(url, &scale).await,
        BenchMode::Stats(stats) => stats::stats(url, &stats).await,
    }
}

/// The bench database at `url`, dropped if it exists, created, migrated and opened as a
/// runner's store.
async fn fresh_database(url: &str) -> anyhow::Result<Store> {
    if Postgres::database_exists(url).await.context("reaching Postgres")? {
        Postgres::drop_database(url).await.context("dropping the previous bench database")?;
    }
    queue::migrate(url).await.context("creating the bench database")?;
    Ok(Store::open(url, Role::Runner, 16).await.context("opening the bench database")?)
}

async fn throughput(
    store: &Store,
    module: &[u8],
    n: usize,
    retained: usize,
    args: &WorkerArgs,
    sql_limit: Option<f64>,
) -> anyhow::Result<()> {
    let pool = store.pool();
    if retained > 0 {
        println!("filling history: {retained} finished tasks");
        fixtures::fill_finished(pool, "noop", retained).await?;
    }
    let started = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(ENQUEUE_CHUNK) {
        let tasks: Vec<NewTask> =
            chunk.iter().map(|i| NewTask::new("noop", json!({ "i": i }))).collect();
        queue::enqueue_many(pool, &tasks).await?;
    }
    let enqueue_secs = started.elapsed().as_secs_f64();
    println!(
        "enqueued {n} tasks in {enqueue_secs:.2}s ({:.0} tasks/s, bulk of {ENQUEUE_CHUNK})",
        n as f64 / enqueue_secs
    );

    let config = args.to_config();
    let worker = Worker::new(store, config.clone())?;
    // Compiled before the clock starts, as a runner that has been up for a while has it: the
    // drain measures running tasks, not one compile (a Python component's takes ~20 s).
    let compile = Instant::now();
    worker.modules().insert(module.to_vec()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let sandbox = worker.sandbox().clone();
    println!("compiled the module in {:.2}s (not counted)", compile.elapsed().as_secs_f64());
    let bar = ProgressBar::new(n as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} tasks  {per_sec}  eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let first = fixtures::first_unfinished(pool).await?.unwrap_or_default();
    let (stop, stopped) = oneshot::channel::<()>();
    let (runner_cpu, postgres_cpu) = (cpu::Cpu::this_process(), cpu::Cpu::postgres());
    let run_started = Instant::now();
    let runner = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    // The end is detected within 20 ms by a cheap probe; the progress bar moves once a second,
    // by the lowest unfinished id (runners take these tasks in id order), not by a count, which
    // reads the whole backlog: the benchmark must not pay for its own progress bar.
    let mut next_count = Instant::now();
    while fixtures::any_unfinished(pool).await? {
        if runner.is_finished() {
            bail!("the runner stopped early");
        }
        if Instant::now() >= next_count {
            if let Some(at) = fixtures::first_unfinished(pool).await? {
                bar.set_position(u64::try_from(at - first).unwrap_or_default());
            }
            next_count = Instant::now() + Duration::from_secs(1);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = run_started.elapsed().as_secs_f64();
    let runner_cpu = cpu::Cpu::this_process().since(&runner_cpu);
    let postgres_cpu = cpu::Cpu::postgres().since(&postgres_cpu);
    bar.finish_and_clear();
    let _ = stop.send(());
    runner.await??;

    let rate = n as f64 / secs;
    let span = fixtures::work_span(pool, first).await?;
    let reused = sandbox.warm_stats().reused;
    let instances = if reused == 0 {
        "fresh instance per task".to_owned()
    } else {
        format!("{reused} tasks on kept instances")
    };
    println!(
        "drained {n} tasks in {secs:.2}s: {rate:.0} tasks/s  (batch {}, concurrency {}, \
         {instances}, fuel + epoch deadline + memory + output limits on)",
        config.batch_size, config.concurrency
    );
    if let Some(span) = span.filter(|s| *s > 0.0) {
        println!(
            "span from the first task's start to the last task's end: {span:.2}s: {:.0} tasks/s \
             (the span Graphile Worker's bench times; the drain above adds the runner's start \
             and the wait for the last report's commit)",
            n as f64 / span
        );
    }
    let per_task = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    println!(
        "CPU per task: runner {:.1} us (user {:.1}, system {:.1}; includes this benchmark's \
         20 ms probe), Postgres {:.1} us (user {:.1}, system {:.1})",
        per_task(runner_cpu.total()),
        per_task(runner_cpu.user),
        per_task(runner_cpu.system),
        per_task(postgres_cpu.total()),
        per_task(postgres_cpu.user),
        per_task(postgres_cpu.system),
    );
    if let Some(limit) = sql_limit {
        println!("ratio to the raw SQL ceiling ({limit:.0} jobs/s): {:.2}x", rate / limit);
    }
    print_latency("enqueue-to-start", pool).await
}

async fn latency(
    store: &Store,
    url: &str,
    n: usize,
    rate: u32,
    args: &WorkerArgs,
) -> anyhow::Result<()> {
    let pool = store.pool();
    if rate == 0 {
        bail!("--rate must be at least 1");
    }
    // The tasks are enqueued as an application would: through a pool of its own, with sqlx's
    // defaults, not through the runner's connections.
    let app = PgPool::connect(url).await.context("opening the enqueuing application's pool")?;
    let worker = Worker::new(store, args.to_config())?;
    let (stop, stopped) = oneshot::channel::<()>();
    let runner = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    // Let the runner reach its idle wait before the first enqueue.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let bar = ProgressBar::new(n as u64);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    // When each enqueue's commit was acknowledged, on the same host clock Postgres uses.
    let mut acked = Vec::with_capacity(n);
    // How long each enqueue call took, statement and synchronous commit.
    let mut calls = Vec::with_capacity(n);
    for i in 0..n {
        tick.tick().await;
        let called = Instant::now();
        let id = queue::enqueue(&app, NewTask::new("noop", json!({ "i": i }))).await?.id;
        calls.push(called.elapsed().as_secs_f64());
        acked.push((id, chrono::Utc::now()));
        bar.inc(1);
    }
    while fixtures::any_unfinished(pool).await? {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bar.finish_and_clear();
    let _ = stop.send(());
    runner.await??;
    println!("{n} tasks enqueued one at a time at {rate}/s into an idle queue");
    print_latency("enqueue statement start to attempt start (includes the enqueue's commit)", pool)
        .await?;
    print_percentiles("the enqueue call itself (statement and commit)", calls);
    let ids: Vec<i64> = acked.iter().map(|(id, _)| *id).collect();
    let started = fixtures::started_at(pool, &ids).await?;
    let waits: Vec<f64> = acked
        .iter()
        .zip(started)
        .filter_map(|((_, ack), (_, start))| start.map(|s| (s - *ack).as_seconds_f64()))
        .collect();
    print_percentiles("commit acknowledged to attempt start (the wake-up path)", waits);
    Ok(())
}

/// The `q` quantile (0 to 1) of `sorted`, nearest rank; `None` for an empty sample.
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    sorted.get((last as f64 * q).round() as usize).copied()
}

/// Prints the p50, p95 and p99 of `seconds` in milliseconds (nothing for an empty sample).
fn print_percentiles(what: &str, mut seconds: Vec<f64>) {
    seconds.sort_by(f64::total_cmp);
    let at = |q| quantile(&seconds, q);
    if let (Some(p50), Some(p95), Some(p99)) = (at(0.5), at(0.95), at(0.99)) {
        println!(
            "{what}: p50 {:.2} ms  p95 {:.2} ms  p99 {:.2} ms",
            p50 * 1000.0,
            p95 * 1000.0,
            p99 * 1000.0
        );
    }
}

async fn print_latency(what: &str, pool: &PgPool) -> anyhow::Result<()> {
    let p = fixtures::start_latency_percentiles(pool, &[0.5, 0.95, 0.99]).await?;
    let ms = |s: f64| s * 1000.0;
    println!(
        "{what} latency: p50 {:.2} ms  p95 {:.2} ms  p99 {:.2} ms",
        ms(p[0]),
        ms(p[1]),
        ms(p[2])
    );
    Ok(())
}
