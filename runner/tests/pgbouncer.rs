//! Sweep behind PgBouncer in transaction pooling mode: a real pgbouncer per test, with two
//! server connections per database so that the stores' many clients really share them. The
//! claim/complete path on pooled runner and admin stores; a runner end to end with its LISTEN
//! on a direct connection, and with none (polling); cron ticks (a transaction per pass);
//! `sweep migrate` and the other commands through the pooler; and, as the control, a store unaware of the pooler breaking.
//!
//! These fail if a pooled store sent named prepared statements (a client's statement then
//! meets server connections that never saw it, or saw another client's of the same name), or
//! unnamed ones outside a transaction (its Bind then meets another client's unnamed
//! statement). Without pgbouncer installed they fail, saying how to install it.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use sweep::{
    admin::{self, AdminConfig, AdminState},
    config::WorkerConfig,
    queue::{self, Failure, NewTask, Role, Store, StoreError, StoreOptions, Wakeups},
};
use sweep_dev::pgbouncer::PgBouncer;

/// Server connections per database and user: far fewer than the stores' clients.
const SERVERS: u32 = 2;

const OPERATOR: &str = "pgbouncer-test-operator-token-0123";

async fn pooled(bouncer: &PgBouncer, role: Role, listen: Option<PgConnectOptions>) -> Store {
    StoreOptions { pooled: true, listen }
        .open_with(bouncer.options(), role, 8)
        .await
        .unwrap_or_else(|e| panic!("opening a pooled {role:?} store: {e}\n{}", bouncer.log()))
}

/// A migrated test database (`direct`) behind a pgbouncer of its own, with pooled stores for
/// the runner (listening on the direct URL when `listen_direct`) and the admin side.
struct Behind {
    direct: PgPool,
    runner: Store,
    admin: Store,
    _bouncer: PgBouncer,
}

async fn behind_pgbouncer(db: PgConnectOptions, listen_direct: bool) -> Behind {
    let db = migrated(db).await;
    let bouncer = PgBouncer::start(&db.options, SERVERS, &[]).await;
    let listen = listen_direct.then(|| db.options.clone());
    let runner = pooled(&bouncer, Role::Runner, listen).await;
    let admin = pooled(&bouncer, Role::Admin, None).await;
    Behind { direct: db.pool(), runner, admin, _bouncer: bouncer }
}

