//! `sweep-bench compile`: a costly module (by default a hostile shape of about the size the
//! default compile budget stops admitting; any shape with `--functions`/`--code-kib`), uploaded
//! to a real `sweep run` (a process of its own, so its memory is its own), and what that
//! costs: the compile's CPU time and peak RSS (the compiler child's own report, read from
//! `/metrics`), the runner's RSS before and after, the upload's wall time, and the latency
//! of `/healthz` measured while the compile runs. Then one task of that module runs, and the
//! compile counter shows whether the runner compiled it again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;
use sweep::queue::TenantCaps;
use sweep::sandbox::{check_structure, CompileLimits};
use tokio::time::Instant;

use super::fresh_database;

/// The operator token the bench's runner is started with.
const OPERATOR: &str = "bench-operator-token-0123456789";

/// The default module's functions.
pub const HOSTILE_FUNCTIONS: u32 = 20_000;
/// The default module's KiB of code.
pub const HOSTILE_CODE_KIB: u64 = 1024;

#[derive(Debug, clap::Args)]
pub struct CompileArgs {
    /// The `sweep` binary to run (default: next to this one).
    #[arg(long)]
    pub sweep: Option<PathBuf>,
    /// Functions in the module (default: the many-small-functions shape; a few large
    /// functions, e.g. 13, is the other costly shape).
    #[arg(long, default_value_t = HOSTILE_FUNCTIONS)]
    pub functions: u32,
    /// KiB of code in the module (default: about where the default budget stops admitting
    /// the costly shapes: their CPU grows ~4x faster per MiB than the budget does).
    #[arg(long, default_value_t = HOSTILE_CODE_KIB)]
    pub code_kib: u64,
    /// Pause between two `/healthz` probes while the compile runs, in milliseconds.
    #[arg(long, default_value_t = 10)]
    pub probe_ms: u64,
}

/// A `sweep run` process, stopped (SIGTERM, then waited for) on drop.
struct RunnerProcess(Child);

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let _ = self.0.wait();
    }
}

pub async fn compile(url: &str, args: &CompileArgs) -> anyhow::Result<()> {
    let sweep = match &args.sweep {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("sweep"),
    };
    if !sweep.is_file() {
        bail!("{} not found: build it (cargo build --bin sweep) or pass --sweep", sweep.display());
    }
    let store = fresh_database(url).await?;
    let (_, token) = sweep::admin::create_tenant(store.pool(), "bench", &TenantCaps::default())
        .await
        .context("creating the bench tenant")?;
    store.close().await;

    let bomb = crate::modules::compile_bomb(args.functions, args.code_kib << 10);
    let admitted = check_structure(&bomb, &CompileLimits::default());
    println!(
        "module: {} functions, {} KiB of code, {} KiB in all; default structural limits: {}",
        args.functions,
        args.code_kib,
        bomb.len() >> 10,
        match &admitted {
            Ok(s) => format!(
                "admitted (CPU budget {:?})",
                CompileLimits::default().budget_for(s.code_bytes).cpu
            ),
            Err(e) => format!("refused ({e})"),
        }
    );

    let port = crate::servers::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let runner = start_runner(&sweep, url, port)?;
    let pid = runner.0.id();
    let http = reqwest::Client::new();
    wait_healthy(&http, &base).await?;
    let rss_before = proc_status_kib(pid, "VmRSS:")?;
    // The same probes without a compile, for comparison (the host may be busy otherwise).
    let mut idle = Vec::new();
    let idle_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < idle_until {
        idle.push(probe(&http, &base).await?);
        tokio::time::sleep(Duration::from_millis(args.probe_ms)).await;
    }

    let upload = {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let answer = http
                .put(format!("{base}/v1/modules/bomb"))
                .bearer_auth(&token)
                .header("content-type", "application/wasm")
                .body(bomb)
                .send()
                .await;
            (started.elapsed(), answer)
        })
    };
    let mut latencies = Vec::new();
    let mut rss_during = 0;
    while !upload.is_finished() {
        let started = Instant::now();
        let ok =
            http.get(format!("{base}/healthz")).send().await.is_ok_and(|r| r.status().is_success());
        latencies.push(started.elapsed());
        if !ok {
            bail!("/healthz failed while the module compiled");
        }
        rss_during = rss_during.max(proc_status_kib(pid, "VmRSS:")?);
        tokio::time::sleep(Duration::from_millis(args.probe_ms)).await;
    }
    let (upload_wall, answer) = upload.await?;
    let answer = answer.context("uploading the module")?;
    let status = answer.status();
    let body: Value = answer.json().await.unwrap_or(Value::Null);
    let rss_after = proc_status_kib(pid, "VmRSS:")?;
    let metrics = scrape(&http, &base).await?;

    println!("upload: {status} in {:.2} s", upload_wall.as_secs_f64());
    if !status.is_success() {
        println!("  {body}");
    }
    println!(
        "compile (child process): {:.2} s CPU, peak RSS {:.0} MiB",
        gauge(&metrics, sweep::metrics::MODULE_COMPILE_CPU).unwrap_or(f64::NAN),
        gauge(&metrics, sweep::metrics::MODULE_COMPILE_PEAK_RSS).unwrap_or(f64::NAN)
            / f64::from(1 << 20)
    );
    println!(
        "runner RSS: {} MiB before, at most {} MiB while compiling, {} MiB after",
        rss_before >> 10,
        rss_during >> 10,
        rss_after >> 10
    );
    for (what, mut probes) in [("before the upload", idle), ("while compiling", latencies)] {
        probes.sort();
        println!(
            "/healthz {what}: {} probes, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            probes.len(),
            percentile(&probes, 0.50),
            percentile(&probes, 0.99),
            probes.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        );
    }

    if status.is_success() {
        let compiles = gauge(&metrics, sweep::metrics::MODULE_COMPILES).unwrap_or(f64::NAN);
        run_one(&http, &base, &token).await?;
        let after = gauge(&scrape(&http, &base).await?, sweep::metrics::MODULE_COMPILES)
            .unwrap_or(f64::NAN);
        println!("compiles: {compiles} after the upload, {after} after its first task ran");
    }
    drop(runner);
    Ok(())
}

