//! Command-line argument groups shared by the `sweep` binary and the development tools
//! (`sweep-bench`): the runner's settings, each flag with its environment variable, parsed
//! into the plain [`WorkerConfig`], and the compile limits ([`CompileArgs`]) that `sweep run`
//! and `sweep admin` share. The compiler stays in process here; the `sweep` binary points it
//! at its own `compile-module` subcommand.

use std::{path::PathBuf, time::Duration};

use sqlx::postgres::PgConnectOptions;

use crate::{
    config::{MaintenanceConfig, WorkerConfig},
    sandbox::{CompileLimits, Limits, SandboxConfig},
};

/// What a module may be and cost to compile, at upload or at its first run; every flag has an
/// environment variable. Over any of them, an upload is refused with 422
/// `module_limit_exceeded`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompileArgs {
    /// Most functions a module may define.
    #[arg(long, env = "SWEEP_MAX_FUNCTIONS", default_value_t = crate::sandbox::DEFAULT_MAX_FUNCTIONS)]
    pub max_functions: u32,
    /// Most KiB of function bodies (the code section) in a module.
    #[arg(long, env = "SWEEP_MAX_CODE_KIB", default_value_t = crate::sandbox::DEFAULT_MAX_CODE_BYTES >> 10)]
    pub max_code_kib: u64,
    /// Most KiB in one function body.
    #[arg(long, env = "SWEEP_MAX_FUNCTION_KIB", default_value_t = crate::sandbox::DEFAULT_MAX_FUNCTION_BYTES >> 10)]
    pub max_function_kib: u64,
    /// Most locals one function may declare.
    #[arg(long, env = "SWEEP_MAX_LOCALS", default_value_t = crate::sandbox::DEFAULT_MAX_LOCALS)]
    pub max_locals: u32,
    /// CPU seconds any compile may use (all its threads together), before the allowance for
    /// its code.
    #[arg(long, env = "SWEEP_COMPILE_CPU_SECS", default_value_t = crate::sandbox::DEFAULT_COMPILE_CPU.as_secs())]
    pub compile_cpu_secs: u64,
    /// CPU milliseconds added to a compile's budget per MiB of its code.
    #[arg(long, env = "SWEEP_COMPILE_CPU_MS_PER_CODE_MIB", default_value_t = crate::sandbox::DEFAULT_COMPILE_CPU_PER_CODE_MIB.as_millis() as u64)]
    pub compile_cpu_ms_per_code_mib: u64,
    /// Most CPU seconds one compile may use, whatever its code.
    #[arg(long, env = "SWEEP_MAX_COMPILE_CPU_SECS", default_value_t = crate::sandbox::DEFAULT_MAX_COMPILE_CPU.as_secs())]
    pub max_compile_cpu_secs: u64,
    /// MiB of address space any compile may map, before the allowance for its code.
    #[arg(long, env = "SWEEP_COMPILE_MEMORY_MB", default_value_t = crate::sandbox::DEFAULT_COMPILE_MEMORY_BYTES >> 20)]
    pub compile_memory_mb: u64,
    /// MiB of address space added to a compile's budget per MiB of its code.
    #[arg(long, env = "SWEEP_COMPILE_MEMORY_MB_PER_CODE_MIB", default_value_t = crate::sandbox::DEFAULT_COMPILE_MEMORY_PER_CODE_MIB >> 20)]
    pub compile_memory_mb_per_code_mib: u64,
    /// Most MiB of address space one compile may map, whatever its code.
    #[arg(long, env = "SWEEP_MAX_COMPILE_MEMORY_MB", default_value_t = crate::sandbox::DEFAULT_MAX_COMPILE_MEMORY_BYTES >> 20)]
    pub max_compile_memory_mb: u64,
    /// Seconds after which a compile of the base CPU budget is killed, however little CPU it
    /// got (it grows in proportion with a compile's CPU budget).
    #[arg(long, env = "SWEEP_COMPILE_WALL_SECS", default_value_t = crate::sandbox::DEFAULT_COMPILE_WALL.as_secs())]
    pub compile_wall_secs: u64,
    /// Compiles that run at once in this process (uploads and first runs together).
    #[arg(long, env = "SWEEP_COMPILE_CONCURRENCY", default_value_t = crate::sandbox::DEFAULT_MAX_CONCURRENT_COMPILES)]
    pub compile_concurrency: usize,
}