/// Claims through `store` in `lanes` concurrent loops until `total` tasks succeeded: each
/// lane renews its leases and fails the first attempt of every third task (retrying at once),
/// completing everything else. Returns how many attempts failed.
async fn drain(store: &Store, lanes: usize, total: usize) -> usize {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..lanes {
        let (store, done, failed) = (store.clone(), done.clone(), failed.clone());
        handles.push(tokio::spawn(async move {
            use std::sync::atomic::Ordering::SeqCst;
            let me = new_runner();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while done.load(SeqCst) < total {
                assert!(tokio::time::Instant::now() < deadline, "tasks never all succeeded");
                let claimed = queue::claim_batch(&store, me, 5, &[], LEASE).await.unwrap();
                if claimed.is_empty() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                let held: Vec<_> = claimed.iter().map(|c| (c.id, c.attempt)).collect();
                queue::heartbeat_leases(&store, me, LEASE, &held).await.unwrap();
                let (fail, complete): (Vec<_>, Vec<_>) =
                    claimed.iter().partition(|c| c.attempt == 1 && c.id % 3 == 0);
                let failures: Vec<Failure> = fail
                    .iter()
                    .map(|c| Failure {
                        id: c.id,
                        attempt: c.attempt,
                        kind: FailureKind::Trap,
                        message: "first attempts of every third task fail".into(),
                        permanent: false,
                        retry_delay: Duration::ZERO,
                        detail: json!({}),
                        module_sha256: None,
                        usage: None,
                    })
                    .collect();
                let report = queue::fail_batch(&store, me, &failures).await.unwrap();
                assert_eq!(report.retrying.len(), failures.len(), "{report:?}");
                let completions: Vec<_> =
                    complete.iter().map(|c| completion(c, json!({"n": c.id}))).collect();
                let lost = queue::complete_batch(&store, me, &completions).await.unwrap();
                assert!(lost.is_empty(), "lost leases: {lost:?}");
                done.fetch_add(completions.len(), SeqCst);
                failed.fetch_add(failures.len(), SeqCst);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    failed.load(std::sync::atomic::Ordering::SeqCst)
}

#[sqlx::test(migrations = false)]
async fn claims_reports_heartbeats_and_enqueues_go_through_the_pooler(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let Behind { direct, runner, admin, _bouncer } = behind_pgbouncer(db, false).await;

    // Both enqueue paths (plain batch, dedup keys), from concurrent clients.
    let plain: Vec<NewTask> = (0..150).map(|i| task("work", i)).collect();
    let keyed: Vec<NewTask> =
        (0..50).map(|i| task("work", 1000 + i).dedup_key(format!("key-{}", i % 25))).collect();
    let (plain_ids, keyed_ids) =
        tokio::join!(queue::enqueue_many(&admin, &plain), queue::enqueue_many(&admin, &keyed));
    let (plain_ids, keyed_ids) = (plain_ids.unwrap(), keyed_ids.unwrap());
    assert_eq!(keyed_ids.iter().filter(|e| e.created).count(), 25, "one task per dedup key");
    let again = queue::enqueue(&admin, task("work", 0).dedup_key("key-0")).await.unwrap();
    assert_eq!((again.id, again.created), (keyed_ids[0].id, false));
    let total = plain_ids.len() + 25;

    // A claim handed back on a pooled connection is claimable again, uncounted.
    let me = new_runner();
    let held = queue::claim_batch(&runner, me, 3, &[], LEASE).await.unwrap();
    let leases: Vec<_> = held.iter().map(|c| (c.id, c.attempt)).collect();
    assert_eq!(queue::release_batch(&runner, me, &leases).await.unwrap().len(), 3);

    let failed = drain(&runner, 6, total).await;
    assert!(failed > 0, "some first attempts failed and were retried");

    for e in plain_ids.iter().chain(keyed_ids.iter().filter(|e| e.created)) {
        let t = show(&direct, e.id).await;
        assert_eq!(t.state, TaskState::Succeeded, "{t:#?}");
        assert_eq!(t.attempts, if e.id % 3 == 0 { 2 } else { 1 }, "{t:#?}");
    }
    // Maintenance and the admin reads, through the pooler too.
    let reaped =
        queue::reap_expired(&runner, me, 100, Default::default(), Duration::ZERO).await.unwrap();
    assert!(reaped.retrying.is_empty() && reaped.dead.is_empty(), "{reaped:?}");
    queue::vacuum_live(&runner).await.unwrap();
    queue::check_schema(&admin).await.unwrap();
    let stats = queue::queue_stats(&admin, None).await.unwrap();
    assert_eq!(stats.iter().map(|s| s.succeeded).sum::<i64>(), total as i64, "{stats:?}");
    let shown = queue::get_task(&admin, None, plain_ids[0].id).await.unwrap();
    assert_eq!(shown.result, Some(json!({"n": plain_ids[0].id})));

    // A completion with enough follow-ups to write them by `COPY`, in its transaction.
    let parent = queue::enqueue(&admin, task("parent", 0)).await.unwrap().id;
    let held = queue::claim_batch(&runner, me, 1, &["parent".to_owned()], LEASE).await.unwrap();
    let n = queue::COPY_MIN_BATCH;
    let done = queue::Completion {
        id: parent,
        attempt: held[0].attempt,
        result: json!({}),
        module_sha256: None,
        logs: None,
        follow_ups: (0..n as i64).map(|i| task("next", i)).collect(),
        usage: None,
    };
    assert!(queue::complete_batch(&runner, me, &[done]).await.unwrap().is_empty());
    let enqueued = show(&direct, parent).await.result.unwrap()["$enqueued"].clone();
    let spawned: Vec<i64> =
        sqlx::query_scalar("select id from sweep.tasks where task_type = 'next' order by id")
            .fetch_all(&direct)
            .await
            .unwrap();
    assert_eq!((spawned.len(), json!(spawned)), (n, enqueued));
}

/// An admin API on a pooled admin store, driven in-process.
fn api(admin: &Store) -> AdminState {
    let config = AdminConfig { operator_token: Some(OPERATOR.into()), ..AdminConfig::default() };
    AdminState::new(admin, shared_sandbox(false).clone(), config).expect("admin state")
}

async fn call(state: &AdminState, method: &str, path: &str, body: Option<Vec<u8>>) -> Value {
    let mut req = warp::test::request()
        .method(method)
        .path(path)
        .header("authorization", format!("Bearer {OPERATOR}"));
    if let Some(body) = body {
        let wasm = body.starts_with(b"\0asm");
        let kind = if wasm { "application/wasm" } else { "application/json" };
        req = req.header("content-type", kind).body(body);
    }
    let response = req.reply(&admin::routes(state.clone())).await;
    let text = String::from_utf8_lossy(response.body()).into_owned();
    assert!(response.status().is_success(), "{method} {path}: {} {text}", response.status());
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// Enqueues `n` wordcount tasks through the API and waits until each succeeded.
async fn run_wordcounts(state: &AdminState, direct: &PgPool, first: usize, n: usize) {
    let tasks: Vec<Value> = (first..first + n)
        .map(|i| json!({"task_type": "wordcount", "payload": {"text": "a b ".repeat(i + 1)}}))
        .collect();
    let enqueued =
        call(state, "POST", "/v1/tasks/batch", Some(serde_json::to_vec(&tasks).unwrap())).await;
    let ids: Vec<i64> =
        enqueued["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), n);
    for (i, id) in (first..).zip(ids) {
        let t = wait_settled(direct, id).await;
        assert_eq!(t.state, TaskState::Succeeded, "{t:#?}");
        let shown = call(state, "GET", &format!("/v1/tasks/{id}"), None).await;
        assert_eq!(shown["result"]["words"], json!(2 * (i + 1)), "{shown}");
    }
}

#[sqlx::test(migrations = false)]
async fn a_runner_through_the_pooler_listens_on_the_direct_url(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let Behind { direct, runner, admin, _bouncer } = behind_pgbouncer(db, true).await;
    let state = api(&admin);
    call(&state, "PUT", "/v1/modules/wordcount", Some(module_bytes("wordcount"))).await;

    // The NOTIFY of an enqueue through the pooler reaches the LISTEN on the direct URL.
    let wakeups = Wakeups::for_store(&runner).await.unwrap();
    assert!(wakeups.listening());
    let probe = queue::enqueue(&admin, task("nobody-runs-this", 0)).await.unwrap().id;
    assert!(wakeups.wait(Duration::from_secs(60)).await, "no wake-up came through LISTEN");
    drop(wakeups);
    queue::cancel(&admin, None, probe).await.unwrap();

    // A poll far beyond the test's deadlines: tasks enqueued while the runner waits start
    // only because a notification woke it.
    let config = WorkerConfig { poll_interval: Duration::from_secs(3600), ..unpooled_config(4) };
    let worker = start_worker_on(&runner, config);
    run_wordcounts(&state, &direct, 0, 12).await;
    run_wordcounts(&state, &direct, 12, 12).await;
    let stats = call(&state, "GET", "/v1/stats", None).await;
    assert_eq!(stats["runners"].as_array().map(Vec::len), Some(1), "{stats}");
    assert_eq!(worker.stop().await.claimed, 24);
}

#[sqlx::test(migrations = false)]
async fn a_runner_through_the_pooler_without_a_listen_url_polls(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let Behind { direct, runner, admin, _bouncer } = behind_pgbouncer(db, false).await;
    assert!(!Wakeups::for_store(&runner).await.unwrap().listening());
    let bytes = module_bytes("wordcount");
    let sha = sweep::sandbox::sha256_hex(&bytes);
    queue::register_module(&admin, "default", "wordcount", &sha, &bytes, &Default::default())
        .await
        .unwrap();

    let worker = start_worker_on(&runner, test_config());
    run_wordcounts(&api(&admin), &direct, 0, 20).await;
    assert_eq!(worker.stop().await.claimed, 20);
}

async fn sweep(args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sweep"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("SWEEP_DATABASE_POOLED")
        .env_remove("SWEEP_LISTEN_URL")
        .output()
        .await
        .expect("running sweep");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[sqlx::test(migrations = false)]
async fn migrate_needs_a_direct_connection_and_says_so(_: PgPoolOptions, db: PgConnectOptions) {
    let bouncer = PgBouncer::start(&db, SERVERS, &[]).await;
    match queue::migrate_with(bouncer.options()).await {
        Err(e @ StoreError::Pooler(_)) => assert!(e.to_string().contains("--pooled"), "{e}"),
        other => panic!("migrating through the pooler: {other:?}"),
    }
    // A pooler told to ignore the startup options would drop search_path = sweep: caught
    // before anything is written.
    let lenient = ["ignore_startup_parameters = extra_float_digits, options"];
    let lenient = PgBouncer::start(&db, SERVERS, &lenient).await;
    match queue::migrate_with(lenient.options()).await {
        Err(StoreError::NotDirect { search_path }) => assert_ne!(search_path, "sweep"),
        other => panic!("migrating through a pooler that drops options: {other:?}"),
    }
    let direct: PgPool = PgPoolOptions::new().connect_with(db.clone()).await.unwrap();
    let (schema,): (bool,) = sqlx::query_as("select to_regnamespace('sweep') is not null")
        .fetch_one(&direct)
        .await
        .unwrap();
    assert!(!schema, "nothing was created");

    // The command: refuses with --pooled alone, migrates through --listen-url.
    let url = bouncer.url();
    let direct_url = sweep_dev::db::database_url(db.get_database().unwrap());
    let (ok, stderr) = sweep(&["migrate", "--pooled", "--database-url", &url]).await;
    assert!(!ok && stderr.contains("--listen-url"), "{stderr}");
    let (ok, stderr) =
        sweep(&["migrate", "--pooled", "--database-url", &url, "--listen-url", &direct_url]).await;
    assert!(ok, "{stderr}");
    // The other commands work through the pooler when told, and say so when not.
    let (ok, stderr) = sweep(&["tenant", "list", "--pooled", "--database-url", &url]).await;
    assert!(ok, "{stderr}");
    let (ok, stderr) = sweep(&["tenant", "list", "--database-url", &url]).await;
    assert!(!ok && stderr.contains("--pooled"), "{stderr}");
}

/// The control: a store that does not know about the pooler (sqlx's cached, named statements;
/// only the startup parameter PgBouncer refuses left out) breaks through this setup. If it
/// stopped breaking, the pooler here would no longer share server connections the way the
/// tests above rely on.
#[sqlx::test(migrations = false)]
async fn named_statements_break_through_the_pooler(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    enqueue_n(&db.pool(), "work", 500).await;
    let bouncer = PgBouncer::start(&db.options, SERVERS, &[]).await;
    // Opening it may already fail (the schema check is two statements).
    let errors = match Store::open_with(bouncer.options().extra_float_digits(None), Role::Runner, 8)
        .await
    {
        Err(e) => vec![e.to_string()],
        Ok(unaware) => {
            let mut lanes = tokio::task::JoinSet::new();
            for _ in 0..6 {
                let store = unaware.clone();
                lanes.spawn(async move {
                    let me = new_runner();
                    for _ in 0..200 {
                        let claimed = queue::claim_batch(store.pool(), me, 1, &[], LEASE).await?;
                        let held: Vec<_> = claimed.iter().map(|c| (c.id, c.attempt)).collect();
                        queue::heartbeat_leases(store.pool(), me, LEASE, &held).await?;
                    }
                    Ok::<_, queue::QueueError>(())
                });
            }
            let results = lanes.join_all().await;
            results.into_iter().filter_map(|r| r.err().map(|e| e.to_string())).collect()
        }
    };
    assert!(
        errors.iter().any(|e| e.contains("prepared statement")),
        "named statements survived the pooler: {errors:?}"
    );
}

#[sqlx::test(migrations = false)]
async fn cron_ticks_go_through_the_pooler_one_task_each(_: PgPoolOptions, db: PgConnectOptions) {
    let Behind { direct, runner, admin, _bouncer } = behind_pgbouncer(db, false).await;
    let bytes = sweep_dev::modules::empty_module();
    let sha = sweep::sandbox::sha256_hex(&bytes);
    queue::register_module(&admin, "default", "tick", &sha, &bytes, &Default::default())
        .await
        .unwrap();
    let every_second =
        queue::NewSchedule::new("s", "* * * * * *", "tick").overlap(queue::Overlap::Allow);
    let s = queue::create_schedule(&admin, &every_second).await.unwrap();
    // Two schedulers through the pooler's two server connections, racing for each tick.
    let workers =
        [start_worker_on(&runner, test_config()), start_worker_on(&runner, test_config())];
    let pattern = format!("schedule:{}:%", s.id);
    let count_ticks = "select count(distinct dedup_key), count(*) from (
            select dedup_key from sweep.tasks union all select dedup_key from sweep.finished_tasks
        ) t where dedup_key like $1";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (ticks, tasks) = loop {
        let (ticks, tasks): (i64, i64) =
            sqlx::query_as(count_ticks).bind(&pattern).fetch_one(&direct).await.unwrap();
        if ticks >= 3 {
            break (ticks, tasks);
        }
        assert!(tokio::time::Instant::now() < deadline, "only {ticks} ticks ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for worker in workers {
        worker.stop().await;
    }
    assert_eq!(tasks, ticks, "one task per tick");
    let (ticks, tasks): (i64, i64) =
        sqlx::query_as(count_ticks).bind(&pattern).fetch_one(&direct).await.unwrap();
    assert_eq!(tasks, ticks, "one task per tick, after the stop too");
}
