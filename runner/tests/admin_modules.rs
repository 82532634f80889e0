//! Module routes: upload (with every way it can be refused), idempotent re-upload, versions,
//! listing and activation (rollback).

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::admin::AdminConfig;
use sweep::queue::{self, TenantCaps};

const OP: Option<&str> = Some(OPERATOR);

#[sqlx::test(migrations = false)]
async fn upload_answers_201_with_version_hash_size_and_limits(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let api = api(&db);
    let bytes = module("wordcount");
    let a = api.put_wasm("/v1/modules/wordcount", OP, &bytes).await;
    let body = a.ok(201);
    assert_eq!(body["tenant"], "default");
    assert_eq!(body["task_type"], "wordcount");
    assert_eq!(body["version"], 1);
    assert_eq!(body["sha256"], sweep::sandbox::sha256_hex(&bytes));
    assert_eq!(body["size"], bytes.len());
    assert_eq!(body["created"], true);
    let limits = &body["limits"];
    assert_eq!(limits["fuel"], sweep::sandbox::DEFAULT_FUEL);
    assert_eq!(limits["timeout_ms"], 30_000);
    assert_eq!(limits["max_attempts"], 5);
    assert!(body["wasi_imports"].as_array().is_some_and(|i| !i.is_empty()));
    assert_eq!(body["kind"], "module");

    // Same bytes, same limits: the same version, 200, nothing new.
    let again = api.put_wasm("/v1/modules/wordcount", OP, &bytes).await;
    assert_eq!(again.ok(200)["version"], 1);
    assert_eq!(again.json["created"], false);

    // New limits make a new version, which becomes active.
    let path = "/v1/modules/wordcount?fuel=1000000&timeout_ms=500&memory_mb=16&max_attempts=2\
                &backoff_base_ms=10&backoff_cap_ms=100&max_running=3";
    let v2 = api.put_wasm(path, OP, &bytes).await;
    let v2 = v2.ok(201);
    assert_eq!(v2["version"], 2);
    assert_eq!(
        v2["limits"],
        json!({"fuel": 1_000_000, "timeout_ms": 500, "memory_bytes": 16 << 20,
               "output_bytes": sweep::sandbox::DEFAULT_OUTPUT_BYTES, "max_attempts": 2,
               "backoff_base_ms": 10, "backoff_cap_ms": 100, "max_running": 3})
    );

    // A task type in the path is percent-decoded: clients send `:` as `%3A` (the fuzzer found
    // `hs%3Ak` refused as an invalid task type).
    let a = api.put_wasm("/v1/modules/mail%3Asend", OP, &bytes).await;
    assert_eq!(a.ok(201)["task_type"], "mail:send");
    api.get("/v1/modules/mail:send", OP).await.ok(200);
    api.get("/v1/modules/mail%3asend", OP).await.ok(200);
    let a = api.post("/v1/modules/mail%3Asend/activate", OP, &json!({"version": 1})).await;
    assert_eq!(a.ok(200)["task_type"], "mail:send");
}

