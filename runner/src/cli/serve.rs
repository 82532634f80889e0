//! Server-side commands: `migrate` and `run`, and the [`Runner`] (a runner with its admin
//! API) that `run` and `dev` serve. They talk to Postgres directly.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use sqlx::PgPool;
use sweep::{
    admin::{self, AdminState},
    config::{MaintenanceConfig, WorkerConfig},
    queue,
    sandbox::{Limits, Sandbox, SandboxConfig},
    worker::{self, Worker, WorkerSummary},
};

use tokio::sync::watch;

use super::{client::AdminServerArgs, DatabaseArgs};

pub async fn migrate(db: DatabaseArgs) -> anyhow::Result<()> {
    let pool = queue::connect(&db.database_url, 2).await.context("migrating")?;
    pool.close().await;
    println!("migrations applied");
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub worker: WorkerArgs,
    #[command(flatten)]
    pub admin: AdminServerArgs,
    /// Do not serve the admin API from this runner.
    #[arg(long, env = "SWEEP_NO_ADMIN")]
    pub no_admin: bool,
}

/// Runner settings; every flag has an environment variable.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Tasks that run at once.
    #[arg(long, env = "SWEEP_CONCURRENCY", default_value_t = sweep::config::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Extra instances for queues with nothing running while every slot is busy, so a newly
    /// due tenant or task type starts at once (0: none).
    #[arg(long, env = "SWEEP_SPARE_SLOTS", default_value_t = sweep::config::DEFAULT_SPARE_SLOTS)]
    pub spare_slots: usize,
    /// Most tasks claimed per statement.
    #[arg(long, env = "SWEEP_BATCH_SIZE", default_value_t = sweep::config::DEFAULT_BATCH_SIZE)]
    pub batch_size: usize,
    /// Claim statements kept in flight at once.
    #[arg(long, env = "SWEEP_CLAIMERS", default_value_t = sweep::config::DEFAULT_CLAIMERS)]
    pub claimers: usize,
    /// Lease length in seconds (renewed every third of it).
    #[arg(long, env = "SWEEP_LEASE_SECS", default_value_t = sweep::config::DEFAULT_LEASE.as_secs())]
    pub lease_secs: u64,
    /// Poll interval in milliseconds, the backstop for NOTIFY wake-ups.
    #[arg(long, env = "SWEEP_POLL_MS", default_value_t = 1000)]
    pub poll_ms: u64,
    /// Seconds running tasks get to finish on SIGINT/SIGTERM before they are handed back.
    #[arg(long, env = "SWEEP_GRACE_SECS", default_value_t = sweep::config::DEFAULT_GRACE_PERIOD.as_secs())]
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
    /// Vacuum the live task table this often, in milliseconds (0: leave it to autovacuum).
    /// The table only holds live work, so this is cheap, and it keeps claims from walking
    /// past the index entries of tasks that already ran.
    #[arg(long, env = "SWEEP_VACUUM_MS", default_value_t = sweep::config::DEFAULT_VACUUM_INTERVAL.as_millis() as u64)]
    pub vacuum_ms: u64,
}

impl WorkerArgs {
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
            lease: Duration::from_secs(self.lease_secs),
            poll_interval: Duration::from_millis(self.poll_ms),
            grace_period: Duration::from_secs(self.grace_secs),
            task_types: self.task_types.clone(),
            sandbox: SandboxConfig {
                pooling: !self.no_pooling,
                max_concurrency: u32::try_from(self.concurrency.saturating_add(self.spare_slots))
                    .unwrap_or(u32::MAX),
                defaults,
                maxima,
                ..SandboxConfig::default()
            },
            maintenance: MaintenanceConfig {
                vacuum_interval: (self.vacuum_ms > 0)
                    .then(|| Duration::from_millis(self.vacuum_ms)),
                ..MaintenanceConfig::default()
            },
            ..WorkerConfig::default()
        }
    }
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = args.worker.to_config();
    config.validate().context("invalid runner settings")?;
    let pool = queue::connect(&args.db.database_url, pool_size(&config))
        .await
        .context("connecting to Postgres")?;
    let admin = (!args.no_admin).then_some(&args.admin);
    let runner = Runner::new(pool.clone(), config, admin).await?;
    let summary = runner.run(stop_on_signal()).await?;
    pool.close().await;
    println!("runner stopped: {} tasks claimed, {} handed back", summary.claimed, summary.released);
    Ok(())
}

/// Connections a runner's pool needs for `config`.
pub fn pool_size(config: &WorkerConfig) -> u32 {
    u32::try_from(config.concurrency / 4 + config.claimers + 4).unwrap_or(32)
}

/// A channel that turns `true` on SIGINT or SIGTERM. Listening starts at once, so a signal
/// that arrives while the caller is still starting up is not lost.
pub fn stop_on_signal() -> watch::Receiver<bool> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        worker::shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    stop_rx
}

/// A runner and, unless disabled, its admin API on a bound listener, both on one pool and
/// stopped by one signal. Built before anything runs, so a caller can learn the API's address
/// (and use the runner's sandbox) first.
pub struct Runner {
    worker: Worker,
    admin: Option<(tokio::net::TcpListener, AdminState)>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").field("admin_addr", &self.admin_addr()).finish_non_exhaustive()
    }
}

impl Runner {
    pub async fn new(
        pool: PgPool,
        config: WorkerConfig,
        admin: Option<&AdminServerArgs>,
    ) -> anyhow::Result<Runner> {
        config.validate().context("invalid runner settings")?;
        let worker = Worker::new(pool.clone(), config).context("starting the runner")?;
        let admin = match admin {
            None => None,
            Some(args) => {
                // Built before the runner starts, so the metrics recorder sees every task.
                let state = AdminState::new(pool, worker.sandbox().clone(), args.to_config())
                    .context("setting up the admin API")?;
                let listener = tokio::net::TcpListener::bind(args.admin_addr)
                    .await
                    .with_context(|| format!("binding the admin API to {}", args.admin_addr))?;
                Some((listener, state))
            }
        };
        Ok(Runner { worker, admin })
    }

    pub fn sandbox(&self) -> &Sandbox {
        self.worker.sandbox()
    }

    /// Where the admin API listens (the real port when asked for port 0).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|(listener, _)| listener.local_addr().ok())
    }

    /// Serves until `stop` turns true: then the runner stops claiming, lets running tasks
    /// finish within the grace period and hands the rest back, and the API finishes the
    /// requests in flight.
    pub async fn run(self, stop: watch::Receiver<bool>) -> anyhow::Result<WorkerSummary> {
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let admin = self.admin.map(|(listener, state)| {
            tokio::spawn(admin::serve_on(listener, state, stopped(stop.clone())))
        });
        let summary = self.worker.run(stopped(stop)).await?;
        if let Some(admin) = admin {
            admin.await.context("admin API task")?.context("admin API")?;
        }
        Ok(summary)
    }
}

/// Where `scripts/build-modules.sh` puts the Wasm modules.
pub fn default_modules_dir() -> PathBuf {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    target.join("wasm32-wasip1").join("wasm")
}
