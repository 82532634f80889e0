//! The admin API served over real TCP next to real runners: a module from `modules/`
//! uploaded over HTTP runs and its result is served back; two runners together keep a
//! tenant under its running cap.

#![allow(clippy::unwrap_used)]

mod admin_support;

use std::time::Duration;

use admin_support::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use sweep::admin::{self, AdminConfig};
use sweep::config::WorkerConfig;
use sweep::queue::{RetryPolicy, TenantCaps};
use sweep::sandbox::SandboxConfig;
use sweep::worker::Worker;
use tokio::sync::oneshot;

/// The API on an ephemeral port; dropping the sender stops it.
async fn serve(pool: &PgPool) -> (String, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let config = AdminConfig { operator_token: Some(OPERATOR.into()), ..AdminConfig::default() };
    let state = admin::AdminState::new(pool.clone(), sandbox(), config).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        admin::serve_on(listener, state, shutdown).await.expect("serve");
    });
    (url, stop, server)
}

fn worker_config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 4,
        spare_slots: 0,
        poll_interval: Duration::from_millis(50),
        retry: RetryPolicy {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(5),
            jitter: 0.0,
        },
        sandbox: SandboxConfig { max_concurrency: 4, pooling: false, ..SandboxConfig::default() },
        ..WorkerConfig::default()
    }
}

fn start_worker(pool: &PgPool) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let worker = Worker::new(pool.clone(), worker_config()).expect("worker");
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
            .expect("worker run");
    });
    (stop, handle)
}

async fn json_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.expect("json body"))
}

#[sqlx::test(migrator = "sweep::queue::MIGRATOR")]
async fn a_module_uploaded_over_http_runs_and_its_result_is_served(pool: PgPool) {
    let (url, stop_api, api_task) = serve(&pool).await;
    let (_, token) =
        admin::create_tenant(&pool, "acme", &TenantCaps::default()).await.expect("tenant");
    let http = reqwest::Client::new();

    let upload = http
        .put(format!("{url}/v1/modules/wordcount"))
        .bearer_auth(&token)
        .header("content-type", "application/wasm")
        .body(module("wordcount"))
        .send()
        .await
        .expect("upload");
    let (status, uploaded) = json_of(upload).await;
    assert_eq!(status, 201, "{uploaded}");

    let enqueue = http
        .post(format!("{url}/v1/tasks"))
        .bearer_auth(&token)
        .json(
            &json!({"task_type": "wordcount", "payload": {"text": "to be or not to be", "top": 2}}),
        )
        .send()
        .await
        .expect("enqueue");
    let (status, enqueued) = json_of(enqueue).await;
    assert_eq!(status, 201, "{enqueued}");
    let id = enqueued["id"].as_i64().expect("id");

    let (stop_worker, worker) = start_worker(&pool);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let task = loop {
        let shown = http.get(format!("{url}/v1/tasks/{id}")).bearer_auth(&token).send().await;
        let (status, task) = json_of(shown.expect("show")).await;
        assert_eq!(status, 200, "{task}");
        if task["state"] == "succeeded" || task["state"] == "dead" {
            break task;
        }
        assert!(tokio::time::Instant::now() < deadline, "task never finished: {task}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(task["state"], "succeeded", "{task}");
    assert_eq!(
        task["result"],
        json!({"words": 6, "lines": 1, "chars": 18, "top": [["be", 2], ["to", 2]]})
    );
    assert_eq!(task["module_sha256"], uploaded["sha256"]);
    assert_eq!(task["attempts"], 1);

    let stats = http.get(format!("{url}/v1/stats")).bearer_auth(&token).send().await;
    let (_, stats) = json_of(stats.expect("stats")).await;
    assert_eq!(stats["types"][0]["succeeded"], 1);
    assert_eq!(stats["runners"].as_array().map(Vec::len), Some(1));

    let _ = stop_worker.send(());
    worker.await.expect("worker stopped");
    let _ = stop_api.send(());
    api_task.await.expect("api stopped");
}

#[sqlx::test(migrator = "sweep::queue::MIGRATOR")]
async fn two_runners_keep_a_tenant_under_its_running_cap(pool: PgPool) {
    let api = api(&pool);
    let caps = TenantCaps { max_running: Some(2), ..TenantCaps::default() };
    let capped = api.tenant("capped", caps).await;
    // Each task holds its slot for 300 ms, then times out and dies (one attempt).
    let path = "/v1/modules/nap?timeout_ms=300&max_attempts=1";
    api.put_wasm(path, Some(&capped), &module("sleep")).await.ok(201);
    let naps = serde_json::Value::Array(vec![json!({"task_type": "nap"}); 8]);
    api.post("/v1/tasks/batch", Some(&capped), &naps).await.ok(201);
    // Someone else's work must flow while the capped tenant waits.
    api.upload(OPERATOR, "quick", "noop").await;
    let quick = serde_json::Value::Array(vec![json!({"task_type": "quick"}); 6]);
    api.post("/v1/tasks/batch", Some(OPERATOR), &quick).await.ok(201);

    let runners = [start_worker(&pool), start_worker(&pool)];
    let mut most = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (running, dead, quick_done): (i64, i64, i64) = sqlx::query_as(
            "select (select count(*) from tasks where tenant = 'capped' and state = 'running'),
                    (select count(*) from dead_tasks where tenant = 'capped'),
                    (select count(*) from finished_tasks
                     where tenant = 'default' and state = 'succeeded')",
        )
        .fetch_one(&pool)
        .await
        .expect("sample");
        assert!(running <= 2, "{running} tasks of a tenant capped at 2 are running");
        most = most.max(running);
        if dead == 8 && quick_done == 6 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "work never finished");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(most >= 1, "the capped tenant's tasks did run");
    for (stop, handle) in runners {
        let _ = stop.send(());
        handle.await.expect("worker stopped");
    }
}
