//! Operator commands: `sweep admin` (serve the admin API alone) and `sweep tenant create|list`
//! work on the database itself; `sweep tenant weight|caps|rotate-token` go through the API
//! with the operator token. Also the admin API flags that `sweep run` shares.

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
    /// Largest task payload in bytes of compact JSON, for tenants without a limit of their
    /// own (`sweep tenant caps --max-payload-bytes`). A larger one is refused with 413
    /// `payload_too_large`.
    #[arg(long, env = "SWEEP_MAX_PAYLOAD_BYTES", default_value_t = admin::DEFAULT_MAX_PAYLOAD_BYTES)]
    pub max_payload_bytes: usize,
}

impl AdminServerArgs {
    pub fn to_config(&self) -> AdminConfig {
        AdminConfig {
            operator_token: self.operator_token.clone(),
            max_module_bytes: self.max_module_mb.saturating_mul(1 << 20),
            max_payload_bytes: self.max_payload_bytes,
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
    #[command(flatten)]
    pub compile: sweep::args::CompileArgs,
}

/// `sweep admin`: the API without a runner, until SIGINT/SIGTERM. Uploads are validated with
/// the built-in sandbox limits; each runner still caps limits by its own maxima.
pub async fn admin(args: AdminArgs) -> anyhow::Result<()> {
    let config =
        AdminConfig { secrets_key: crate::cli::secrets_key_from_env()?, ..args.server.to_config() };
    config.validate().context("invalid admin API settings")?;
    if config.operator_token.is_none() {
        tracing::warn!(
            "no operator token (SWEEP_OPERATOR_TOKEN): only tenant tokens can call the API"
        );
    }
    let store = args.db.admin_store(8).await?;
    let sandbox = Sandbox::new(SandboxConfig {
        pooling: false,
        compile: args.compile.to_limits(),
        compiler: crate::cli::child_compiler()?,
        ..SandboxConfig::default()
    })
    .context("starting the module validator")?;
    let state = AdminState::new(&store, sandbox, config)?;
    admin::serve(args.server.admin_addr, state, sweep::worker::shutdown_signal()).await?;
    store.close().await;
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
    /// Replace a tenant's API token (operator token; through the admin API): the old token
    /// stops working at once; the new one is printed once.
    RotateToken {
        name: String,
        #[command(flatten)]
        client: super::ClientArgs,
    },
    /// Pause every task type of a tenant (operator token; through the admin API): claims skip
    /// its work until `sweep tenant resume`; enqueues are still accepted.
    Pause {
        name: String,
        #[command(flatten)]
        client: super::ClientArgs,
    },
    /// Lift a tenant's pause (task types it paused itself stay paused).
    Resume {
        name: String,
        #[command(flatten)]
        client: super::ClientArgs,
    },
    /// Set or clear some of a tenant's caps (operator token; through the admin API). Caps not
    /// named keep their value; `none` clears one (no cap beyond the runner's maxima).
    Caps(TenantCapsArgs),
    /// Show a tenant's egress policy (the hosts its handlers may send HTTP requests to) and
    /// HTTP limits, or replace them with --allow / --none and the limit flags (operator token
    /// to change; through the admin API). Default for every tenant: nothing allowed.
    Egress(super::capabilities::EgressArgs),
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
    /// Largest task payload the tenant may enqueue, in bytes of compact JSON (default: the
    /// admin API's --max-payload-bytes).
    #[arg(long)]
    pub max_payload_bytes: Option<i64>,
    /// Largest result (stdout) a task of the tenant may write, in bytes (default: the
    /// runner's --output-bytes).
    #[arg(long)]
    pub max_result_bytes: Option<i64>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct TenantCapsArgs {
    pub name: String,
    /// Most tasks running at once across all runners (0 pauses the tenant), or `none`.
    #[arg(long, value_name = "N|none")]
    pub max_running: Option<Cap>,
    /// Largest module upload in bytes, or `none`.
    #[arg(long, value_name = "BYTES|none")]
    pub max_module_bytes: Option<Cap>,
    /// Most fuel a module may ask for, or `none`.
    #[arg(long, value_name = "F|none")]
    pub max_fuel: Option<Cap>,
    /// Longest timeout a module may ask for in milliseconds, or `none`.
    #[arg(long, value_name = "MS|none")]
    pub max_timeout_ms: Option<Cap>,
    /// Most memory a module may ask for in MiB, or `none`.
    #[arg(long, value_name = "MIB|none")]
    pub max_memory_mb: Option<Cap>,
    /// Largest task payload in bytes of compact JSON, or `none` (the deployment default).
    #[arg(long, value_name = "BYTES|none")]
    pub max_payload_bytes: Option<Cap>,
    /// Largest task result (stdout) in bytes, or `none` (the runner default).
    #[arg(long, value_name = "BYTES|none")]
    pub max_result_bytes: Option<Cap>,
    #[command(flatten)]
    pub client: super::ClientArgs,
}

/// A cap given on the command line: a number, or `none` to clear it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    Clear,
    Set(i64),
}

impl std::str::FromStr for Cap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(Cap::Clear);
        }
        s.parse::<i64>()
            .map(Cap::Set)
            .map_err(|_| format!("expected a whole number or `none`, got {s:?}"))
    }
}

