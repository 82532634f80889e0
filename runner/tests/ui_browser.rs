//! The dashboard in a real browser: headless Chromium driven over WebDriver (chromedriver,
//! started here on a free port) against the admin API on TCP, a real runner and Postgres.
//!
//! One scenario, in order: log in; watch an enqueued task go from pending to succeeded
//! without a reload; watch dead tasks appear; open one's history and requeue it; a POST
//! without the CSRF token is refused; a read-only token sees but cannot requeue; a second
//! tenant sees none of it (another tenant's task is a 404 page); the operator changes a
//! weight and activates an older module version.
//!
//! A second scenario drives the console: state tabs and search, cancelling a running task,
//! bulk requeue and delete with their confirmations, pausing and resuming a queue and a
//! tenant, a rate limit and a running limit, the schedules, runners and charts pages, what a
//! read-only session cannot do, and sessions ending at logout and at a token rotation.
//!
//! Needs `chromium` and `chromium-driver` (`.ci/run` installs them). Without chromedriver the
//! test FAILS, unless `SWEEP_SKIP_BROWSER=1` (never set in CI). Every page is saved as a PNG
//! at 1280x900 in `target/ui-screenshots/` (`SWEEP_SHOTS_DIR` elsewhere).

#![allow(clippy::unwrap_used)]

mod admin_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use admin_support::{migrated, module, serve, start_worker, unpooled_config, OPERATOR};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::admin;
use sweep::queue::TenantCaps;
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(60);

/// chromedriver, killed when dropped.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// A browser session, or `None` when chromedriver is missing and SWEEP_SKIP_BROWSER=1.
async fn browser() -> Option<(Driver, Client)> {
    let driver = std::env::var_os("SWEEP_CHROMEDRIVER")
        .map(PathBuf::from)
        .or_else(|| find_in_path("chromedriver"));
    let Some(driver) = driver else {
        if std::env::var("SWEEP_SKIP_BROWSER").as_deref() == Ok("1") {
            eprintln!("SWEEP_SKIP_BROWSER=1 and no chromedriver: browser test skipped");
            return None;
        }
        panic!(
            "chromedriver not found in PATH: install the Debian packages chromium and \
             chromium-driver (.ci/run does), or set SWEEP_SKIP_BROWSER=1 to skip"
        );
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(&driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", driver.display()));
    let driver = Driver(child);
    let deadline = Instant::now() + WAIT;
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "chromedriver never listened on port {port}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut options = json!({
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,900"]
    });
    if Path::new("/usr/bin/chromium").is_file() {
        options["binary"] = json!("/usr/bin/chromium");
    }
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), options);
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("WebDriver session");
    Some((driver, client))
}

