//! Dependencies and workflows through the admin API: `after` on the task routes, the workflow
//! routes, and bad input answered with a 4xx naming the field or the step, nothing written.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::TenantCaps;

const OP: Option<&str> = Some(OPERATOR);

async fn count(pool: &sqlx::PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("select count(*) from sweep.{table}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn after_on_the_task_routes(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    api.put_wasm("/v1/modules/noop", OP, &tiny_command()).await.ok(201);
    let other = api.tenant("other", TenantCaps::default()).await;
    api.put_wasm("/v1/modules/noop", Some(&other), &tiny_command()).await.ok(201);
    let parent = api.post("/v1/tasks", OP, &json!({"task_type": "noop"})).await.ok(201)["id"]
        .as_i64()
        .unwrap();
    let theirs = api.post("/v1/tasks", Some(&other), &json!({"task_type": "noop"})).await.ok(201)
        ["id"]
        .as_i64()
        .unwrap();

    let child =
        api.post("/v1/tasks", OP, &json!({"task_type": "noop", "after": [parent]})).await.ok(201)
            ["id"]
            .as_i64()
            .unwrap();
    let shown = api.get(&format!("/v1/tasks/{child}"), OP).await;
    assert_eq!(shown.ok(200)["state"], "blocked");
    assert_eq!(shown.ok(200)["blocked_on"], 1);
    let stats = api.get("/v1/stats", OP).await;
    let noop = stats.ok(200)["types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == "default" && t["task_type"] == "noop")
        .cloned()
        .unwrap();
    assert_eq!(noop["blocked"], 1, "{noop}");

    let before = count(&pool, "tasks").await;
    let refused =
        api.post("/v1/tasks", OP, &json!({"task_type": "noop", "after": [parent, 987654]})).await;
    refused.expect(422, "invalid_task");
    assert_eq!(refused.message(), "after[1]: no task 987654 of this tenant");
    let refused =
        api.post("/v1/tasks", Some(&other), &json!({"task_type": "noop", "after": [parent]})).await;
    refused.expect(422, "invalid_task");
    assert!(refused.message().starts_with("after[0]: no task"), "another tenant's task");
    let batch = json!([
        {"task_type": "noop", "after": [parent]},
        {"task_type": "noop", "after": [theirs]},
    ]);
    let refused = api.post("/v1/tasks/batch", OP, &batch).await;
    refused.expect(422, "invalid_task");
    assert!(refused.message().starts_with("task 1: after[0]: no task"), "{}", refused.message());
    let refused = api
        .post("/v1/tasks", OP, &json!({"task_type": "noop", "after": [parent], "dedup_key": "k"}))
        .await;
    refused.expect(422, "invalid_task");
    let refused = api.post("/v1/tasks", OP, &json!({"task_type": "noop", "after": ["x"]})).await;
    refused.expect(400, "invalid_json");
    let refused = api
        .post("/v1/tasks", OP, &json!({"task_type": "noop", "on_parent_failure": "maybe"}))
        .await;
    refused.expect(400, "invalid_json");
    assert_eq!(count(&pool, "tasks").await, before, "nothing written");

    // Cancelling the parent cancels the child, naming it.
    api.post(&format!("/v1/tasks/{parent}/cancel"), OP, &json!({})).await.ok(200);
    let shown = api.get(&format!("/v1/tasks/{child}"), OP).await;
    assert_eq!(shown.ok(200)["state"], "cancelled");
    assert_eq!(shown.ok(200)["last_error"], format!("parent {parent} ended cancelled"));
}

fn diamond() -> Value {
    json!({"steps": [
        {"name": "d", "task_type": "noop", "after": ["b", "c"]},
        {"name": "b", "task_type": "noop", "after": ["a"]},
        {"name": "c", "task_type": "noop", "after": ["a"], "payload": {"x": 1}},
        {"name": "a", "task_type": "noop"},
    ]})
}

#[sqlx::test(migrations = false)]
async fn workflows_are_created_shown_listed_and_cancelled(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    api.put_wasm("/v1/modules/noop", OP, &tiny_command()).await.ok(201);
    let created = api.post("/v1/workflows", OP, &diamond()).await;
    let created = created.ok(201).clone();
    let steps = created["steps"].as_array().unwrap();
    assert_eq!(steps.iter().map(|s| s["name"].clone()).collect::<Vec<_>>(), ["d", "b", "c", "a"]);
    let id = created["id"].as_i64().unwrap();

    let shown = api.get(&format!("/v1/workflows/{id}"), OP).await;
    let shown = shown.ok(200).clone();
    assert_eq!(shown["state"], "running");
    let states: Vec<(Value, Value)> = shown["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].clone(), s["state"].clone()))
        .collect();
    assert_eq!(
        states,
        [
            (json!("a"), json!("pending")),
            (json!("b"), json!("blocked")),
            (json!("c"), json!("blocked")),
            (json!("d"), json!("blocked")),
        ]
    );
    let listed = api.get("/v1/workflows", OP).await;
    assert_eq!(listed.ok(200)["workflows"][0]["steps"], 4);
    assert_eq!(listed.ok(200)["workflows"][0]["live"], 4);

    let other = api.tenant("other", TenantCaps::default()).await;
    api.get(&format!("/v1/workflows/{id}"), Some(&other)).await.expect(404, "not_found");
    api.post(&format!("/v1/workflows/{id}/cancel"), Some(&other), &json!({}))
        .await
        .expect(404, "not_found");

    let done = api.post(&format!("/v1/workflows/{id}/cancel"), OP, &json!({})).await;
    assert_eq!(done.ok(200), &json!({"cancelled": 4, "cancel_requested": 0}));
    let shown = api.get(&format!("/v1/workflows/{id}"), OP).await;
    assert_eq!(shown.ok(200)["state"], "cancelled");
    assert_eq!(count(&pool, "task_deps").await, 0);
}

#[sqlx::test(migrations = false)]
async fn bad_workflows_name_the_step_and_write_nothing(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    api.put_wasm("/v1/modules/noop", OP, &tiny_command()).await.ok(201);
    let tight = api
        .tenant("tight", TenantCaps { max_payload_bytes: Some(12), ..TenantCaps::default() })
        .await;
    api.put_wasm("/v1/modules/noop", Some(&tight), &tiny_command()).await.ok(201);
    let refuse = |body: Value| {
        let api = &api;
        async move { api.post("/v1/workflows", OP, &body).await }
    };

    let cycle = json!({"steps": [
        {"name": "a", "task_type": "noop", "after": ["c"]},
        {"name": "b", "task_type": "noop", "after": ["a"]},
        {"name": "c", "task_type": "noop", "after": ["b"]},
        {"name": "z", "task_type": "noop"},
    ]});
    let r = refuse(cycle).await;
    r.expect(422, "invalid_workflow");
    assert!(r.message().contains("is in a cycle: "), "{}", r.message());
    let r = refuse(json!({"steps": [{"name": "a", "task_type": "noop", "after": ["nope"]}]})).await;
    r.expect(422, "invalid_workflow");
    assert_eq!(r.message(), "step \"a\": after names no step \"nope\"");
    let r = refuse(json!({"steps": [
        {"name": "a", "task_type": "noop"}, {"name": "a", "task_type": "noop"}
    ]}))
    .await;
    r.expect(422, "invalid_workflow");
    let r = refuse(json!({"steps": [{"name": "a", "task_type": "unregistered"}]})).await;
    r.expect(422, "unknown_task_type");
    let r = refuse(json!({"steps": []})).await;
    r.expect(422, "invalid_workflow");
    let r = api
        .post(
            "/v1/workflows",
            Some(&tight),
            &json!({"steps": [
                {"name": "small", "task_type": "noop"},
                {"name": "big", "task_type": "noop", "payload": {"s": "0123456789"}},
            ]}),
        )
        .await;
    r.expect(413, "payload_too_large");
    assert!(r.message().starts_with("step \"big\": payload is "), "{}", r.message());
    assert_eq!(count(&pool, "tasks").await, 0);
    assert_eq!(count(&pool, "workflows").await, 0);
}
