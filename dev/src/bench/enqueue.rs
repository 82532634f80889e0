//! `sweep-bench enqueue`: bulk enqueue throughput on a fresh database, no runner, through
//! the library (`queue::enqueue_many_using`) and through the admin API's batch route
//! (`POST /v1/tasks/batch`, served in this process on a local port).
//!
//! Each client (a tokio task; one connection, or one HTTP connection) sends its share of the
//! batches one after the other; tasks/s is the whole count over the wall clock from the first
//! send to the last answer. The `NewTask`s and the request bodies are built before the clock
//! starts (the caller's cost, not the queue's); the API's parsing and checks are timed. The
//! table is emptied between runs, outside the clock.

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;
use sweep::{
    admin::{self, AdminConfig, AdminState},
    queue::{self, EnqueueMethod, NewTask, Role, Store},
    sandbox::{Sandbox, SandboxConfig},
};
use tokio::{sync::oneshot, time::Instant};

use crate::fixtures;

#[derive(Debug, Clone, clap::Args)]
pub struct EnqueueArgs {
    /// Tasks per run.
    #[arg(long, default_value_t = 500_000)]
    pub tasks: usize,
    /// Tasks per call (per request). Comma-separated for several runs.
    #[arg(long, value_delimiter = ',', default_value = "10000")]
    pub batch: Vec<usize>,
    /// Concurrent clients. Comma-separated for several runs.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    pub clients: Vec<usize>,
    /// Which paths to measure.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "copy,insert,http")]
    pub via: Vec<Via>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Via {
    /// `enqueue_many` by binary COPY.
    Copy,
    /// `enqueue_many` by the INSERT statement.
    Insert,
    /// `POST /v1/tasks/batch` (which takes COPY from `queue::COPY_MIN_BATCH` tasks on).
    Http,
}

const OPERATOR: &str = "sweep-bench-operator-token";

pub async fn enqueue(store: &Store, url: &str, args: &EnqueueArgs) -> anyhow::Result<()> {
    let pool = store.pool();
    if args.batch.contains(&0) || args.clients.contains(&0) {
        bail!("--batch and --clients must be at least 1");
    }
    let admin_store = Store::open(url, Role::Admin, 8).await.context("opening the admin store")?;
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let max_batch = args.batch.iter().copied().max().unwrap_or(1);
    let config = AdminConfig {
        operator_token: Some(OPERATOR.to_owned()),
        max_batch,
        max_json_bytes: 64 * 1024 * 1024,
        ..AdminConfig::default()
    };
    let state = AdminState::new(&admin_store, sandbox, config)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api_url = format!("http://{}/v1/tasks/batch", listener.local_addr()?);
    let (stop_api, api_stopped) = oneshot::channel::<()>();
    let api = tokio::spawn(admin::serve_on(listener, state, async {
        let _ = api_stopped.await;
    }));

    println!("{} tasks per run, payload {{\"i\": n}}, no dedup keys", args.tasks);
    for &batch in &args.batch {
        for &clients in &args.clients {
            for &via in &args.via {
                fixtures::reset(pool, None).await?;
                let rate = match via {
                    Via::Copy => {
                        library(store, args.tasks, batch, clients, EnqueueMethod::Copy).await?
                    }
                    Via::Insert => {
                        library(store, args.tasks, batch, clients, EnqueueMethod::Insert).await?
                    }
                    Via::Http => http(&api_url, args.tasks, batch, clients).await?,
                };
                let stored = fixtures::count_unfinished(pool).await?;
                if stored != args.tasks as i64 {
                    bail!("{via:?}: {stored} tasks stored, {} enqueued", args.tasks);
                }
                println!(
                    "{:<7} batch {batch:>6}  clients {clients}  {rate:>9.0} tasks/s",
                    format!("{via:?}").to_lowercase()
                );
            }
        }
    }
    let _ = stop_api.send(());
    api.await??;
    admin_store.close().await;
    Ok(())
}

fn tasks(from: usize, n: usize) -> Vec<NewTask> {
    (from..from + n).map(|i| NewTask::new("noop", json!({ "i": i }))).collect()
}

/// The batches of `n` tasks, dealt round-robin to `clients`.
fn shares<T>(
    n: usize,
    batch: usize,
    clients: usize,
    make: impl Fn(usize, usize) -> T,
) -> Vec<Vec<T>> {
    let mut shares: Vec<Vec<T>> = (0..clients).map(|_| Vec::new()).collect();
    for (k, from) in (0..n).step_by(batch).enumerate() {
        shares[k % clients].push(make(from, batch.min(n - from)));
    }
    shares
}

async fn library(
    store: &Store,
    n: usize,
    batch: usize,
    clients: usize,
    method: EnqueueMethod,
) -> anyhow::Result<f64> {
    let shares = shares(n, batch, clients, tasks);
    let started = Instant::now();
    let mut running = Vec::new();
    for share in shares {
        let store = store.clone();
        running.push(tokio::spawn(async move {
            for tasks in share {
                queue::enqueue_many_using(&store, &tasks, usize::MAX, method).await?;
            }
            anyhow::Ok(())
        }));
    }
    for r in running {
        r.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

async fn http(url: &str, n: usize, batch: usize, clients: usize) -> anyhow::Result<f64> {
    let shares = shares(n, batch, clients, |from, len| {
        let body: Vec<serde_json::Value> =
            (from..from + len).map(|i| json!({"task_type": "noop", "payload": {"i": i}})).collect();
        serde_json::to_vec(&body).map(bytes_of)
    });
    let client = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let started = Instant::now();
    let mut running = Vec::new();
    for share in shares {
        let (client, url) = (client.clone(), url.to_owned());
        running.push(tokio::spawn(async move {
            for body in share {
                let response = client
                    .post(&url)
                    .bearer_auth(OPERATOR)
                    .header("content-type", "application/json")
                    .body(body?)
                    .send()
                    .await?;
                let status = response.status();
                if status.as_u16() != 201 {
                    bail!("POST /v1/tasks/batch: {status}: {}", response.text().await?);
                }
                // The answer is part of the work: read it whole.
                response.bytes().await?;
            }
            anyhow::Ok(())
        }));
    }
    for r in running {
        r.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

fn bytes_of(v: Vec<u8>) -> reqwest::Body {
    reqwest::Body::from(v)
}
