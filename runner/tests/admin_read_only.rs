//! Read-only tokens in the JSON API (GET routes only, 403 `read_only` on writes) and the
//! dashboard's HTTP contract without a browser: login cookie flags, redirects, CSRF and
//! origin checks, tenant scoping as 404 pages, static assets.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::admin;
use sweep::queue::{TenantCaps, TenantError};
use warp::http::Response;

async fn ui(api: &Api, req: warp::test::RequestBuilder) -> Response<bytes::Bytes> {
    req.reply(&admin::routes(api.state.clone())).await
}

fn text(r: &Response<bytes::Bytes>) -> String {
    String::from_utf8_lossy(r.body()).into_owned()
}

/// Logs in with `token`; returns the `Cookie` header value to send back.
async fn login(api: &Api, token: &str) -> String {
    let r = ui(
        api,
        warp::test::request()
            .method("POST")
            .path("/ui/login")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}")),
    )
    .await;
    assert_eq!(r.status(), 303, "{}", text(&r));
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"), "{set}");
    assert!(!set.contains(token), "the cookie does not carry the token in clear");
    set.split(';').next().unwrap().to_owned()
}

/// The CSRF token rendered into a page.
fn csrf_of(page: &str) -> String {
    let start = page.find(r#"name="csrf" value=""#).expect("csrf field") + 19;
    page[start..start + 64].to_owned()
}

#[sqlx::test(migrations = false)]
async fn read_only_tokens_read_everything_and_change_nothing(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    let owner = api.tenant("acme", TenantCaps::default()).await;
    api.upload(&owner, "quick", "noop").await;
    let id = api.enqueue(&owner, "quick", json!({})).await;
    let viewer = admin::create_read_only_token(&pool, "acme").await.unwrap();
    assert!(viewer.starts_with(admin::TOKEN_PREFIX));

    api.get(&format!("/v1/tasks/{id}"), Some(&viewer)).await.ok(200);
    api.get("/v1/stats", Some(&viewer)).await.ok(200);
    api.get("/v1/modules", Some(&viewer)).await.ok(200);
    api.get("/v1/dead", Some(&viewer)).await.ok(200);
    let enqueue = json!({"task_type": "quick", "payload": {}});
    api.post("/v1/tasks", Some(&viewer), &enqueue).await.expect(403, "read_only");
    api.post(&format!("/v1/tasks/{id}/cancel"), Some(&viewer), &json!({}))
        .await
        .expect(403, "read_only");
    api.post(&format!("/v1/dead/{id}/requeue"), Some(&viewer), &json!({}))
        .await
        .expect(403, "read_only");
    api.put_wasm("/v1/modules/quick", Some(&viewer), &module("noop"))
        .await
        .expect(403, "read_only");
    // Nothing was written: the one task is still the only one, and still pending.
    let count: i64 =
        sqlx::query_scalar("select count(*) from sweep.tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(count, 1);
    // The owner's token still writes.
    api.post(&format!("/v1/tasks/{id}/cancel"), Some(&owner), &json!({})).await.ok(200);

    match admin::create_read_only_token(&pool, "nobody").await {
        Err(TenantError::NotFound(name)) => assert_eq!(name, "nobody"),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[sqlx::test(migrations = false)]
async fn the_dashboard_scopes_sessions_and_refuses_forged_writes(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let globex = api.tenant("globex", TenantCaps::default()).await;
    api.upload(&acme, "quick", "noop").await;
    let id = api.enqueue(&acme, "quick", json!({"secret": "acme's payload"})).await;

    // No session: every page sends to the login; a bad token is a 401 login page.
    let r = ui(&api, warp::test::request().path("/ui/tasks")).await;
    assert_eq!(
        (r.status().as_u16(), r.headers()["location"].to_str().unwrap()),
        (303, "/ui/login")
    );
    let r = ui(
        &api,
        warp::test::request()
            .method("POST")
            .path("/ui/login")
            .header("content-type", "application/x-www-form-urlencoded")
            .body("token=swp_wrong"),
    )
    .await;
    assert_eq!(r.status(), 401);
    assert!(text(&r).contains("not valid"));

    let acme_cookie = login(&api, &acme).await;
    let page = ui(
        &api,
        warp::test::request().path(&format!("/ui/tasks/{id}")).header("cookie", &acme_cookie),
    )
    .await;
    assert_eq!(page.status(), 200);
    let body = text(&page);
    assert!(body.contains("acme&#39;s payload") || body.contains("acme's payload"), "{body}");
    assert!(!body.contains(&acme), "the token is never rendered");
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));

    // Another tenant: a 404 page, and nothing of acme's in its lists.
    let globex_cookie = login(&api, &globex).await;
    let r = ui(
        &api,
        warp::test::request().path(&format!("/ui/tasks/{id}")).header("cookie", &globex_cookie),
    )
    .await;
    assert_eq!(r.status(), 404);
    assert!(!text(&r).contains("acme&#39;s payload"));
    let r =
        ui(&api, warp::test::request().path("/ui/tasks").header("cookie", &globex_cookie)).await;
    assert!(text(&r).contains("No tasks match"), "{}", text(&r));
    let r = ui(
        &api,
        warp::test::request().path("/ui/tasks?tenant=acme").header("cookie", &globex_cookie),
    )
    .await;
    assert_eq!(r.status(), 403, "a tenant cannot name another tenant");

    // Writes: the CSRF token of this session, from the page, and the same origin.
    let csrf = csrf_of(&body);
    let post = |cookie: &str, body: String| {
        warp::test::request()
            .method("POST")
            .path("/ui/tenants/acme/weight")
            .header("cookie", cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
    };
    let r = ui(&api, post(&acme_cookie, "weight=2".into())).await;
    assert_eq!(r.status(), 403, "no CSRF token");
    let r = ui(&api, post(&globex_cookie, format!("weight=2&csrf={csrf}"))).await;
    assert_eq!(r.status(), 403, "another session's CSRF token");
    let r = ui(
        &api,
        post(&acme_cookie, format!("weight=2&csrf={csrf}"))
            .header("origin", "http://evil.example")
            .header("host", "127.0.0.1"),
    )
    .await;
    assert_eq!(r.status(), 403, "cross-origin");
    assert!(text(&r).contains("cross-origin"));
    // The right token gets through to the handler, which refuses a tenant changing weights.
    let r = ui(&api, post(&acme_cookie, format!("weight=2&csrf={csrf}"))).await;
    assert_eq!(r.status(), 403);
    assert!(text(&r).contains("set by the operator"), "{}", text(&r));

    // The operator may; the form answers with a redirect and the weight changed.
    let op_cookie = login(&api, OPERATOR).await;
    let page =
        ui(&api, warp::test::request().path("/ui/tenants").header("cookie", &op_cookie)).await;
    let op_csrf = csrf_of(&text(&page));
    let r = ui(&api, post(&op_cookie, format!("weight=2&csrf={op_csrf}"))).await;
    assert_eq!(r.status(), 303, "{}", text(&r));
    let w: i32 = sqlx::query_scalar("select weight from sweep.tenants where name = 'acme'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(w, 2);
    let r = ui(&api, post(&op_cookie, format!("weight=0&csrf={op_csrf}"))).await;
    assert_eq!(r.status(), 400, "bad weight is a 400 page: {}", text(&r));

    // Unknown pages are HTML 404s; bad parameters are 400 pages; the script is cacheable.
    let r = ui(&api, warp::test::request().path("/ui/nope").header("cookie", &acme_cookie)).await;
    assert_eq!(r.status(), 404);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let r = ui(
        &api,
        warp::test::request().path("/ui/tasks?state=bogus").header("cookie", &acme_cookie),
    )
    .await;
    assert_eq!(r.status(), 400);
    let r = ui(
        &api,
        warp::test::request().path("/ui/tasks?since=yesterday").header("cookie", &acme_cookie),
    )
    .await;
    assert_eq!(r.status(), 400);
    // Logging out clears the cookie; it needs the CSRF token like any other POST.
    let logout = warp::test::request()
        .method("POST")
        .path("/ui/logout")
        .header("cookie", &acme_cookie)
        .header("origin", "http://127.0.0.1:7070")
        .header("host", "127.0.0.1:7070")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}"));
    let r = ui(&api, logout).await;
    assert_eq!(r.status(), 303, "{}", text(&r));
    assert!(r.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));

    let r = ui(&api, warp::test::request().path("/ui/static/htmx.min.js")).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["cache-control"].to_str().unwrap().contains("immutable"));
}
