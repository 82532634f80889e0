//! Task routes: enqueue (one, batch, dedup), show, cancel, and the dead-letter routes, with
//! their bad inputs.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::admin::AdminConfig;
use sweep::queue::TenantCaps;

const OP: Option<&str> = Some(OPERATOR);

async fn with_module(db: &Stores) -> Api {
    let api = api(db);
    api.put_wasm("/v1/modules/count", OP, &module("wordcount")).await.ok(201);
    api
}

#[sqlx::test(migrations = false)]
async fn enqueue_show_and_dedup(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = with_module(&db).await;
    let body = json!({"task_type": "count", "payload": {"text": "a b"}, "priority": 3,
                      "delay_ms": 60000, "max_attempts": 2, "dedup_key": "k1"});
    let first = api.post("/v1/tasks", OP, &body).await;
    let id = first.ok(201)["id"].as_i64().unwrap();
    assert_eq!(first.json["created"], true);

    let again = api.post("/v1/tasks", OP, &body).await;
    assert_eq!(again.ok(200)["id"], id, "the live task holding the dedup key");
    assert_eq!(again.json["created"], false);

    let shown = api.get(&format!("/v1/tasks/{id}"), OP).await;
    let t = shown.ok(200);
    assert_eq!(t["state"], TaskState::Pending.as_str());
    assert_eq!(t["tenant"], "default");
    assert_eq!(t["task_type"], "count");
    assert_eq!(t["payload"], json!({"text": "a b"}));
    assert_eq!((t["priority"].clone(), t["max_attempts"].clone()), (json!(3), json!(2)));
    assert_eq!(t["attempts"], 0);
    assert_eq!(t["errors"], json!([]));
    assert!(t["result"].is_null());

    // A module-less payload default and run_at also work.
    let at = api
        .post("/v1/tasks", OP, &json!({"task_type": "count", "run_at": "2030-01-01T00:00:00Z"}))
        .await;
    let at_id = at.ok(201)["id"].as_i64().unwrap();
    let t = api.get(&format!("/v1/tasks/{at_id}"), OP).await;
    assert_eq!(t.ok(200)["payload"], json!({}));

    api.get("/v1/tasks/999999", OP).await.expect(404, "not_found");
    api.get("/v1/tasks/not-a-number", OP).await.expect(404, "not_found");
}

