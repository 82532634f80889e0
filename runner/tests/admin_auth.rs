//! Authentication and the operations routes: missing, malformed and wrong tokens; operator
//! versus tenant; health, readiness, stats, tenants and Prometheus metrics.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::admin::AdminConfig;
use sweep::queue::TenantCaps;

const OP: Option<&str> = Some(OPERATOR);

#[sqlx::test(migrations = false)]
async fn every_v1_route_needs_a_valid_token(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    let routes = [
        ("GET", "/v1/modules"),
        ("GET", "/v1/modules/t"),
        ("PUT", "/v1/modules/t"),
        ("POST", "/v1/modules/t/activate"),
        ("POST", "/v1/tasks"),
        ("POST", "/v1/tasks/batch"),
        ("GET", "/v1/tasks/1"),
        ("POST", "/v1/tasks/1/cancel"),
        ("GET", "/v1/dead"),
        ("POST", "/v1/dead/1/requeue"),
        ("GET", "/v1/stats"),
        ("GET", "/v1/tenants"),
        ("GET", "/metrics"),
    ];
    for (method, path) in routes {
        let missing = api.send(api.req(method, path, None)).await;
        missing.expect(401, "unauthorized");
        assert_eq!(missing.content_type, "application/json");
        let wrong = api.send(api.req(method, path, Some("swp_not-a-real-token"))).await;
        wrong.expect(401, "unauthorized");
        let basic = api
            .send(api.req(method, path, None).header("authorization", "Basic dXNlcjpwYXNz"))
            .await;
        basic.expect(401, "unauthorized");
        let empty = api.send(api.req(method, path, None).header("authorization", "Bearer ")).await;
        empty.expect(401, "unauthorized");
    }
    let huge = format!("Bearer {}", "x".repeat(10_000));
    api.send(api.req("GET", "/v1/stats", None).header("authorization", &huge))
        .await
        .expect(401, "unauthorized");
}

#[sqlx::test(migrations = false)]
async fn without_an_operator_token_only_tenants_get_in(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = Api { state: state(&db, AdminConfig::default()), pool: pool.clone() };
    api.get("/v1/stats", OP).await.expect(401, "unauthorized");
    let token = api.tenant("acme", TenantCaps::default()).await;
    api.get("/v1/stats", Some(&token)).await.ok(200);
}

#[sqlx::test(migrations = false)]
async fn health_and_readiness_need_no_token(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    assert_eq!(api.get("/healthz", None).await.ok(200)["status"], "ok");
    assert_eq!(api.get("/readyz", None).await.ok(200)["status"], "ready");
    // A database the API cannot reach: not ready, and no 500.
    sqlx::query("delete from sweep._sqlx_migrations where version = 3")
        .execute(&pool)
        .await
        .unwrap();
    let behind = api.get("/readyz", None).await;
    behind.expect(503, "unavailable");
    assert!(behind.message().contains("sweep migrate"), "{}", behind.text);
    db.admin.close().await;
    api.get("/readyz", None).await.expect(503, "unavailable");
    assert_eq!(api.get("/healthz", None).await.ok(200)["status"], "ok");
}

#[sqlx::test(migrations = false)]
async fn tenants_route_shows_all_to_the_operator_and_itself_to_a_tenant(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let api = api(&db);
    let caps = TenantCaps { max_running: Some(4), max_fuel: Some(10), ..TenantCaps::default() };
    let acme = api.tenant("acme", caps).await;
    api.tenant("globex", TenantCaps::default()).await;
    let all = api.get("/v1/tenants", OP).await;
    let names: Vec<_> =
        all.ok(200)["tenants"].as_array().unwrap().iter().map(|t| t["name"].clone()).collect();
    assert_eq!(names, vec![json!("acme"), json!("globex")]);
    let mine = api.get("/v1/tenants", Some(&acme)).await;
    let mine = mine.ok(200)["tenants"].as_array().unwrap().clone();
    assert_eq!(mine.len(), 1);
    assert_eq!(
        (mine[0]["name"].clone(), mine[0]["max_running"].clone()),
        (json!("acme"), json!(4))
    );
    assert!(mine[0].get("token_sha256").is_none(), "the token hash is never shown");
}

#[sqlx::test(migrations = false)]
async fn stats_count_by_state_and_show_runners(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    api.put_wasm("/v1/modules/count", OP, &module("wordcount")).await.ok(201);
    for _ in 0..3 {
        api.enqueue(OPERATOR, "count", json!({"text": "x"})).await;
    }
    make_dead(&pool, "default", "count").await;
    let runner = uuid::Uuid::new_v4();
    sweep::queue::register_runner(&pool, runner, "host-1", 42).await.unwrap();

    let stats = api.get("/v1/stats", OP).await;
    let s = stats.ok(200);
    let count = &s["types"][0];
    assert_eq!((count["task_type"].clone(), count["pending"].clone()), (json!("count"), json!(3)));
    assert_eq!(count["dead"], 1);
    assert_eq!(count["failures_last_hour"], 0, "no runner reported a failed attempt");
    assert!(count.get("completed_last_minute").is_some());
    assert!(count.get("oldest_due_ms").is_some());
    assert_eq!(s["runners"][0]["id"], runner.to_string());
    assert_eq!(s["runners"][0]["host"], "host-1");
    assert!(s["runners"][0]["heartbeat_age_ms"].as_i64().is_some_and(|a| a >= 0));

    // Tenants see runners without host or pid, and only their own types.
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let theirs = api.get("/v1/stats", Some(&acme)).await;
    let theirs = theirs.ok(200);
    assert_eq!(theirs["types"], json!([]));
    assert!(theirs["runners"][0].get("host").is_none());
    assert!(theirs["runners"][0].get("pid").is_none());
    api.get("/v1/stats?tenant=default", Some(&acme)).await.expect(403, "tenant_not_allowed");
    let filtered = api.get("/v1/stats?tenant=acme", OP).await;
    assert_eq!(filtered.ok(200)["types"], json!([]));
}

#[sqlx::test(migrations = false)]
async fn metrics_are_prometheus_text_for_the_operator_only(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    api.put_wasm("/v1/modules/count", OP, &module("wordcount")).await.ok(201);
    api.enqueue(OPERATOR, "count", json!({"text": "x"})).await;
    metrics::counter!(sweep::metrics::TASKS_CLAIMED).increment(1);
    metrics::histogram!(sweep::metrics::QUEUE_LAG).record(0.2);

    let m = api.get("/metrics", OP).await;
    assert_eq!(m.status.as_u16(), 200, "{}", m.text);
    assert!(m.content_type.starts_with("text/plain"), "{}", m.content_type);
    for expected in [
        "# TYPE sweep_tasks gauge",
        "sweep_tasks{tenant=\"default\",task_type=\"count\",state=\"pending\"} 1",
        "# TYPE sweep_tasks_claimed_total counter",
        "# TYPE sweep_queue_lag_seconds histogram",
        "sweep_queue_lag_seconds_bucket{le=\"0.25\"}",
        "# TYPE sweep_runners gauge",
        // The API's sandbox keeps no instances here; the series is there all the same.
        "sweep_instances_idle 0",
    ] {
        assert!(m.text.contains(expected), "missing {expected:?} in\n{}", m.text);
    }
    let acme = api.tenant("acme", TenantCaps::default()).await;
    api.get("/metrics", Some(&acme)).await.expect(403, "operator_only");
}
