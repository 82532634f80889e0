//! Isolation between tenants on every route: another tenant's modules, tasks and dead tasks
//! answer exactly as absent ones do; the operator sees and acts on all of them.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::TenantCaps;

const OP: Option<&str> = Some(OPERATOR);

struct World {
    api: Api,
    acme: String,
    globex: String,
    acme_task: i64,
    acme_dead: i64,
    globex_task: i64,
}

async fn world(db: &Stores) -> World {
    let api = api(db);
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let globex = api.tenant("globex", TenantCaps::default()).await;
    api.upload(&acme, "count", "wordcount").await;
    api.upload(&acme, "only-acme", "noop").await;
    api.upload(&globex, "count", "noop").await;
    let acme_task = api.enqueue(&acme, "count", json!({"text": "a"})).await;
    let globex_task = api.enqueue(&globex, "count", json!({})).await;
    let acme_dead = make_dead(&db.pool(), "acme", "count").await;
    World { api, acme, globex, acme_task, acme_dead, globex_task }
}

fn tenants_of(list: &Value, key: &str) -> Vec<String> {
    list[key]
        .as_array()
        .map(|items| items.iter().filter_map(|m| m["tenant"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

#[sqlx::test(migrations = false)]
async fn another_tenants_rows_answer_as_if_absent(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let w = world(&db).await;
    let (api, g) = (&w.api, Some(w.globex.as_str()));

    // Same status and code as ids/types that exist nowhere.
    let absent = api.get("/v1/tasks/987654321", g).await;
    absent.expect(404, "not_found");
    api.get(&format!("/v1/tasks/{}", w.acme_task), g).await.expect(404, "not_found");
    api.get(&format!("/v1/tasks/{}", w.acme_dead), g).await.expect(404, "not_found");
    api.post(&format!("/v1/tasks/{}/cancel", w.acme_task), g, &json!({}))
        .await
        .expect(404, "not_found");
    api.post(&format!("/v1/dead/{}/requeue", w.acme_dead), g, &json!({}))
        .await
        .expect(404, "not_found");
    api.get("/v1/modules/only-acme", g).await.expect(404, "not_found");
    api.post("/v1/modules/only-acme/activate", g, &json!({"version": 1}))
        .await
        .expect(404, "not_found");
    api.post("/v1/tasks", g, &json!({"task_type": "only-acme"}))
        .await
        .expect(422, "unknown_task_type");

    // Lists only hold the caller's rows.
    let modules = api.get("/v1/modules?all=true", g).await;
    assert_eq!(tenants_of(modules.ok(200), "modules"), vec!["globex"]);
    let versions = api.get("/v1/modules/count", g).await;
    assert_eq!(tenants_of(versions.ok(200), "modules"), vec!["globex"]);
    let dead = api.get("/v1/dead", g).await;
    assert_eq!(dead.ok(200)["tasks"], json!([]));
    let stats = api.get("/v1/stats", g).await;
    assert_eq!(tenants_of(stats.ok(200), "types"), vec!["globex"]);
    let tenants = api.get("/v1/tenants", g).await;
    assert_eq!(tenants.ok(200)["tenants"].as_array().map(Vec::len), Some(1));

    // Naming the other tenant is refused everywhere it could be named.
    for (method, path) in [
        ("GET", "/v1/modules?tenant=acme"),
        ("GET", "/v1/modules/count?tenant=acme"),
        ("GET", "/v1/dead?tenant=acme"),
        ("GET", "/v1/stats?tenant=acme"),
    ] {
        api.send(api.req(method, path, g)).await.expect(403, "tenant_not_allowed");
    }
    api.post("/v1/tasks?tenant=acme", g, &json!({"task_type": "count"}))
        .await
        .expect(403, "tenant_not_allowed");
    api.post("/v1/tasks/batch?tenant=acme", g, &json!([{"task_type": "count"}]))
        .await
        .expect(403, "tenant_not_allowed");
    api.post("/v1/modules/count/activate?tenant=acme", g, &json!({"version": 1}))
        .await
        .expect(403, "tenant_not_allowed");
    api.put_wasm("/v1/modules/count?tenant=acme", g, &tiny_command())
        .await
        .expect(403, "tenant_not_allowed");
    // Naming yourself is fine.
    api.get("/v1/dead?tenant=globex", g).await.ok(200);

    // Nothing of acme's changed.
    let t = api.get(&format!("/v1/tasks/{}", w.acme_task), Some(&w.acme)).await;
    assert_eq!(t.ok(200)["state"], TaskState::Pending.as_str());
    let d = api.get("/v1/dead", Some(&w.acme)).await;
    assert_eq!(d.ok(200)["tasks"][0]["id"], w.acme_dead);
}

#[sqlx::test(migrations = false)]
async fn same_task_type_names_are_separate_per_tenant(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let w = world(&db).await;
    let api = &w.api;
    // globex's second upload of "count" is its version 2, whatever acme did.
    let v = api.put_wasm("/v1/modules/count", Some(&w.globex), &tiny_command()).await;
    assert_eq!(v.ok(201)["version"], 2);
    assert_eq!(v.json["tenant"], "globex");
    let acme_versions = api.get("/v1/modules/count", Some(&w.acme)).await;
    assert_eq!(acme_versions.ok(200)["modules"].as_array().map(Vec::len), Some(1));
    // Dedup keys are per tenant, too.
    let body = json!({"task_type": "count", "dedup_key": "same"});
    let a = api.post("/v1/tasks", Some(&w.acme), &body).await;
    let b = api.post("/v1/tasks", Some(&w.globex), &body).await;
    assert_ne!(a.ok(201)["id"], b.ok(201)["id"]);
}

#[sqlx::test(migrations = false)]
async fn the_operator_sees_everyone_and_names_tenants(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let w = world(&db).await;
    let api = &w.api;
    api.get(&format!("/v1/tasks/{}", w.acme_task), OP).await.ok(200);
    api.get(&format!("/v1/tasks/{}", w.globex_task), OP).await.ok(200);
    let all = api.get("/v1/modules", OP).await;
    let mut tenants = tenants_of(all.ok(200), "modules");
    tenants.dedup();
    assert_eq!(tenants, vec!["acme", "globex"]);
    let only = api.get("/v1/modules?tenant=globex", OP).await;
    assert_eq!(tenants_of(only.ok(200), "modules"), vec!["globex"]);

    // Acting for a tenant: enqueue, upload, activate, requeue.
    let id = api.post("/v1/tasks?tenant=acme", OP, &json!({"task_type": "only-acme"})).await;
    let id = id.ok(201)["id"].as_i64().unwrap();
    let t = api.get(&format!("/v1/tasks/{id}"), Some(&w.acme)).await;
    assert_eq!(t.ok(200)["tenant"], "acme");
    let up = api.put_wasm("/v1/modules/ops?tenant=globex", OP, &tiny_command()).await;
    assert_eq!(up.ok(201)["tenant"], "globex");
    api.post("/v1/modules/count/activate?tenant=acme", OP, &json!({"version": 1})).await.ok(200);
    // Without ?tenant= the operator acts on "default", which has no "only-acme" module.
    api.post("/v1/tasks", OP, &json!({"task_type": "only-acme"}))
        .await
        .expect(422, "unknown_task_type");
    api.post(&format!("/v1/dead/{}/requeue", w.acme_dead), OP, &json!({})).await.ok(200);
}