#[sqlx::test(migrations = false)]
async fn list_versions_and_activate_to_roll_back(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    api.put_wasm("/v1/modules/count", OP, &module("wordcount")).await.ok(201);
    api.put_wasm("/v1/modules/count", OP, &module("noop")).await.ok(201);
    api.put_wasm("/v1/modules/other", OP, &module("noop")).await.ok(201);

    let list = api.get("/v1/modules", OP).await;
    let modules = list.ok(200)["modules"].as_array().unwrap().clone();
    let summary: Vec<_> =
        modules.iter().map(|m| (m["task_type"].clone(), m["version"].clone())).collect();
    assert_eq!(summary, vec![(json!("count"), json!(2)), (json!("other"), json!(1))]);
    // `?all=` is no boolean (it used to mean true; the fuzzer found it accepted).
    api.get("/v1/modules?all=", OP).await.expect(400, "invalid_parameter");
    let all = api.get("/v1/modules?all=true", OP).await;
    assert_eq!(all.ok(200)["modules"].as_array().unwrap().len(), 3);

    let versions = api.get("/v1/modules/count", OP).await;
    let versions = versions.ok(200)["modules"].as_array().unwrap().clone();
    assert_eq!(versions.len(), 2);
    assert_eq!(
        (versions[0]["version"].clone(), versions[0]["active"].clone()),
        (json!(2), json!(true))
    );
    assert_eq!(versions[1]["active"], false);

    let rolled = api.post("/v1/modules/count/activate", OP, &json!({"version": 1})).await;
    assert_eq!(rolled.ok(200)["version"], 1);
    assert_eq!(rolled.json["active"], true);
    let versions = api.get("/v1/modules/count", OP).await;
    assert_eq!(versions.ok(200)["modules"][1]["active"], true);

    api.post("/v1/modules/count/activate", OP, &json!({"version": 9}))
        .await
        .expect(404, "not_found");
    api.post("/v1/modules/ghost/activate", OP, &json!({"version": 1}))
        .await
        .expect(404, "not_found");
    api.post("/v1/modules/count/activate", OP, &json!({"version": "one"}))
        .await
        .expect(400, "invalid_json");
    api.post("/v1/modules/count/activate", OP, &json!({})).await.expect(400, "invalid_json");
    api.post("/v1/modules/count/activate", OP, &json!([1])).await.expect(400, "invalid_json");
    let rolled = api.post("/v1/modules/count/activate", OP, &json!({"version": 2.0})).await;
    assert_eq!(rolled.ok(200)["version"], 2, "2.0 is an integer to JSON Schema");
    api.get("/v1/modules/ghost", OP).await.expect(404, "not_found");
    api.get("/v1/modules/bad%20type", OP).await.expect(400, "invalid_task_type");
}

