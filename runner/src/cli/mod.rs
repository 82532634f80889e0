//! The `sweep` command line: argument definitions and dispatch. Flags and environment are
//! parsed here, once, into the library's plain config structs.
//!
//! Server-side commands (`migrate`, `run`, `demo`, `dev`) talk to Postgres directly; client
//! commands (`tenant`, `module`, `enqueue`, `task`, `stats`, `dead`, `secret`, `usage`) talk
//! to the admin API.

mod client;
mod demo;
mod demo_mail;
mod dev;
mod local_pg;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "sweep",
    version,
    about = "Background jobs in Postgres, each run as a sandboxed WebAssembly module"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Args)]
pub struct DatabaseArgs {
    /// Postgres connection string. Only `sweep migrate` (and the demo) creates the database
    /// and its schema; every other command needs it migrated.
    #[arg(long, env = "DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/sweep")]
    pub database_url: String,
    /// The database URL goes through a transaction pooler (PgBouncer with
    /// `pool_mode = transaction`): every statement then runs unnamed in a transaction of its
    /// own, and runners LISTEN only on --listen-url (without it they poll). `sweep migrate`
    /// needs a direct connection: it uses --listen-url, or refuses.
    #[arg(long, env = "SWEEP_DATABASE_POOLED")]
    pub pooled: bool,
}

impl DatabaseArgs {
    /// How stores open the database URL (no listen URL: that is the runner's).
    pub fn store_options(&self) -> sweep::queue::StoreOptions {
        sweep::queue::StoreOptions { pooled: self.pooled, listen: None }
    }

    /// The admin store of the operator commands, with `connections`.
    pub async fn admin_store(&self, connections: u32) -> anyhow::Result<sweep::queue::Store> {
        use anyhow::Context;
        self.store_options()
            .open(&self.database_url, sweep::queue::Role::Admin, connections)
            .await
            .context("opening the database")
    }
}

#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// With --pooled: a direct connection to the same database (the one runners LISTEN on),
    /// which the migrations run through instead of the pooler.
    #[arg(long, env = "SWEEP_LISTEN_URL")]
    pub listen_url: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the database if needed and bring the Sweep schema up to date.
    Migrate(MigrateArgs),
    /// Run a runner: claim tasks and execute their modules until SIGINT/SIGTERM.
    Run(serve::RunArgs),
    /// Register the example modules, enqueue work, run it and show what happened.
    Demo(demo::DemoArgs),
    /// Start Postgres (unless given a URL), a runner, the admin API and the dashboard, with
    /// the example modules registered for tenant `dev`; print the URLs and a token.
    Dev(dev::DevArgs),
    /// Serve the admin API alone (no runner) until SIGINT/SIGTERM.
    Admin(client::AdminArgs),
    /// Create or list tenants (operator; talks to Postgres directly).
    #[command(subcommand)]
    Tenant(client::TenantCommand),
    /// Upload, list and activate handler modules.
    #[command(subcommand)]
    Module(client::ModuleCommand),
    /// Enqueue a task.
    Enqueue(client::EnqueueArgs),
    /// Show or cancel a task.
    #[command(subcommand)]
    Task(client::TaskCommand),
    /// Create, list, pause, resume and delete cron schedules.
    #[command(subcommand)]
    Schedule(client::ScheduleCommand),
    /// Create, show, list and cancel workflows (steps with dependencies).
    #[command(subcommand)]
    Workflow(client::WorkflowCommand),
    /// Queue statistics per task type, and the runners.
    Stats(client::StatsArgs),
    /// List or requeue dead tasks.
    #[command(subcommand)]
    Dead(client::DeadCommand),
    /// Flow control of a task type: pause, resume.
    #[command(subcommand)]
    Queue(client::QueueCommand),
    /// Set, list and delete tenant secrets (handlers get the ones their module names as
    /// environment variables).
    #[command(subcommand)]
    Secret(client::SecretCommand),
    /// What tasks used (attempts, wall time, fuel, memory, HTTP), per tenant, task type and day.
    Usage(client::UsageArgs),
    /// Internal: compile the module on stdin to stdout under a CPU and memory budget (the
    /// runner and the admin API start this for every compile).
    #[command(name = "compile-module", hide = true)]
    CompileModule(CompileModuleArgs),
}

#[derive(Debug, clap::Args)]
pub struct CompileModuleArgs {
    /// RLIMIT_CPU, in seconds.
    #[arg(long)]
    pub cpu_secs: u64,
    /// RLIMIT_AS, in bytes.
    #[arg(long)]
    pub memory_bytes: u64,
}

/// The key tenant secrets are sealed under, from `SWEEP_SECRETS_KEY` (the environment only: an
/// argument would show in `ps`). Unset or empty: none.
pub fn secrets_key_from_env() -> anyhow::Result<Option<sweep::secrets::SecretsKey>> {
    use sweep::secrets::{SecretsKey, KEY_ENV};
    match std::env::var(KEY_ENV) {
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => Ok(Some(SecretsKey::parse(&text)?)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => anyhow::bail!(sweep::secrets::BadKey),
    }
}

/// Where this binary compiles modules: in a child process of itself.
pub fn child_compiler() -> anyhow::Result<sweep::sandbox::CompilerKind> {
    use anyhow::Context;
    let program =
        std::env::current_exe().context("finding this executable to compile modules with")?;
    Ok(sweep::sandbox::CompilerKind::Child { program })
}

pub async fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate(args) => serve::migrate(args).await,
        Command::Run(args) => serve::run(args).await,
        Command::Demo(args) => demo::demo(args).await,
        Command::Dev(args) => dev::dev(args).await,
        Command::Admin(args) => client::admin(args).await,
        Command::Tenant(command) => client::tenant(command).await,
        Command::Module(command) => client::module(command).await,
        Command::Enqueue(args) => client::enqueue(args).await,
        Command::Task(command) => client::task(command).await,
        Command::Schedule(command) => client::schedule(command).await,
        Command::Workflow(command) => client::workflow(command).await,
        Command::Stats(args) => client::stats(args).await,
        Command::Dead(command) => client::dead(command).await,
        Command::Queue(command) => client::queue(command).await,
        Command::Secret(command) => client::secret(command).await,
        Command::Usage(args) => client::usage(args).await,
        // main runs it before any runtime starts; here only for completeness.
        Command::CompileModule(args) => std::process::exit(sweep::sandbox::compile_module_main(
            args.cpu_secs,
            args.memory_bytes,
        )),
    }
}
