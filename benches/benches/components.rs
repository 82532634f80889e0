//! What a WASI 0.2 component costs the sandbox next to a preview-1 module, and what the egress
//! check costs an outbound request.
//!
//! run with `cargo bench -p sweep-benches --bench components` (after `scripts/build-modules.sh`,
//! which builds the Rust, Python and JavaScript guests)
//!
//! - `components/pooled/{module_noop,component_noop,component_noop_kept}`: `Sandbox::run` of
//!   the Rust no-op as a preview-1 module (`modules/noop`, the SDK) and as a component
//!   (`components/component-noop`, the same work: read the payload, parse it, write `{}`), in
//!   the same run, the component on a fresh instance per task and on a kept one (up to
//!   `DEFAULT_REUSE` tasks each, what an upload without `reuse` gets); the target is
//!   component / module ≤ 1.5;
//! - `components/big/{python_hello,js_hello}/{image,no_image,kept}`: `Sandbox::run` of the
//!   componentize-py and componentize-js hello guests (`guests/python-hello`, `guests/js-hello`,
//!   tens of MB of pre-initialized interpreter), with their memory instantiated from its
//!   copy-on-write image (the default) and copied in at every instantiation instead
//!   (`SandboxConfig::memory_images` off): what the prepared image buys a big guest; and on a
//!   kept instance (`TaskInput::reuse`, a version uploaded with `?reuse=`): what keeping it
//!   buys;
//! - `egress/check`: the egress layer's decision for one request (`allows_host` on the URL's
//!   host, `allows_address` on the address to dial) against a 10-entry allow list;
//! - `egress/loopback_request`: one component run that sends one request to a loopback server
//!   it is allowed to reach, less nothing: the check is part of it. The check's share of a
//!   request is `egress/check` over this.

use std::net::SocketAddr;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;
use sweep::sandbox::{
    Capabilities, EgressPolicy, Limits, Outcome, Reuse, Sandbox, SandboxConfig, TaskInput,
};
use sweep_benches::{noop_wasm, runtime};
use sweep_dev::mail::{MailApi, Reply};
use sweep_dev::modules::component_bytes;

fn noops(c: &mut Criterion) {
    let rt = runtime();
    let input = TaskInput::new("1", "noop", 1, 5, &json!({ "i": 1 }));
    let limits = Limits::DEFAULT;
    let sandbox = Sandbox::new(SandboxConfig::default()).expect("sandbox");
    let mut group = c.benchmark_group("components/pooled");
    group.throughput(Throughput::Elements(1));
    // At the upload's default a component keeps its instance for this many tasks.
    let tasks = u32::try_from(sweep::queue::DEFAULT_REUSE).expect("positive");
    let kept = Some(Reuse { scope: "noop".to_owned(), tasks });
    let component = component_bytes("component-noop");
    for (name, bytes, reuse) in [
        ("module_noop", noop_wasm(), None),
        ("component_noop", component.clone(), None),
        ("component_noop_kept", component, kept),
    ] {
        let handler = sandbox.compile(&bytes).expect("compile");
        let input = TaskInput { reuse, ..input.clone() };
        let first = rt.block_on(sandbox.run(&handler, &input, &limits));
        assert!(matches!(first.outcome, Outcome::Success(_)), "{name}: {first:?}");
        let again = rt.block_on(sandbox.run(&handler, &input, &limits));
        assert_eq!(again.on_kept_instance, input.reuse.is_some(), "{name}: {again:?}");
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| sandbox.run(&handler, &input, &limits))
        });
    }
    group.finish();
}

fn big_guests(c: &mut Criterion) {
    let rt = runtime();
    let input = TaskInput::new("1", "hello", 1, 5, &json!({ "i": 1 }));
    let limits = Limits::DEFAULT;
    let mut group = c.benchmark_group("components/big");
    group.throughput(Throughput::Elements(1));
    for (guest, bytes) in [
        ("python_hello", component_bytes("python-hello")),
        ("js_hello", component_bytes("js-hello")),
    ] {
        let kept = Some(Reuse { scope: guest.to_owned(), tasks: u32::MAX });
        for (image, memory_images, reuse) in
            [("image", true, None), ("no_image", false, None), ("kept", true, kept)]
        {
            let config = SandboxConfig { memory_images, ..SandboxConfig::default() };
            let sandbox = Sandbox::new(config).expect("sandbox");
            let input = TaskInput { reuse, ..input.clone() };
            let handler = sandbox.compile(&bytes).expect("compile");
            let first = rt.block_on(sandbox.run(&handler, &input, &limits));
            assert!(matches!(first.outcome, Outcome::Success(_)), "{guest}/{image}: {first:?}");
            // Only checked when measured: a filter (`-- egress`) skips the function.
            let measured = std::cell::Cell::new(false);
            group.bench_function(format!("{guest}/{image}"), |b| {
                measured.set(true);
                b.to_async(&rt).iter(|| sandbox.run(&handler, &input, &limits))
            });
            if measured.get() {
                let reused = sandbox.warm_stats().reused > 0;
                assert_eq!(
                    reused,
                    input.reuse.is_some(),
                    "{guest}/{image}: {:?}",
                    sandbox.warm_stats()
                );
            }
        }
    }
    group.finish();
}

fn egress(c: &mut Criterion) {
    let rt = runtime();
    let api = rt.block_on(MailApi::start(Reply::MessageId)).expect("server");
    let mut entries: Vec<String> = (0..8).map(|i| format!("api{i}.mail.example")).collect();
    entries.push("*.example.org".to_owned());
    entries.push(api.allow_entry());
    let policy = EgressPolicy::parse(&entries).expect("policy");
    let public: SocketAddr = "93.184.216.34:443".parse().expect("address");

    let mut group = c.benchmark_group("egress");
    group.throughput(Throughput::Elements(1));
    group.bench_function("check", |b| {
        b.iter(|| {
            let host = std::hint::black_box("hooks.eu.example.org");
            let allowed = policy.allows_host(host, 443)
                && policy.allows_address(std::hint::black_box(public));
            assert!(allowed);
        })
    });

    let sandbox = Sandbox::new(SandboxConfig::default()).expect("sandbox");
    let probe = sandbox.compile(&component_bytes("component-probe")).expect("compile");
    let caps = Capabilities { egress: Arc::new(policy), ..Capabilities::none() };
    let payload =
        json!({"do": "fetch", "requests": [{"url": api.url(), "method": "POST", "body": {}}]});
    let input = TaskInput { capabilities: caps, ..TaskInput::new("1", "fetch", 1, 5, &payload) };
    let limits = Limits::DEFAULT;
    let first = rt.block_on(sandbox.run(&probe, &input, &limits));
    match &first.outcome {
        Outcome::Success(v) if v[0]["status"] == 200 => {}
        other => panic!("the probe's request failed: {other:?} {}", first.stderr),
    }
    group.bench_function("loopback_request", |b| {
        b.to_async(&rt).iter(|| sandbox.run(&probe, &input, &limits))
    });
    group.finish();
}

criterion_group!(benches, noops, big_guests, egress);
criterion_main!(benches);