#[sqlx::test(migrations = false)]
async fn modules_that_break_the_guest_contract_are_422_and_say_why(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let api = api(&db);
    let put = |bytes: Vec<u8>| {
        let api = &api;
        async move { api.put_wasm("/v1/modules/bad", OP, &bytes).await }
    };
    put(b"#!/bin/sh\necho hi\n".to_vec()).await.expect(422, "not_wasm");
    put(Vec::new()).await.expect(422, "not_wasm");

    let whole = module("wordcount");
    let truncated = put(whole[..whole.len() / 2].to_vec()).await;
    truncated.expect(422, "invalid_wasm");
    assert!(truncated.message().contains("compile"), "{}", truncated.message());

    let foreign = wat(r#"(module (import "env" "launch_missiles" (func))
                           (memory (export "memory") 1) (func (export "_start")))"#);
    let a = put(foreign).await;
    a.expect(422, "forbidden_import");
    assert!(a.message().contains("env::launch_missiles"), "{}", a.message());

    let no_start = wat(r#"(module (memory (export "memory") 1) (func (export "main")))"#);
    put(no_start).await.expect(422, "missing_start");

    let unknown_wasi = wat(r#"(module (import "wasi_snapshot_preview1" "sock_magic" (func))
                                (memory (export "memory") 1) (func (export "_start")))"#);
    let a = put(unknown_wasi).await;
    a.expect(422, "unknown_import");
    assert!(a.message().contains("sock_magic"));

    // A component that is not a command: 422, naming what it exports instead.
    let library = wat(r#"(component
                           (core module $m (func (export "f") (result i32) i32.const 7))
                           (core instance $i (instantiate $m))
                           (func $f (result u32) (canon lift (core func $i "f")))
                           (export "greet" (func $f)))"#);
    let a = put(library).await;
    a.expect(422, "missing_run_export");
    assert!(a.message().contains("`wasi:cli/run`") && a.message().contains("greet"));

    // Nothing was stored by any of these.
    api.get("/v1/modules/bad", OP).await.expect(404, "not_found");
    put(tiny_command()).await.ok(201);
}

#[sqlx::test(migrations = false)]
async fn a_component_uploads_like_a_module(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    let bytes = sweep_dev::modules::component_bytes("send-email");
    let body = api.put_wasm("/v1/modules/send_email", OP, &bytes).await.ok(201).clone();
    assert_eq!(body["kind"], "component");
    assert_eq!(body["sha256"], sweep::sandbox::sha256_hex(&bytes));
    let imports = body["wasi_imports"].as_array().cloned().unwrap_or_default();
    assert!(
        imports.iter().any(|i| i.as_str().is_some_and(|i| i.starts_with("wasi:http/"))),
        "{imports:?}"
    );
}

#[sqlx::test(migrations = false)]
async fn a_component_may_keep_its_instances_and_a_module_may_not(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let api = api(&db);
    let bytes = sweep_dev::modules::component_bytes("component-noop");
    // A component keeps its instances unless its upload says otherwise.
    let default = api.put_wasm("/v1/modules/noop", OP, &bytes).await.ok(201).clone();
    assert_eq!(default["reuse"], json!(queue::DEFAULT_REUSE));
    let explicit = format!("/v1/modules/noop?reuse={}", queue::DEFAULT_REUSE);
    assert_eq!(api.put_wasm(&explicit, OP, &bytes).await.ok(200)["version"], 1);
    // Another count is another version; the same count, the same version.
    let kept = api.put_wasm("/v1/modules/noop?reuse=50", OP, &bytes).await.ok(201).clone();
    assert_eq!((kept["version"].clone(), kept["reuse"].clone()), (json!(2), json!(50)));
    let again = api.put_wasm("/v1/modules/noop?reuse=50", OP, &bytes).await;
    assert_eq!(again.ok(200)["version"], 2);
    let fresh = api.put_wasm("/v1/modules/noop?reuse=1", OP, &bytes).await.ok(201).clone();
    assert_eq!((fresh["version"].clone(), fresh["reuse"].clone()), (json!(3), json!(1)));
    let listed = api.get("/v1/modules/noop", OP).await.ok(200).clone();
    let reuse: Vec<_> = listed["modules"].as_array().unwrap().iter().map(|m| &m["reuse"]).collect();
    assert_eq!(reuse, [&json!(1), &json!(50), &json!(queue::DEFAULT_REUSE)]);

    for bad in ["reuse=0", "reuse=-1", "reuse=abc", "reuse=1000001", "reuse=1&reuse=2"] {
        let a = api.put_wasm(&format!("/v1/modules/noop?{bad}"), OP, &bytes).await;
        assert_eq!(a.status.as_u16(), 400, "{bad}: {}", a.text);
    }
    // A preview-1 command's `_start` runs once per instance: nothing stored.
    let a = api.put_wasm("/v1/modules/wc?reuse=10", OP, &module("wordcount")).await;
    a.expect(422, "reuse_needs_component");
    assert!(a.message().contains("preview-1 module"), "{}", a.message());
    api.get("/v1/modules/wc", OP).await.expect(404, "not_found");
    let plain = api.put_wasm("/v1/modules/wc", OP, &module("wordcount")).await.ok(201).clone();
    assert_eq!(plain["reuse"], serde_json::Value::Null);
}

#[sqlx::test(migrations = false)]
async fn size_content_type_and_parameters_are_checked(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api_with(&db, AdminConfig { max_module_bytes: 64 * 1024, ..AdminConfig::default() });
    // Over the server limit: 413, whether the length is declared or not.
    let big = vec![0u8; 64 * 1024 + 1];
    api.put_wasm("/v1/modules/big", OP, &big).await.expect(413, "too_large");

    // The tenant's own cap is lower still.
    let caps = TenantCaps { max_module_bytes: Some(100), ..TenantCaps::default() };
    let small = api.tenant("small", caps).await;
    let a = api.put_wasm("/v1/modules/t", Some(&small), &module("noop")).await;
    a.expect(413, "too_large");
    assert!(a.message().contains("100 bytes"), "{}", a.message());
    api.put_wasm("/v1/modules/t", Some(&small), &tiny_command()).await.ok(201);

    let wrong_type = api.req("PUT", "/v1/modules/t", OP).body("text/plain", tiny_command());
    let a = api.send(wrong_type).await;
    a.expect(415, "unsupported_media_type");
    assert!(a.message().contains("application/octet-stream"), "{}", a.message());
    // Raw bytes as generated clients send a file: the same upload.
    let octets =
        api.req("PUT", "/v1/modules/t2", OP).body("application/octet-stream", tiny_command());
    api.send(octets).await.ok(201);
    let no_type = api.req("PUT", "/v1/modules/t", OP).header("content-length", "0");
    api.send(no_type).await.expect(415, "unsupported_media_type");

    for bad in [
        "fuel=-1",
        "fuel=0",
        "timeout_ms=abc",
        "memory_mb=1.5",
        "max_attempts=-3",
        "fule=1",
        "fuel=1&fuel=2",
    ] {
        let a = api.put_wasm(&format!("/v1/modules/t?{bad}"), OP, &tiny_command()).await;
        assert_eq!(a.status.as_u16(), 400, "{bad}: {}", a.text);
    }
    api.put_wasm("/v1/modules/bad%2Ftype", OP, &tiny_command())
        .await
        .expect(400, "invalid_task_type");
}

#[sqlx::test(migrations = false)]
async fn limits_above_runner_maxima_or_tenant_caps_are_422(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    let caps = TenantCaps {
        max_fuel: Some(1_000_000),
        max_timeout_ms: Some(1000),
        max_memory_bytes: Some(32 << 20),
        ..TenantCaps::default()
    };
    let capped = api.tenant("capped", caps).await;
    let put = |query: &'static str, token: String| {
        let api = &api;
        async move {
            api.put_wasm(&format!("/v1/modules/t?{query}"), Some(&token), &tiny_command()).await
        }
    };
    let a = put("fuel=999999999999999", OPERATOR.into()).await;
    a.expect(422, "limit_too_high");
    assert!(a.message().contains("runner maximum"), "{}", a.message());
    put("timeout_ms=86400000", OPERATOR.into()).await.expect(422, "limit_too_high");
    put("memory_mb=100000", OPERATOR.into()).await.expect(422, "limit_too_high");
    put("max_attempts=100000", OPERATOR.into()).await.expect(422, "limit_too_high");
    put("backoff_base_ms=100&backoff_cap_ms=10", OPERATOR.into())
        .await
        .expect(422, "invalid_backoff");

    let a = put("fuel=2000000", capped.clone()).await;
    a.expect(422, "limit_too_high");
    assert!(a.message().contains("tenant's cap"), "{}", a.message());
    put("timeout_ms=2000", capped.clone()).await.expect(422, "limit_too_high");
    put("memory_mb=64", capped.clone()).await.expect(422, "limit_too_high");

    // Within the caps; and without asking, the caps (below the runner defaults) apply.
    let ok = put("fuel=500000", capped.clone()).await;
    assert_eq!(ok.ok(201)["limits"]["fuel"], 500_000);
    assert_eq!(ok.json["limits"]["timeout_ms"], 1000);
    assert_eq!(ok.json["limits"]["memory_bytes"], 32 << 20);
}

