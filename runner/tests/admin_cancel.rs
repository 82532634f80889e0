//! The cancel routes with a real runner behind the API: `POST /v1/tasks/{id}/cancel` answers
//! 200 for a waiting task, 202 for a running one (which then ends `cancelled`, its attempt in
//! the history GET shows), 409 naming the state a finished task ended in, and 404 for another
//! tenant's task; `POST /v1/tasks/cancel` cancels a task type of the caller's tenant only and
//! answers the counts; bad input names its field and changes nothing.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::TenantCaps;

fn kinds(task: &Value) -> Vec<String> {
    task["errors"]
        .as_array()
        .map(|a| a.iter().map(|e| e["kind"].as_str().unwrap_or("").to_owned()).collect())
        .unwrap_or_default()
}

#[sqlx::test(migrations = false)]
async fn cancel_answers_which_way_it_went(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let globex = api.tenant("globex", TenantCaps::default()).await;
    api.upload(&acme, "nap", "sleep").await;
    api.upload(&acme, "quick", "noop").await;
    let (a, g) = (Some(acme.as_str()), Some(globex.as_str()));
    let runner = start_worker(&db, unpooled_config(2));

    // Running: 202 with the task, its cancel under way; then it ends cancelled.
    let nap = api.enqueue(&acme, "nap", json!({})).await;
    wait_for(&pool, nap, "to run", |t| t.state == TaskState::Running).await;
    let cancel = format!("/v1/tasks/{nap}/cancel");
    api.post(&cancel, g, &json!({})).await.expect(404, "not_found");
    let asked = api.post(&cancel, a, &json!({})).await;
    let body = asked.ok(202);
    // The body is the task read right after the cancel: its runner may have stopped it and
    // reported before that read (a stop takes well under a millisecond), so it shows either
    // the request on the running task or the attempt it ended.
    match body["state"].as_str() {
        Some("running") => assert!(body["cancel_requested_at"].is_string(), "{body}"),
        Some("cancelled") => assert!(body["errors"][0]["requested_at"].is_string(), "{body}"),
        _ => panic!("202 with a task neither running nor cancelled: {body}"),
    }
    let ended = wait_ended(&pool, nap).await;
    assert_eq!(ended.state, TaskState::Cancelled);
    let shown = api.get(&format!("/v1/tasks/{nap}"), a).await;
    let shown = shown.ok(200);
    assert_eq!(shown["state"], "cancelled");
    assert_eq!(kinds(shown), vec!["cancelled"], "{shown}");
    assert!(shown["errors"][0]["stop_ms"].is_number(), "{shown}");
    let again = api.post(&cancel, a, &json!({})).await;
    again.expect(409, "not_cancellable");
    assert!(again.message().contains("cancelled"), "{}", again.message());

    // Finished: 409 names the state it ended in.
    let quick = api.enqueue(&acme, "quick", json!({})).await;
    wait_settled(&pool, quick).await;
    let late = api.post(&format!("/v1/tasks/{quick}/cancel"), a, &json!({})).await;
    late.expect(409, "not_cancellable");
    assert!(late.message().contains("succeeded"), "{}", late.message());

    // Waiting: 200, cancelled at once.
    let later = json!({"task_type": "nap", "payload": {}, "delay_ms": 600_000});
    let waiting = api.post("/v1/tasks", a, &later).await.ok(201)["id"].as_i64().unwrap();
    let done = api.post(&format!("/v1/tasks/{waiting}/cancel"), a, &json!({})).await;
    assert_eq!(done.ok(200)["state"], "cancelled");
    runner.stop().await;
}

#[sqlx::test(migrations = false)]
async fn bulk_cancel_is_scoped_to_the_tenant_and_counts(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let api = api(&db);
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let globex = api.tenant("globex", TenantCaps::default()).await;
    api.upload(&acme, "nap", "sleep").await;
    api.upload(&globex, "nap", "sleep").await;
    let (a, g) = (Some(acme.as_str()), Some(globex.as_str()));
    let later = json!({"task_type": "nap", "payload": {}, "delay_ms": 600_000});
    let mut acme_waiting = Vec::new();
    for _ in 0..3 {
        acme_waiting.push(api.post("/v1/tasks", a, &later).await.ok(201)["id"].as_i64().unwrap());
    }
    let globex_waiting = api.post("/v1/tasks", g, &later).await.ok(201)["id"].as_i64().unwrap();
    let runner = start_worker(&db, unpooled_config(2));
    let running =
        [api.enqueue(&acme, "nap", json!({})).await, api.enqueue(&acme, "nap", json!({})).await];
    for id in running {
        wait_for(&pool, id, "to run", |t| t.state == TaskState::Running).await;
    }

    // Bad input names its field and cancels nothing.
    for (body, code, field) in [
        (json!({"task_type": ""}), "invalid_task_type", "task_type"),
        (json!({"task_type": "no spaces"}), "invalid_task_type", "task_type"),
        (json!({"task_type": "nap", "state": "dead"}), "invalid_state", "state"),
        (json!({"state": "pending"}), "invalid_json", "task_type"),
    ] {
        let answer = api.post("/v1/tasks/cancel", a, &body).await;
        answer.expect(400, code);
        assert!(answer.message().contains(field), "{body}: {}", answer.message());
    }
    for id in acme_waiting.iter().chain(&running) {
        assert!(common::state(&pool, *id).await.is_live(), "nothing was cancelled by bad input");
    }

    // Only the waiting ones first, then the rest; another tenant's tasks are untouched.
    let only_pending = json!({"task_type": "nap", "state": "pending"});
    let first = api.post("/v1/tasks/cancel", a, &only_pending).await;
    assert_eq!(first.ok(200), &json!({"cancelled": 3, "cancel_requested": 0}));
    let rest = api.post("/v1/tasks/cancel", a, &json!({"task_type": "nap"})).await;
    assert_eq!(rest.ok(200), &json!({"cancelled": 0, "cancel_requested": 2}));
    for id in acme_waiting.iter().chain(&running) {
        assert_eq!(wait_ended(&pool, *id).await.state, TaskState::Cancelled);
    }
    assert_eq!(common::state(&pool, globex_waiting).await, TaskState::Pending);
    // A tenant cannot name another; the operator can.
    let other = api.post("/v1/tasks/cancel?tenant=globex", a, &json!({"task_type": "nap"})).await;
    other.expect(403, "tenant_not_allowed");
    let nap = json!({"task_type": "nap"});
    let op = api.post("/v1/tasks/cancel?tenant=globex", Some(OPERATOR), &nap).await;
    assert_eq!(op.ok(200), &json!({"cancelled": 1, "cancel_requested": 0}));
    runner.stop().await;
}
