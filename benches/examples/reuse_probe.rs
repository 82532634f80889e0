//! What a big guest (componentize-py, componentize-js) costs per task when each task gets a
//! fresh instance from the copy-on-write image, as the sandbox does, against one instance
//! that runs `wasi:cli/run` for task after task (issue 30's open question: a warm instance
//! per module and tenant, as Cloudflare Workers and AWS Lambda keep one).
//!
//! A probe, not part of the sandbox: it runs on the engine of a `Sandbox` with the default
//! configuration (pooling, copy-on-write images, the page-map reset), gives the guest stdin
//! that is filled again before every task and a `wasi:cli/environment` that answers with each
//! task's own variables (a host function shadowing WASI's, whose list is fixed when its
//! context is built), and times a fresh instance's three parts (instantiate, run, drop) and a
//! reused instance's run. It checks that each reused task answered with its own environment.
//! The guest's minor page faults per task come from `/proc/self/stat`.
//!
//! ```text
//! cargo run --profile bench -p sweep-benches --example reuse_probe -- GUEST.wasm [TASKS]
//! ```

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sweep::sandbox::{Sandbox, SandboxConfig};
use sweep_dev::bench::cpu::minor_faults_of_this_process;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::cli::{IsTerminal, StdinStream};
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::p2::{InputStream, Pollable, StreamError};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

const PAYLOAD: &[u8] = br#"{"name": "Ada"}"#;

/// Stdin whose streams all read one buffer, which the probe fills again before each task;
/// empty is the stream's end, and a later fill opens it again.
#[derive(Debug, Clone, Default)]
struct Refillable(Arc<Mutex<Bytes>>);

impl Refillable {
    fn fill(&self, bytes: &'static [u8]) {
        *self.0.lock().expect("stdin lock") = Bytes::from_static(bytes);
    }
}

impl IsTerminal for Refillable {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdinStream for Refillable {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncRead + Send + Sync> {
        Box::new(tokio::io::empty())
    }
    fn p2_stream(&self) -> Box<dyn InputStream> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl InputStream for Refillable {
    fn read(&mut self, size: usize) -> Result<Bytes, StreamError> {
        let mut buffer = self.0.lock().expect("stdin lock");
        if buffer.is_empty() {
            return Err(StreamError::Closed);
        }
        let size = size.min(buffer.len());
        Ok(buffer.split_to(size))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Refillable {
    async fn ready(&mut self) {}
}

/// The guests link `wasi:http`; the probe's tasks send nothing.
#[derive(Debug)]
struct NoRequests;

type Sent = Result<
    (http::Response<WasiBody>, Box<dyn Future<Output = Result<(), HttpError>> + Send>),
    HttpError,
>;

impl WasiHttpHooks for NoRequests {
    fn send_request(
        &mut self,
        _: http::Request<WasiBody>,
        _: Option<RequestOptions>,
        _: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = Sent> + Send> {
        Box::new(async { Err(HttpError::HttpRequestDenied) })
    }
}

struct State {
    /// What `wasi:cli/environment` answers: set before each task (the `WasiCtx`'s own list is
    /// fixed when it is built).
    env: Vec<(String, String)>,
    ctx: WasiCtx,
    table: ResourceTable,
    http: WasiHttpCtx,
    hooks: NoRequests,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.ctx, table: &mut self.table }
    }
}

impl WasiHttpView for State {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.hooks }
    }
}

fn new_store(engine: &Engine, stdin: &Refillable, stdout: &MemoryOutputPipe) -> Store<State> {
    let mut builder = WasiCtxBuilder::new();
    builder.stdin(stdin.clone()).stdout(stdout.clone());
    let state = State {
        env: task_env(1),
        ctx: builder.build(),
        table: ResourceTable::new(),
        http: WasiHttpCtx::new(),
        hooks: NoRequests,
    };
    let mut store = Store::new(engine, state);
    store.set_fuel(u64::MAX).expect("fuel is on");
    // The sandbox's engine ticks its epoch; the deadline is added to the current one.
    store.set_epoch_deadline(u64::MAX / 2);
    store
}

/// The environment of task `n`: its id and an attempt number that differs from task to task,
/// so each answer shows whose environment the guest read.
fn task_env(n: usize) -> Vec<(String, String)> {
    vec![
        ("SWEEP_TASK_ID".to_owned(), n.to_string()),
        ("SWEEP_ATTEMPT".to_owned(), (n % 7 + 1).to_string()),
    ]
}

/// Minor page faults of this process so far.
fn minor_faults() -> u64 {
    minor_faults_of_this_process().expect("minflt in /proc/self/stat")
}

fn per_task(total: Duration, tasks: usize) -> String {
    format!("{:.1} us", total.as_secs_f64() * 1e6 / tasks as f64)
}

/// The attempt number in an answer (`"attempt": 3` or `"attempt":3`).
fn attempt_of(line: &str) -> Option<&str> {
    let rest = line.split("\"attempt\":").nth(1)?.trim_start();
    Some(rest.trim_end_matches(['}', ' ']))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> wasmtime::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: reuse_probe GUEST.wasm [TASKS]");
    let tasks: usize = args.next().map_or(Ok(300), |n| n.parse())?;
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let engine = sandbox.engine();
    let compiled = Instant::now();
    let component = Component::from_file(engine, &path)?;
    println!("{path}: compiled in {:.1} s", compiled.elapsed().as_secs_f64());
    let mut linker = Linker::<State>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    // The task's environment, in place of the one `WasiCtx` was built with.
    linker.allow_shadowing(true);
    linker
        .instance("wasi:cli/environment@0.2.12")?
        .func_wrap("get-environment", |store: wasmtime::StoreContextMut<'_, State>, (): ()| {
            Ok((store.data().env.clone(),))
        })?;
    let pre = CommandPre::new(linker.instantiate_pre(&component)?)?;
    let stdin = Refillable::default();
    let stdout = MemoryOutputPipe::new(usize::MAX);

