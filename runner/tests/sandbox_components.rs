//! WASI 0.2 components as handlers: told apart from modules, held to the same contract and
//! limits, and their outbound HTTP under the egress policy (loopback only: a local server
//! stands in for a mail API and counts the connections it accepts). The components are
//! built by `scripts/build-modules.sh` (crates under `components/`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use sweep::queue::FailureKind;
use sweep::sandbox::{
    Capabilities, CompiledModule, EgressPolicy, Execution, HandlerKind, HttpLimits, Limits,
    Outcome, Sandbox, SandboxConfig, TaskInput, ValidationError,
};
use sweep_dev::mail::{MailApi, Reply};
use sweep_dev::modules::component_bytes;
use sweep_dev::testing::{
    both_allocators as both, error_chain as chain, shared_sandbox as sandbox,
};

fn limits() -> Limits {
    Limits {
        fuel: 500_000_000,
        timeout: Duration::from_secs(10),
        memory_bytes: 32 << 20,
        output_bytes: 64 << 10,
    }
}

/// Each component compiled once per sandbox kind.
fn component(sb: &Sandbox, name: &str) -> CompiledModule {
    static CACHE: OnceLock<std::sync::Mutex<Vec<(usize, String, CompiledModule)>>> =
        OnceLock::new();
    let key = sb as *const Sandbox as usize;
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, _, m)) = cache.iter().find(|(k, n, _)| *k == key && n == name) {
        return m.clone();
    }
    let compiled = sb.compile(&component_bytes(name)).expect("the component compiles");
    cache.push((key, name.to_owned(), compiled.clone()));
    compiled
}

fn input(payload: Value, capabilities: Capabilities) -> TaskInput {
    TaskInput { capabilities, ..TaskInput::new("task-9", "mail", 1, 3, &payload) }
}

fn allowing(entries: &[&str]) -> Capabilities {
    let egress = EgressPolicy::parse(entries).expect("a valid allow list");
    Capabilities { egress: Arc::new(egress), ..Capabilities::none() }
}

async fn probe(sb: &Sandbox, payload: Value, capabilities: Capabilities) -> Execution {
    let module = component(sb, "component-probe");
    sb.run(&module, &input(payload, capabilities), &limits()).await
}

fn success(exec: &Execution) -> &Value {
    match &exec.outcome {
        Outcome::Success(v) => v,
        other => panic!("expected success, got {other:?}; stderr: {}", exec.stderr),
    }
}

#[tokio::test]
async fn the_component_noop_returns_an_empty_object_under_both_allocators() {
    for sb in both() {
        let module = component(sb, "component-noop");
        assert_eq!(module.kind(), HandlerKind::Component);
        let exec = sb.run(&module, &input(json!({"n": 1}), Capabilities::none()), &limits()).await;
        assert_eq!(success(&exec), &json!({}));
        let usage = exec.usage;
        assert!(usage.fuel_used > 0 && usage.fuel_used < limits().fuel, "{usage:?}");
        assert!(usage.peak_memory_bytes >= 64 << 10, "{usage:?}");
        assert_eq!((usage.http_requests, usage.http_refused), (0, 0));
        assert_eq!((usage.bytes_sent, usage.bytes_received), (0, 0));
    }
}