/// Polls the element's text until it contains `want` (the page updates itself; nothing
/// here reloads it).
async fn wait_text(c: &Client, css: &str, want: &str) -> String {
    let deadline = Instant::now() + WAIT;
    let mut last = String::from("<not found>");
    loop {
        if let Ok(e) = c.find(Locator::Css(css)).await {
            if let Ok(text) = e.text().await {
                if text.contains(want) {
                    return text;
                }
                last = text;
            }
        }
        assert!(Instant::now() < deadline, "{css} never showed {want:?}; last: {last:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn present(c: &Client, css: &str) -> bool {
    c.find(Locator::Css(css)).await.is_ok()
}

async fn login(c: &Client, base: &str, token: &str, who: &str) {
    c.goto(&format!("{base}/ui/login")).await.unwrap();
    c.find(Locator::Css("#token")).await.unwrap().send_keys(token).await.unwrap();
    c.find(Locator::Css("#login")).await.unwrap().click().await.unwrap();
    wait_text(c, "#who", who).await;
}

async fn logout(c: &Client) {
    c.find(Locator::Css("header form button")).await.unwrap().click().await.unwrap();
    wait_text(c, "main", "Sweep dashboard").await;
}

/// A POST from the page's own script; returns the HTTP status.
async fn post_from_page(c: &Client, path: &str, with_csrf: bool) -> u64 {
    let script = r#"
        const [path, withCsrf, done] = arguments;
        const headers = {'Content-Type': 'application/x-www-form-urlencoded'};
        if (withCsrf) {
            headers['X-CSRF-Token'] =
                JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token'];
        }
        fetch(path, {method: 'POST', headers, body: '', redirect: 'manual'})
            .then(r => done(r.status), e => done(String(e)));
    "#;
    let status = c.execute_async(script, vec![json!(path), json!(with_csrf)]).await.unwrap();
    status.as_u64().unwrap_or_else(|| panic!("fetch failed: {status}"))
}

/// A PNG of the page at 1280x900 in `target/ui-screenshots/` (or `$SWEEP_SHOTS_DIR`), to look
/// at after the run.
async fn shot(c: &Client, name: &str) {
    let dir = std::env::var_os("SWEEP_SHOTS_DIR").map(PathBuf::from).unwrap_or_else(|| {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
        target.join("ui-screenshots")
    });
    std::fs::create_dir_all(&dir).unwrap();
    let png = c.screenshot().await.unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

async fn api(http: &reqwest::Client, req: reqwest::RequestBuilder, want: u16) -> Value {
    let _ = http;
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, want, "{body}");
    body
}

async fn dead_row(pool: &PgPool, id: i64) -> Option<i64> {
    sqlx::query_scalar("select id from sweep.dead_tasks where id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn the_dashboard_in_a_real_browser(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let Some((_driver, c)) = browser().await else { return };
    let (base, stop_api, api_task) = serve(&db).await;
    let http = reqwest::Client::new();
    let (_, acme) = admin::create_tenant(&pool, "acme", &TenantCaps::default()).await.unwrap();
    let (_, globex) = admin::create_tenant(&pool, "globex", &TenantCaps::default()).await.unwrap();
    let viewer = admin::create_read_only_token(&pool, "acme").await.unwrap();
    for (task_type, file, params) in
        [("quick", "noop", ""), ("doomed", "permanent", "?max_attempts=1")]
    {
        let put = http
            .put(format!("{base}/v1/modules/{task_type}{params}"))
            .bearer_auth(&acme)
            .header("content-type", "application/wasm")
            .body(module(file));
        api(&http, put, 201).await;
    }
    let enqueue = |task_type: &'static str| {
        http.post(format!("{base}/v1/tasks"))
            .bearer_auth(&acme)
            .json(&json!({"task_type": task_type, "payload": {"hello": "world"}}))
    };
    let quick = api(&http, enqueue("quick"), 201).await["id"].as_i64().unwrap();

    // Log in; the unstarted task is pending. A marker in the page's JS state proves later
    // that the page never reloaded.
    c.goto(&format!("{base}/ui")).await.unwrap();
    wait_text(&c, "h1", "Sweep dashboard").await;
    shot(&c, "login").await;
    login(&c, &base, &acme, "tenant acme").await;
    c.goto(&format!("{base}/ui/tasks/{quick}")).await.unwrap();
    wait_text(&c, "#state", "pending").await;
    c.execute("window.sweepMarker = 'same page'", vec![]).await.unwrap();
    let runner = start_worker(&db, unpooled_config(2));
    wait_text(&c, "#state", "succeeded").await;
    let marker = c.execute("return window.sweepMarker", vec![]).await.unwrap();
    assert_eq!(marker, json!("same page"), "the page reloaded");
    wait_text(&c, "#result", "{}").await;
    shot(&c, "task-succeeded").await;

    // Two tasks that die; the dead-letter list shows them as they die.
    c.goto(&format!("{base}/ui/dead")).await.unwrap();
    let doomed = [
        api(&http, enqueue("doomed"), 201).await["id"].as_i64().unwrap(),
        api(&http, enqueue("doomed"), 201).await["id"].as_i64().unwrap(),
    ];
    for id in doomed {
        wait_text(&c, &format!("#dead-{id}"), "handler_error").await;
    }
    // Stop the runner so a requeued task stays pending for us to see.
    runner.stop().await;
    shot(&c, "dead-letters").await;

    // Its history: every attempt with kind, duration and fuel.
    c.find(Locator::Css(&format!("#dead-{} a", doomed[0]))).await.unwrap().click().await.unwrap();
    wait_text(&c, "#state", "dead").await;
    let history = wait_text(&c, "#history", "handler_error").await;
    assert!(history.contains(" ms"), "duration shown: {history}");
    shot(&c, "dead-task").await;

    // A forged POST without the CSRF token is refused; the task stays dead.
    let path = format!("/ui/dead/{}/requeue", doomed[1]);
    assert_eq!(post_from_page(&c, &path, false).await, 403);
    assert!(dead_row(&pool, doomed[1]).await.is_some());

    // Requeue from the page.
    c.find(Locator::Css("#requeue")).await.unwrap().click().await.unwrap();
    wait_text(&c, "#notice", "Requeued").await;
    wait_text(&c, "#state", "pending").await;
    let (attempts, history_len): (i32, i32) = sqlx::query_as(
        "select attempts, jsonb_array_length(errors) from sweep.tasks where id = $1 and state = 'pending'",
    )
    .bind(doomed[0])
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((attempts, history_len), (0, 1), "attempts reset, history kept");

    // The task list filters by state.
    c.goto(&format!("{base}/ui/tasks?state=dead")).await.unwrap();
    wait_text(&c, &format!("#task-{}", doomed[1]), "dead").await;
    assert!(!present(&c, &format!("#task-{quick}")).await, "filtered out");
    c.goto(&format!("{base}/ui/tasks")).await.unwrap();
    wait_text(&c, &format!("#task-{quick}"), "succeeded").await;
    shot(&c, "tasks").await;
    c.goto(&format!("{base}/ui")).await.unwrap();
    wait_text(&c, "#queues", "doomed").await;
    wait_text(&c, "#succeeded-hour", "1").await;
    shot(&c, "overview-tenant").await;
    logout(&c).await;

    // A read-only token sees the dead task but has no requeue button, and a POST carrying
    // its valid CSRF token is still refused.
    login(&c, &base, &viewer, "read-only").await;
    c.goto(&format!("{base}/ui/tasks/{}", doomed[1])).await.unwrap();
    wait_text(&c, "#state", "dead").await;
    assert!(!present(&c, "#requeue").await, "read-only sessions get no requeue button");
    assert_eq!(post_from_page(&c, &path, true).await, 403);
    c.goto(&format!("{base}/ui/dead")).await.unwrap();
    wait_text(&c, &format!("#dead-{}", doomed[1]), "handler_error").await;
    assert!(!present(&c, "#requeue-all").await);
    assert!(dead_row(&pool, doomed[1]).await.is_some(), "still dead");
    logout(&c).await;

    // The second tenant sees none of it.
    login(&c, &base, &globex, "tenant globex").await;
    wait_text(&c, "#no-queues", "No tasks").await;
    c.goto(&format!("{base}/ui/tasks")).await.unwrap();
    wait_text(&c, "#no-tasks", "No tasks").await;
    c.goto(&format!("{base}/ui/dead")).await.unwrap();
    wait_text(&c, "#no-dead", "No dead tasks").await;
    c.goto(&format!("{base}/ui/modules")).await.unwrap();
    wait_text(&c, "#no-modules", "No module").await;
    c.goto(&format!("{base}/ui/tasks/{quick}")).await.unwrap();
    wait_text(&c, "h1", "404").await;
    wait_text(&c, "#error", "not found").await;
    logout(&c).await;

    // The operator: sees every tenant, changes a weight, rolls a module back.
    let put = http
        .put(format!("{base}/v1/modules/quick?fuel=1000000"))
        .bearer_auth(&acme)
        .header("content-type", "application/wasm")
        .body(module("noop"));
    assert_eq!(api(&http, put, 201).await["version"], 2);
    login(&c, &base, OPERATOR, "operator").await;
    wait_text(&c, "#queues", "acme").await;
    shot(&c, "overview").await;
    c.goto(&format!("{base}/ui/tenants")).await.unwrap();
    let weight = c.find(Locator::Css("#tenant-acme input[name=weight]")).await.unwrap();
    weight.clear().await.unwrap();
    weight.send_keys("3").await.unwrap();
    c.find(Locator::Css("#tenant-acme button")).await.unwrap().click().await.unwrap();
    wait_text(&c, "#notice", "acme").await;
    wait_text(&c, "#tenant-acme .weight", "3").await;
    shot(&c, "tenants").await;
    let w: i32 = sqlx::query_scalar("select weight from sweep.tenants where name = 'acme'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(w, 3);
    c.goto(&format!("{base}/ui/modules")).await.unwrap();
    c.find(Locator::Css("#module-acme-quick-1 button.activate"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#notice", "quick v1").await;
    wait_text(&c, "#module-acme-quick-1", "active").await;
    wait_text(&c, "#module-acme-quick-1 td.compile", "ready").await;
    shot(&c, "modules").await;
    let active: i32 = sqlx::query_scalar(
        "select version from sweep.active_modules where tenant = 'acme' and task_type = 'quick'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(active, 1);

    // Requeue-all for the operator's filtered view.
    c.goto(&format!("{base}/ui/dead?tenant=acme&task_type=doomed")).await.unwrap();
    c.find(Locator::Css("#requeue-all")).await.unwrap().click().await.unwrap();
    wait_text(&c, "#notice", "Requeued 1 tasks").await;
    assert!(dead_row(&pool, doomed[1]).await.is_none());

    c.close().await.unwrap();
    let _ = stop_api.send(());
    api_task.await.unwrap();
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("clicking {css}: {e}"));
}

/// Fills the input `css` with `text` (clearing it first).
async fn fill(c: &Client, css: &str, text: &str) {
    let input = c.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
    input.clear().await.unwrap();
    input.send_keys(text).await.unwrap();
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await.unwrap()
}

/// Waits until `sql` (one int8) equals `want`: the runner's work is awaited, never slept on.
async fn wait_db(pool: &PgPool, sql: &str, want: i64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = scalar(pool, sql).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{sql}: {got}, waited for {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn the_console_actions_in_a_real_browser(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let Some((_driver, c)) = browser().await else { return };
    let (base, stop_api, api_task) = serve(&db).await;
    let http =
        reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let (_, acme) = admin::create_tenant(&pool, "acme", &TenantCaps::default()).await.unwrap();
    let viewer = admin::create_read_only_token(&pool, "acme").await.unwrap();
    for (task_type, file, params) in [
        ("quick", "noop", ""),
        ("doomed", "permanent", "?max_attempts=1"),
        ("nap", "sleep", "?timeout_ms=120000"),
    ] {
        let put = http
            .put(format!("{base}/v1/modules/{task_type}{params}"))
            .bearer_auth(&acme)
            .header("content-type", "application/wasm")
            .body(module(file));
        api(&http, put, 201).await;
    }
    let enqueue = |task_type: &str, payload: Value| {
        http.post(format!("{base}/v1/tasks"))
            .bearer_auth(&acme)
            .json(&json!({"task_type": task_type, "payload": payload}))
    };
    let mut quick = Vec::new();
    for user in [42, 7, 7] {
        quick.push(
            api(&http, enqueue("quick", json!({"user": {"id": user}})), 201).await["id"]
                .as_i64()
                .unwrap(),
        );
    }
    for _ in 0..2 {
        api(&http, enqueue("doomed", json!({})), 201).await;
    }
    let nap = api(&http, enqueue("nap", json!({})), 201).await["id"].as_i64().unwrap();
    let schedule = json!({"name": "nightly", "cron": "0 3 * * *", "task_type": "quick"});
    api(&http, http.post(format!("{base}/v1/schedules")).bearer_auth(&acme).json(&schedule), 201)
        .await;
    let runner = start_worker(&db, unpooled_config(2));
    wait_db(&pool, "select count(*) from sweep.finished_tasks where task_type = 'quick'", 3).await;
    wait_db(&pool, "select count(*) from sweep.dead_tasks", 2).await;
    wait_db(
        &pool,
        &format!("select count(*) from sweep.tasks where id = {nap} and state = 'running'"),
        1,
    )
    .await;

    login(&c, &base, OPERATOR, "operator").await;

    // State tabs count, and searches narrow the list: by payload path, by id, by type prefix.
    c.goto(&format!("{base}/ui/tasks")).await.unwrap();
    wait_text(&c, "#tab-succeeded", "3").await;
    wait_text(&c, "#tab-dead", "2").await;
    wait_text(&c, "#tab-running", "1").await;
    shot(&c, "tasks-tabs").await;
    fill(&c, "#search-payload", "user.id=42").await;
    click(&c, "#search button[type=submit]").await;
    wait_text(&c, &format!("#task-{}", quick[0]), "succeeded").await;
    assert!(!present(&c, &format!("#task-{}", quick[1])).await, "user 7 is filtered out");
    assert!(
        c.current_url().await.unwrap().as_str().contains("payload=user.id%3D42"),
        "the filter is in the URL"
    );
    wait_text(&c, "#tab-all", "1").await;
    shot(&c, "tasks-search").await;
    c.goto(&format!("{base}/ui/tasks?id={}", quick[1])).await.unwrap();
    wait_text(&c, &format!("#task-{}", quick[1]), "quick").await;
    assert!(!present(&c, &format!("#task-{}", quick[0])).await);
    c.goto(&format!("{base}/ui/tasks?type_prefix=do")).await.unwrap();
    wait_text(&c, "#tab-all", "2").await;
    assert!(!present(&c, &format!("#task-{nap}")).await);

    // Cancel the running task from its page: it ends cancelled, shown as a cancellation.
    c.goto(&format!("{base}/ui/tasks/{nap}")).await.unwrap();
    wait_text(&c, "#state", "running").await;
    click(&c, "#cancel").await;
    c.accept_alert().await.unwrap();
    wait_text(&c, "#state", "cancelled").await;
    wait_text(&c, "#cancellation", "cancelled while running").await;
    wait_text(&c, "#no-attempts", "None").await;
    shot(&c, "task-cancelled").await;

    // Bulk requeue of the selected dead tasks, confirmed with the count.
    c.goto(&format!("{base}/ui/tasks?task_type=doomed&state=dead")).await.unwrap();
    wait_text(&c, "#tab-dead", "2").await;
    click(&c, "#pick-all").await;
    click(&c, "#requeue-selected").await;
    wait_text(&c, "#confirm-what", "Requeue the 2 selected tasks").await;
    shot(&c, "bulk-confirm").await;
    click(&c, "#confirm-button").await;
    wait_text(&c, "#notice", "Requeued 2").await;
    // They run again and die again (max_attempts 1).
    wait_db(&pool, "select count(*) from sweep.dead_tasks where jsonb_array_length(errors) = 2", 2)
        .await;
    // After a requeue the counter and the history read together: the second round's attempt
    // is "1 of 1", marked as counted again, with both attempts listed.
    let again: i64 = scalar(&pool, "select min(id) from sweep.dead_tasks").await;
    c.goto(&format!("{base}/ui/tasks/{again}")).await.unwrap();
    wait_text(&c, "#attempts", "requeued 1×; 2 attempts in all").await;
    wait_text(&c, "#history", "requeued: attempts counted from 1 again").await;
    shot(&c, "task-requeued").await;

    // Bulk delete of everything the filter matches: the succeeded quick tasks.
    c.goto(&format!("{base}/ui/tasks?type_prefix=quick&state=succeeded")).await.unwrap();
    wait_text(&c, "#tab-succeeded", "3").await;
    click(&c, "#delete-matching").await;
    wait_text(&c, "#confirm-what", "Delete 3 tasks").await;
    click(&c, "#confirm-button").await;
    wait_text(&c, "#notice", "Deleted 3").await;
    assert_eq!(
        scalar(&pool, "select count(*) from sweep.finished_tasks where task_type = 'quick'").await,
        0
    );

    // Pause a queue: its tasks wait, the pause shows who and since when, here and on the
    // overview; resuming lets them run.
    c.goto(&format!("{base}/ui/queues")).await.unwrap();
    c.find(Locator::Css("#queue-acme-quick form[action$='/pause'] button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#notice", "Paused acme/quick").await;
    wait_text(&c, "#queue-acme-quick", "paused by the operator").await;
    let held = api(&http, enqueue("quick", json!({})), 201).await["id"].as_i64().unwrap();
    c.goto(&format!("{base}/ui/tasks?task_type=quick")).await.unwrap();
    wait_text(&c, "#paused-banner", "paused by the operator").await;
    wait_text(&c, &format!("#task-{held}"), "pending").await;
    c.goto(&format!("{base}/ui")).await.unwrap();
    wait_text(&c, "#overview-acme-quick", "paused by the operator").await;
    shot(&c, "overview-paused").await;
    assert_eq!(
        scalar(
            &pool,
            &format!("select count(*) from sweep.tasks where id = {held} and state = 'pending'")
        )
        .await,
        1
    );
    c.goto(&format!("{base}/ui/queues")).await.unwrap();
    shot(&c, "queues-paused").await;
    c.find(Locator::Css("#queue-acme-quick form[action$='/resume'] button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#notice", "Resumed acme/quick").await;
    wait_db(&pool, &format!("select count(*) from sweep.finished_tasks where id = {held}"), 1)
        .await;

    // A rate limit and a running limit, edited in place.
    fill(&c, "#queue-acme-quick input[name=rate_per_sec]", "5").await;
    fill(&c, "#queue-acme-quick input[name=burst]", "2").await;
    click(&c, "#queue-acme-quick form.rate button").await;
    wait_text(&c, "#notice", "5 per second, burst 2").await;
    let (rate, burst): (f64, i32) = sqlx::query_as(
        "select rate_per_sec, burst from sweep.queues where tenant = 'acme' and task_type = 'quick'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((rate, burst), (5.0, 2));
    fill(&c, "#queue-acme-quick input[name=max_running]", "3").await;
    click(&c, "#queue-acme-quick form.max-running button").await;
    wait_text(&c, "#notice", "Max running of acme/quick: 3").await;
    assert_eq!(
        scalar(&pool, "select max_running::int8 from sweep.queues where tenant = 'acme' and task_type = 'quick'").await,
        3
    );

    // The whole tenant, paused and resumed by the operator.
    click(&c, "#tenant-pause-acme button").await;
    wait_text(&c, "#tenant-pause-acme", "paused by the operator").await;
    wait_text(&c, "#queue-acme-doomed", "tenant paused").await;
    shot(&c, "queues").await;
    click(&c, "#tenant-pause-acme button").await;
    wait_text(&c, "#tenant-pause-acme", "running").await;

    // Schedules: next run, pause, resume, delete.
    c.goto(&format!("{base}/ui/schedules")).await.unwrap();
    wait_text(&c, "#schedule-acme-nightly", "0 3 * * *").await;
    click(&c, "#schedule-acme-nightly form[action$='/pause'] button").await;
    wait_text(&c, "#schedule-acme-nightly", "paused since").await;
    shot(&c, "schedules").await;
    click(&c, "#schedule-acme-nightly form[action$='/resume'] button").await;
    wait_text(&c, "#schedule-acme-nightly", "active").await;
    click(&c, "#schedule-acme-nightly form[action$='/delete'] button").await;
    c.accept_alert().await.unwrap();
    wait_text(&c, "#notice", "Deleted schedule nightly").await;
    wait_text(&c, "#no-schedules", "No schedules").await;

    // Runners and charts.
    c.goto(&format!("{base}/ui/runners")).await.unwrap();
    wait_text(&c, &format!("#runner-{}", runner.id), "alive").await;
    shot(&c, "runners").await;
    runner.stop().await; // its last counts are added as it stops
    c.goto(&format!("{base}/ui/charts")).await.unwrap();
    wait_text(&c, "#chart-totals", "succeeded").await;
    let totals = c.find(Locator::Css("#chart-totals")).await.unwrap().text().await.unwrap();
    assert!(!totals.starts_with("0 succeeded"), "{totals}");
    assert!(present(&c, "#chart-throughput").await && present(&c, "#chart-latency").await);
    wait_text(&c, "#chart-types", "doomed").await;
    wait_text(&c, "#chart-failures", "").await;
    shot(&c, "charts-1h").await;
    click(&c, "#range-24h").await;
    wait_text(&c, "#range-24h", "24h").await;
    assert!(c.current_url().await.unwrap().as_str().contains("range=24h"));
    shot(&c, "charts-24h").await;
    click(&c, "#range-7d").await;
    wait_text(&c, "#chart-types", "quick").await;
    shot(&c, "charts-7d").await;
    logout(&c).await;

    // A read-only session sees the pages but no control, and a POST with its CSRF token is
    // still refused.
    login(&c, &base, &viewer, "read-only").await;
    c.goto(&format!("{base}/ui/queues")).await.unwrap();
    wait_text(&c, "#queue-acme-quick", "quick").await;
    assert!(!present(&c, "#queues form").await, "no controls for a read-only session");
    assert_eq!(post_from_page(&c, "/ui/queues/acme/quick/pause", true).await, 403);
    c.goto(&format!("{base}/ui/tasks")).await.unwrap();
    wait_text(&c, "#tab-all", "").await;
    assert!(!present(&c, "#bulk").await && !present(&c, "input.pick").await);
    c.goto(&format!("{base}/ui/schedules")).await.unwrap();
    wait_text(&c, "h1", "Schedules").await;
    logout(&c).await;

    // Sessions live on the server: the cookie holds an id, not the token; logging out ends
    // it, and so does rotating its token.
    let login_as = |token: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http
                .post(format!("{base}/ui/login"))
                .form(&[("token", token)])
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 303);
            let cookie =
                r.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_owned();
            cookie
        }
    };
    let page_status = |cookie: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            http.get(format!("{base}/ui"))
                .header("cookie", cookie)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let cookie = login_as(acme.clone()).await;
    assert!(
        !cookie.contains(&acme) && !cookie.contains(&hex(&acme)),
        "the cookie holds no token: {cookie}"
    );
    assert_eq!(page_status(cookie.clone()).await, 200);
    let rotated: Value =
        api(&http, http.post(format!("{base}/v1/tenants/acme/token")).bearer_auth(OPERATOR), 200)
            .await;
    assert_eq!(page_status(cookie).await, 303, "a rotated token ends its sessions");
    let cookie = login_as(rotated["token"].as_str().unwrap().to_owned()).await;
    assert_eq!(page_status(cookie.clone()).await, 200);
    // Logging out deletes the session on the server: the same cookie no longer works.
    let page = http.get(format!("{base}/ui")).header("cookie", &cookie).send().await.unwrap();
    let html = page.text().await.unwrap();
    let csrf = html
        .split("X-CSRF-Token&quot;: &quot;")
        .nth(1)
        .or_else(|| html.split("X-CSRF-Token\": \"").nth(1))
        .and_then(|rest| rest.split("&quot;").next().and_then(|t| t.split('"').next()))
        .unwrap_or_else(|| panic!("no CSRF token in the page"))
        .to_owned();
    let sessions = "select count(*) from sweep.ui_sessions";
    let before = scalar(&pool, sessions).await;
    let out = http
        .post(format!("{base}/ui/logout"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf)])
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 303);
    assert_eq!(scalar(&pool, sessions).await, before - 1, "logging out deletes the session");
    assert_eq!(page_status(cookie).await, 303, "a logged-out session is gone");
    c.close().await.unwrap();
    let _ = stop_api.send(());
    api_task.await.unwrap();
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}
