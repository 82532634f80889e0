//! Flow control through the API: a tenant pauses and resumes its task types, the operator a
//! whole tenant; stats show what is paused, since when and by whom; bad input is refused
//! naming the field, with nothing written.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::TenantCaps;

const OP: Option<&str> = Some(OPERATOR);

async fn paused_rows(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "select (select count(*) from sweep.queues where paused)
              + (select count(*) from sweep.tenants where paused_at is not null)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_tenant_pauses_its_type_and_stats_show_it(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let other = api.tenant("other", TenantCaps::default()).await;
    api.put_wasm("/v1/modules/work", Some(&acme), &tiny_command()).await.ok(201);
    api.put_wasm("/v1/modules/work", Some(&other), &tiny_command()).await.ok(201);

    let a = api.post("/v1/queues/work/pause", Some(&acme), &json!({})).await;
    let q = a.ok(200);
    assert_eq!(
        (&q["tenant"], &q["task_type"], &q["paused"]),
        (&json!("acme"), &json!("work"), &json!(true))
    );
    assert_eq!(q["paused_by"], "tenant:acme");
    // Enqueues are still accepted.
    api.enqueue(&acme, "work", json!({})).await;

    let stats = api.get("/v1/stats", Some(&acme)).await;
    let s = stats.ok(200);
    assert_eq!(s["queues"].as_array().unwrap().len(), 1);
    assert_eq!(s["queues"][0]["paused_at"], q["paused_at"]);
    assert_eq!(s["queues"][0]["paused_by"], "tenant:acme");
    // The other tenant sees nothing of it, and its own type is not paused.
    let s = api.get("/v1/stats", Some(&other)).await;
    assert_eq!(s.ok(200)["queues"], json!([]));
    let s = api.get("/v1/stats", OP).await;
    assert_eq!(s.ok(200)["queues"].as_array().unwrap().len(), 1);

    let a = api.post("/v1/queues/work/resume", Some(&acme), &json!({})).await;
    assert_eq!((&a.ok(200)["paused"], &a.json["paused_at"]), (&json!(false), &Value::Null));
    let s = api.get("/v1/stats", Some(&acme)).await;
    assert_eq!(s.ok(200)["queues"], json!([]));

    // The operator pauses a tenant's type with ?tenant=.
    let a = api.post("/v1/queues/work/pause?tenant=other", OP, &json!({})).await;
    assert_eq!((&a.ok(200)["tenant"], &a.json["paused_by"]), (&json!("other"), &json!("operator")));
}

#[sqlx::test(migrations = false)]
async fn the_operator_pauses_a_whole_tenant(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    let acme = api.tenant("acme", TenantCaps::default()).await;
    api.put_wasm("/v1/modules/work", Some(&acme), &tiny_command()).await.ok(201);

    api.post("/v1/tenants/acme/pause", Some(&acme), &json!({})).await.expect(403, "operator_only");
    assert_eq!(paused_rows(&pool).await, 0);
    let a = api.post("/v1/tenants/acme/pause", OP, &json!({})).await;
    let t = a.ok(200);
    assert_eq!(
        (&t["tenant"], &t["paused"], &t["paused_by"]),
        (&json!("acme"), &json!(true), &json!("operator"))
    );
    let s = api.get("/v1/stats", Some(&acme)).await;
    let s = s.ok(200);
    assert_eq!(s["paused_tenants"][0]["paused_at"], t["paused_at"]);
    assert_eq!(
        (&s["queues"][0]["tenant_paused"], &s["queues"][0]["paused"]),
        (&json!(true), &json!(true))
    );
    assert_eq!(s["queues"][0]["paused_at"], Value::Null, "the type has no pause of its own");
    let got = sweep::queue::claim_batch(&pool, uuid::Uuid::new_v4(), 5, &[], LEASE).await.unwrap();
    assert!(got.is_empty());

    let a = api.post("/v1/tenants/acme/resume", OP, &json!({})).await;
    assert_eq!(a.ok(200)["paused"], false);
    assert_eq!(paused_rows(&pool).await, 0);
}

#[sqlx::test(migrations = false)]
async fn bad_pauses_name_the_field_and_write_nothing(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let other = api.tenant("other", TenantCaps::default()).await;
    api.put_wasm("/v1/modules/theirs", Some(&other), &tiny_command()).await.ok(201);

    let a = api.post("/v1/queues/nothing/pause", Some(&acme), &json!({})).await;
    a.expect(404, "not_found");
    assert!(a.message().contains("task_type \"nothing\""), "{}", a.message());
    // Another tenant's type is as absent as one that was never registered.
    api.post("/v1/queues/theirs/pause", Some(&acme), &json!({})).await.expect(404, "not_found");
    api.post("/v1/queues/theirs/pause?tenant=other", Some(&acme), &json!({}))
        .await
        .expect(403, "tenant_not_allowed");
    let a = api.post("/v1/queues/bad%20type/pause", Some(&acme), &json!({})).await;
    a.expect(400, "invalid_task_type");
    assert!(a.message().contains("task_type"), "{}", a.message());
    api.post("/v1/queues/theirs/pause?tenant=nobody", OP, &json!({}))
        .await
        .expect(404, "not_found");
    api.post("/v1/queues/theirs/pause?color=red", OP, &json!({}))
        .await
        .expect(400, "unknown_parameter");
    api.post("/v1/tenants/nobody/pause", OP, &json!({})).await.expect(404, "not_found");
    api.post("/v1/tenants/nobody/resume", OP, &json!({})).await.expect(404, "not_found");
    assert_eq!(paused_rows(&pool).await, 0);
}

#[sqlx::test(migrations = false)]
async fn rate_limits_are_set_shown_cleared_and_bad_ones_refused(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    let acme = api.tenant("acme", TenantCaps::default()).await;
    api.put_wasm("/v1/modules/work", Some(&acme), &tiny_command()).await.ok(201);
    let put = |body: Value| {
        let req = api.req("PUT", "/v1/queues/work/rate-limit", Some(&acme)).json(&body);
        api.send(req)
    };
    let limited = || async {
        sqlx::query_scalar::<_, i64>("select count(*) from sweep.queues where burst is not null")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    for (body, field) in [
        (json!({"rate_per_sec": 0, "burst": 1}), "rate_per_sec"),
        (json!({"rate_per_sec": -2.5, "burst": 1}), "rate_per_sec"),
        (json!({"rate_per_sec": 5, "burst": 0}), "burst"),
        (json!({"rate_per_sec": 5, "burst": -1}), "burst"),
    ] {
        let a = put(body).await;
        a.expect(422, "invalid_rate_limit");
        assert!(a.message().starts_with(field), "{}", a.message());
    }
    let a = put(json!({"rate_per_sec": "5", "burst": 1})).await;
    a.expect(400, "invalid_json");
    put(json!({"rate_per_sec": 5})).await.expect(400, "invalid_json");
    put(json!({"rate_per_sec": 5, "burst": 1, "per": "s"})).await.expect(400, "invalid_json");
    let req = api.req("PUT", "/v1/queues/nothing/rate-limit", Some(&acme));
    let a = api.send(req.json(&json!({"rate_per_sec": 5, "burst": 1}))).await;
    a.expect(404, "not_found");
    assert!(a.message().contains("task_type"), "{}", a.message());
    assert_eq!(limited().await, 0, "nothing written");

    let a = put(json!({"rate_per_sec": 2.5, "burst": 10})).await;
    assert_eq!((&a.ok(200)["rate_per_sec"], &a.json["burst"]), (&json!(2.5), &json!(10)));
    let s = api.get("/v1/stats", Some(&acme)).await;
    let q = &s.ok(200)["queues"][0];
    assert_eq!(
        (&q["task_type"], &q["rate_per_sec"], &q["paused"]),
        (&json!("work"), &json!(2.5), &json!(false))
    );
    let a = api.send(api.req("DELETE", "/v1/queues/work/rate-limit", Some(&acme))).await;
    assert_eq!(a.ok(200)["burst"], Value::Null);
    assert_eq!(limited().await, 0);
}