impl Default for CompileArgs {
    fn default() -> Self {
        let d = CompileLimits::default();
        CompileArgs {
            max_functions: d.max_functions,
            max_code_kib: d.max_code_bytes >> 10,
            max_function_kib: d.max_function_bytes >> 10,
            max_locals: d.max_locals,
            compile_cpu_secs: d.cpu.as_secs(),
            compile_cpu_ms_per_code_mib: d.cpu_per_code_mib.as_millis() as u64,
            max_compile_cpu_secs: d.max_cpu.as_secs(),
            compile_memory_mb: d.memory_bytes >> 20,
            compile_memory_mb_per_code_mib: d.memory_per_code_mib >> 20,
            max_compile_memory_mb: d.max_memory_bytes >> 20,
            compile_wall_secs: d.wall.as_secs(),
            compile_concurrency: d.max_concurrent,
        }
    }
}

impl CompileArgs {
    pub fn to_limits(&self) -> CompileLimits {
        CompileLimits {
            max_functions: self.max_functions,
            max_code_bytes: self.max_code_kib.saturating_mul(1 << 10),
            max_function_bytes: self.max_function_kib.saturating_mul(1 << 10),
            max_locals: self.max_locals,
            cpu: Duration::from_secs(self.compile_cpu_secs),
            cpu_per_code_mib: Duration::from_millis(self.compile_cpu_ms_per_code_mib),
            max_cpu: Duration::from_secs(self.max_compile_cpu_secs),
            memory_bytes: self.compile_memory_mb.saturating_mul(1 << 20),
            memory_per_code_mib: self.compile_memory_mb_per_code_mib.saturating_mul(1 << 20),
            max_memory_bytes: self.max_compile_memory_mb.saturating_mul(1 << 20),
            wall: Duration::from_secs(self.compile_wall_secs),
            max_concurrent: self.compile_concurrency,
        }
    }
}

