//! Kept instances through a real runner: a module version uploaded with `reuse` runs its
//! tasks on one instance (each with its own payload and attempt), and a version with
//! `reuse=1` on a fresh instance each. The guest is the componentize-js hello (`scripts/build-guests.sh`),
//! whose `run` may be called again; `sandbox_polyglot.rs` covers what ends an instance.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::config::WorkerConfig;
use sweep::queue::{self, ModuleSettings, NewTask, UploadOptions};
use sweep::sandbox::{sha256_hex, Sandbox};
use sweep::worker::Worker;

const TASKS: u32 = 6;

/// One slot, so each task after the first finds the instance the one before kept; compile
/// limits with room for a language runtime (as in `sandbox_polyglot.rs`).
fn config() -> WorkerConfig {
    let base = test_config();
    let mut sandbox = base.sandbox.clone();
    sandbox.defaults.memory_bytes = 128 << 20;
    sandbox.compile = runtime_compile_limits();
    WorkerConfig { concurrency: 1, spare_slots: 0, sandbox, ..base }
}

#[sqlx::test(migrations = false)]
async fn a_version_with_reuse_runs_its_tasks_on_one_instance(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let pool = db.pool();
    let bytes = sweep_dev::modules::component_bytes("js-hello");
    let settings = ModuleSettings { max_attempts: Some(1), ..ModuleSettings::default() };
    let sha = sha256_hex(&bytes);
    let kept = UploadOptions { reuse: Some(100), ..UploadOptions::default() };
    queue::register_module_with(&pool, "default", "kept", &sha, &bytes, &settings, &kept)
        .await
        .unwrap();
    // One task per instance: how an upload asks for fresh instances (`reuse=1`).
    let fresh = UploadOptions { reuse: Some(1), ..UploadOptions::default() };
    queue::register_module_with(&pool, "default", "fresh", &sha, &bytes, &settings, &fresh)
        .await
        .unwrap();

    // This binary's one test: the process-wide recorder counts its tasks alone.
    let metrics = sweep::metrics::install().unwrap();
    let config = config();
    let sandbox = Sandbox::new(config.sandbox.clone()).unwrap();
    let runner = run_worker(Worker::with_sandbox(&db.runner, sandbox.clone(), config).unwrap());
    for task_type in ["kept", "fresh"] {
        let before = sandbox.warm_stats();
        let mut ids = Vec::new();
        for n in 0..TASKS {
            let task = NewTask::new(task_type, json!({"name": format!("n{n}")}));
            ids.push(queue::enqueue(&pool, task).await.unwrap().id);
        }
        for (n, id) in ids.into_iter().enumerate() {
            let task = wait_settled(&pool, id).await;
            assert_eq!(task.state, TaskState::Succeeded, "{task:#?}");
            let want = json!({"greeting": format!("Hello, n{n}!"), "attempt": 1});
            assert_eq!(task.result, Some(want), "{task_type}");
            assert_eq!(task.logs.as_deref(), Some(format!("js-hello: task {id}\n").as_str()));
        }
        let after = sandbox.warm_stats();
        let reused = after.reused - before.reused;
        let expected = if task_type == "kept" { TASKS - 1 } else { 0 };
        assert_eq!(reused, u64::from(expected), "{task_type}: {after:?}");
    }
    runner.stop().await;
    // Usage per tenant tells kept attempts from all attempts.
    let text = metrics.render();
    for line in [
        format!("sweep_tenant_attempts_total{{tenant=\"default\"}} {}", 2 * TASKS),
        format!(
            "sweep_tenant_attempts_on_kept_instances_total{{tenant=\"default\"}} {}",
            TASKS - 1
        ),
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
}
