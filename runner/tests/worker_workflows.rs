//! Workflows end to end through a real runner: follow-up tasks (`$enqueue`) are enqueued with
//! the success that asks for them, once, and never by a failed attempt; a workflow's steps run
//! after their parents with the parents' results; a workflow cancelled mid-flight ends
//! cancelled, its running step stopped.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;

use common::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{self, ModuleSettings, NewStep, NewTask, TaskId, WorkflowState};

async fn tasks_of(pool: &PgPool, task_type: &str) -> Vec<TaskId> {
    sqlx::query_scalar(
        "select id from sweep.tasks where task_type = $1
         union all select id from sweep.finished_tasks where task_type = $1
         union all select id from sweep.dead_tasks where task_type = $1 order by 1",
    )
    .bind(task_type)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn follow_ups(n: usize) -> Vec<Value> {
    (0..n).map(|i| json!({"task_type": "leaf", "payload": {"i": i}})).collect()
}

#[sqlx::test(migrations = false)]
async fn a_retried_attempt_enqueues_its_follow_ups_once(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    register(&pool, "spawn", "spawn", ModuleSettings::default()).await;
    register(&pool, "leaf", "noop", ModuleSettings::default()).await;
    let runner = start_worker(&db, test_config());
    let payload = json!({"enqueue": follow_ups(3), "fail_times": 2});
    let id = queue::enqueue(&pool, NewTask::new("spawn", payload)).await.unwrap().id;
    let t = wait_settled(&pool, id).await;
    assert_eq!(t.state, TaskState::Succeeded, "{t:#?}");
    assert_eq!(t.attempts, 3, "two failed attempts first");
    let leaves = tasks_of(&pool, "leaf").await;
    assert_eq!(leaves.len(), 3, "the follow-ups of the attempt that succeeded, once");
    let result = t.result.unwrap();
    assert_eq!(result["$enqueued"], json!(leaves), "their ids, in request order");
    assert!(result.get("$enqueue").is_none(), "the request is not stored");
    for leaf in leaves {
        let t = wait_settled(&pool, leaf).await;
        assert_eq!((t.state, t.tenant.as_str()), (TaskState::Succeeded, "default"));
    }
    runner.stop().await;
}

#[sqlx::test(migrations = false)]
async fn a_refused_follow_up_fails_the_attempt_and_enqueues_nothing(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    register(
        &pool,
        "spawn",
        "spawn",
        ModuleSettings { max_attempts: Some(2), ..Default::default() },
    )
    .await;
    register(&pool, "leaf", "noop", ModuleSettings::default()).await;
    let runner = start_worker(&db, test_config());
    let mut asks = follow_ups(2);
    asks.push(json!({"task_type": "nothing-registered"}));
    let id =
        queue::enqueue(&pool, NewTask::new("spawn", json!({"enqueue": asks}))).await.unwrap().id;
    let t = wait_settled(&pool, id).await;
    assert_eq!(t.state, TaskState::Dead, "{t:#?}");
    assert_eq!(error_kinds(&t), vec![FailureKind::FollowUpRejected; 2]);
    let message = t.last_error.unwrap();
    assert!(message.starts_with("$enqueue[2]: no module"), "{message}");
    assert!(tasks_of(&pool, "leaf").await.is_empty(), "no follow-up of a failed attempt");

    // Another tenant cannot be named: the element has no tenant.
    let id = queue::enqueue(
        &pool,
        NewTask::new("spawn", json!({"enqueue": [{"task_type": "leaf", "tenant": "other"}]})),
    )
    .await
    .unwrap()
    .id;
    let t = wait_settled(&pool, id).await;
    assert!(t.last_error.unwrap().contains("unknown field `tenant`"));
    assert!(tasks_of(&pool, "leaf").await.is_empty());
    runner.stop().await;
}

fn step(name: &str, after: &[&str], payload: Value) -> NewStep {
    NewStep {
        name: name.into(),
        task: NewTask::new("spawn", payload),
        after: after.iter().map(|s| (*s).to_owned()).collect(),
    }
}

#[sqlx::test(migrations = false)]
async fn a_diamond_runs_each_step_after_its_parents(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    register(&pool, "spawn", "spawn", ModuleSettings::default()).await;
    let steps = [
        step("join", &["left", "right"], json!({})),
        step("left", &["top"], json!({"fail_times": 1})),
        step("right", &["top"], json!({})),
        step("top", &[], json!({})),
    ];
    let created = queue::create_workflow(&pool, "default", &steps, usize::MAX).await.unwrap();
    let id_of = |name: &str| created.steps.iter().find(|s| s.name == name).unwrap().task;
    assert_eq!(state(&pool, id_of("join")).await, TaskState::Blocked);
    let runner = start_worker(&db, test_config());
    let t = wait_settled(&pool, id_of("join")).await;
    assert_eq!(t.state, TaskState::Succeeded, "{t:#?}");
    let parents = &t.result.as_ref().unwrap()["parents"];
    assert_eq!(parents, &json!([id_of("left"), id_of("right")]));
    let w = queue::get_workflow(&pool, Some("default"), created.id).await.unwrap();
    assert_eq!(w.state, WorkflowState::Succeeded);
    assert_eq!(w.steps.len(), 4);
    assert_eq!(w.steps[0].name, "top", "in dependency order");
    assert!(queue::get_workflow(&pool, Some("other"), created.id).await.is_err());
    runner.stop().await;
}

#[sqlx::test(migrations = false)]
async fn a_workflow_cancelled_mid_flight_ends_cancelled(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    register(&pool, "spawn", "spawn", ModuleSettings::default()).await;
    register(&pool, "sleep", "sleep", ModuleSettings::default()).await;
    let mut slow = step("slow", &["first"], json!({}));
    slow.task = NewTask::new("sleep", json!({}));
    let steps = [
        step("first", &[], json!({})),
        slow,
        step("after", &["slow"], json!({})),
        step("last", &["after"], json!({})),
    ];
    let created = queue::create_workflow(&pool, "default", &steps, usize::MAX).await.unwrap();
    let runner = start_worker(&db, test_config());
    let slow = created.steps[1].task;
    wait_for(&pool, slow, "running", |t| t.state == TaskState::Running).await;
    let done = queue::cancel_workflow(&pool, Some("default"), created.id).await.unwrap();
    assert_eq!((done.cancelled, done.cancel_requested), (2, 1));
    let t = wait_ended(&pool, slow).await;
    assert_eq!(t.state, TaskState::Cancelled, "the running step was stopped: {t:#?}");
    let w = queue::get_workflow(&pool, None, created.id).await.unwrap();
    assert_eq!(w.state, WorkflowState::Cancelled);
    let states: HashSet<_> = w.steps.iter().map(|s| (s.name.clone(), s.state.0)).collect();
    assert!(states.contains(&("first".into(), Some(TaskState::Succeeded))), "{states:?}");
    assert!(states.contains(&("last".into(), Some(TaskState::Cancelled))), "{states:?}");
    assert!(w.cancelled_at.is_some());
    runner.stop().await;
}
