//! `sweep demo`: the README's main job. Against a fresh Postgres database it registers the
//! example modules, enqueues real work plus a few misbehaving tasks, runs a runner until every
//! task has settled, and prints what happened to each (results, retries, dead letters).
//! Without a database URL it runs on a throwaway server of its own (see `local_pg`).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use sqlx::{migrate::MigrateDatabase, Postgres};
use sweep::{
    queue::{self, ModuleSettings, NewTask, Registered, Role, Store, TaskState, TaskView},
    sandbox::{sha256_hex, Sandbox},
    secrets::SecretsKey,
    worker::Worker,
};
use tokio::sync::oneshot;

use super::demo_mail::{self, DemoMail};
use super::local_pg::{LocalPgArgs, LocalPostgres};
use super::serve::{default_components_dir, default_modules_dir, WorkerArgs};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// The demo's own database, dropped and created afresh on every run (e.g.
    /// postgres://postgres@127.0.0.1:5432/sweep_demo). Without one, the demo starts a
    /// throwaway Postgres server from the binaries installed here and removes it afterwards.
    #[arg(long, env = "SWEEP_DEMO_DATABASE_URL")]
    pub database_url: Option<String>,
    #[command(flatten)]
    pub local: LocalPgArgs,
    /// Where the built Wasm modules are (see scripts/build-modules.sh).
    #[arg(long, default_value_os_t = default_modules_dir())]
    pub modules_dir: PathBuf,
    /// Where the built WASI 0.2 components are (`send-email.wasm`; scripts/build-modules.sh).
    #[arg(long, default_value_os_t = default_components_dir())]
    pub components_dir: PathBuf,
    #[command(flatten)]
    pub worker: WorkerArgs,
}

/// The example modules: (task type, module file name without `.wasm`, registry settings).
pub fn modules() -> Vec<(&'static str, &'static str, ModuleSettings)> {
    let quick_retry = ModuleSettings {
        backoff_base_ms: Some(100),
        backoff_cap_ms: Some(1000),
        ..Default::default()
    };
    vec![
        ("wordcount", "wordcount", ModuleSettings::default()),
        ("checksum", "checksum", ModuleSettings::default()),
        ("template", "template", ModuleSettings::default()),
        ("flaky", "flaky", quick_retry),
        ("permanent", "permanent", ModuleSettings::default()),
        (
            "runaway",
            "spinloop",
            // Fuel far above what 300 ms can burn: the wall-clock limit stops it.
            ModuleSettings {
                fuel: Some(100_000_000_000),
                timeout_ms: Some(300),
                max_attempts: Some(2),
                ..quick_retry
            },
        ),
    ]
}

pub fn tasks() -> Vec<NewTask> {
    vec![
        NewTask::new(
            "wordcount",
            json!({"text": "the quick brown fox jumps over the lazy dog; the dog sleeps", "top": 2}),
        ),
        NewTask::new("checksum", json!({"data": "hello, sweep", "algorithm": "sha256"})),
        NewTask::new(
            "template",
            json!({"template": "Dear {{name}}, order #{{order}} has shipped.",
                   "vars": {"name": "Ada", "order": 1815}}),
        ),
        NewTask::new("template", json!({"template": "Hello {{name}}", "vars": {}})),
        NewTask::new("flaky", json!({"fail_times": 2})),
        NewTask::new("permanent", json!({})),
        NewTask::new("runaway", json!({})),
        NewTask::new("no-such-module", json!({})).max_attempts(1),
    ]
}

pub async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    if let Some(url) = args.database_url.as_deref().filter(|u| !u.is_empty()) {
        return run_demo(&args, url).await;
    }
    let pg = LocalPostgres::start(&args.local, false)
        .await
        .context("starting a Postgres server for the demo (or pass --database-url)")?;
    println!(
        "== started Postgres {} on {} (data in {}, removed afterwards)",
        pg.version(),
        pg.url("sweep_demo"),
        pg.data_dir().display(),
    );
    let url = pg.url("sweep_demo");
    let result = tokio::select! {
        result = run_demo(&args, &url) => result,
        () = sweep::worker::shutdown_signal() => Err(anyhow::anyhow!("interrupted")),
    };
    let stopped = pg.stop().await.context("stopping the demo's Postgres server");
    result.and(stopped)
}

