//! Operator commands that need the database itself rather than the API: `sweep admin`
//! (serve the admin API alone) and `sweep tenant create|list`. Also the admin API flags that
//! `sweep run` shares.

use std::net::SocketAddr;

use anyhow::Context;
use serde_json::json;
use sweep::admin::{self, AdminConfig, AdminState};
use sweep::queue::{self, TenantCaps};
use sweep::sandbox::{Sandbox, SandboxConfig};

use super::print;
use crate::cli::DatabaseArgs;

/// Admin API settings, for `sweep admin` (and `sweep run`, which serves the API too).
#[derive(Debug, clap::Args)]
pub struct AdminServerArgs {
    /// Address the admin API listens on.
    #[arg(long, env = "SWEEP_ADMIN_ADDR", default_value = admin::DEFAULT_ADDR)]
    pub admin_addr: SocketAddr,
    /// Bearer token that acts as the operator: every tenant, `?tenant=`, `/metrics`. Without
    /// one, only tenant tokens get in. At least 16 characters.
    #[arg(long, env = "SWEEP_OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: Option<String>,
    /// Largest module upload in MiB (tenants may be capped lower).
    #[arg(long, env = "SWEEP_MAX_MODULE_MB", default_value_t = admin::DEFAULT_MAX_MODULE_BYTES >> 20)]
    pub max_module_mb: usize,
}

