//! Server-side commands: `migrate` and `run`, and the [`Runner`] (a runner with its admin
//! API) that `run` and `dev` serve. They talk to Postgres directly.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context;
use sweep::{
    admin::{self, AdminState},
    config::WorkerConfig,
    queue::{self, Role, Store, StoreError, StoreOptions},
    sandbox::Sandbox,
    worker::{self, Worker, WorkerSummary},
};

use tokio::sync::watch;

use super::{client::AdminServerArgs, DatabaseArgs, MigrateArgs};
pub use sweep::args::{default_components_dir, default_modules_dir, WorkerArgs};

pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let url = match (args.db.pooled, args.listen_url.as_deref().filter(|url| !url.is_empty())) {
        (false, _) => args.db.database_url.as_str(),
        (true, Some(direct)) => {
            eprintln!(
                "migrating through the listen URL (--listen-url): migrations need a direct \
                 connection, not the transaction pooler the database URL goes through"
            );
            direct
        }
        (true, None) => anyhow::bail!(
            "sweep migrate cannot run through a transaction pooler (--pooled, \
             SWEEP_DATABASE_POOLED): the migrator holds a session advisory lock across the \
             migrations and they need search_path set at connect, neither of which a pooler \
             keeps. Give --listen-url (SWEEP_LISTEN_URL) a direct URL to the same database, or \
             run it with DATABASE_URL pointing at Postgres itself and without --pooled"
        ),
    };
    let done = queue::migrate(url).await.context("migrating")?;
    if done.database_created {
        println!("created the database");
    }
    match done.applied.as_slice() {
        [] => println!("the schema is up to date"),
        applied => println!(
            "applied migrations {}",
            applied.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
        ),
    }
    println!("installed the SQL functions (sha256 {})", &done.functions_sha256[..12]);
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

/// The runner settings of `args`, compiling modules in child processes of this binary.
pub fn worker_config(args: &WorkerArgs) -> anyhow::Result<WorkerConfig> {
    let mut config = args.to_config();
    config.sandbox.compiler = super::child_compiler()?;
    config.secrets_key = super::secrets_key_from_env()?;
    Ok(config)
}

/// Connections of the admin API served next to a runner: four for requests, and one that the
/// first `GET /v1/tasks/{id}?wait=` keeps for its LISTEN (`admin/wait.rs`).
const ADMIN_CONNECTIONS: u32 = 5;

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = worker_config(&args.worker)?;
    config.validate().context("invalid runner settings")?;
    let admin = (!args.no_admin).then_some(&args.admin);
    let listen = args.worker.listen_options().context("invalid --listen-url (SWEEP_LISTEN_URL)")?;
    let connect = StoreOptions { listen, ..args.db.store_options() };
    let runner = Runner::new(&args.db.database_url, &connect, config, admin).await?;
    let summary = runner.run(stop_on_signal()).await?;
    println!("runner stopped: {} tasks claimed, {} handed back", summary.claimed, summary.released);
    Ok(())
}

/// Opens a store, waiting while the server cannot be reached: a runner (re)started during a
/// Postgres outage comes up when the database does, as a running one rides the outage out.
/// Any other failure (a bad URL, a refused login, a schema to migrate) is returned at once.
async fn open_waiting(
    options: &StoreOptions,
    url: &str,
    role: Role,
    connections: u32,
) -> Result<Store, StoreError> {
    let pause = Duration::from_secs(1);
    queue::while_unreachable(pause, StoreError::is_unreachable, || {
        options.open(url, role, connections)
    })
    .await
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

/// A runner and, unless disabled, its admin API on a bound listener, each on a store of its
/// own role, stopped by one signal. Built before anything runs, so a caller can learn the API's address
/// (and use the runner's sandbox) first.
pub struct Runner {
    store: Store,
    worker: Worker,
    admin: Option<(tokio::net::TcpListener, AdminState, Store)>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").field("admin_addr", &self.admin_addr()).finish_non_exhaustive()
    }
}

impl Runner {
    /// Opens the database at `url` (which must be migrated) as `connect` says for the runner
    /// and, with `admin`, once more for the API (without the listen URL), so its reads never
    /// wait for the runner's connections.
    pub async fn new(
        url: &str,
        connect: &StoreOptions,
        config: WorkerConfig,
        admin: Option<&AdminServerArgs>,
    ) -> anyhow::Result<Runner> {
        config.validate().context("invalid runner settings")?;
        let secrets_key = config.secrets_key.clone();
        let store = open_waiting(connect, url, Role::Runner, pool_size(&config))
            .await
            .context("opening the database")?;
        let worker = Worker::new(&store, config).context("starting the runner")?;
        let admin = match admin {
            None => None,
            Some(args) => {
                let admin_connect = StoreOptions { listen: None, ..connect.clone() };
                let admin_store = open_waiting(&admin_connect, url, Role::Admin, ADMIN_CONNECTIONS)
                    .await
                    .context("opening the database for the admin API")?;
                // The API seals secrets under the key the runner opens them with.
                let config = admin::AdminConfig { secrets_key, ..args.to_config() };
                // Built before the runner starts, so the metrics recorder sees every task.
                let state = AdminState::for_runner(
                    &admin_store,
                    worker.sandbox().clone(),
                    worker.modules().clone(),
                    config,
                )
                .context("setting up the admin API")?;
                let listener = tokio::net::TcpListener::bind(args.admin_addr)
                    .await
                    .with_context(|| format!("binding the admin API to {}", args.admin_addr))?;
                Some((listener, state, admin_store))
            }
        };
        Ok(Runner { store, worker, admin })
    }

    /// The runner's store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn sandbox(&self) -> &Sandbox {
        self.worker.sandbox()
    }

    /// Where the admin API listens (the real port when asked for port 0).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|(listener, _, _)| listener.local_addr().ok())
    }

    /// Serves until `stop` turns true: then the runner stops claiming, lets running tasks
    /// finish within the grace period and hands the rest back, and the API finishes the
    /// requests in flight.
    pub async fn run(self, stop: watch::Receiver<bool>) -> anyhow::Result<WorkerSummary> {
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let admin = self.admin.map(|(listener, state, store)| {
            (tokio::spawn(admin::serve_on(listener, state, stopped(stop.clone()))), store)
        });
        let summary = self.worker.run(stopped(stop)).await?;
        if let Some((admin, store)) = admin {
            admin.await.context("admin API task")?.context("admin API")?;
            store.close().await;
        }
        self.store.close().await;
        Ok(summary)
    }
}
