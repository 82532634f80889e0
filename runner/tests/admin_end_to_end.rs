//! The admin API served over real TCP next to real runners: a module from `modules/`
//! uploaded over HTTP runs and its result is served back; two runners together keep a
//! tenant under its running cap.

#![allow(clippy::unwrap_used)]

mod admin_support;

use std::time::Duration;

use admin_support::*;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::admin;
use sweep::queue::TenantCaps;

async fn json_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.expect("json body"))
}

#[sqlx::test(migrations = false)]
async fn a_module_uploaded_over_http_runs_and_its_result_is_served(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let (url, stop_api, api_task) = serve(&db).await;
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

    let worker = start_worker(&db, unpooled_config(4));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let task = loop {
        let shown = http.get(format!("{url}/v1/tasks/{id}")).bearer_auth(&token).send().await;
        let (status, task) = json_of(shown.expect("show")).await;
        assert_eq!(status, 200, "{task}");
        if task["state"] == TaskState::Succeeded.as_str()
            || task["state"] == TaskState::Dead.as_str()
        {
            break task;
        }
        assert!(tokio::time::Instant::now() < deadline, "task never finished: {task}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(task["state"], TaskState::Succeeded.as_str(), "{task}");
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

    worker.stop().await;
    let _ = stop_api.send(());
    api_task.await.expect("api stopped");
}

#[sqlx::test(migrations = false)]
async fn two_runners_keep_a_tenant_under_its_running_cap(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
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

    let runners = [start_worker(&db, unpooled_config(4)), start_worker(&db, unpooled_config(4))];
    let mut most = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (running, dead, quick_done): (i64, i64, i64) = sqlx::query_as(
            "select (select count(*) from sweep.tasks where tenant = 'capped' and state = $1),
                    (select count(*) from sweep.dead_tasks where tenant = 'capped'),
                    (select count(*) from sweep.finished_tasks
                     where tenant = 'default' and state = $2)",
        )
        .bind(TaskState::Running.as_str())
        .bind(TaskState::Succeeded.as_str())
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
    for runner in runners {
        runner.stop().await;
    }
}