async fn run_demo(args: &DemoArgs, url: &str) -> anyhow::Result<()> {
    if Postgres::database_exists(url).await.context("reaching Postgres")? {
        Postgres::drop_database(url).await.context("dropping the previous demo database")?;
    }
    queue::migrate(url).await.context("creating the demo database")?;
    let store = Store::open(url, Role::Runner, 8).await.context("opening the demo database")?;
    let pool = store.pool().clone();
    let mut config = super::serve::worker_config(&args.worker)?;
    let secrets_key = config.secrets_key.get_or_insert_with(|| SecretsKey::generate().0).clone();
    let worker = Worker::new(&store, config).context("starting the runner")?;

    println!("== registering modules from {}", args.modules_dir.display());
    for (task_type, file, settings) in modules() {
        let path = args.modules_dir.join(format!("{file}.wasm"));
        let (reg, size) = register_example(
            &pool,
            worker.sandbox(),
            queue::DEFAULT_TENANT,
            task_type,
            &path,
            &settings,
        )
        .await?;
        println!(
            "  {task_type:<10} v{} sha256 {}… {:>4} KiB  {}",
            reg.module.version,
            &reg.module.sha256[..12.min(reg.module.sha256.len())],
            size / 1024,
            describe_settings(&settings)
        );
    }

    let mail = DemoMail::start().await?;
    let component = args.components_dir.join("send-email.wasm");
    mail.register(&pool, worker.sandbox(), &secrets_key, queue::DEFAULT_TENANT, &component).await?;
    println!(
        "  {:<10} component, egress {} only, secret MAIL_API_KEY (a stand-in mail API)",
        demo_mail::TASK_TYPE,
        mail.url()
    );

    let mut work = tasks();
    work.push(mail.task());
    let ids: Vec<i64> =
        queue::enqueue_many(&pool, &work).await?.into_iter().map(|e| e.id).collect();
    println!("== enqueued {} tasks; running them in a sandboxed runner", ids.len());

    let (stop, stopped) = oneshot::channel::<()>();
    let runner = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    let settled = wait_until_settled(&pool, &ids, Duration::from_secs(60)).await;
    let _ = stop.send(());
    runner.await.context("runner task")??;
    let views = settled?;

    println!("== what happened");
    for t in &views {
        println!("{}", describe(t));
    }
    println!("== the stand-in mail API accepted {} email(s)", mail.sent());
    println!("== queue stats");
    for s in queue::queue_stats(&pool, None).await? {
        println!(
            "  {:<15} succeeded={} dead={} failed_attempts_last_hour={}",
            s.task_type, s.succeeded, s.dead, s.failures_last_hour
        );
    }
    queue::close_pool(&pool).await;
    Ok(())
}

/// Validates the module at `path` and registers it for `tenant` as `task_type`; returns the
/// registration and the module's size.
pub async fn register_example(
    pool: &sqlx::PgPool,
    sandbox: &Sandbox,
    tenant: &str,
    task_type: &str,
    path: &Path,
    settings: &ModuleSettings,
) -> anyhow::Result<(Registered, usize)> {
    register_example_with_secrets(pool, sandbox, tenant, task_type, path, settings, &[]).await
}

/// [`register_example`] for a module that receives the tenant's `secrets` (which exist).
pub async fn register_example_with_secrets(
    pool: &sqlx::PgPool,
    sandbox: &Sandbox,
    tenant: &str,
    task_type: &str,
    path: &Path,
    settings: &ModuleSettings,
    secrets: &[String],
) -> anyhow::Result<(Registered, usize)> {
    let bytes = std::fs::read(path).with_context(|| {
        format!("reading {} (run scripts/build-modules.sh first)", path.display())
    })?;
    sandbox.validate_module(&bytes).with_context(|| format!("validating {}", path.display()))?;
    let sha256 = sha256_hex(&bytes);
    let reuse = queue::upload_reuse(&bytes, None);
    let options = queue::UploadOptions { secrets: secrets.to_vec(), reuse };
    let reg =
        queue::register_module_with(pool, tenant, task_type, &sha256, &bytes, settings, &options)
            .await
            .with_context(|| format!("registering {task_type} for tenant {tenant}"))?;
    Ok((reg, bytes.len()))
}

/// Polls until every task has succeeded or died (a demo may poll; tests await events).
async fn wait_until_settled(
    pool: &sqlx::PgPool,
    ids: &[i64],
    limit: Duration,
) -> anyhow::Result<Vec<TaskView>> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let mut views = Vec::with_capacity(ids.len());
        for &id in ids {
            views.push(queue::get_task(pool, None, id).await?);
        }
        if views.iter().all(|t| matches!(t.state, TaskState::Succeeded | TaskState::Dead)) {
            return Ok(views);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("tasks did not settle within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn describe_settings(s: &ModuleSettings) -> String {
    let mut parts = Vec::new();
    if let Some(t) = s.timeout_ms {
        parts.push(format!("timeout={t}ms"));
    }
    if let Some(m) = s.max_attempts {
        parts.push(format!("max_attempts={m}"));
    }
    if let Some(b) = s.backoff_base_ms {
        parts.push(format!("backoff_base={b}ms"));
    }
    parts.join(" ")
}

fn describe(t: &TaskView) -> String {
    let head = format!("  #{:<3} {:<15} {:<9} attempts={}", t.id, t.task_type, t.state, t.attempts);
    let kinds: Vec<&str> = t
        .errors
        .as_array()
        .map(|errors| errors.iter().filter_map(|e| e["kind"].as_str()).collect())
        .unwrap_or_default();
    let history =
        if kinds.is_empty() { String::new() } else { format!(" failures=[{}]", kinds.join(", ")) };
    let tail = match (&t.result, &t.last_error) {
        (Some(result), _) => format!("\n        result: {}", compact(result)),
        (None, Some(error)) => format!("\n        last error: {}", compact(&json!(error))),
        _ => String::new(),
    };
    format!("{head}{history}{tail}")
}

fn compact(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(110) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s,
    }
}