#[sqlx::test(migrations = false)]
async fn bad_task_bodies_are_4xx_never_500(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = with_module(&db).await;
    let raw = |content_type: &str, body: &str| {
        api.req("POST", "/v1/tasks", OP).body(content_type, body.as_bytes())
    };
    api.send(raw("application/json", "{\"task_type\": ")).await.expect(400, "invalid_json");
    api.send(raw("application/json", "")).await.expect(400, "invalid_json");
    api.send(raw("application/json", "[1, 2]")).await.expect(400, "invalid_json");
    // An array of the fields in order is no task (serde alone reads it as one; the fuzzer
    // found it).
    api.send(raw("application/json", r#"["count"]"#)).await.expect(400, "invalid_json");
    let batch = api.req("POST", "/v1/tasks/batch", OP).body("application/json", r#"[["count"]]"#);
    api.send(batch).await.expect(400, "invalid_json");
    api.send(raw("text/plain", "{}")).await.expect(415, "unsupported_media_type");

    let post = |body: serde_json::Value| {
        let api = &api;
        async move { api.post("/v1/tasks", OP, &body).await }
    };
    post(json!({"payload": {}})).await.expect(400, "invalid_json");
    post(json!({"task_type": "count", "delay": 5})).await.expect(400, "invalid_json");
    post(json!({"task_type": "count", "delay_ms": -5})).await.expect(400, "invalid_json");
    post(json!({"task_type": "count", "priority": 1e20})).await.expect(400, "invalid_json");
    post(json!({"task_type": "count", "priority": 2.5})).await.expect(400, "invalid_json");
    post(json!({"task_type": "count", "max_attempts": 1.5})).await.expect(400, "invalid_json");
    post(json!({"task_type": "count", "run_at": "yesterday"})).await.expect(400, "invalid_json");

    let unknown = post(json!({"task_type": "nope"})).await;
    unknown.expect(422, "unknown_task_type");
    assert!(unknown.message().contains("nope"));
    post(json!({"task_type": "bad type!"})).await.expect(422, "invalid_task");
    post(json!({"task_type": "count", "payload": [1]})).await.expect(422, "invalid_task");
    post(json!({"task_type": "count", "payload": {"s": "nul\u{0}"}}))
        .await
        .expect(422, "invalid_task");
    post(json!({"task_type": "count", "dedup_key": "a\u{0}b"})).await.expect(422, "invalid_task");
    post(json!({"task_type": "count", "max_attempts": 0})).await.expect(422, "invalid_task");
    post(json!({"task_type": "count", "run_at": "1970-01-01T00:00:00Z"}))
        .await
        .expect(422, "invalid_task");
    post(json!({"task_type": "count", "delay_ms": 1, "run_at": "2030-01-01T00:00:00Z"}))
        .await
        .expect(422, "invalid_task");
    post(json!({"task_type": "count", "dedup_key": ""})).await.expect(422, "invalid_task");

    // Operator naming a tenant that does not exist; a bad tenant name.
    api.post("/v1/tasks?tenant=ghost", OP, &json!({"task_type": "count"}))
        .await
        .expect(404, "not_found");
    api.post("/v1/tasks?tenant=bad%20name", OP, &json!({"task_type": "count"}))
        .await
        .expect(400, "invalid_tenant");
    api.post("/v1/tasks?bogus=1", OP, &json!({"task_type": "count"}))
        .await
        .expect(400, "unknown_parameter");

    let stored: i64 =
        sqlx::query_scalar("select count(*) from sweep.tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(stored, 0, "no bad request wrote anything");
}

/// JSON Schema (the OpenAPI document's language) counts `3.0` as an integer; so does the API
/// (the fuzzer found integers with a zero fraction refused as malformed).
#[sqlx::test(migrations = false)]
async fn integers_may_be_written_with_a_zero_fraction(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = with_module(&db).await;
    let body = json!({"task_type": "count", "priority": 3.0, "delay_ms": 6e4, "max_attempts": 2.0});
    let id = api.post("/v1/tasks", OP, &body).await.ok(201)["id"].as_i64().unwrap();
    let t = api.get(&format!("/v1/tasks/{id}"), OP).await;
    let t = t.ok(200);
    assert_eq!((&t["priority"], &t["max_attempts"]), (&json!(3), &json!(2)));
    let batch = json!([{"task_type": "count", "priority": -1.0}]);
    api.post("/v1/tasks/batch", OP, &batch).await.ok(201);
}

#[sqlx::test(migrations = false)]
async fn request_bodies_are_size_limited(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api_with(&db, AdminConfig { max_json_bytes: 1024, ..AdminConfig::default() });
    api.put_wasm("/v1/modules/count", OP, &module("wordcount")).await.ok(201);
    let big = json!({"task_type": "count", "payload": {"text": "x".repeat(2000)}});
    api.post("/v1/tasks", OP, &big).await.expect(413, "too_large");
    let small = json!({"task_type": "count", "payload": {"text": "x"}});
    api.post("/v1/tasks", OP, &small).await.ok(201);
}

#[sqlx::test(migrations = false)]
async fn payloads_over_the_tenant_limit_are_413_and_nothing_is_written(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    // Deployment default 100 bytes; "roomy" may send 1000, "tight" only 20.
    let api = api_with(&db, AdminConfig { max_payload_bytes: 100, ..AdminConfig::default() });
    let roomy = api
        .tenant("roomy", TenantCaps { max_payload_bytes: Some(1000), ..TenantCaps::default() })
        .await;
    let tight = api
        .tenant("tight", TenantCaps { max_payload_bytes: Some(20), ..TenantCaps::default() })
        .await;
    api.put_wasm("/v1/modules/count", OP, &module("wordcount")).await.ok(201);
    api.upload(&roomy, "count", "wordcount").await;
    api.upload(&tight, "count", "wordcount").await;
    // {"text":"xxx..."} is 11 bytes of JSON around the text.
    let of_size = |n: usize| json!({"task_type": "count", "payload": {"text": "x".repeat(n - 11)}});

    // The default tenant has the deployment's limit: 100 bytes in, 101 out.
    api.post("/v1/tasks", OP, &of_size(100)).await.ok(201);
    let over = api.post("/v1/tasks", OP, &of_size(101)).await;
    over.expect(413, "payload_too_large");
    assert_eq!(over.message(), "payload is 101 bytes of JSON; the limit is 100 bytes");

    // A tenant's own limit beats the default, above it and below.
    api.post("/v1/tasks", Some(&roomy), &of_size(1000)).await.ok(201);
    api.post("/v1/tasks", Some(&roomy), &of_size(1001)).await.expect(413, "payload_too_large");
    api.post("/v1/tasks?tenant=roomy", OP, &of_size(500)).await.ok(201);
    api.post("/v1/tasks", Some(&tight), &of_size(20)).await.ok(201);
    let small = api.post("/v1/tasks", Some(&tight), &of_size(21)).await;
    small.expect(413, "payload_too_large");
    assert!(small.message().contains("limit is 20 bytes"), "{}", small.message());
    // Checked before the task type: an oversized payload for an unknown type is still 413.
    let unknown = json!({"task_type": "nope", "payload": {"text": "x".repeat(200)}});
    api.post("/v1/tasks", OP, &unknown).await.expect(413, "payload_too_large");

    let count = || async {
        sqlx::query_scalar::<_, i64>("select count(*) from sweep.tasks")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(count().await, 4);

    // One oversized task refuses the whole batch, naming it; nothing of it is written.
    let batch = json!([of_size(12), of_size(21)]);
    let bad = api.post("/v1/tasks/batch", Some(&tight), &batch).await;
    bad.expect(413, "payload_too_large");
    assert!(bad.message().starts_with("task 1: payload is 21 bytes"), "{}", bad.message());
    assert_eq!(count().await, 4, "the batch wrote nothing");
    api.post("/v1/tasks/batch", Some(&roomy), &batch).await.ok(201);
    assert_eq!(count().await, 6);

    // The operator changes the limit; null gives the tenant the default back.
    let caps = api
        .send(
            api.req("PATCH", "/v1/tenants/tight/caps", OP)
                .json(&json!({"max_payload_bytes": null})),
        )
        .await;
    assert!(caps.ok(200)["max_payload_bytes"].is_null());
    api.post("/v1/tasks", Some(&tight), &of_size(100)).await.ok(201);
    api.send(api.req("PATCH", "/v1/tenants/tight/caps", OP).json(&json!({"max_payload_bytes": 0})))
        .await
        .expect(422, "invalid_tenant");
}

#[sqlx::test(migrations = false)]
async fn batches_are_all_or_nothing(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api_with(&db, AdminConfig { max_batch: 3, ..AdminConfig::default() });
    api.put_wasm("/v1/modules/count", OP, &module("wordcount")).await.ok(201);
    let ok = api
        .post(
            "/v1/tasks/batch",
            OP,
            &json!([{"task_type": "count", "payload": {"text": "a"}},
                    {"task_type": "count", "dedup_key": "d"},
                    {"task_type": "count", "dedup_key": "d"}]),
        )
        .await;
    let tasks = ok.ok(201)["tasks"].as_array().unwrap().clone();
    assert_eq!(tasks.len(), 3);
    assert_eq!(tasks[1]["id"], tasks[2]["id"], "one live task per dedup key");
    assert_eq!(
        (tasks[1]["created"].clone(), tasks[2]["created"].clone()),
        (json!(true), json!(false))
    );

    let bad = api
        .post(
            "/v1/tasks/batch",
            OP,
            &json!([{"task_type": "count"}, {"task_type": "count", "payload": 7}]),
        )
        .await;
    bad.expect(422, "invalid_task");
    assert!(bad.message().starts_with("task 1:"), "{}", bad.message());
    let missing = api
        .post(
            "/v1/tasks/batch",
            OP,
            &json!([{"task_type": "count"}, {"task_type": "a"}, {"task_type": "b"}]),
        )
        .await;
    missing.expect(422, "unknown_task_type");
    assert!(missing.message().contains("a, b"), "{}", missing.message());
    let four = serde_json::Value::Array(vec![json!({"task_type": "count"}); 4]);
    api.post("/v1/tasks/batch", OP, &four).await.expect(422, "batch_too_large");
    api.post("/v1/tasks/batch", OP, &json!({"task_type": "count"}))
        .await
        .expect(400, "invalid_json");
    assert_eq!(api.post("/v1/tasks/batch", OP, &json!([])).await.ok(201)["tasks"], json!([]));

    let stored: i64 =
        sqlx::query_scalar("select count(*) from sweep.tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(stored, 2, "only the good batch was written");
}

#[sqlx::test(migrations = false)]
async fn cancel_pending_then_conflict(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = with_module(&db).await;
    let id = api.enqueue(OPERATOR, "count", json!({"text": "x"})).await;
    let cancelled = api.post(&format!("/v1/tasks/{id}/cancel"), OP, &json!({})).await;
    assert_eq!(cancelled.ok(200)["state"], TaskState::Cancelled.as_str());
    api.post(&format!("/v1/tasks/{id}/cancel"), OP, &json!({}))
        .await
        .expect(409, "not_cancellable");
    api.post("/v1/tasks/424242/cancel", OP, &json!({})).await.expect(404, "not_found");
}

#[sqlx::test(migrations = false)]
async fn dead_tasks_list_in_pages_filter_and_requeue(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = with_module(&db).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(make_dead(&pool, "default", if i % 2 == 0 { "count" } else { "other" }).await);
    }
    let page = api.get("/v1/dead?limit=2", OP).await;
    let page = page.ok(200).clone();
    let got: Vec<i64> =
        page["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_i64().unwrap()).collect();
    assert_eq!(got, ids[..2]);
    assert_eq!(page["next_after"], ids[1]);
    let rest = api.get(&format!("/v1/dead?limit=2&after={}", ids[3]), OP).await;
    assert_eq!(rest.ok(200)["tasks"].as_array().unwrap().len(), 1);
    assert!(rest.json["next_after"].is_null(), "last page");
    let counts = api.get("/v1/dead?task_type=count", OP).await;
    assert_eq!(counts.ok(200)["tasks"].as_array().unwrap().len(), 3);
    assert_eq!(counts.json["tasks"][0]["errors"][0]["kind"], FailureKind::Trap.as_str());

    for bad in ["limit=0", "limit=5000", "after=-1", "task_type=a%20b", "nope=1"] {
        let a = api.get(&format!("/v1/dead?{bad}"), OP).await;
        assert_eq!(a.status.as_u16(), 400, "{bad}: {}", a.text);
    }

    let requeued = api.post(&format!("/v1/dead/{}/requeue", ids[0]), OP, &json!({})).await;
    assert_eq!(requeued.ok(200)["state"], TaskState::Pending.as_str());
    assert_eq!(requeued.json["errors"][0]["kind"], FailureKind::Trap.as_str(), "history kept");
    api.post(&format!("/v1/dead/{}/requeue", ids[0]), OP, &json!({}))
        .await
        .expect(404, "not_found");
}

#[sqlx::test(migrations = false)]
async fn unknown_routes_are_404_and_wrong_methods_405(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    api.get("/nope", OP).await.expect(404, "not_found");
    api.get("/v1/nope", None).await.expect(404, "not_found");
    // A 405 names what the path serves (RFC 9110; the fuzzer found it missing).
    let allow = |a: &Answer| a.headers.get("allow").map(|v| v.to_str().unwrap().to_owned());
    let a = api.send(api.req("DELETE", "/v1/tasks/1", OP)).await;
    assert_eq!(allow(a.expect(405, "method_not_allowed")).as_deref(), Some("GET"));
    let a = api.send(api.req("DELETE", "/v1/tasks", OP)).await;
    assert_eq!(allow(a.expect(405, "method_not_allowed")).as_deref(), Some("GET, POST"));
    let a = api.send(api.req("TRACE", "/v1/modules/count", OP)).await;
    assert_eq!(allow(a.expect(405, "method_not_allowed")).as_deref(), Some("GET, PUT"));
    let a = api.send(api.req("HEAD", "/healthz", None)).await;
    assert_eq!(allow(a.expect(405, "method_not_allowed")).as_deref(), Some("GET"));
    assert_eq!(allow(&api.get("/nope", OP).await), None, "a 404 has no Allow");
}

#[sqlx::test(migrations = false)]
async fn the_task_list_filters_and_pages(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = with_module(&db).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let body = json!({"task_type": "count", "payload": {"n": i, "user": {"id": i % 2}}});
        ids.push(api.post("/v1/tasks", OP, &body).await.ok(201)["id"].as_i64().unwrap());
    }
    let listed = |a: &Answer| -> Vec<i64> {
        let page = a.ok(200);
        page["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_i64().unwrap()).collect()
    };
    // Pages of two, newest first, followed by their cursor to the end.
    let (mut seen, mut before) = (Vec::new(), None::<i64>);
    loop {
        let url = match before {
            Some(b) => format!("/v1/tasks?limit=2&before={b}"),
            None => "/v1/tasks?limit=2".to_owned(),
        };
        let page = api.get(&url, OP).await;
        seen.extend(listed(&page));
        match page.json["next_before"].as_i64() {
            Some(b) => before = Some(b),
            None => break,
        }
    }
    let newest_first: Vec<i64> = ids.iter().rev().copied().collect();
    assert_eq!(seen, newest_first);

    let odd: Vec<i64> = newest_first.iter().copied().filter(|id| (id - ids[0]) % 2 == 1).collect();
    assert_eq!(listed(&api.get("/v1/tasks?payload=user.id%3D1", OP).await), odd);
    let object = "/v1/tasks?payload=%7B%22n%22%3A%203%7D";
    assert_eq!(listed(&api.get(object, OP).await), vec![ids[3]]);
    assert_eq!(listed(&api.get("/v1/tasks?type_prefix=co", OP).await), newest_first);
    assert!(listed(&api.get("/v1/tasks?type_prefix=x", OP).await).is_empty());
    assert_eq!(listed(&api.get(&format!("/v1/tasks?id={}", ids[2]), OP).await), vec![ids[2]]);
    assert!(listed(&api.get("/v1/tasks?state=dead", OP).await).is_empty());
    api.get("/v1/tasks?payload=nope", OP).await.expect(400, "invalid_parameter");
    api.get("/v1/tasks?payload=%7B%7D", OP).await.expect(400, "invalid_parameter");
    api.get("/v1/tasks?state=gone", OP).await.expect(400, "invalid_parameter");

    // Another tenant sees none of them.
    let other = api.tenant("other", TenantCaps::default()).await;
    assert!(listed(&api.get("/v1/tasks", Some(&other)).await).is_empty());

    // A wait that runs out answers the task as it is: still pending (no runner here).
    let waited = api.get(&format!("/v1/tasks/{}?wait=200ms", ids[0]), OP).await;
    assert_eq!(waited.ok(200)["state"], "pending");
    api.get(&format!("/v1/tasks/{}?wait=soon", ids[0]), OP).await.expect(400, "invalid_parameter");
}