impl Cap {
    fn to_json(self, scale: i64) -> anyhow::Result<serde_json::Value> {
        Ok(match self {
            Cap::Clear => serde_json::Value::Null,
            Cap::Set(v) => {
                json!(v.checked_mul(scale).ok_or_else(|| anyhow::anyhow!("{v} is too large"))?)
            }
        })
    }
}

/// The `PATCH /v1/tenants/{name}/caps` body for `args`: only the caps given.
fn caps_body(args: &TenantCapsArgs) -> anyhow::Result<serde_json::Value> {
    let mut body = serde_json::Map::new();
    for (field, cap, scale) in [
        ("max_running", args.max_running, 1),
        ("max_module_bytes", args.max_module_bytes, 1),
        ("max_fuel", args.max_fuel, 1),
        ("max_timeout_ms", args.max_timeout_ms, 1),
        ("max_memory_bytes", args.max_memory_mb, 1 << 20),
        ("max_payload_bytes", args.max_payload_bytes, 1),
        ("max_result_bytes", args.max_result_bytes, 1),
    ] {
        if let Some(cap) = cap {
            body.insert(field.to_owned(), cap.to_json(scale)?);
        }
    }
    if body.is_empty() {
        anyhow::bail!("name at least one cap to change (e.g. --max-running 4, --max-fuel none)");
    }
    Ok(serde_json::Value::Object(body))
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
        TenantCommand::Pause { name, client } => {
            super::flow::tenant_pause(&name, true, client).await
        }
        TenantCommand::Resume { name, client } => {
            super::flow::tenant_pause(&name, false, client).await
        }
        TenantCommand::RotateToken { name, client } => {
            let api = super::Api::new(client)?;
            let request = api.request(reqwest::Method::POST, &format!("/v1/tenants/{name}/token"));
            let answer = api.send(request).await?;
            if !api.printed_json(&answer) {
                println!("new token for tenant {}; the old one no longer works", name);
                println!("API token (shown once, store it now; only its hash is kept):");
                println!("  {}", print::cell(&answer["token"]));
            }
            Ok(())
        }
        TenantCommand::Egress(args) => super::capabilities::egress(args).await,
        TenantCommand::Caps(args) => {
            let body = caps_body(&args)?;
            let api = super::Api::new(args.client)?;
            let request = api
                .request(reqwest::Method::PATCH, &format!("/v1/tenants/{}/caps", args.name))
                .json(&body);
            let answer = api.send(request).await?;
            if !api.printed_json(&answer) {
                let cap = |field: &str| match &answer[field] {
                    serde_json::Value::Null => "-".to_owned(),
                    v => v.to_string(),
                };
                println!(
                    "tenant {}: max_running {}, max_module_bytes {}, max_fuel {}, \
                     max_timeout_ms {}, max_memory_bytes {}, max_payload_bytes {}, \
                     max_result_bytes {}",
                    print::cell(&answer["name"]),
                    cap("max_running"),
                    cap("max_module_bytes"),
                    cap("max_fuel"),
                    cap("max_timeout_ms"),
                    cap("max_memory_bytes"),
                    cap("max_payload_bytes"),
                    cap("max_result_bytes"),
                );
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
        max_payload_bytes: args.max_payload_bytes,
        max_result_bytes: args.max_result_bytes,
    };
    let store = args.db.admin_store(2).await?;
    let created = admin::create_tenant(&store, &args.name, &caps).await;
    store.close().await;
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
    let store = db.admin_store(2).await?;
    let created = admin::create_read_only_token(&store, &name).await;
    store.close().await;
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
    let store = db.admin_store(2).await?;
    let tenants = queue::list_tenants(&store).await;
    store.close().await;
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
                c.max_payload_bytes.map_or_else(|| "-".into(), |b| print::bytes(b.unsigned_abs())),
                c.max_result_bytes.map_or_else(|| "-".into(), |b| print::bytes(b.unsigned_abs())),
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
            "MAX_PAYLOAD",
            "MAX_RESULT",
            "CREATED",
        ],
        &rows,
    );
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        caps: TenantCapsArgs,
    }

    #[test]
    fn caps_send_only_what_was_named_and_none_clears() {
        let cli = Cli::try_parse_from([
            "t",
            "acme",
            "--max-running",
            "4",
            "--max-fuel",
            "none",
            "--max-memory-mb",
            "2",
            "--max-payload-bytes",
            "4096",
            "--max-result-bytes",
            "none",
            "--token",
            "x",
        ])
        .unwrap();
        let body = caps_body(&cli.caps).unwrap();
        assert_eq!(
            body,
            json!({"max_running": 4, "max_fuel": null, "max_memory_bytes": 2 * 1024 * 1024,
                   "max_payload_bytes": 4096, "max_result_bytes": null})
        );
        let cli = Cli::try_parse_from(["t", "acme", "--token", "x"]).unwrap();
        assert!(caps_body(&cli.caps).is_err(), "nothing to change is an error");
        assert!(Cli::try_parse_from(["t", "acme", "--max-fuel", "lots"]).is_err());
    }
}
