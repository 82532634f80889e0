//! Server-side commands: `migrate`, `run` and `demo`. They talk to Postgres directly.

use anyhow::Context;
use sweep::{
    admin::{self, AdminState},
    queue::{self, Role, Store},
    worker::{self, Worker},
};

use tokio::sync::watch;

use super::{client::AdminServerArgs, DatabaseArgs};
pub use sweep::args::{default_modules_dir, WorkerArgs};

pub async fn migrate(db: DatabaseArgs) -> anyhow::Result<()> {
    let done = queue::migrate(&db.database_url).await.context("migrating")?;
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

/// Connections of the admin API served next to a runner.
const ADMIN_CONNECTIONS: u32 = 4;

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = args.worker.to_config();
    config.validate().context("invalid runner settings")?;
    let connections = u32::try_from(config.concurrency / 4 + config.claimers + 4).unwrap_or(32);
    let store = Store::open(&args.db.database_url, Role::Runner, connections)
        .await
        .context("opening the database")?;
    let worker = Worker::new(&store, config).context("starting the runner")?;

    // One signal stops both the runner and its admin API.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        worker::shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let admin = if args.no_admin {
        None
    } else {
        // Built before the runner starts, so the metrics recorder sees every task. The API
        // has connections of its own: its reads never wait for the runner's.
        let admin_store = Store::open(&args.db.database_url, Role::Admin, ADMIN_CONNECTIONS)
            .await
            .context("opening the database for the admin API")?;
        let state = AdminState::new(&admin_store, worker.sandbox().clone(), args.admin.to_config())
            .context("setting up the admin API")?;
        let listener = tokio::net::TcpListener::bind(args.admin.admin_addr)
            .await
            .with_context(|| format!("binding the admin API to {}", args.admin.admin_addr))?;
        tracing::info!(addr = %args.admin.admin_addr, "admin API listening");
        Some(tokio::spawn(admin::serve_on(listener, state, stopped(stop_rx.clone()))))
    };
    let summary = worker.run(stopped(stop_rx)).await?;
    if let Some(admin) = admin {
        admin.await.context("admin API task")?.context("admin API")?;
    }
    store.close().await;
    println!("runner stopped: {} tasks claimed, {} handed back", summary.claimed, summary.released);
    Ok(())
}
