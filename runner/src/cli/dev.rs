//! `sweep dev`: everything a developer needs in one command. Without a database URL it starts
//! a Postgres server of its own (`local_pg`), then migrates, serves a runner with the admin
//! API, registers the example modules for tenant `dev` and prints the dashboard URL, the API
//! URL and the tenant's token.
//!
//! Invariants:
//! - on SIGINT/SIGTERM the runner stops first (gracefully, as `sweep run` does), then the
//!   server; a throwaway data directory is removed last, a kept one (`--keep`) stays;
//! - the token is new on every start (only its hash is stored, so a kept tenant gets a fresh
//!   one and the previous run's stops working);
//! - if the embedded server exits on its own, the runner is stopped and the command fails.

use std::path::PathBuf;

use anyhow::Context;
use sweep::{
    admin,
    queue::{self, StoreOptions, TenantCaps, TenantError},
};

use super::{
    client::AdminServerArgs,
    demo,
    demo_mail::{self, DemoMail},
    local_pg::{LocalPgArgs, LocalPostgres},
    serve::{self, default_components_dir, default_modules_dir, Runner, WorkerArgs},
};

/// The tenant `sweep dev` registers the examples for and prints a token of.
pub const DEV_TENANT: &str = "dev";
/// The database `sweep dev` uses on its embedded server.
const DEV_DATABASE: &str = "sweep";

#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// Use this Postgres instead of starting one (the database is created if missing).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Keep the embedded server's data for the next `sweep dev --keep` (default: a throwaway
    /// server, removed on exit).
    #[arg(long)]
    pub keep: bool,
    #[command(flatten)]
    pub local: LocalPgArgs,
    /// Where the built example modules are (see scripts/build-modules.sh).
    #[arg(long, default_value_os_t = default_modules_dir())]
    pub modules_dir: PathBuf,
    /// Where the built WASI 0.2 components are (`send-email.wasm`, for `--demo`).
    #[arg(long, default_value_os_t = default_components_dir())]
    pub components_dir: PathBuf,
    /// Also enqueue the demo's tasks for tenant `dev` (one that retries, one that runs away,
    /// some that end in the dead-letter table, an email sent through a stand-in mail API on
    /// loopback), to watch in the dashboard.
    #[arg(long)]
    pub demo: bool,
    #[command(flatten)]
    pub worker: WorkerArgs,
    #[command(flatten)]
    pub admin: AdminServerArgs,
}

pub async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let stop = serve::stop_on_signal();
    let given = args.database_url.clone().filter(|u| !u.is_empty());
    let Some(url) = given else {
        let pg = LocalPostgres::start(&args.local, args.keep)
            .await
            .context("starting Postgres (or pass --database-url / DATABASE_URL)")?;
        if *stop.borrow() {
            return pg.stop().await.context("stopping Postgres");
        }
        let served = serve_dev(&args, &pg.url(DEV_DATABASE), Some(&pg), stop).await;
        let stopped = pg.stop().await.context("stopping Postgres");
        if served.is_ok() && stopped.is_ok() {
            println!("sweep dev stopped");
        }
        return served.and(stopped);
    };
    if args.keep {
        tracing::warn!("--keep applies to the embedded server; the data stays in {url}");
    }
    serve_dev(&args, &url, None, stop).await
}

