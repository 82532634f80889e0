//! The batch route at bulk sizes (the COPY path behind it): all or nothing, errors that name
//! the task and the field, and bodies past the limits refused before any work.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::admin::AdminConfig;
use sweep::queue::TenantCaps;

const OP: Option<&str> = Some(OPERATOR);

async fn count(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sweep.tasks").fetch_one(pool).await.unwrap()
}

fn batch(n: usize) -> Vec<Value> {
    (0..n).map(|i| json!({"task_type": "noop", "payload": {"i": i}})).collect()
}

#[sqlx::test(migrations = false)]
async fn a_large_batch_is_written_whole_or_not_at_all(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    api.put_wasm("/v1/modules/noop", OP, &tiny_command()).await.ok(201);
    let tight = api
        .tenant("tight", TenantCaps { max_payload_bytes: Some(12), ..TenantCaps::default() })
        .await;
    api.put_wasm("/v1/modules/noop", Some(&tight), &tiny_command()).await.ok(201);

    let answer = api.post("/v1/tasks/batch", OP, &Value::Array(batch(10_000))).await;
    let tasks = answer.ok(201)["tasks"].as_array().unwrap().clone();
    assert_eq!(tasks.len(), 10_000);
    let ids: Vec<i64> = tasks.iter().map(|t| t["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in input order");
    let last = api.get(&format!("/v1/tasks/{}", ids[9_999]), OP).await;
    assert_eq!(last.ok(200)["payload"], json!({"i": 9_999}));
    assert_eq!(count(&pool).await, 10_000);

    // `{"i":9999}` is 10 bytes, `{"i":123456}` 12, `{"i":1234567}` 13: over the tenant's limit.
    let mut big = batch(5_000);
    big[4_321] = json!({"task_type": "noop", "payload": {"i": 1_234_567}});
    let refused = api.post("/v1/tasks/batch", Some(&tight), &Value::Array(big)).await;
    refused.expect(413, "payload_too_large");
    assert!(
        refused.message().starts_with("task 4321: payload is 13 bytes"),
        "{}",
        refused.message()
    );

    let mut bad = batch(5_000);
    bad[3_210]["priority"] = json!(0.5);
    let refused = api.post("/v1/tasks/batch", OP, &Value::Array(bad)).await;
    refused.expect(400, "invalid_json");
    assert!(refused.message().contains("task 3210: priority: "), "{}", refused.message());

    let mut bad = batch(5_000);
    bad[4_999]["max_attempts"] = json!(0);
    let refused = api.post("/v1/tasks/batch", OP, &Value::Array(bad)).await;
    refused.expect(422, "invalid_task");
    assert!(refused.message().starts_with("task 4999: max_attempts"), "{}", refused.message());

    let mut bad = batch(5_000);
    bad[17]["payload"] = json!({"s": "nul \u{0} here"});
    let refused = api.post("/v1/tasks/batch", OP, &Value::Array(bad)).await;
    refused.expect(422, "invalid_task");
    assert!(refused.message().starts_with("task 17: payload"), "{}", refused.message());
    assert_eq!(count(&pool).await, 10_000, "no refused batch wrote anything");
}

#[sqlx::test(migrations = false)]
async fn oversized_batches_are_refused_before_any_work(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    api.put_wasm("/v1/modules/noop", OP, &tiny_command()).await.ok(201);
    // 200,000 tasks fit the default 8 MiB body as `{"task_type":"noop"}` (21 bytes each) and
    // are refused by count, without building the tasks past the limit.
    let body = format!("[{}]", vec![r#"{"task_type":"noop"}"#; 200_000].join(","));
    assert!(body.len() < sweep::admin::DEFAULT_MAX_JSON_BYTES);
    let req = api.req("POST", "/v1/tasks/batch", OP).body("application/json", body);
    let refused = api.send(req).await;
    refused.expect(422, "batch_too_large");
    assert_eq!(refused.message(), "a batch holds at most 10000 tasks, got 200000");
    // Past the byte limit: 413 before parsing.
    let body = format!(
        "[{}]",
        vec![
            r#"{"task_type":"noop","payload":{"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}"#;
            200_000
        ]
        .join(",")
    );
    assert!(body.len() > sweep::admin::DEFAULT_MAX_JSON_BYTES);
    let req = api.req("POST", "/v1/tasks/batch", OP).body("application/json", body);
    api.send(req).await.expect(413, "too_large");
    assert_eq!(count(&pool).await, 0);

    // An operator may raise both limits; the queue takes up to 100,000 tasks per call.
    let roomy = api_with(
        &db,
        AdminConfig { max_batch: 100_000, max_json_bytes: 16 << 20, ..AdminConfig::default() },
    );
    let answer = roomy.post("/v1/tasks/batch", OP, &Value::Array(batch(50_000))).await;
    assert_eq!(answer.ok(201)["tasks"].as_array().unwrap().len(), 50_000);
    assert_eq!(count(&pool).await, 50_000);
}