/// Runner settings; every flag has an environment variable.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Tasks that run at once.
    #[arg(long, env = "SWEEP_CONCURRENCY", default_value_t = crate::config::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Extra instances for queues with nothing running while every slot is busy, so a newly
    /// due tenant or task type starts at once (0: none).
    #[arg(long, env = "SWEEP_SPARE_SLOTS", default_value_t = crate::config::DEFAULT_SPARE_SLOTS)]
    pub spare_slots: usize,
    /// Most tasks claimed per statement.
    #[arg(long, env = "SWEEP_BATCH_SIZE", default_value_t = crate::config::DEFAULT_BATCH_SIZE)]
    pub batch_size: usize,
    /// Claim statements kept in flight at once.
    #[arg(long, env = "SWEEP_CLAIMERS", default_value_t = crate::config::DEFAULT_CLAIMERS)]
    pub claimers: usize,
    /// Most tasks claimed ahead of free slots, so a freed slot starts at once; the runner
    /// sizes the buffer below this from what it observes, and claims nothing ahead for tasks
    /// longer than a claim round trip (0: never claim ahead).
    #[arg(long, env = "SWEEP_CLAIM_AHEAD", default_value_t = crate::config::DEFAULT_MAX_AHEAD)]
    pub claim_ahead: usize,
    /// Lease length in seconds (renewed every third of it).
    #[arg(long, env = "SWEEP_LEASE_SECS", default_value_t = crate::config::DEFAULT_LEASE.as_secs())]
    pub lease_secs: u64,
    /// Poll interval in milliseconds, the backstop for NOTIFY wake-ups.
    #[arg(long, env = "SWEEP_POLL_MS", default_value_t = 1000)]
    pub poll_ms: u64,
    /// A direct connection (no transaction pooler) to the same database, to LISTEN for
    /// wake-ups on. Default: the database URL, unless it goes through a pooler (--pooled);
    /// then runners claim every --poll-ms instead.
    #[arg(long, env = "SWEEP_LISTEN_URL")]
    pub listen_url: Option<String>,
    /// Seconds running tasks get to finish on SIGINT/SIGTERM before they are handed back.
    #[arg(long, env = "SWEEP_GRACE_SECS", default_value_t = crate::config::DEFAULT_GRACE_PERIOD.as_secs())]
    pub grace_secs: u64,
    /// Only run these task types (repeat the flag; default: all).
    #[arg(long = "task-type", env = "SWEEP_TASK_TYPES", value_delimiter = ',')]
    pub task_types: Vec<String>,
    /// Default fuel per task (modules may ask for less or more, up to --max-fuel).
    #[arg(long, env = "SWEEP_FUEL", default_value_t = Limits::DEFAULT.fuel)]
    pub fuel: u64,
    /// Default wall-clock limit per task, in milliseconds.
    #[arg(long, env = "SWEEP_TIMEOUT_MS", default_value_t = Limits::DEFAULT.timeout.as_millis() as u64)]
    pub timeout_ms: u64,
    /// Default memory limit per task, in MiB.
    #[arg(long, env = "SWEEP_MEMORY_MB", default_value_t = Limits::DEFAULT.memory_bytes >> 20)]
    pub memory_mb: u64,
    /// Most stdout (result) bytes per task.
    #[arg(long, env = "SWEEP_OUTPUT_BYTES", default_value_t = Limits::DEFAULT.output_bytes)]
    pub output_bytes: usize,
    /// Highest fuel any module may ask for.
    #[arg(long, env = "SWEEP_MAX_FUEL", default_value_t = Limits::MAXIMA.fuel)]
    pub max_fuel: u64,
    /// Highest timeout any module may ask for, in milliseconds.
    #[arg(long, env = "SWEEP_MAX_TIMEOUT_MS", default_value_t = Limits::MAXIMA.timeout.as_millis() as u64)]
    pub max_timeout_ms: u64,
    /// Highest memory any module may ask for, in MiB.
    #[arg(long, env = "SWEEP_MAX_MEMORY_MB", default_value_t = Limits::MAXIMA.memory_bytes >> 20)]
    pub max_memory_mb: u64,
    /// Allocate instances on demand instead of from a pre-reserved pool.
    #[arg(long, env = "SWEEP_NO_POOLING")]
    pub no_pooling: bool,
    /// Vacuum the live task table at least this often, in milliseconds (0: leave it to
    /// autovacuum); sooner, after every 5,000 tasks this runner reported. The table only holds
    /// live work, so this is cheap, and it keeps claims from walking past the index entries of
    /// tasks that already ran.
    #[arg(long, env = "SWEEP_VACUUM_MS", default_value_t = crate::config::DEFAULT_VACUUM_INTERVAL.as_millis() as u64)]
    pub vacuum_ms: u64,
    /// How often the reaper looks for expired leases, in milliseconds.
    #[arg(long, env = "SWEEP_REAPER_MS", default_value_t = crate::config::DEFAULT_REAPER_INTERVAL.as_millis() as u64)]
    pub reaper_ms: u64,
    /// The longest the cron scheduler sleeps between passes, in milliseconds (it wakes at the
    /// next due tick sooner); 0: this runner runs no schedules.
    #[arg(long, env = "SWEEP_SCHEDULER_MS", default_value_t = crate::config::DEFAULT_SCHEDULER_INTERVAL.as_millis() as u64)]
    pub scheduler_ms: u64,
    /// Seconds finished reports wait for an unreachable Postgres before they are given up
    /// (their tasks then run again): a task that finishes during a shorter outage is recorded
    /// as finished.
    #[arg(long, env = "SWEEP_REPORT_HOLD_SECS", default_value_t = crate::config::DEFAULT_REPORT_HOLD.as_secs())]
    pub report_hold_secs: u64,
    /// Most MiB of reports kept while Postgres is unreachable (the oldest are given up first).
    #[arg(long, env = "SWEEP_REPORT_BUFFER_MB", default_value_t = crate::config::DEFAULT_REPORT_BUFFER_BYTES >> 20)]
    pub report_buffer_mb: usize,
    #[command(flatten)]
    pub compile: CompileArgs,
    /// Most MiB of compiled modules kept in memory (least used evicted past it, compiled
    /// again when next needed).
    #[arg(long, env = "SWEEP_MODULE_CACHE_MB", default_value_t = crate::sandbox::DEFAULT_MODULE_CACHE_BYTES >> 20)]
    pub module_cache_mb: u64,
}

