//! The admin API as an off-the-shelf generator sees it: `openapi-python-client` (PyPI, pinned in
//! `.ci/run`) generates a Python client from the document a live server serves; the test fails
//! on any warning or any operation the generator skipped, then runs a scenario through the
//! generated client against that server and a real runner: upload a module, enqueue, wait for
//! the task to end (`?wait=`), read its result, see a failing task dead in `GET /v1/dead`,
//! requeue it, and find both with `GET /v1/tasks`.
//!
//! Needs `openapi-python-client` on PATH; without it the test FAILS, unless
//! `SWEEP_SKIP_PYTHON_CLIENT=1` (never set in CI).

#![allow(clippy::unwrap_used)]

mod admin_support;

use std::process::Command;

use admin_support::{migrated, serve, start_worker, unpooled_config};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::admin;
use sweep::queue::TenantCaps;

const GENERATOR: &str = "openapi-python-client";

/// A directory of its own under the system's temporary directory, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "sweep-python-client-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn have_generator() -> bool {
    let found = Command::new(GENERATOR).arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert_eq!(
            std::env::var("SWEEP_SKIP_PYTHON_CLIENT").as_deref(),
            Ok("1"),
            "{GENERATOR} not found: `python3 -m pip install openapi-python-client==0.29.1` (.ci/run \
             does), or set SWEEP_SKIP_PYTHON_CLIENT=1 to skip"
        );
        eprintln!("SWEEP_SKIP_PYTHON_CLIENT=1 and no {GENERATOR}: test skipped");
    }
    found
}

/// The scenario, through the generated package `sweep_client`.
const SCENARIO: &str = r#"
import io, json, os, sys
from sweep_client import AuthenticatedClient
from sweep_client.api.modules import upload_module
from sweep_client.api.tasks import enqueue, show_task, list_tasks
from sweep_client.api.dead import list_dead, requeue_dead
from sweep_client.models import EnqueueRequest, EnqueueRequestPayload, TaskState
from sweep_client.types import File

client = AuthenticatedClient(base_url=os.environ["SWEEP_URL"], token=os.environ["SWEEP_TOKEN"],
                             timeout=90.0, raise_on_unexpected_status=True)
modules = os.environ["MODULES"]

def upload(task_type, name, **limits):
    with open(os.path.join(modules, name + ".wasm"), "rb") as f:
        body = File(payload=io.BytesIO(f.read()), file_name=name + ".wasm")
    r = upload_module.sync_detailed(task_type, client=client, body=body, **limits)
    assert r.status_code in (200, 201), (r.status_code, r.content)
    return r.parsed

up = upload("count", "wordcount")
assert up.version == 1 and up.task_type == "count", up
upload("doomed", "permanent", max_attempts=1)

payload = EnqueueRequestPayload.from_dict({"text": "the quick brown fox the end"})
done = enqueue.sync(client=client, body=EnqueueRequest(task_type="count", payload=payload))
task = show_task.sync(done.id, client=client, wait="30s")
assert task.state == TaskState.SUCCEEDED, task.state
result = task.result
assert result is not None and result["words"] == 6, result

dead = enqueue.sync(client=client, body=EnqueueRequest(task_type="doomed"))
task = show_task.sync(dead.id, client=client, wait="30s")
assert task.state == TaskState.DEAD, task.state
page = list_dead.sync(client=client, task_type="doomed")
assert [t.id for t in page.tasks] == [dead.id], page
requeued = requeue_dead.sync(dead.id, client=client)
assert requeued.id == dead.id and requeued.state in (TaskState.PENDING, TaskState.RUNNING, TaskState.DEAD), requeued.state
assert requeued.attempts == 0 or requeued.state != TaskState.PENDING

listed = list_tasks.sync(client=client, type_prefix="co")
assert [t.id for t in listed.tasks] == [done.id], listed
print("scenario ok")
"#;

#[sqlx::test(migrations = false)]
async fn a_generated_python_client_covers_every_route_and_runs_a_scenario(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    if !have_generator() {
        return;
    }
    let db = migrated(db).await;
    let pool = db.pool();
    let (base, stop_api, api_task) = serve(&db).await;
    let (_, token) = admin::create_tenant(&pool, "acme", &TenantCaps::default()).await.unwrap();
    let runner = start_worker(&db, unpooled_config(2));

    let dir = TempDir::new();
    let doc: Value =
        reqwest::get(format!("{base}/v1/openapi.json")).await.unwrap().json().await.unwrap();
    let doc_path = dir.path().join("openapi.json");
    std::fs::write(&doc_path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let out = dir.path().join("sweep_client");
    let generated = Command::new(GENERATOR)
        .args(["generate", "--meta", "none", "--path"])
        .arg(&doc_path)
        .arg("--output-path")
        .arg(&out)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&generated.stdout),
        String::from_utf8_lossy(&generated.stderr)
    );
    assert!(generated.status.success(), "{GENERATOR} failed:\n{said}");
    assert!(
        !said.contains("WARNING") && !said.contains("Warning") && !said.contains("Unsupported"),
        "{GENERATOR} warned (something may be missing from the client):\n{said}"
    );

    // Every operation of the document is a module of the generated client.
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap();
            let tag = op["tags"][0].as_str().unwrap();
            let file = out.join("api").join(tag).join(format!("{id}.py"));
            assert!(file.is_file(), "{method} {path} ({id}) was not generated: {}", file.display());
            operations += 1;
        }
    }
    assert!(operations > 30, "{operations} operations");

    let script = dir.path().join("scenario.py");
    std::fs::write(&script, SCENARIO).unwrap();
    let modules = sweep_dev::modules::modules_dir();
    let ran = tokio::task::spawn_blocking({
        let (dir, base, token) = (dir.path().to_owned(), base.clone(), token.clone());
        move || {
            Command::new("python3")
                .arg(&script)
                .env("PYTHONPATH", &dir)
                .env("SWEEP_URL", base)
                .env("SWEEP_TOKEN", token)
                .env("MODULES", modules)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&ran.stdout), String::from_utf8_lossy(&ran.stderr));
    assert!(ran.status.success() && said.contains("scenario ok"), "the scenario failed:\n{said}");

    runner.stop().await;
    let _ = stop_api.send(());
    api_task.await.unwrap();
}
