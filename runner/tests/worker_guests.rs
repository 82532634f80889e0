//! End to end through a real runner and Postgres with the handlers written in other languages
//! (`guests/`): their results are stored, their stderr kept, the task's id and attempt reach
//! them through the environment, and their exit 100 sends a task straight to the dead-letter
//! table. The Rust modules' equivalents are in `worker_outcomes.rs`.

mod common;

use common::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::queue::{self, ModuleSettings, NewTask, TaskState};

#[sqlx::test(migrations = false)]
async fn c_and_zig_handlers_succeed_and_fail_permanently_through_a_runner(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let c_sha = register(&pool, "c-wordcount", "c-wordcount", ModuleSettings::default()).await;
    let zig_sha = register(&pool, "zig-checksum", "zig-checksum", ModuleSettings::default()).await;
    let enqueue = |task_type: &'static str, payload: serde_json::Value| {
        let pool = pool.clone();
        async move {
            let task = NewTask::new(task_type, payload).max_attempts(5);
            queue::enqueue(&pool, task).await.expect("enqueue").id
        }
    };
    let c_ok = enqueue("c-wordcount", json!({"text": "to be or\nnot to be"})).await;
    let c_bad = enqueue("c-wordcount", json!({"text": ["not", "a", "string"]})).await;
    let zig_ok = enqueue("zig-checksum", json!({"data": "abc", "algorithm": "SHA-224"})).await;
    let zig_bad = enqueue("zig-checksum", json!({"data": "abc", "algorithm": "crc32"})).await;
    let runner = start_worker(&db, test_config());

    let t = wait_settled(&pool, c_ok).await;
    assert_eq!(t.state, TaskState::Succeeded, "{t:#?}");
    assert_eq!(t.result, Some(json!({"words": 6, "lines": 2, "chars": 18, "bytes": 18})));
    assert_eq!(t.module_sha256.as_deref(), Some(c_sha.as_str()));
    assert_eq!(
        t.logs.as_deref().map(str::trim),
        Some(format!("c-wordcount: task {c_ok} attempt 1/5: 6 words in 2 lines").as_str()),
        "stderr is kept, and the environment carried the task id and attempt"
    );

    let t = wait_settled(&pool, zig_ok).await;
    assert_eq!(t.state, TaskState::Succeeded, "{t:#?}");
    let sha224_abc = "23097d223405d8228642a477bda255b32aadbce4bda0b3f7e36c9da7";
    assert_eq!(t.result, Some(json!({"algorithm": "sha224", "hex": sha224_abc})));
    assert_eq!(t.module_sha256.as_deref(), Some(zig_sha.as_str()));
    assert_eq!(
        t.logs.as_deref().map(str::trim),
        Some(format!("zig-checksum: task {zig_ok} attempt 1/5: sha224 of 3 bytes").as_str())
    );

    for (id, task_type, reason) in [
        (c_bad, "c-wordcount", "c-wordcount: invalid task payload: `text` must be a string"),
        (zig_bad, "zig-checksum", "zig-checksum: unknown algorithm \"crc32\""),
    ] {
        let t = wait_settled(&pool, id).await;
        assert_eq!(
            (t.state, t.attempts),
            (TaskState::Dead, 1),
            "{task_type}: max_attempts is 5, but exit 100 means no retry: {t:#?}"
        );
        assert_eq!(error_kinds(&t), vec![FailureKind::HandlerError], "{task_type}");
        assert_eq!(t.errors[0]["exit_code"], 100, "{task_type}");
        let last_error = t.last_error.as_deref().unwrap_or("");
        assert!(last_error.contains(reason), "{task_type}: {last_error:?} lacks {reason:?}");
        let dead = queue::list_dead(&pool, None, Some(task_type), None, 10).await.expect("dead");
        assert_eq!(
            (dead.len(), dead[0].reason.as_str()),
            (1, FailureKind::HandlerError.as_str()),
            "{task_type}"
        );
    }
    runner.stop().await;
}