impl WorkerArgs {
    /// `--listen-url` parsed (an empty one counts as none).
    pub fn listen_options(&self) -> Result<Option<PgConnectOptions>, sqlx::Error> {
        self.listen_url.as_deref().filter(|url| !url.is_empty()).map(str::parse).transpose()
    }

    pub fn to_config(&self) -> WorkerConfig {
        let defaults = Limits {
            fuel: self.fuel,
            timeout: Duration::from_millis(self.timeout_ms),
            memory_bytes: self.memory_mb << 20,
            output_bytes: self.output_bytes,
        };
        let maxima = Limits {
            fuel: self.max_fuel,
            timeout: Duration::from_millis(self.max_timeout_ms),
            memory_bytes: self.max_memory_mb << 20,
            output_bytes: self.output_bytes.max(Limits::MAXIMA.output_bytes),
        };
        WorkerConfig {
            concurrency: self.concurrency,
            spare_slots: self.spare_slots,
            batch_size: self.batch_size,
            claimers: self.claimers,
            max_ahead: self.claim_ahead,
            lease: Duration::from_secs(self.lease_secs),
            poll_interval: Duration::from_millis(self.poll_ms),
            grace_period: Duration::from_secs(self.grace_secs),
            task_types: self.task_types.clone(),
            report_hold: Duration::from_secs(self.report_hold_secs),
            report_buffer_bytes: self.report_buffer_mb.saturating_mul(1 << 20),
            module_cache_bytes: self.module_cache_mb.saturating_mul(1 << 20),
            sandbox: SandboxConfig {
                pooling: !self.no_pooling,
                max_concurrency: u32::try_from(self.concurrency.saturating_add(self.spare_slots))
                    .unwrap_or(u32::MAX),
                defaults,
                maxima,
                compile: self.compile.to_limits(),
                ..SandboxConfig::default()
            },
            maintenance: MaintenanceConfig {
                vacuum_interval: (self.vacuum_ms > 0)
                    .then(|| Duration::from_millis(self.vacuum_ms)),
                reaper_interval: Duration::from_millis(self.reaper_ms),
                scheduler_interval: (self.scheduler_ms > 0)
                    .then(|| Duration::from_millis(self.scheduler_ms)),
                ..MaintenanceConfig::default()
            },
            ..WorkerConfig::default()
        }
    }
}

/// Where `scripts/build-modules.sh` puts the Wasm modules (preview 1).
pub fn default_modules_dir() -> PathBuf {
    target_dir().join("wasm32-wasip1").join("wasm")
}

/// Where `scripts/build-modules.sh` puts the WASI 0.2 components (`components/`).
pub fn default_components_dir() -> PathBuf {
    target_dir().join("wasm32-wasip2").join("wasm")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from)
}