#[sqlx::test(migrations = false)]
async fn a_module_whose_memory_cannot_fit_its_limit_is_refused_in_those_terms(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let api = api(&db);
    // 65536 pages: 4 GiB at start, against the 32 MiB the upload asks for.
    let huge = wat(r#"(module (memory (export "memory") 65536) (func (export "_start")))"#);
    let a = api.put_wasm("/v1/modules/hog?memory_mb=32", OP, &huge).await;
    a.expect(422, "memory_too_large");
    assert_eq!(a.message(), "module needs 4096 MiB at start; its limit is 32 MiB");

    // Without a request, the limit is the runner's default (64 MiB); 100 MiB does not fit.
    let big = wat(r#"(module (memory (export "memory") 1600) (func (export "_start")))"#);
    let a = api.put_wasm("/v1/modules/big", OP, &big).await;
    a.expect(422, "memory_too_large");
    assert_eq!(a.message(), "module needs 100 MiB at start; its limit is 64 MiB");
    // Asking for enough memory makes it fit.
    api.put_wasm("/v1/modules/big?memory_mb=128", OP, &big).await.ok(201);
    // The pooling allocator's sandbox (the one `sweep run` shares) says the same.
    let pooled = sweep::sandbox::Sandbox::new(sweep::sandbox::SandboxConfig::default()).unwrap();
    let e = pooled.validate_module_for(&huge, 64 << 20).unwrap_err();
    assert_eq!(e.to_string(), "module needs 4096 MiB at start; its limit is 64 MiB");
}