    for round in 1..=2 {
        let (mut instantiate, mut run, mut drop) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let faults = minor_faults();
        for _ in 0..tasks {
            stdin.fill(PAYLOAD);
            let mut store = new_store(engine, &stdin, &stdout);
            let t = Instant::now();
            let command = pre.instantiate_async(&mut store).await?;
            instantiate += t.elapsed();
            let t = Instant::now();
            let ran = command.wasi_cli_run().call_run(&mut store).await?;
            run += t.elapsed();
            ran.map_err(|()| wasmtime::format_err!("run returned err"))?;
            let t = Instant::now();
            std::mem::drop(store);
            drop += t.elapsed();
        }
        println!(
            "fresh, round {round}: instantiate {}, run {}, drop {} per task; {:.0} minor faults \
             per task",
            per_task(instantiate, tasks),
            per_task(run, tasks),
            per_task(drop, tasks),
            (minor_faults() - faults) as f64 / tasks as f64
        );
    }
    let fresh_output = stdout.contents().len();

    let mut store = new_store(engine, &stdin, &stdout);
    let command = pre.instantiate_async(&mut store).await?;
    for round in 1..=2 {
        let faults = minor_faults();
        let t = Instant::now();
        for task in 0..tasks {
            stdin.fill(PAYLOAD);
            store.data_mut().env = task_env(task);
            // A command (wasi-libc's entry, as Rust's wasm32-wasip2 std builds) runs once: its
            // second `run` traps.
            match command.wasi_cli_run().call_run(&mut store).await {
                Ok(ran) => ran.map_err(|()| wasmtime::format_err!("run returned err"))?,
                Err(e) => {
                    println!("reused: run {} of one instance trapped: {e:#}", task + 1);
                    return Ok(());
                }
            }
        }
        println!(
            "reused, round {round}: run {} per task; {:.0} minor faults per task",
            per_task(t.elapsed(), tasks),
            (minor_faults() - faults) as f64 / tasks as f64
        );
    }
    // Each reused task answered with its own environment's attempt.
    let all = stdout.contents();
    let reused = String::from_utf8_lossy(&all[fresh_output..]).into_owned();
    let attempts: Vec<&str> = reused.lines().filter_map(|line| attempt_of(line)).collect();
    let expected: Vec<String> = (0..2 * tasks).map(|n| (n % tasks % 7 + 1).to_string()).collect();
    let own =
        attempts.len() == expected.len() && attempts.iter().zip(&expected).all(|(a, e)| a == e);
    println!(
        "output: fresh {fresh_output} bytes, reused {} bytes; each reused task saw its own \
         environment: {own}",
        all.len() - fresh_output
    );
    Ok(())
}
