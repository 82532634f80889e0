//! The schedule routes: create, list, show, pause, resume, delete; every bad input is a 4xx
//! whose message names the field and writes nothing; schedules are scoped to their tenant like
//! tasks; stats show next and last run.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::TenantCaps;

const OP: Option<&str> = Some(OPERATOR);

async fn schedule_rows(api: &Api) -> i64 {
    sqlx::query_scalar("select count(*) from sweep.schedules").fetch_one(&api.pool).await.unwrap()
}

async fn with_module(api: &Api, tenant: &str, caps: TenantCaps) -> String {
    let token = api.tenant(tenant, caps).await;
    api.put_wasm("/v1/modules/tick", Some(&token), &tiny_command()).await.ok(201);
    token
}

fn names(list: &Value) -> Vec<String> {
    list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("{}/{}", s["tenant"].as_str().unwrap(), s["name"].as_str().unwrap()))
        .collect()
}

#[sqlx::test(migrations = false)]
async fn a_tenant_creates_lists_pauses_resumes_and_deletes(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    let acme = with_module(&api, "acme", TenantCaps::default()).await;
    let t = Some(acme.as_str());

    let body = json!({
        "name": "nightly", "cron": "0 30 2 * * *", "timezone": "Europe/Berlin",
        "task_type": "tick", "payload": {"report": "daily"}, "priority": 3, "max_attempts": 2,
        "overlap": "allow", "catch_up": "skip",
    });
    let created = api.post("/v1/schedules", t, &body).await.ok(201).clone();
    assert_eq!(created["tenant"], "acme");
    assert_eq!(created["timezone"], "Europe/Berlin");
    assert_eq!(
        (created["overlap"].as_str(), created["catch_up"].as_str()),
        (Some("allow"), Some("skip"))
    );
    assert_eq!(created["paused"], false);
    assert!(created["last_run_at"].is_null() && created["last_task_id"].is_null());
    let next =
        chrono::DateTime::parse_from_rfc3339(created["next_run_at"].as_str().unwrap()).unwrap();
    // 02:30 in Berlin is 00:30 or 01:30 UTC, depending on the season.
    let utc = next.with_timezone(&chrono::Utc);
    assert!(matches!(chrono::Timelike::hour(&utc), 0 | 1), "{utc}");
    assert_eq!(chrono::Timelike::minute(&utc), 30);

    api.post("/v1/schedules", t, &body).await.expect(409, "schedule_exists");
    let minimal = json!({"name": "often", "cron": "*/5 * * * * *", "task_type": "tick"});
    let often = api.post("/v1/schedules", t, &minimal).await.ok(201).clone();
    assert_eq!(
        (often["timezone"].as_str(), often["overlap"].as_str()),
        (Some("UTC"), Some("skip"))
    );
    assert_eq!(often["catch_up"], "latest");

    let list = api.get("/v1/schedules", t).await.ok(200).clone();
    assert_eq!(names(&list), ["acme/nightly", "acme/often"]);
    let shown = api.get("/v1/schedules/nightly", t).await.ok(200).clone();
    assert_eq!(shown, created);

    let paused = api.post("/v1/schedules/often/pause", t, &json!({})).await.ok(200).clone();
    assert!(paused["paused"] == true && paused["paused_at"].is_string());
    let again = api.post("/v1/schedules/often/pause", t, &json!({})).await.ok(200).clone();
    assert_eq!(again["paused_at"], paused["paused_at"], "pausing twice keeps the first time");
    let resumed = api.post("/v1/schedules/often/resume", t, &json!({})).await.ok(200).clone();
    assert!(resumed["paused"] == false && resumed["paused_at"].is_null());

    let stats = api.get("/v1/stats", t).await.ok(200).clone();
    assert_eq!(names(&stats), ["acme/nightly", "acme/often"]);
    assert!(stats["schedules"][0]["next_run_at"].is_string());

    let deleted = api.send(api.req("DELETE", "/v1/schedules/often", t)).await;
    assert_eq!(deleted.ok(200)["name"], "often");
    api.get("/v1/schedules/often", t).await.expect(404, "not_found");
    api.send(api.req("DELETE", "/v1/schedules/often", t)).await.expect(404, "not_found");
    assert_eq!(schedule_rows(&api).await, 1);
}