#[tokio::test]
async fn a_component_is_told_from_a_module_and_must_export_run() {
    let sb = sandbox(true);
    let info = sb.validate_module(&component_bytes("send-email")).expect("valid");
    assert_eq!(info.kind, HandlerKind::Component);
    assert!(info.wasi_imports.iter().any(|i| i.starts_with("wasi:http/outgoing-handler@0.2.")));
    assert!(info.wasi_imports.iter().any(|i| i.starts_with("wasi:cli/stdin@0.2.")));

    let library = wat::parse_str(
        r#"(component
             (core module $m (func (export "f") (result i32) i32.const 7))
             (core instance $i (instantiate $m))
             (func $f (result u32) (canon lift (core func $i "f")))
             (export "greet" (func $f)))"#,
    )
    .expect("component text");
    match sb.validate_module(&library) {
        Err(e @ ValidationError::MissingRunExport { .. }) => {
            let text = e.to_string();
            assert!(text.contains("does not export `wasi:cli/run`"), "{text}");
            assert!(text.ends_with("it exports: greet"), "{text}");
        }
        other => panic!("expected a missing run export, got {other:?}"),
    }

    let imports_unknown = wat::parse_str(
        r#"(component
             (import "acme:db/query@1.0.0" (instance (export "q" (func))))
             (core module $m (func (export "run") (result i32) i32.const 0))
             (core instance $i (instantiate $m))
             (func $run (result (result)) (canon lift (core func $i "run")))
             (instance $run (export "run" (func $run)))
             (export "wasi:cli/run@0.2.0" (instance $run)))"#,
    )
    .expect("component text");
    match sb.validate_module(&imports_unknown) {
        Err(e @ ValidationError::ComponentLink(_)) => {
            let text = chain(&e);
            assert!(text.contains("acme:db/query"), "{text}");
        }
        other => panic!("expected a link error, got {other:?}"),
    }
}

#[tokio::test]
async fn exit_codes_keep_their_meaning() {
    let sb = sandbox(true);
    let exec = probe(
        sb,
        json!({"do": "exit", "code": 100, "message": "bad address"}),
        Capabilities::none(),
    )
    .await;
    assert_eq!(
        exec.outcome,
        Outcome::HandlerError { permanent: true, exit_code: 100, message: "bad address".into() }
    );
    let exec = probe(sb, json!({"do": "exit", "code": 3}), Capabilities::none()).await;
    assert!(matches!(exec.outcome, Outcome::HandlerError { permanent: false, exit_code: 3, .. }));
    let echoed = probe(sb, json!({"do": "echo", "x": [1, 2]}), Capabilities::none()).await;
    assert_eq!(success(&echoed), &json!({"do": "echo", "x": [1, 2]}));
}

#[tokio::test]
async fn components_are_held_to_every_limit() {
    for sb in both() {
        let none = Capabilities::none;
        let module = &component(sb, "component-probe");
        let run = |payload: Value, limits: Limits| {
            let input = input(payload, none());
            async move { sb.run(module, &input, &limits).await.outcome }
        };
        let small_fuel = Limits { fuel: 5_000_000, ..limits() };
        assert_eq!(run(json!({"do": "spin"}), small_fuel).await, Outcome::OutOfFuel);
        let short = Limits { fuel: u64::MAX / 2, timeout: Duration::from_millis(300), ..limits() };
        assert_eq!(run(json!({"do": "spin"}), short).await, Outcome::Timeout);
        // Waiting in the host: stopped by the wall clock, at no cost in fuel.
        let short = Limits { timeout: Duration::from_millis(300), ..limits() };
        assert_eq!(run(json!({"do": "sleep", "ms": 3_600_000}), short).await, Outcome::Timeout);
        assert_eq!(run(json!({"do": "grow", "mib": 64}), limits()).await, Outcome::MemoryLimit);
        assert_eq!(run(json!({"do": "flood"}), limits()).await, Outcome::OutputTooLarge);
        let grown =
            sb.run(module, &input(json!({"do": "grow", "mib": 8}), none()), &limits()).await;
        assert_eq!(success(&grown), &json!({"bytes": 8 << 20}));
        assert!(grown.usage.peak_memory_bytes >= 8 << 20, "{:?}", grown.usage);
    }
}

#[tokio::test]
async fn secrets_reach_the_guest_as_environment_variables() {
    let caps = Capabilities {
        env: vec![("MAIL_API_KEY".into(), "k-secret".into())],
        ..Capabilities::none()
    };
    let exec = probe(sandbox(true), json!({"do": "env"}), caps).await;
    assert_eq!(
        success(&exec),
        &json!({
            "SWEEP_TASK_ID": "task-9",
            "SWEEP_TASK_TYPE": "mail",
            "SWEEP_ATTEMPT": "1",
            "SWEEP_MAX_ATTEMPTS": "3",
            "MAIL_API_KEY": "k-secret",
        })
    );
}