async fn serve_dev(
    args: &DevArgs,
    url: &str,
    pg: Option<&LocalPostgres>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut config = serve::worker_config(&args.worker)?;
    // Without one given, a key for this session only: secrets set now cannot be opened by a
    // later session with another key (their tasks then fail as secrets_unavailable, saying so).
    let secrets_key =
        config.secrets_key.get_or_insert_with(|| sweep::secrets::SecretsKey::generate().0).clone();
    queue::migrate(url).await.context("migrating the database")?;
    let listen = args.worker.listen_options().context("invalid --listen-url (SWEEP_LISTEN_URL)")?;
    let connect = StoreOptions { listen, ..StoreOptions::default() };
    let runner = Runner::new(url, &connect, config, Some(&args.admin)).await?;
    let pool = runner.store().pool().clone();
    let token = dev_token(&pool).await?;
    let mut registered = Vec::new();
    let mut missing = Vec::new();
    for (task_type, file, settings) in demo::modules() {
        let path = args.modules_dir.join(format!("{file}.wasm"));
        if !path.is_file() {
            missing.push(path);
            continue;
        }
        demo::register_example(&pool, runner.sandbox(), DEV_TENANT, task_type, &path, &settings)
            .await?;
        registered.push(task_type);
    }

    // Lives as long as the runner: the demo's email task posts to it.
    let mut mail = None;
    let mut demo_tasks = 0;
    if args.demo {
        let path = args.components_dir.join("send-email.wasm");
        if path.is_file() {
            let server = DemoMail::start().await?;
            server.register(&pool, runner.sandbox(), &secrets_key, DEV_TENANT, &path).await?;
            registered.push(demo_mail::TASK_TYPE);
            mail = Some(server);
        } else {
            missing.push(path);
        }
        let work: Vec<queue::NewTask> = demo::tasks()
            .into_iter()
            .chain(mail.as_ref().map(DemoMail::task))
            .map(|t| t.tenant(DEV_TENANT))
            .collect();
        queue::enqueue_many(&pool, &work).await.context("enqueueing the demo's tasks")?;
        demo_tasks = work.len();
    }

    let addr = runner.admin_addr().context("the admin API has no address")?;
    println!("sweep dev is up (Ctrl-C stops it)");
    println!("  dashboard  http://{addr}/ui");
    println!("  api        http://{addr}/v1");
    println!("  token      {token}");
    println!("  tenant     {DEV_TENANT}");
    match pg {
        Some(pg) => {
            let fate = if pg.keeps_data() {
                "kept for the next `sweep dev --keep`"
            } else {
                "removed on exit"
            };
            println!(
                "  database   {url} (Postgres {}, data in {}, {fate})",
                pg.version(),
                pg.data_dir().display()
            );
        }
        None => println!("  database   {}", redact(url)),
    }
    println!(
        "  modules    {}",
        if registered.is_empty() { "-".into() } else { registered.join(" ") }
    );
    if !missing.is_empty() {
        println!(
            "  (not built: {}; run scripts/build-modules.sh and restart)",
            missing.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    if demo_tasks > 0 {
        println!("  demo       {demo_tasks} tasks enqueued: watch them run, retry and die on the dashboard");
    }
    if let Some(mail) = &mail {
        println!("  mail       {} (stand-in mail API; tenant dev's egress allows it)", mail.url());
    }
    println!("try:");
    println!("  export SWEEP_URL=http://{addr} SWEEP_TOKEN={token}");
    println!("  sweep enqueue wordcount '{{\"text\": \"a b a\"}}' && sweep stats");

    // A server that goes away on its own stops the runner too, instead of leaving it
    // retrying connections forever.
    let (stop_runner, runner_stop) = tokio::sync::watch::channel(false);
    let run = runner.run(runner_stop);
    tokio::pin!(run);
    let mut died = false;
    let summary = tokio::select! {
        summary = &mut run => summary,
        signalled = stop.wait_for(|s| *s) => {
            drop(signalled);
            let _ = stop_runner.send(true);
            run.await
        }
        () = server_exit(pg) => {
            died = true;
            let _ = stop_runner.send(true);
            run.await
        }
    };
    queue::close_pool(&pool).await;
    drop(mail);
    let summary = summary?;
    println!("runner stopped: {} tasks claimed, {} handed back", summary.claimed, summary.released);
    if died {
        anyhow::bail!("the embedded Postgres server exited on its own");
    }
    Ok(())
}

async fn server_exit(pg: Option<&LocalPostgres>) {
    match pg {
        Some(pg) => pg.exited().await,
        None => std::future::pending().await,
    }
}

/// Creates tenant `dev`, or gives it a new token if it exists (a kept or shared database).
async fn dev_token(pool: &sqlx::PgPool) -> anyhow::Result<String> {
    match admin::create_tenant(pool, DEV_TENANT, &TenantCaps::default()).await {
        Ok((_, token)) => Ok(token),
        Err(TenantError::Exists(_)) => Ok(admin::rotate_token(pool, DEV_TENANT)
            .await
            .context("giving tenant dev a new token")?
            .1),
        Err(e) => Err(e).context("creating tenant dev"),
    }
}

/// `url` without its password, for printing.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://h/db"), "postgres://h/db");
    }
}
