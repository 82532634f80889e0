//! Handlers in Python (componentize-py) and JavaScript (componentize-js), built as WASI 0.2
//! components against the `wasi:cli` command world (`guests/wit`), run through the real
//! sandbox under the same contract as the Rust components: the result on stdout, exit 100 for
//! a permanent failure, secrets as environment variables, and outbound HTTP only where the
//! egress list allows (a loopback server stands in for a mail API, as in
//! `sandbox_components.rs`).
//!
//! The components come from `scripts/build-guests.sh` (run by `scripts/build-modules.sh`),
//! with the toolchains `scripts/prepare.sh` installs; a component that was not built fails
//! these tests with a message naming both: they never skip.
//!
//! Each component is tens of MB with a language runtime inside, past the structural compile
//! limits a default sandbox holds modules to, so this sandbox sets its compile limits itself.
//! `measure_python_and_js_against_rust` (ignored: run it with `--ignored --nocapture`) prints
//! sizes, compile times and per-task sandbox times next to the Rust component no-op.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sweep::sandbox::{
    Capabilities, CompiledModule, EgressPolicy, Execution, HandlerKind, Limits, Outcome, Reuse,
    Sandbox, SandboxConfig, TaskInput, WarmStats,
};
use sweep_dev::mail::{MailApi, Reply};
use sweep_dev::modules::{component_bytes, components_dir};
use sweep_dev::testing::{error_chain as chain, runtime_compile_limits};

const PYTHON_HELLO: &str = "python-hello";
const PYTHON_SEND: &str = "python-send";
const JS_HELLO: &str = "js-hello";
const JS_FETCH: &str = "js-fetch";

const HELLOS: [&str; 2] = [PYTHON_HELLO, JS_HELLO];
const SENDERS: [&str; 2] = [PYTHON_SEND, JS_FETCH];

fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(sandbox_of_its_own)
}

/// A sandbox with the compile limits a language runtime needs; a test that counts kept
/// instances makes its own, so the counters are its alone (its guests compiled again).
fn sandbox_of_its_own() -> Sandbox {
    let config = SandboxConfig { compile: runtime_compile_limits(), ..SandboxConfig::default() };
    Sandbox::new(config).expect("sandbox builds")
}

fn limits() -> Limits {
    Limits {
        fuel: 2_000_000_000,
        timeout: Duration::from_secs(20),
        memory_bytes: 128 << 20,
        output_bytes: 64 << 10,
    }
}

/// The bytes of guest component `name`, or a failure that says how to get them.
fn guest_bytes(name: &str) -> Vec<u8> {
    let path: PathBuf = components_dir().join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build it with `scripts/build-guests.sh {name}` after \
             `scripts/prepare.sh python_guests js_guests` installs componentize-py and \
             componentize-js",
            path.display()
        )
    })
}

/// Each guest compiled once per test binary (a compile takes seconds).
fn compiled(name: &str) -> CompiledModule {
    static CACHE: OnceLock<Mutex<HashMap<String, CompiledModule>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    // Held while compiling: two tests wanting the same guest compile it once.
    let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(module) = cache.get(name) {
        return module.clone();
    }
    let module = sandbox()
        .compile(&guest_bytes(name))
        .unwrap_or_else(|e| panic!("{name} compiles: {}", chain(&e)));
    cache.insert(name.to_owned(), module.clone());
    module
}

fn input(payload: &[u8], capabilities: Capabilities) -> TaskInput {
    TaskInput {
        task_id: "task-7".into(),
        task_type: "polyglot".into(),
        attempt: 2,
        max_attempts: 5,
        payload: payload.to_vec(),
        capabilities,
        reuse: None,
    }
}

async fn run(name: &str, payload: &Value, capabilities: Capabilities) -> Execution {
    let payload = serde_json::to_vec(payload).expect("json");
    sandbox().run(&compiled(name), &input(&payload, capabilities), &limits()).await
}

fn success<'e>(name: &str, exec: &'e Execution) -> &'e Value {
    match &exec.outcome {
        Outcome::Success(v) => v,
        other => panic!("{name}: expected success, got {other:?}; stderr: {}", exec.stderr),
    }
}

fn permanent_message(name: &str, exec: &Execution) -> String {
    match &exec.outcome {
        Outcome::HandlerError { permanent: true, exit_code: 100, message } => message.clone(),
        other => panic!("{name}: expected exit 100, got {other:?}; stderr: {}", exec.stderr),
    }
}