fn mail_input(api: &MailApi, caps: Capabilities) -> TaskInput {
    let caps = Capabilities { env: vec![("MAIL_API_KEY".into(), "k-123".into())], ..caps };
    let payload = json!({"mail_api_url": api.url(), "to": "ada@example.org", "subject": "hi"});
    input(payload, caps)
}

#[tokio::test]
async fn send_email_posts_with_the_key_and_returns_the_message_id() {
    let api = MailApi::start(Reply::MessageId).await.expect("mail api");
    let sb = sandbox(true);
    let module = component(sb, "send-email");
    let exec = sb.run(&module, &mail_input(&api, allowing(&[&api.allow_entry()])), &limits()).await;
    assert_eq!(success(&exec), &json!({"message_id": "msg-1", "status": 200}));
    let requests = api.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!((sent.method.as_str(), sent.path.as_str()), ("POST", "/send"));
    assert_eq!(sent.header("authorization"), Some("Bearer k-123"));
    let body: Value = serde_json::from_slice(&sent.body).expect("a JSON body");
    assert_eq!(body, json!({"to": "ada@example.org", "subject": "hi"}));
    let usage = exec.usage;
    assert_eq!((usage.http_requests, usage.http_refused), (1, 0));
    assert_eq!(usage.bytes_sent, sent.body.len() as u64);
    assert_eq!(usage.bytes_received, br#"{"id":"msg-1"}"#.len() as u64);
}

#[tokio::test]
async fn a_host_off_the_list_is_denied_before_any_connection() {
    let api = MailApi::start(Reply::MessageId).await.expect("mail api");
    let sb = sandbox(true);
    let module = component(sb, "send-email");
    for caps in [Capabilities::none(), allowing(&["api.mail.example", "127.0.0.1:1"])] {
        let exec = sb.run(&module, &mail_input(&api, caps), &limits()).await;
        assert!(
            matches!(exec.outcome, Outcome::HandlerError { permanent: false, exit_code: 1, .. }),
            "{exec:?}"
        );
        assert!(exec.stderr.contains("HttpRequestDenied"), "{}", exec.stderr);
        let port = api.addr().port();
        let why = format!("refused: 127.0.0.1:{port} is not on the tenant's egress list");
        assert!(exec.stderr.contains(&why), "{}", exec.stderr);
        assert_eq!((exec.usage.http_requests, exec.usage.http_refused), (0, 1));
    }
    assert_eq!(api.connections(), 0);
}

#[tokio::test]
async fn private_addresses_need_their_literal_on_the_list() {
    let api = MailApi::start(Reply::MessageId).await.expect("mail api");
    let port = api.addr().port();
    let sb = sandbox(true);
    let fetch = |url: String| json!({"do": "fetch", "requests": [{"url": url}]});

    // Cloud metadata: off the list, whatever else is on it.
    let caps = allowing(&["*.example.org", &api.allow_entry()]);
    let exec = probe(sb, fetch("http://169.254.169.254/latest/meta-data/".into()), caps).await;
    let error = success(&exec)[0]["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("HttpRequestDenied"), "{error}");

    // Names on the list that resolve to loopback: refused at the address, not connected to.
    let mut names = vec!["localhost".to_owned()];
    if let Ok(host) = gethostname::gethostname().into_string() {
        let loopback_only = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
            .map(|mut addrs| addrs.all(|a| a.ip().is_loopback()))
            .unwrap_or(false);
        if loopback_only {
            names.push(host);
        }
    }
    for name in &names {
        let caps = allowing(&[name.as_str()]);
        let exec = probe(sb, fetch(format!("http://{name}:{port}/send")), caps).await;
        let error = success(&exec)[0]["error"].as_str().unwrap_or_default().to_owned();
        assert!(error.contains("DestinationIpProhibited"), "{name}: {error}");
        assert!(exec.stderr.contains("which are not public addresses"), "{}", exec.stderr);
        assert_eq!((exec.usage.http_requests, exec.usage.http_refused), (0, 1));
    }
    assert_eq!(api.connections(), 0);

    // The literal itself (with its port) is what allows a private address.
    let exec = probe(sb, fetch(api.url()), allowing(&[&api.allow_entry()])).await;
    assert_eq!(success(&exec)[0]["status"], 200, "{}", exec.stderr);
    assert_eq!(api.connections(), 1);
}

#[tokio::test]
async fn a_refused_request_with_a_large_body_sends_nothing() {
    let api = MailApi::start(Reply::MessageId).await.expect("mail api");
    // More than the host reads of a refused request's body before answering (1 MiB).
    let body = "x".repeat(3 << 20);
    let payload =
        json!({"do": "fetch", "requests": [{"url": api.url(), "method": "POST", "body": body}]});
    let exec = probe(sandbox(true), payload, allowing(&["api.mail.example"])).await;
    let error = success(&exec)[0]["error"].as_str().unwrap_or_default().to_owned();
    assert!(!error.is_empty(), "the refused request did not fail in the guest");
    assert!(exec.stderr.contains("is not on the tenant's egress list"), "{}", exec.stderr);
    assert_eq!((exec.usage.http_requests, exec.usage.http_refused), (0, 1));
    assert_eq!(exec.usage.bytes_sent, 0);
    assert_eq!(api.connections(), 0);
}

#[tokio::test]
async fn requests_past_the_limit_are_refused() {
    let api = MailApi::start(Reply::MessageId).await.expect("mail api");
    let caps = Capabilities {
        http: HttpLimits { max_requests: 2, ..HttpLimits::DEFAULT },
        ..allowing(&[&api.allow_entry()])
    };
    let one = json!({"url": api.url(), "method": "POST", "body": {"n": 1}});
    let payload = json!({"do": "fetch", "requests": [one, one, one]});
    let exec = probe(sandbox(true), payload, caps).await;
    let results = success(&exec);
    assert_eq!(results[0]["status"], 200);
    assert_eq!(results[1]["status"], 200);
    let error = results[2]["error"].as_str().unwrap_or_default();
    assert!(error.contains("HttpRequestDenied"), "{results}");
    assert!(exec.stderr.contains("limit of 2 requests"), "{}", exec.stderr);
    assert_eq!(api.connections(), 2);
    assert_eq!((exec.usage.http_requests, exec.usage.http_refused), (2, 1));
}

#[tokio::test]
async fn a_response_over_the_byte_limit_fails_in_the_guest() {
    let api = MailApi::start(Reply::Bytes(256 << 10)).await.expect("mail api");
    let caps = Capabilities {
        http: HttpLimits { max_response_bytes: 16 << 10, ..HttpLimits::DEFAULT },
        ..allowing(&[&api.allow_entry()])
    };
    let payload = json!({"do": "fetch", "requests": [{"url": api.url()}]});
    let exec = probe(sandbox(true), payload, caps).await;
    let result = &success(&exec)[0];
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains("HTTP response body size exceeds limit: 16384 bytes"), "{result}");
    // What arrived before the stop is counted, and it is not the whole body.
    let received = exec.usage.bytes_received;
    assert!(received > 16 << 10 && received < 256 << 10, "{:?}", exec.usage);
}

#[tokio::test]
async fn a_server_that_never_answers_ends_the_task_at_its_wall_clock() {
    let api = MailApi::start(Reply::Silent).await.expect("mail api");
    // One slot: the next run only gets one if the stopped run gave its slot back.
    let config = SandboxConfig { max_concurrency: 1, ..SandboxConfig::default() };
    let sb = Sandbox::new(config).expect("sandbox");
    let module = sb.compile(&component_bytes("send-email")).expect("compiles");
    let short = Limits { timeout: Duration::from_millis(500), ..limits() };
    let exec = sb.run(&module, &mail_input(&api, allowing(&[&api.allow_entry()])), &short).await;
    assert_eq!(exec.outcome, Outcome::Timeout);
    assert_eq!(exec.outcome.failure_kind(), Some(FailureKind::Timeout));
    // The stopped run's socket is closed: the server sees its client go.
    api.closed(1).await;
    assert_eq!(api.connections(), 1);

    let noop = sb.compile(&component_bytes("component-noop")).expect("compiles");
    let next = sb.run(&noop, &input(json!({}), Capabilities::none()), &limits()).await;
    assert_eq!(success(&next), &json!({}));
}
