//! Operator changes to tenants through the API: rotating a token (the old one stops working
//! at once, only the new one's hash is stored) and changing some caps (others kept, `null`
//! clears one, bad values refused with nothing written).

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::TenantCaps;

const OP: Option<&str> = Some(OPERATOR);

#[sqlx::test(migrations = false)]
async fn a_rotated_token_replaces_the_old_one_at_once(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    let old = api.tenant("acme", TenantCaps::default()).await;
    let other = api.tenant("other", TenantCaps::default()).await;
    api.get("/v1/tenants", Some(&old)).await.ok(200);

    api.post("/v1/tenants/acme/token", Some(&old), &json!({})).await.expect(403, "operator_only");
    api.post("/v1/tenants/nobody/token", OP, &json!({})).await.expect(404, "not_found");
    let a = api.send(api.req("POST", "/v1/tenants/acme/token", OP)).await;
    let body = a.ok(200);
    assert_eq!(body["tenant"]["name"], "acme");
    let new = body["token"].as_str().unwrap().to_owned();
    assert!(new.starts_with(sweep::admin::TOKEN_PREFIX) && new != old);

    api.get("/v1/tenants", Some(&old)).await.expect(401, "unauthorized");
    let me = api.get("/v1/tenants", Some(&new)).await;
    assert_eq!(me.ok(200)["tenants"][0]["name"], "acme");
    api.get("/v1/tenants", Some(&other)).await.ok(200);

    let stored: String =
        sqlx::query_scalar("select token_sha256 from sweep.tenants where name = 'acme'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, sweep::admin::hash_token(&new), "only the hash is stored");
}

#[sqlx::test(migrations = false)]
async fn caps_change_only_what_is_named_and_null_clears(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    let caps = TenantCaps { max_fuel: Some(500), max_running: Some(2), ..TenantCaps::default() };
    let token = api.tenant("acme", caps).await;
    let patch = |body: serde_json::Value| {
        let req = api.req("PATCH", "/v1/tenants/acme/caps", OP).json(&body);
        api.send(req)
    };

    let a = patch(json!({"max_running": 5, "max_memory_bytes": 1048576})).await;
    let t = a.ok(200);
    assert_eq!(
        (&t["max_running"], &t["max_fuel"], &t["max_memory_bytes"]),
        (&json!(5), &json!(500), &json!(1048576)),
        "named caps set, max_fuel kept"
    );
    // An array is not a caps object (serde alone reads `[null, null]` as clearing the first
    // two caps; the fuzzer found it); integers may carry a zero fraction.
    patch(json!([null, null])).await.expect(400, "invalid_json");
    let t = patch(json!({"max_running": 5.0})).await;
    assert_eq!((&t.ok(200)["max_running"], &t.json["max_fuel"]), (&json!(5), &json!(500)));
    let t = patch(json!({"max_fuel": null})).await;
    assert_eq!(t.ok(200)["max_fuel"], serde_json::Value::Null);

    patch(json!({"max_timeout_ms": 0})).await.expect(422, "invalid_tenant");
    patch(json!({"max_running": -1})).await.expect(422, "invalid_tenant");
    patch(json!({"max_runing": 1})).await.expect(400, "invalid_json");
    let tenants = api.get("/v1/tenants", OP).await;
    let t = &tenants.ok(200)["tenants"][0];
    assert_eq!((&t["max_running"], &t["max_timeout_ms"]), (&json!(5), &serde_json::Value::Null));

    let req = api.req("PATCH", "/v1/tenants/acme/caps", Some(&token)).json(&json!({}));
    api.send(req).await.expect(403, "operator_only");
    let req = api.req("PATCH", "/v1/tenants/%61cme/caps", OP).json(&json!({"max_fuel": 7}));
    assert_eq!(api.send(req).await.ok(200)["name"], "acme", "the name is percent-decoded");
    let req = api.req("PATCH", "/v1/tenants/nobody/caps", OP).json(&json!({"max_fuel": 1}));
    api.send(req).await.expect(404, "not_found");

    // The new memory cap binds uploads at once.
    let a = api.put_wasm("/v1/modules/t?memory_mb=2", Some(&token), &tiny_command()).await;
    a.expect(422, "limit_too_high");
}