fn retryable_message(name: &str, exec: &Execution) -> String {
    match &exec.outcome {
        Outcome::HandlerError { permanent: false, exit_code: 1, message } => message.clone(),
        other => panic!("{name}: expected exit 1, got {other:?}; stderr: {}", exec.stderr),
    }
}

#[tokio::test]
async fn hello_guests_answer_from_the_payload_and_the_task() {
    for name in HELLOS {
        let module = compiled(name);
        assert_eq!(module.kind(), HandlerKind::Component, "{name}");

        let exec = run(name, &json!({"name": "Ada"}), Capabilities::none()).await;
        assert_eq!(success(name, &exec), &json!({"greeting": "Hello, Ada!", "attempt": 2}));
        assert!(exec.stderr.contains(&format!("{name}: task task-7")), "{name}: {}", exec.stderr);
        assert!(exec.usage.fuel_used > 0, "{name}: {:?}", exec.usage);

        let exec = run(name, &json!({}), Capabilities::none()).await;
        assert_eq!(success(name, &exec), &json!({"greeting": "Hello, world!", "attempt": 2}));
    }
}

#[tokio::test]
async fn bad_payloads_fail_permanently_with_the_reason_last_on_stderr() {
    for name in HELLOS {
        let exec = run(name, &json!({"name": 5}), Capabilities::none()).await;
        assert_eq!(permanent_message(name, &exec), "name must be a string");

        let not_json = input(b"{not json", Capabilities::none());
        let exec = sandbox().run(&compiled(name), &not_json, &limits()).await;
        let message = permanent_message(name, &exec);
        assert!(message.starts_with("the payload is not JSON"), "{name}: {message}");

        let exec = run(name, &json!([1, 2]), Capabilities::none()).await;
        assert_eq!(permanent_message(name, &exec), "the payload is not a JSON object");
    }
    for name in SENDERS {
        // No key: the module names no secret, so retrying cannot help.
        let payload = json!({"mail_api_url": "http://127.0.0.1:9/send", "to": "a@example.org"});
        let exec = run(name, &payload, Capabilities::none()).await;
        let message = permanent_message(name, &exec);
        assert_eq!(message, "MAIL_API_KEY is not set: name it as a secret of the module");
        assert_eq!((exec.usage.http_requests, exec.usage.http_refused), (0, 0), "{name}");
    }
}

fn allowing(entries: &[&str]) -> Capabilities {
    let egress = EgressPolicy::parse(entries).expect("a valid allow list");
    Capabilities { egress: Arc::new(egress), ..Capabilities::none() }
}

/// The mail payload for `api`, with the key as the module's secret.
async fn send(name: &str, api: &MailApi, capabilities: Capabilities) -> Execution {
    let capabilities =
        Capabilities { env: vec![("MAIL_API_KEY".into(), "k-123".into())], ..capabilities };
    let payload = json!({"mail_api_url": api.url(), "to": "ada@example.org", "subject": "hi"});
    run(name, &payload, capabilities).await
}

