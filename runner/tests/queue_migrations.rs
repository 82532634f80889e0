//! Migrations that move data: applied by hand, step by step, to a database holding rows in
//! the shape the earlier migrations left them.

mod common;

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use sweep::queue::{self, TaskState, MIGRATOR};

/// Applies every embedded migration whose version is in `versions`, in order.
async fn apply(pool: &PgPool, versions: impl Fn(i64) -> bool) {
    for m in MIGRATOR.iter().filter(|m| versions(m.version)) {
        sqlx::raw_sql(&m.sql)
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("migration {} failed: {e}", m.version));
    }
}

#[sqlx::test(migrations = false)]
async fn finished_tasks_move_out_of_the_live_table_with_everything_they_held(pool: PgPool) {
    apply(&pool, |v| v < 8).await;
    sqlx::raw_sql(
        r#"
        insert into tasks (id, task_type, payload, state, attempts, result, logs, errors,
                           started_at, finished_at, module_sha256)
        values (1, 'done', '{"n": 1}', 'succeeded', 2, '{"ok": true}', 'a log line',
                '[{"attempt": 1, "kind": "timeout"}]', now(), now(), 'sha-1'),
               (2, 'gone', '{"n": 2}', 'cancelled', 0, null, null, '[]', null, now(), null),
               (3, 'live', '{"n": 3}', 'pending', 0, null, null, '[]', null, null, null);
        select setval('tasks_id_seq', 3);
        "#,
    )
    .execute(&pool)
    .await
    .unwrap();

    apply(&pool, |v| v >= 8).await;

    let done = show(&pool, 1).await;
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.result, Some(json!({"ok": true})));
    assert_eq!(done.logs.as_deref(), Some("a log line"));
    assert_eq!(done.attempts, 2);
    assert_eq!(done.errors, json!([{"attempt": 1, "kind": "timeout"}]));
    assert_eq!(done.module_sha256.as_deref(), Some("sha-1"));
    assert!(done.started_at.is_some() && done.finished_at.is_some());
    assert_eq!(state(&pool, 2).await, TaskState::Cancelled);
    assert_eq!(state(&pool, 3).await, TaskState::Pending);

    let live: Vec<(i64, String)> =
        sqlx::query_as("select id, state from tasks order by id").fetch_all(&pool).await.unwrap();
    assert_eq!(live, vec![(3, "pending".to_owned())], "only live work stays in tasks");
    let refused = sqlx::query("update tasks set state = 'succeeded' where id = 3")
        .execute(&pool)
        .await
        .expect_err("a finished state in tasks must be refused");
    assert!(refused.to_string().contains("tasks_state_live"), "{refused}");

    // The queue works on the migrated schema: the pending task runs to completion.
    let runner = new_runner();
    let c = claim(&pool, runner, 10).await;
    assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>(), vec![3]);
    let completion = queue::Completion {
        id: 3,
        attempt: 1,
        result: Value::Null,
        module_sha256: None,
        logs: None,
    };
    assert!(queue::complete_batch(&pool, runner, &[completion]).await.unwrap().is_empty());
    assert_eq!(state(&pool, 3).await, TaskState::Succeeded);
}

#[sqlx::test(migrations = false)]
async fn queues_are_built_from_the_tasks_and_modules_there_are(pool: PgPool) {
    apply(&pool, |v| v < 9).await;
    let later = "now() + interval '1 hour'";
    sqlx::raw_sql(&format!(
        r#"
        insert into modules (tenant, task_type, version, sha256, bytes)
        values ('acme', 'mixed', 1, repeat('a', 64), '\x00'),
               ('acme', 'idle', 1, repeat('b', 64), '\x00');
        insert into active_modules (tenant, task_type, version)
        values ('acme', 'mixed', 1), ('acme', 'idle', 1);
        insert into tasks (id, tenant, task_type, payload, state, attempts, lease_owner,
                           lease_expires_at, run_at)
        values (1, 'acme', 'mixed', '{{}}', 'pending', 0, null, null, now()),
               (2, 'acme', 'mixed', '{{}}', 'running', 1, gen_random_uuid(), {later}, now()),
               (3, 'other', 'later', '{{}}', 'retrying', 1, null, null, {later});
        select setval('tasks_id_seq', 3);
        "#
    ))
    .execute(&pool)
    .await
    .unwrap();

    apply(&pool, |v| v >= 9).await;

    let queues: Vec<(String, String, bool)> = sqlx::query_as(
        "select tenant, task_type, coalesce(next_run_at <= now(), false) from queues order by 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let has = |t: &str, ty: &str| queues.iter().find(|q| q.0 == t && q.1 == ty).map(|q| q.2);
    assert_eq!(queues.len(), 3, "{queues:?}");
    assert_eq!(has("acme", "mixed"), Some(true), "its pending task is due");
    assert_eq!(has("other", "later"), Some(false), "its retry is due in an hour");
    let idle: Option<Option<chrono::DateTime<chrono::Utc>>> = sqlx::query_scalar(
        "select next_run_at from queues where tenant = 'acme' and task_type = 'idle'",
    )
    .fetch_optional(&pool)
    .await
    .unwrap();
    assert_eq!(idle, Some(None), "a module without tasks gets a queue with nothing due");

    // The fair claim finds the due task and only that one.
    let got = claim(&pool, new_runner(), 10).await;
    assert_eq!(got.iter().map(|c| c.id).collect::<Vec<_>>(), vec![1]);
}