impl AdminServerArgs {
    pub fn to_config(&self) -> AdminConfig {
        AdminConfig {
            operator_token: self.operator_token.clone(),
            max_module_bytes: self.max_module_mb.saturating_mul(1 << 20),
            ..AdminConfig::default()
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct AdminArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub server: AdminServerArgs,
}

/// `sweep admin`: the API without a runner, until SIGINT/SIGTERM. Uploads are validated with
/// the built-in sandbox limits; each runner still caps limits by its own maxima.
pub async fn admin(args: AdminArgs) -> anyhow::Result<()> {
    let config = args.server.to_config();
    config.validate().context("invalid admin API settings")?;
    if config.operator_token.is_none() {
        tracing::warn!(
            "no operator token (SWEEP_OPERATOR_TOKEN): only tenant tokens can call the API"
        );
    }
    let pool = queue::connect(&args.db.database_url, 8).await.context("connecting to Postgres")?;
    let sandbox = Sandbox::new(SandboxConfig { pooling: false, ..SandboxConfig::default() })
        .context("starting the module validator")?;
    let state = AdminState::new(pool.clone(), sandbox, config)?;
    admin::serve(args.server.admin_addr, state, sweep::worker::shutdown_signal()).await?;
    pool.close().await;
    Ok(())
}

#[derive(Debug, clap::Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its API token (shown once; only a hash is stored).
    Create(TenantCreateArgs),
    /// Set a tenant's fair-share weight (operator token; through the admin API): a tenant with
    /// weight 2 gets twice the slots of a weight-1 tenant while both have due work.
    Weight {
        name: String,
        /// 1 to 10000 (default for every tenant: 1).
        weight: i32,
        #[command(flatten)]
        client: super::ClientArgs,
    },
    /// Create an extra token for a tenant and print it (shown once; talks to Postgres
    /// directly). Only read-only tokens exist: they see everything the tenant sees, in the API
    /// (GET routes) and the dashboard, and change nothing (403 `read_only`).
    Token {
        name: String,
        /// Required: the token may read but not change anything.
        #[arg(long, required = true)]
        read_only: bool,
        #[command(flatten)]
        db: DatabaseArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List tenants, their weights and caps.
    List {
        #[command(flatten)]
        db: DatabaseArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct TenantCreateArgs {
    /// Tenant name: letters, digits, '.', '-', '_' (at most 64).
    pub name: String,
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Most tasks of this tenant running at once across all runners (0 pauses it).
    #[arg(long)]
    pub max_running: Option<i32>,
    /// Largest module the tenant may upload, in bytes.
    #[arg(long)]
    pub max_module_bytes: Option<i64>,
    /// Most fuel a module of this tenant may ask for.
    #[arg(long)]
    pub max_fuel: Option<i64>,
    /// Longest timeout a module of this tenant may ask for, in milliseconds.
    #[arg(long)]
    pub max_timeout_ms: Option<i64>,
    /// Most memory a module of this tenant may ask for, in MiB.
    #[arg(long)]
    pub max_memory_mb: Option<i64>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub async fn tenant(command: TenantCommand) -> anyhow::Result<()> {
    match command {
        TenantCommand::Create(args) => create(args).await,
        TenantCommand::List { db, json } => list(db, json).await,
        TenantCommand::Token { name, read_only: _, db, json } => {
            read_only_token(name, db, json).await
        }
        TenantCommand::Weight { name, weight, client } => {
            let api = super::Api::new(client)?;
            let request = api
                .request(reqwest::Method::PUT, &format!("/v1/tenants/{name}/weight"))
                .json(&json!({ "weight": weight }));
            let answer = api.send(request).await?;
            if !api.printed_json(&answer) {
                println!("tenant {}: weight {}", print::cell(&answer["name"]), answer["weight"]);
            }
            Ok(())
        }
    }
}

async fn create(args: TenantCreateArgs) -> anyhow::Result<()> {
    let caps = TenantCaps {
        max_module_bytes: args.max_module_bytes,
        max_fuel: args.max_fuel,
        max_timeout_ms: args.max_timeout_ms,
        max_memory_bytes: args.max_memory_mb.map(|mb| mb.saturating_mul(1 << 20)),
        max_running: args.max_running,
    };
    let pool = queue::connect(&args.db.database_url, 2).await.context("connecting to Postgres")?;
    let created = admin::create_tenant(&pool, &args.name, &caps).await;
    pool.close().await;
    let (tenant, token) = created.with_context(|| format!("creating tenant {:?}", args.name))?;
    if args.json {
        println!("{}", print::pretty(&json!({"tenant": tenant, "token": token})));
    } else {
        println!("created tenant {}", tenant.name);
        println!("API token (shown once, store it now; only its hash is kept):");
        println!("  {token}");
    }
    Ok(())
}

async fn read_only_token(name: String, db: DatabaseArgs, json: bool) -> anyhow::Result<()> {
    let pool = queue::connect(&db.database_url, 2).await.context("connecting to Postgres")?;
    let created = admin::create_read_only_token(&pool, &name).await;
    pool.close().await;
    let token = created.with_context(|| format!("creating a read-only token for {name:?}"))?;
    if json {
        println!("{}", print::pretty(&json!({"tenant": name, "read_only": true, "token": token})));
    } else {
        println!(
            "read-only token for tenant {name} (shown once, store it now; only its hash is kept):"
        );
        println!("  {token}");
    }
    Ok(())
}

async fn list(db: DatabaseArgs, json: bool) -> anyhow::Result<()> {
    let pool = queue::connect(&db.database_url, 2).await.context("connecting to Postgres")?;
    let tenants = queue::list_tenants(&pool).await;
    pool.close().await;
    let tenants = tenants.context("listing tenants")?;
    if json {
        println!("{}", print::pretty(&json!({ "tenants": tenants })));
        return Ok(());
    }
    let opt = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    let rows: Vec<Vec<String>> = tenants
        .iter()
        .map(|t| {
            let c = &t.caps;
            vec![
                t.name.clone(),
                t.weight.to_string(),
                opt(c.max_running.map(i64::from)),
                c.max_module_bytes.map_or_else(|| "-".into(), |b| print::bytes(b.unsigned_abs())),
                opt(c.max_fuel),
                opt(c.max_timeout_ms),
                c.max_memory_bytes.map_or_else(|| "-".into(), |b| print::bytes(b.unsigned_abs())),
                t.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            ]
        })
        .collect();
    print::table(
        &[
            "NAME",
            "WEIGHT",
            "MAX_RUNNING",
            "MAX_MODULE",
            "MAX_FUEL",
            "MAX_TIMEOUT_MS",
            "MAX_MEMORY",
            "CREATED",
        ],
        &rows,
    );
    Ok(())
}
