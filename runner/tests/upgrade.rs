//! Upgrading a database the last release wrote (`runner/tests/fixtures/last-release/`, written
//! by `scripts/release-fixture.sh` at that release's commit): this checkout's `sweep migrate`
//! applies whatever migrations came since and installs its functions, and the tasks that were
//! waiting run, under the tokens that release issued.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::queue::{self, Role, Store, MIGRATOR};

/// What `scripts/release-fixture.sh` wrote beside the dump.
#[derive(Debug, Deserialize)]
struct Fixture {
    sweep: String,
    tenant: String,
    token: String,
    read_only_token: String,
}

const DATABASE: &str = include_str!("fixtures/last-release/database.dump");
const FIXTURE: &str = include_str!("fixtures/last-release/tokens.json");

#[sqlx::test(migrations = false)]
async fn a_database_of_the_last_release_upgrades_and_runs_its_waiting_tasks_under_its_tokens(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let fixture: Fixture = serde_json::from_str(FIXTURE).unwrap();
    let pool = PgPool::connect_with(options.clone()).await.unwrap();
    sqlx::raw_sql(DATABASE).execute(&pool).await.expect("restoring the release's database");
    let written_by = queue::installed_functions(&pool).await.unwrap().expect("functions recorded");
    assert_eq!(written_by.version, fixture.sweep);
    let at_release: Vec<i64> = sqlx::query_scalar("select version from sweep._sqlx_migrations")
        .fetch_all(&pool)
        .await
        .unwrap();
    let waiting: Vec<(i64, Value)> =
        sqlx::query_as("select id, payload from sweep.tasks order by id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(waiting.len(), 3, "the fixture's waiting tasks");

    let applied = queue::migrate_with(options.clone()).await.expect("upgrading");
    let since: Vec<i64> =
        MIGRATOR.iter().map(|m| m.version).filter(|v| !at_release.contains(v)).collect();
    assert_eq!(applied, since, "every migration since the release, and only those");
    Store::open_with(options.clone(), Role::Runner, 1).await.expect("the upgraded database opens");

    let db = migrated(options).await;
    let api = api(&db);
    let token = Some(fixture.token.as_str());
    let read_only = Some(fixture.read_only_token.as_str());
    for (id, _) in &waiting {
        let shown = api.get(&format!("/v1/tasks/{id}"), read_only).await;
        assert_eq!(shown.ok(200)["state"], TaskState::Pending.as_str());
    }
    api.post("/v1/tasks", read_only, &json!({"task_type": "echo", "payload": {}}))
        .await
        .expect(403, "read_only");
    let again = api
        .post("/v1/tasks", token, &json!({"task_type": "echo", "payload": {}, "dedup_key": "once"}))
        .await;
    assert_eq!(again.ok(200)["id"], waiting[2].0, "the release's dedup key still holds");

    let worker = start_worker(&db, unpooled_config(2));
    for (id, payload) in &waiting {
        let done = wait_settled(&db.pool(), *id).await;
        assert_eq!(done.state, TaskState::Succeeded, "{done:#?}");
        let shown = api.get(&format!("/v1/tasks/{id}"), token).await;
        let shown = shown.ok(200);
        assert_eq!(shown["tenant"], fixture.tenant.as_str());
        assert_eq!(&shown["result"], payload, "the echo module wrote the payload back");
    }
    let next = api.enqueue(&fixture.token, "echo", json!({"n": 4})).await;
    assert!(next > waiting[2].0, "ids go on from the release's sequence");
    let done = wait_settled(&db.pool(), next).await;
    assert_eq!(done.result, Some(json!({"n": 4})));
    worker.stop().await;
}