#[sqlx::test(migrations = false)]
async fn bad_input_names_the_field_and_writes_nothing(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    let small = TenantCaps { max_payload_bytes: Some(64), ..TenantCaps::default() };
    let acme = with_module(&api, "acme", small).await;
    let t = Some(acme.as_str());
    let ok = json!({"name": "n", "cron": "* * * * *", "task_type": "tick"});
    let with = |key: &str, value: Value| {
        let mut body = ok.clone();
        body[key] = value;
        body
    };

    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (with("cron", json!("61 * * * *")), 422, "invalid_schedule", "cron"),
        (with("cron", json!("* * *")), 422, "invalid_schedule", "cron"),
        (with("cron", json!("")), 422, "invalid_schedule", "cron"),
        (with("cron", json!("0 0 0 30 2 *")), 422, "invalid_schedule", "cron"),
        (with("timezone", json!("Mars/Olympus")), 422, "invalid_schedule", "timezone"),
        (with("timezone", json!("")), 422, "invalid_schedule", "timezone"),
        (with("task_type", json!("nothing-here")), 422, "unknown_task_type", "task_type"),
        (with("task_type", json!("a b")), 422, "invalid_schedule", "task_type"),
        (with("payload", json!([1, 2])), 422, "invalid_schedule", "payload"),
        (with("payload", json!({"s": "x".repeat(100)})), 413, "payload_too_large", "payload"),
        (with("payload", json!({"s": "\u{0}"})), 422, "invalid_schedule", "payload"),
        (with("max_attempts", json!(0)), 422, "invalid_schedule", "max_attempts"),
        (with("overlap", json!("sometimes")), 422, "invalid_schedule", "overlap"),
        (with("catch_up", json!("all")), 422, "invalid_schedule", "catch_up"),
        (with("name", json!("a/b")), 422, "invalid_schedule", "name"),
        (with("name", json!("")), 422, "invalid_schedule", "name"),
        (with("colour", json!("red")), 400, "invalid_json", "colour"),
    ];
    for (body, status, code, field) in cases {
        let a = api.post("/v1/schedules", t, &body).await;
        a.expect(status, code);
        assert!(a.message().contains(field), "{body}: the message names {field}: {}", a.message());
        assert_eq!(schedule_rows(&api).await, 0, "{body} wrote a schedule");
    }
    // Names in paths are checked too; the operator may not name a tenant that does not exist.
    api.get("/v1/schedules/a%20b", t).await.expect(400, "invalid_schedule_name");
    api.post("/v1/schedules?tenant=nobody", OP, &ok).await.expect(404, "not_found");
    api.post("/v1/schedules?tenant=globex", t, &ok).await.expect(403, "tenant_not_allowed");
    assert_eq!(schedule_rows(&api).await, 0);
    api.post("/v1/schedules", t, &ok).await.ok(201);
    assert_eq!(schedule_rows(&api).await, 1);
}

#[sqlx::test(migrations = false)]
async fn another_tenants_schedules_answer_as_if_absent(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    let acme = with_module(&api, "acme", TenantCaps::default()).await;
    let globex = with_module(&api, "globex", TenantCaps::default()).await;
    let (a, g) = (Some(acme.as_str()), Some(globex.as_str()));
    let body = json!({"name": "shared-name", "cron": "* * * * *", "task_type": "tick"});
    api.post("/v1/schedules", a, &body).await.ok(201);
    api.post(
        "/v1/schedules",
        g,
        &json!({"name": "g-only", "cron": "* * * * *", "task_type": "tick"}),
    )
    .await
    .ok(201);

    for path in ["/v1/schedules/shared-name", "/v1/schedules/never-made"] {
        api.get(path, g).await.expect(404, "not_found");
        api.post(&format!("{path}/pause"), g, &json!({})).await.expect(404, "not_found");
        api.post(&format!("{path}/resume"), g, &json!({})).await.expect(404, "not_found");
        api.send(api.req("DELETE", path, g)).await.expect(404, "not_found");
    }
    assert_eq!(names(&api.get("/v1/schedules", g).await.ok(200).clone()), ["globex/g-only"]);
    assert_eq!(api.get("/v1/schedules/shared-name", a).await.ok(200)["paused"], false);
    // The same name is free in another tenant.
    api.post("/v1/schedules", g, &body).await.ok(201);

    // The operator sees all, and acts on one tenant's with ?tenant=.
    let all = api.get("/v1/schedules", OP).await.ok(200).clone();
    assert_eq!(names(&all), ["acme/shared-name", "globex/g-only", "globex/shared-name"]);
    let only = api.get("/v1/schedules?tenant=acme", OP).await.ok(200).clone();
    assert_eq!(names(&only), ["acme/shared-name"]);
    let paused = api
        .post("/v1/schedules/shared-name/pause?tenant=globex", OP, &json!({}))
        .await
        .ok(200)
        .clone();
    assert_eq!(
        (paused["tenant"].as_str(), paused["paused"].as_bool()),
        (Some("globex"), Some(true))
    );
    assert_eq!(api.get("/v1/schedules/shared-name", a).await.ok(200)["paused"], false);
}