#[tokio::test]
async fn senders_post_with_the_secret_and_return_the_message_id() {
    for name in SENDERS {
        let api = MailApi::start(Reply::MessageId).await.expect("mail api");
        let exec = send(name, &api, allowing(&[&api.allow_entry()])).await;
        assert_eq!(success(name, &exec), &json!({"message_id": "msg-1", "status": 200}));
        let requests = api.requests();
        assert_eq!(requests.len(), 1, "{name}");
        let sent = &requests[0];
        assert_eq!((sent.method.as_str(), sent.path.as_str()), ("POST", "/send"), "{name}");
        assert_eq!(sent.header("authorization"), Some("Bearer k-123"), "{name}");
        assert_eq!(sent.header("content-type"), Some("application/json"), "{name}");
        let body: Value = serde_json::from_slice(&sent.body).expect("a JSON body");
        assert_eq!(body, json!({"to": "ada@example.org", "subject": "hi"}), "{name}");
        let usage = exec.usage;
        assert_eq!((usage.http_requests, usage.http_refused), (1, 0), "{name}");
        assert_eq!(usage.bytes_sent, sent.body.len() as u64, "{name}");
        assert_eq!(usage.bytes_received, br#"{"id":"msg-1"}"#.len() as u64, "{name}");
    }
}

#[tokio::test]
async fn a_host_off_the_list_fails_inside_the_guest_before_any_connection() {
    let api = MailApi::start(Reply::MessageId).await.expect("mail api");
    let port = api.addr().port();
    // What each guest sees: Python's helper names the `wasi:http` error case; StarlingMonkey's
    // `fetch` rejects with a generic network error, so the host's own line says why.
    let seen = [
        (PYTHON_SEND, "HttpRequestDenied"),
        (JS_FETCH, "NetworkError when attempting to fetch resource"),
    ];
    for (name, error) in seen {
        for caps in [Capabilities::none(), allowing(&["api.mail.example", "127.0.0.1:1"])] {
            let exec = send(name, &api, caps).await;
            // Retryable: the list may change; the guest saw its request fail, it did not trap.
            let message = retryable_message(name, &exec);
            let why = format!(
                "sweep: outbound request refused: 127.0.0.1:{port} is not on the tenant's \
                 egress list"
            );
            let failed = format!("POST {} failed: {error}", api.url());
            assert_eq!(message.lines().collect::<Vec<_>>(), [why.as_str(), &failed], "{name}");
            assert_eq!((exec.usage.http_requests, exec.usage.http_refused), (0, 1), "{name}");
        }
    }
    assert_eq!(api.connections(), 0);
}

#[tokio::test]
async fn a_4xx_answer_is_permanent_and_a_5xx_is_retried() {
    for name in SENDERS {
        let api = MailApi::start(Reply::Json(401, r#"{"error":"bad key"}"#.into()))
            .await
            .expect("mail api");
        let exec = send(name, &api, allowing(&[&api.allow_entry()])).await;
        let message = permanent_message(name, &exec);
        assert_eq!(message, format!(r#"{} answered 401: {{"error":"bad key"}}"#, api.url()));

        let api = MailApi::start(Reply::Json(503, "{}".into())).await.expect("mail api");
        let exec = send(name, &api, allowing(&[&api.allow_entry()])).await;
        let message = retryable_message(name, &exec);
        assert_eq!(message, format!("{} answered 503: {{}}", api.url()));
    }
}

/// A task of `scope` (kept instances are found by it) for `name` at `attempt`.
fn warm_input(scope: &str, tasks: u32, payload: &Value, attempt: u32) -> TaskInput {
    let payload = serde_json::to_vec(payload).expect("json");
    let reuse = Some(Reuse { scope: scope.to_owned(), tasks });
    TaskInput { attempt, reuse, ..input(&payload, Capabilities::none()) }
}

/// How the pool's counters moved from `before`.
fn moved(sb: &Sandbox, before: WarmStats) -> WarmStats {
    let now = sb.warm_stats();
    WarmStats {
        reused: now.reused - before.reused,
        kept: now.kept - before.kept,
        dropped: now.dropped - before.dropped,
        evicted: now.evicted - before.evicted,
        refused: now.refused - before.refused,
    }
}

/// Kept instances, on a sandbox of their own.
#[tokio::test]
async fn warm_instances_run_each_task_as_its_own_and_are_dropped_after_any_other_ending() {
    let sb = sandbox_of_its_own();
    for name in HELLOS {
        let module = sb.compile(&guest_bytes(name)).expect("compiles");
        let scope = format!("tenant-a/{name}/1");
        let before = sb.warm_stats();
        // Each task reads its own payload and environment, on one instance after the first.
        for attempt in 1..=5 {
            let who = format!("Ada {attempt}");
            let task = warm_input(&scope, 100, &json!({"name": who}), attempt);
            let exec = sb.run(&module, &task, &limits()).await;
            let want = json!({"greeting": format!("Hello, {who}!"), "attempt": attempt});
            assert_eq!(success(name, &exec), &want);
            assert!(exec.stderr.starts_with(&format!("{name}: task")), "{name}: {}", exec.stderr);
            assert!(exec.usage.fuel_used > 0 && exec.usage.peak_memory_bytes > 0, "{name}");
        }
        let stats = moved(&sb, before);
        assert_eq!((stats.reused, stats.kept, stats.dropped), (4, 5, 0), "{name}: {stats:?}");
        let idle = sb.warm_idle();

        // Another scope (another tenant) never gets that instance: it makes its own.
        let other = warm_input(&format!("tenant-b/{name}/1"), 100, &json!({"name": "Bo"}), 1);
        let exec = sb.run(&module, &other, &limits()).await;
        assert_eq!(success(name, &exec)["greeting"], "Hello, Bo!");
        assert_eq!(moved(&sb, before).reused, 4, "{name}");
        assert_eq!(sb.warm_idle(), idle + 1, "{name}");

        // A failure (exit 100) drops the instance; the next task gets a fresh one.
        let bad = warm_input(&scope, 100, &json!({"name": 5}), 6);
        let exec = sb.run(&module, &bad, &limits()).await;
        assert_eq!(permanent_message(name, &exec), "name must be a string");
        assert_eq!(moved(&sb, before).dropped, 1, "{name}");
        let exec = sb.run(&module, &warm_input(&scope, 100, &json!({}), 7), &limits()).await;
        assert_eq!(success(name, &exec), &json!({"greeting": "Hello, world!", "attempt": 7}));
        assert_eq!(moved(&sb, before).reused, 5, "{name}: the failed task's instance was gone");

        // An instance runs at most `tasks` tasks: with 2, the second task retires it.
        let short = format!("tenant-a/{name}/2");
        for attempt in 1..=3 {
            let exec =
                sb.run(&module, &warm_input(&short, 2, &json!({}), attempt), &limits()).await;
            assert_eq!(success(name, &exec)["attempt"], attempt);
        }
        // Kept after tasks 1 and 3 of that scope; task 2 was the instance's last.
        let stats = moved(&sb, before);
        assert_eq!((stats.reused, stats.kept), (6, 9), "{name}: {stats:?}");
    }
}

/// Idle instances hold pool slots, and give them up: with two slots both held by idle
/// instances, a task of a third scope evicts the oldest and runs.
#[tokio::test]
async fn idle_instances_give_their_slots_to_new_runs() {
    let sb = Sandbox::new(SandboxConfig { max_concurrency: 2, ..SandboxConfig::default() })
        .expect("sandbox builds");
    let module = sb.compile(&sweep_dev::modules::component_bytes("component-noop")).expect("ok");
    for scope in ["a", "b", "c"] {
        let exec = sb.run(&module, &warm_input(scope, 100, &json!({}), 1), &limits()).await;
        success(scope, &exec);
    }
    let stats = sb.warm_stats();
    assert_eq!((stats.kept, stats.evicted), (3, 1), "{stats:?}");
    assert_eq!(sb.warm_idle(), 2);
}

/// A command whose entry runs once (Rust's `fn main` on `wasm32-wasip2`, component-probe)
/// refuses a second `run`: its scope is marked not reusable and every task still succeeds,
/// each on a fresh instance. A Rust component that exports `run` itself (component-noop) is
/// kept like a Python one.
#[tokio::test]
async fn a_command_that_runs_once_is_run_fresh_every_time() {
    let sb = Sandbox::new(SandboxConfig::default()).expect("sandbox builds");
    let probe = sb.compile(&component_bytes("component-probe")).expect("compiles");
    let before = sb.warm_stats();
    for attempt in 1..=4 {
        let task = warm_input("t/probe/1", 100, &json!({"do": "echo", "n": attempt}), attempt);
        let exec = sb.run(&probe, &task, &limits()).await;
        assert_eq!(success("component-probe", &exec)["n"], attempt);
    }
    let stats = moved(&sb, before);
    // Kept after the first task, refused on the second, never kept again.
    assert_eq!((stats.kept, stats.refused, stats.reused), (1, 1, 1), "{stats:?}");
    assert_eq!(sb.warm_idle(), 0);

    let noop = sb.compile(&component_bytes("component-noop")).expect("compiles");
    let before = sb.warm_stats();
    for attempt in 1..=4 {
        let task = warm_input("t/noop/1", 100, &json!({"n": attempt}), attempt);
        assert_eq!(success("component-noop", &sb.run(&noop, &task, &limits()).await), &json!({}));
    }
    let bad = warm_input("t/noop/1", 100, &json!("x"), 5);
    let bad = TaskInput { payload: b"not json".to_vec(), ..bad };
    let exec = sb.run(&noop, &bad, &limits()).await;
    assert!(permanent_message("component-noop", &exec).contains("not JSON"), "{exec:?}");
    let stats = moved(&sb, before);
    assert_eq!((stats.kept, stats.refused, stats.reused, stats.dropped), (4, 0, 4, 1), "{stats:?}");
}

/// A failure on a kept instance is the task's own, even one before the guest read stdin:
/// running out of fuel there ends the task (it is not run again on a fresh instance) and the
/// instance, and the version keeps instances afterwards. Only a command's refused entry (the
/// test above) is taken for "this guest cannot run twice".
#[tokio::test]
async fn a_kept_instance_that_runs_out_of_fuel_fails_the_task_once() {
    let sb = sandbox_of_its_own();
    for name in HELLOS {
        let module = sb.compile(&guest_bytes(name)).expect("compiles");
        let scope = format!("tenant-a/{name}/1");
        let before = sb.warm_stats();
        let exec = sb.run(&module, &warm_input(&scope, 100, &json!({}), 1), &limits()).await;
        success(name, &exec);
        // An interpreter spends far more than this before the handler reads stdin.
        let starved = Limits { fuel: 1_000, ..limits() };
        let exec = sb.run(&module, &warm_input(&scope, 100, &json!({}), 2), &starved).await;
        assert_eq!(exec.outcome, Outcome::OutOfFuel, "{name}: {}", exec.stderr);
        let stats = moved(&sb, before);
        assert_eq!((stats.reused, stats.dropped, stats.refused), (1, 1, 0), "{name}: {stats:?}");
        // The next task starts a fresh instance, which the one after it finds.
        for attempt in 3..=4 {
            let exec =
                sb.run(&module, &warm_input(&scope, 100, &json!({}), attempt), &limits()).await;
            assert_eq!(success(name, &exec)["attempt"], attempt);
        }
        assert_eq!(moved(&sb, before).reused, 2, "{name}");
    }
}

/// A kept instance is held to each task's own wall clock: a task that spins on it ends
/// `Timeout` at its deadline (not when its fuel runs out, which here would take many minutes),
/// the instance ends with it, and the next task starts a fresh one (what the old one counted is
/// gone), which is kept in turn.
#[tokio::test]
async fn a_kept_instance_that_spins_is_stopped_at_its_deadline_and_dropped() {
    let sb = sandbox_of_its_own();
    let kept = sb.compile(&component_bytes("component-kept")).expect("compiles");
    let scope = "tenant-a/component-kept/1";
    let count = |attempt| warm_input(scope, 100, &json!({}), attempt);
    let before = sb.warm_stats();
    for (attempt, calls) in [(1, 1), (2, 2)] {
        let exec = sb.run(&kept, &count(attempt), &limits()).await;
        assert_eq!(success("component-kept", &exec), &json!({ "calls": calls }));
    }

    let timeout = Duration::from_millis(300);
    let deadline = Limits { fuel: 1_000_000_000_000, timeout, ..limits() };
    let spin = warm_input(scope, 100, &json!({"do": "spin"}), 3);
    let started = Instant::now();
    let exec = sb.run(&kept, &spin, &deadline).await;
    let took = started.elapsed();
    assert_eq!(exec.outcome, Outcome::Timeout, "{}", exec.stderr);
    assert!(exec.on_kept_instance, "the spinning task ran on the kept instance");
    assert!(took >= timeout && took < Duration::from_secs(10), "stopped after {took:?}");
    let stats = moved(&sb, before);
    assert_eq!((stats.reused, stats.dropped, stats.refused), (2, 1, 0), "{stats:?}");
    assert_eq!(sb.warm_idle(), 0);

    for (attempt, calls) in [(4, 1), (5, 2)] {
        let exec = sb.run(&kept, &count(attempt), &limits()).await;
        assert_eq!(success("component-kept", &exec), &json!({ "calls": calls }));
    }
    assert_eq!(moved(&sb, before).reused, 3);
    assert_eq!(sb.warm_idle(), 1);
}

/// An HTTP task on a kept instance: each task's requests are counted as its own, and the
/// egress list is the task's. An instance whose guest still holds a response or body when
/// its task ends is not kept: componentize-js's `fetch` leaves them to its garbage collector,
/// so every js-fetch task ends its instance.
#[tokio::test]
async fn warm_senders_count_each_tasks_requests_as_its_own() {
    let sb = sandbox_of_its_own();
    let kept = [(PYTHON_SEND, (3, 3, 1)), (JS_FETCH, (0, 0, 4))];
    for (name, expected) in kept {
        let module = sb.compile(&guest_bytes(name)).expect("compiles");
        let api = MailApi::start(Reply::MessageId).await.expect("mail api");
        let before = sb.warm_stats();
        let payload = json!({"mail_api_url": api.url(), "to": "ada@example.org", "subject": "hi"});
        let env = vec![("MAIL_API_KEY".to_owned(), "k-123".to_owned())];
        for n in 1..=3 {
            let capabilities = Capabilities { env: env.clone(), ..allowing(&[&api.allow_entry()]) };
            let task =
                TaskInput { capabilities, ..warm_input(&format!("s/{name}"), 100, &payload, 1) };
            let exec = sb.run(&module, &task, &limits()).await;
            assert_eq!(
                success(name, &exec),
                &json!({"message_id": format!("msg-{n}"), "status": 200})
            );
            assert_eq!((exec.usage.http_requests, exec.usage.http_refused), (1, 0), "{name}");
            assert_eq!(exec.usage.bytes_received, format!(r#"{{"id":"msg-{n}"}}"#).len() as u64);
        }
        // Off the list for this task: refused, though the instance reached the API before.
        let capabilities = Capabilities { env: env.clone(), ..Capabilities::none() };
        let task = TaskInput { capabilities, ..warm_input(&format!("s/{name}"), 100, &payload, 1) };
        let exec = sb.run(&module, &task, &limits()).await;
        retryable_message(name, &exec);
        assert_eq!((exec.usage.http_requests, exec.usage.http_refused), (0, 1), "{name}");
        assert_eq!(api.requests().len(), 3, "{name}");
        let stats = moved(&sb, before);
        assert_eq!((stats.reused, stats.kept, stats.dropped), expected, "{name}: {stats:?}");
    }
}

/// p50 of `samples`.
fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::test]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn measure_python_and_js_against_rust() {
    const RUNS: usize = 200;
    let payload = serde_json::to_vec(&json!({"name": "Ada"})).expect("json");
    let task = input(&payload, Capabilities::none());
    println!(
        "{:<16} {:>9} {:>10} {:>13} {:>9} {:>9} {:>12}",
        "component", "size KiB", "compile s", "p50 per task", "ratio", "peak MiB", "fuel/task"
    );
    let mut rust_p50 = None;
    for name in ["component-noop", PYTHON_HELLO, JS_HELLO] {
        let bytes =
            if name == "component-noop" { component_bytes(name) } else { guest_bytes(name) };
        let started = Instant::now();
        let module = sandbox().compile(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let compile = started.elapsed();
        let mut samples = Vec::with_capacity(RUNS);
        let mut last = None;
        for _ in 0..RUNS {
            let started = Instant::now();
            let exec = sandbox().run(&module, &task, &limits()).await;
            samples.push(started.elapsed());
            assert!(matches!(exec.outcome, Outcome::Success(_)), "{name}: {exec:?}");
            last = Some(exec.usage);
        }
        let usage = last.expect("at least one run");
        let p50 = median(&mut samples);
        let rust = *rust_p50.get_or_insert(p50);
        println!(
            "{name:<16} {:>9} {:>10.2} {:>13.2?} {:>8.1}x {:>9.1} {:>12}",
            bytes.len().div_ceil(1024),
            compile.as_secs_f64(),
            p50,
            p50.as_secs_f64() / rust.as_secs_f64(),
            usage.peak_memory_bytes as f64 / f64::from(1 << 20),
            usage.fuel_used,
        );
    }
}

/// componentize-js opens a stdin and a stdout stream every task and never drops them: a kept
/// instance is dropped once it holds more resources than the bound, so its table (and the
/// host memory behind it) stays bounded. The Python guest drops what it opens and keeps
/// its instance.
#[tokio::test]
async fn a_guest_that_leaks_handles_gets_a_fresh_instance_past_the_bound() {
    let sb = sandbox_of_its_own();
    for (name, leaks) in [(PYTHON_HELLO, false), (JS_HELLO, true)] {
        let module = sb.compile(&guest_bytes(name)).expect("compiles");
        let before = sb.warm_stats();
        for n in 0..100 {
            let task = warm_input(name, 1000, &json!({"name": "x"}), n + 1);
            let exec = sb.run(&module, &task, &limits()).await;
            assert_eq!(success(name, &exec)["attempt"], n + 1);
        }
        let stats = moved(&sb, before);
        if leaks {
            assert!(stats.dropped >= 1 && stats.reused < 99, "{name}: {stats:?}");
        } else {
            assert_eq!((stats.dropped, stats.reused), (0, 99), "{name}: {stats:?}");
        }
    }
}