fn start_runner(sweep: &Path, url: &str, port: u16) -> anyhow::Result<RunnerProcess> {
    let child = Command::new(sweep)
        .args(["run", "--concurrency", "2", "--no-pooling"])
        .arg("--admin-addr")
        .arg(format!("127.0.0.1:{port}"))
        .env("DATABASE_URL", url)
        .env("SWEEP_OPERATOR_TOKEN", OPERATOR)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", sweep.display()))?;
    Ok(RunnerProcess(child))
}

/// One `/healthz` round trip.
async fn probe(http: &reqwest::Client, base: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let answer = http.get(format!("{base}/healthz")).send().await?;
    if !answer.status().is_success() {
        bail!("/healthz answered {}", answer.status());
    }
    Ok(started.elapsed())
}

async fn wait_healthy(http: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = http.get(format!("{base}/healthz")).send().await;
        if answer.is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the runner did not answer /healthz within a minute");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Enqueues one task of the uploaded module and waits until it has run.
async fn run_one(http: &reqwest::Client, base: &str, token: &str) -> anyhow::Result<()> {
    let task: Value = http
        .post(format!("{base}/v1/tasks"))
        .bearer_auth(token)
        .json(&serde_json::json!({"task_type": "bomb", "payload": {}}))
        .send()
        .await?
        .json()
        .await?;
    let id = task["id"].as_i64().context("no task id")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let t: Value = http
            .get(format!("{base}/v1/tasks/{id}"))
            .bearer_auth(token)
            .send()
            .await?
            .json()
            .await?;
        match t["state"].as_str() {
            Some("succeeded") => return Ok(()),
            Some("dead") => bail!("the task died: {t}"),
            _ if Instant::now() > deadline => bail!("the task did not run in two minutes: {t}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn scrape(http: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    let answer = http.get(format!("{base}/metrics")).bearer_auth(OPERATOR).send().await?;
    Ok(answer.error_for_status()?.text().await?)
}

/// The value of an unlabelled series `name` in a Prometheus text page.
fn gauge(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A `/proc/<pid>/status` field in KiB.
fn proc_status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let value = status.lines().find_map(|l| l.strip_prefix(field)).context("no such field")?;
    Ok(value.trim().trim_end_matches("kB").trim().parse()?)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}
