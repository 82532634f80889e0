//! The capability routes of the admin API: egress policies (operator sets, tenant reads its
//! own, bad entries named), secrets (tenant-scoped, never shown, sealed at rest, bounded,
//! read-only tokens refused), modules naming secrets at upload, and usage per tenant, task
//! type and day.

#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::*;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::admin::{self, AdminConfig};
use sweep::config::WorkerConfig;
use sweep::queue::{self, AttemptUsage, Completion, Failure, FailureKind, NewTask, TenantCaps};
use sweep::secrets::SecretsKey;

fn keyed() -> AdminConfig {
    AdminConfig { secrets_key: Some(SecretsKey::generate().0), ..AdminConfig::default() }
}

async fn put(api: &Api, path: &str, token: Option<&str>, body: &Value) -> Answer {
    api.send(api.req("PUT", path, token).json(body)).await
}

async fn delete(api: &Api, path: &str, token: Option<&str>) -> Answer {
    api.send(api.req("DELETE", path, token)).await
}

#[sqlx::test(migrations = false)]
async fn egress_is_set_by_the_operator_and_read_by_its_tenant(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let api = api(&db);
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let other = api.tenant("other", TenantCaps::default()).await;

    // The default: nothing allowed, the deployment's limits.
    let shown = api.get("/v1/tenants/acme/egress", Some(&acme)).await.ok(200).clone();
    assert_eq!(shown["allow"], json!([]));
    assert_eq!(shown["updated_at"], Value::Null);
    assert_eq!(shown["effective"]["max_requests"], 50);
    assert_eq!(shown["effective"]["request_timeout_ms"], 30_000);

    let body = json!({
        "allow": ["API.Mail.Example.", "127.0.0.1:8025", "*.example.org", "api.mail.example"],
        "max_requests": 3,
    });
    put(&api, "/v1/tenants/acme/egress", Some(&acme), &body).await.expect(403, "operator_only");
    let set = put(&api, "/v1/tenants/acme/egress", Some(OPERATOR), &body).await.ok(200).clone();
    assert_eq!(set["allow"], json!(["*.example.org", "127.0.0.1:8025", "api.mail.example"]));
    assert_eq!(
        (set["max_requests"].clone(), set["effective"]["max_requests"].clone()),
        (json!(3), json!(3))
    );
    assert_eq!(set["max_response_bytes"], Value::Null, "not given: the default");
    assert_eq!(set["effective"]["max_response_bytes"], 10 * 1024 * 1024);
    assert!(set["updated_at"].is_string());

    // The tenant reads its own; another tenant's is as if absent; the operator reads any.
    let own = api.get("/v1/tenants/acme/egress", Some(&acme)).await.ok(200).clone();
    assert_eq!(own, set);
    api.get("/v1/tenants/acme/egress", Some(&other)).await.expect(404, "not_found");
    api.get("/v1/tenants/acme/egress", Some(OPERATOR)).await.ok(200);
    api.get("/v1/tenants/nobody/egress", Some(OPERATOR)).await.expect(404, "not_found");
    put(&api, "/v1/tenants/nobody/egress", Some(OPERATOR), &json!({"allow": []}))
        .await
        .expect(404, "not_found");
    // `default` needs no tenant row.
    put(&api, "/v1/tenants/default/egress", Some(OPERATOR), &json!({"allow": ["example.com"]}))
        .await
        .ok(200);

    // Bad entries: 422 naming the entry and what is wrong; nothing changes.
    for (entry, why) in [
        ("https://api.mail.example", "not a URL"),
        ("*", "'*' only as the whole first label"),
        ("mail.example:0", "the port must be a number from 1 to 65535"),
        ("::1", "an IPv6 literal goes in brackets"),
        ("exa mple.com", "letters, digits, '-' and '_' only"),
    ] {
        let a = put(
            &api,
            "/v1/tenants/acme/egress",
            Some(OPERATOR),
            &json!({"allow": ["ok.example", entry]}),
        )
        .await;
        a.expect(422, "invalid_egress");
        assert!(a.message().contains("entry 1") && a.message().contains(entry), "{}", a.message());
        assert!(a.message().contains(why), "{}", a.message());
    }
    let many: Vec<String> = (0..101).map(|i| format!("h{i}.example")).collect();
    put(&api, "/v1/tenants/acme/egress", Some(OPERATOR), &json!({"allow": many}))
        .await
        .expect(422, "invalid_egress");
    for (field, value) in [
        ("max_requests", 10_001),
        ("max_response_bytes", (1_i64 << 30) + 1),
        ("request_timeout_ms", 0),
    ] {
        let mut body = json!({"allow": []});
        body[field] = json!(value);
        let a = put(&api, "/v1/tenants/acme/egress", Some(OPERATOR), &body).await;
        a.expect(422, "invalid_http_limit");
        assert!(a.message().contains(field), "{}", a.message());
    }
    put(&api, "/v1/tenants/acme/egress", Some(OPERATOR), &json!({"allow": [], "nope": 1}))
        .await
        .expect(400, "invalid_json");
    assert_eq!(api.get("/v1/tenants/acme/egress", Some(&acme)).await.ok(200), &set, "unchanged");
}

#[sqlx::test(migrations = false)]
async fn secrets_are_scoped_sealed_and_never_shown(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api_with(&db, keyed());
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let other = api.tenant("other", TenantCaps::default()).await;
    let value = "mail-key-7f3a9c1e5d";

    let a = put(&api, "/v1/secrets/MAIL_API_KEY", Some(&acme), &json!({"value": value})).await;
    let created = a.ok(201).clone();
    assert_eq!(
        (created["tenant"].as_str(), created["name"].as_str()),
        (Some("acme"), Some("MAIL_API_KEY"))
    );
    assert!(!a.text.contains(value));
    let a =
        put(&api, "/v1/secrets/MAIL_API_KEY", Some(&acme), &json!({"value": "rotated-9b2e"})).await;
    a.ok(200);
    put(&api, "/v1/secrets/MAIL_API_KEY", Some(&other), &json!({"value": "other-value-1"}))
        .await
        .ok(201);

    // Each tenant lists its own names; the operator every tenant's, or one.
    let listed = api.get("/v1/secrets", Some(&acme)).await;
    assert_eq!(listed.ok(200)["secrets"].as_array().unwrap().len(), 1);
    assert_eq!(listed.json["secrets"][0]["tenant"], "acme");
    assert!(!listed.text.contains("rotated-9b2e") && !listed.text.contains("value\""));
    assert_eq!(
        api.get("/v1/secrets", Some(OPERATOR)).await.ok(200)["secrets"].as_array().unwrap().len(),
        2
    );
    assert_eq!(
        api.get("/v1/secrets?tenant=other", Some(OPERATOR)).await.ok(200)["secrets"][0]["tenant"],
        "other"
    );
    api.get("/v1/secrets?tenant=other", Some(&acme)).await.expect(403, "tenant_not_allowed");

    // At rest: sealed, bound to tenant and name, no value in clear anywhere in the row.
    let rows: Vec<(String, Vec<u8>, Vec<u8>, String)> =
        sqlx::query_as("select tenant, nonce, sealed, key_id from sweep.secrets order by tenant")
            .fetch_all(&api.pool)
            .await
            .unwrap();
    for (tenant, nonce, sealed, key_id) in &rows {
        assert_eq!(nonce.len(), 24, "{tenant}");
        assert_eq!(key_id, api.state.config().secrets_key.as_ref().unwrap().id());
        for plain in [value, "rotated-9b2e", "other-value-1"] {
            assert!(!sealed.windows(plain.len()).any(|w| w == plain.as_bytes()), "{tenant}");
        }
    }

    // Read-only tokens read names and write nothing.
    let viewer = admin::create_read_only_token(&api.pool, "acme").await.unwrap();
    api.get("/v1/secrets", Some(&viewer)).await.ok(200);
    put(&api, "/v1/secrets/MAIL_API_KEY", Some(&viewer), &json!({"value": "x"}))
        .await
        .expect(403, "read_only");
    delete(&api, "/v1/secrets/MAIL_API_KEY", Some(&viewer)).await.expect(403, "read_only");

    // Bad input, each refused before anything is written.
    let huge = "x".repeat(16 * 1024 + 1);
    put(&api, "/v1/secrets/BIG", Some(&acme), &json!({"value": huge}))
        .await
        .expect(413, "secret_too_large");
    put(&api, "/v1/secrets/EMPTY", Some(&acme), &json!({"value": ""}))
        .await
        .expect(422, "invalid_secret");
    put(&api, "/v1/secrets/NUL", Some(&acme), &json!({"value": "a\u{0}b"}))
        .await
        .expect(422, "invalid_secret");
    put(&api, "/v1/secrets/SWEEP_TASK_ID", Some(&acme), &json!({"value": "x"}))
        .await
        .expect(422, "reserved_secret_name");
    put(&api, "/v1/secrets/9LIVES", Some(&acme), &json!({"value": "x"}))
        .await
        .expect(400, "invalid_secret_name");
    put(&api, "/v1/secrets/A-B", Some(&acme), &json!({"value": "x"}))
        .await
        .expect(400, "invalid_secret_name");
    put(&api, "/v1/secrets/K", Some(&acme), &json!({"value": "x", "extra": 1}))
        .await
        .expect(400, "invalid_json");
    let count: i64 = sqlx::query_scalar("select count(*) from sweep.secrets")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_eq!(count, 2);

    // Another tenant's secret is invisible: deleting it by name answers 404 for acme's own
    // namespace, and other's stays.
    delete(&api, "/v1/secrets/MAIL_API_KEY", Some(&acme)).await.ok(200);
    delete(&api, "/v1/secrets/MAIL_API_KEY", Some(&acme)).await.expect(404, "not_found");
    assert_eq!(
        api.get("/v1/secrets", Some(&other)).await.ok(200)["secrets"].as_array().unwrap().len(),
        1
    );

    // Without a key the API cannot seal: 503, nothing stored; listing still works.
    let keyless = api_with(&db, AdminConfig::default());
    put(&keyless, "/v1/secrets/K2", Some(&acme), &json!({"value": "v"}))
        .await
        .expect(503, "unavailable");
    keyless.get("/v1/secrets", Some(&acme)).await.ok(200);
}

#[sqlx::test(migrations = false)]
async fn a_tenant_holds_a_bounded_number_of_secrets(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api_with(&db, keyed());
    let acme = api.tenant("acme", TenantCaps::default()).await;
    for i in 0..100 {
        put(&api, &format!("/v1/secrets/K{i}"), Some(&acme), &json!({"value": "v"})).await.ok(201);
    }
    put(&api, "/v1/secrets/K100", Some(&acme), &json!({"value": "v"}))
        .await
        .expect(422, "too_many_secrets");
    // Replacing one is not adding one.
    put(&api, "/v1/secrets/K7", Some(&acme), &json!({"value": "w"})).await.ok(200);
}

#[sqlx::test(migrations = false)]
async fn modules_name_existing_secrets_of_their_own_tenant(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api_with(&db, keyed());
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let other = api.tenant("other", TenantCaps::default()).await;
    put(&api, "/v1/secrets/MAIL_API_KEY", Some(&other), &json!({"value": "others-key-123"}))
        .await
        .ok(201);
    let noop = module("noop");

    // Another tenant's secret of that name does not count: acme has none.
    let a = api.put_wasm("/v1/modules/mail?secrets=MAIL_API_KEY", Some(&acme), &noop).await;
    a.expect(422, "unknown_secret");
    assert!(a.message().contains("MAIL_API_KEY"), "{}", a.message());
    put(&api, "/v1/secrets/MAIL_API_KEY", Some(&acme), &json!({"value": "acme-key-456"}))
        .await
        .ok(201);
    let a =
        api.put_wasm("/v1/modules/mail?secrets=MAIL_API_KEY,OTHER,THIRD", Some(&acme), &noop).await;
    a.expect(422, "unknown_secret");
    assert!(a.message().contains("OTHER, THIRD"), "{}", a.message());
    api.put_wasm("/v1/modules/mail?secrets=SWEEP_X", Some(&acme), &noop)
        .await
        .expect(422, "reserved_secret_name");
    api.put_wasm("/v1/modules/mail?secrets=", Some(&acme), &noop)
        .await
        .expect(400, "invalid_secret_name");
    api.put_wasm("/v1/modules/mail?secrets=A,,B", Some(&acme), &noop)
        .await
        .expect(400, "invalid_secret_name");
    let names: Vec<String> = (0..33).map(|i| format!("S{i}")).collect();
    api.put_wasm(&format!("/v1/modules/mail?secrets={}", names.join(",")), Some(&acme), &noop)
        .await
        .expect(422, "too_many_secrets");
    let count: i64 = sqlx::query_scalar("select count(*) from sweep.modules")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_eq!(count, 0, "nothing was registered");

    let up = api.put_wasm("/v1/modules/mail?secrets=MAIL_API_KEY", Some(&acme), &noop).await;
    assert_eq!(up.ok(201)["secrets"], json!(["MAIL_API_KEY"]));
    // The same bytes and limits with the same secrets are the same version; without them, another.
    let again = api
        .put_wasm("/v1/modules/mail?secrets=MAIL_API_KEY,MAIL_API_KEY", Some(&acme), &noop)
        .await;
    assert_eq!(again.ok(200)["version"], 1);
    let plain = api.put_wasm("/v1/modules/mail", Some(&acme), &noop).await;
    assert_eq!(
        (plain.ok(201)["version"].clone(), plain.json["secrets"].clone()),
        (json!(2), json!([]))
    );
    let versions = api.get("/v1/modules/mail", Some(&acme)).await.ok(200).clone();
    let secrets: Vec<&Value> =
        versions["modules"].as_array().unwrap().iter().map(|m| &m["secrets"]).collect();
    assert_eq!(secrets, [&json!([]), &json!(["MAIL_API_KEY"])], "newest first");
}

fn usage(ms: i64, fuel: i64, requests: i64, refused: i64) -> AttemptUsage {
    AttemptUsage {
        duration_ms: ms,
        fuel_used: fuel,
        peak_memory_bytes: ms * 1000,
        http_requests: requests,
        http_refused: refused,
        bytes_sent: 10 * requests,
        bytes_received: 100 * requests,
    }
}

#[sqlx::test(migrations = false)]
async fn usage_is_totalled_per_tenant_type_and_day(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let api = api(&db);
    let pool = api.pool.clone();
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let other = api.tenant("other", TenantCaps::default()).await;
    for (tenant, task_type) in
        [("acme", "mail"), ("acme", "mail"), ("acme", "resize"), ("other", "mail")]
    {
        queue::enqueue(&pool, NewTask::new(task_type, json!({})).tenant(tenant).max_attempts(2))
            .await
            .unwrap();
    }
    // Two runners report: their totals are kept apart and read together.
    let (r1, r2) = (new_runner(), new_runner());
    let first = claim(&pool, r1, 2).await;
    let rest = claim(&pool, r2, 2).await;
    let done =
        |c: &queue::ClaimedTask, u| Completion { usage: Some(u), ..completion(c, json!({})) };
    let fail = |c: &queue::ClaimedTask, u| Failure {
        id: c.id,
        attempt: c.attempt,
        kind: FailureKind::HandlerError,
        message: "no".into(),
        permanent: false,
        retry_delay: std::time::Duration::from_secs(3600),
        detail: json!({"exit_code": 1}),
        module_sha256: None,
        usage: Some(u),
    };
    let all: Vec<queue::ClaimedTask> = first.iter().chain(&rest).cloned().collect();
    let mails: Vec<&queue::ClaimedTask> =
        all.iter().filter(|c| c.tenant == "acme" && c.task_type == "mail").collect();
    assert_eq!(mails.len(), 2);
    // Every claimed task ends in one report: the first acme mail succeeds, the second fails
    // (its history keeps the usage), acme resize and other mail succeed.
    let mut reports_1 = (Vec::new(), Vec::new());
    let mut reports_2 = (Vec::new(), Vec::new());
    for (runner_claims, reports) in [(&first, &mut reports_1), (&rest, &mut reports_2)] {
        for c in runner_claims.iter() {
            match (c.tenant.as_str(), c.task_type.as_str()) {
                ("acme", "mail") if c.id == mails[0].id => {
                    reports.0.push(done(c, usage(100, 1000, 2, 0)))
                }
                ("acme", "mail") => reports.1.push(fail(c, usage(50, 500, 1, 3))),
                ("acme", "resize") => reports.0.push(done(c, usage(7, 70, 0, 0))),
                _ => reports.0.push(done(c, usage(1, 1, 0, 0))),
            }
        }
    }
    for (runner, (completions, failures)) in [(r1, reports_1), (r2, reports_2)] {
        assert!(queue::complete_batch(&pool, runner, &completions).await.unwrap().is_empty());
        assert!(queue::fail_batch(&pool, runner, &failures).await.unwrap().lost.is_empty());
    }
    // Each attempt keeps its own: the success as the task's usage, the failure in its history.
    let ok = api.get(&format!("/v1/tasks/{}", mails[0].id), Some(&acme)).await.ok(200).clone();
    assert_eq!(ok["usage"], serde_json::to_value(usage(100, 1000, 2, 0)).unwrap());
    let failed = api.get(&format!("/v1/tasks/{}", mails[1].id), Some(&acme)).await.ok(200).clone();
    let entry = &failed["errors"][0];
    assert_eq!(
        (entry["duration_ms"].clone(), entry["http_refused"].clone(), entry["exit_code"].clone()),
        (json!(50), json!(3), json!(1))
    );
    assert_eq!(failed["usage"], Value::Null);

    // Reports append to the deltas; maintenance folds them into per-runner totals, and the
    // reads count both, so folding changes nothing read.
    let before_fold = api.get("/v1/usage", Some(OPERATOR)).await.ok(200).clone();
    queue::fold_kept_counts(&pool).await.unwrap();
    let (runners, pending): (i64, i64) = sqlx::query_as(
        "select (select count(distinct runner) from sweep.usage_days),
                (select count(*) from sweep.usage_deltas)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((runners, pending), (2, 0), "totals of each runner's own, every delta folded");
    assert_eq!(api.get("/v1/usage", Some(OPERATOR)).await.ok(200).clone(), before_fold);

    let today = chrono::Utc::now().date_naive();
    let mine = api.get("/v1/usage", Some(&acme)).await.ok(200).clone();
    assert_eq!(mine["to"], json!(today.to_string()));
    let totals = mine["totals"].as_array().unwrap();
    assert_eq!(totals.len(), 2, "{mine}");
    let mail = totals.iter().find(|t| t["task_type"] == "mail").unwrap();
    assert_eq!(
        [&mail["attempts"], &mail["succeeded"], &mail["failed"], &mail["wall_ms"], &mail["fuel"]],
        [&json!(2), &json!(1), &json!(1), &json!(150), &json!(1500)]
    );
    assert_eq!(
        [
            &mail["http_requests"],
            &mail["http_refused"],
            &mail["bytes_sent"],
            &mail["bytes_received"]
        ],
        [&json!(3), &json!(3), &json!(30), &json!(300)]
    );
    assert_eq!(mail["peak_memory_bytes"], 100_000, "the largest attempt's, not a sum");
    assert!(mine["days"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["tenant"] == "acme" && d["day"] == json!(today.to_string())));

    // The operator: every tenant, or one; a tenant cannot name another.
    let all = api.get("/v1/usage", Some(OPERATOR)).await.ok(200).clone();
    assert_eq!(all["totals"].as_array().unwrap().len(), 3);
    let theirs = api.get("/v1/usage?tenant=other", Some(OPERATOR)).await.ok(200).clone();
    assert_eq!(theirs["totals"].as_array().unwrap().len(), 1);
    api.get("/v1/usage?tenant=other", Some(&acme)).await.expect(403, "tenant_not_allowed");
    let typed = api.get("/v1/usage?task_type=resize", Some(&acme)).await.ok(200).clone();
    assert_eq!(typed["totals"][0]["attempts"], 1);
    let _ = other;

    // Ranges.
    let yesterday = today.pred_opt().unwrap();
    let before = api.get(&format!("/v1/usage?from={yesterday}&to={yesterday}"), Some(&acme)).await;
    assert_eq!(before.ok(200)["days"], json!([]));
    api.get(&format!("/v1/usage?from={today}&to={yesterday}"), Some(&acme))
        .await
        .expect(422, "invalid_range");
    api.get("/v1/usage?from=2020-01-01&to=2022-01-01", Some(&acme))
        .await
        .expect(422, "invalid_range");
    api.get("/v1/usage?from=2026-1-5", Some(&acme)).await.expect(400, "invalid_parameter");
    api.get("/v1/usage?to=yesterday", Some(&acme)).await.expect(400, "invalid_parameter");
    api.get("/v1/usage?nope=1", Some(&acme)).await.expect(400, "unknown_parameter");

    // Retention does not lose totals: finished tasks gone, usage stays.
    sqlx::query("delete from sweep.finished_tasks").execute(&pool).await.unwrap();
    let after = api.get("/v1/usage", Some(&acme)).await.ok(200).clone();
    assert_eq!(after["totals"], mine["totals"]);
}

/// The real job, all through the API: the operator allows the mail API's address, the
/// tenant stores its key and uploads `send-email` naming it, enqueues an email, a runner with
/// the deployment's key sends it; the result carries the provider's message id, the provider
/// saw the key, and nothing the API shows carries it.
#[sqlx::test(migrations = false)]
async fn an_email_goes_out_through_the_api_with_the_tenants_key(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    use sweep_dev::mail::{MailApi, Reply};
    let db = migrated(db).await;
    let key = SecretsKey::generate().0;
    let api =
        api_with(&db, AdminConfig { secrets_key: Some(key.clone()), ..AdminConfig::default() });
    let mail = MailApi::start(Reply::MessageId).await.unwrap();
    let acme = api.tenant("acme", TenantCaps::default()).await;
    let value = "sk-live-4f1c9e";

    put(&api, "/v1/tenants/acme/egress", Some(OPERATOR), &json!({"allow": [mail.allow_entry()]}))
        .await
        .ok(200);
    put(&api, "/v1/secrets/MAIL_API_KEY", Some(&acme), &json!({"value": value})).await.ok(201);
    let bytes = sweep_dev::modules::component_bytes("send-email");
    let uploaded =
        api.put_wasm("/v1/modules/send_email?secrets=MAIL_API_KEY", Some(&acme), &bytes).await;
    assert_eq!(uploaded.ok(201)["secrets"], json!(["MAIL_API_KEY"]));
    let email = json!({"mail_api_url": mail.url(), "to": "ada@example.com", "subject": "Shipped"});
    let id = api.enqueue(&acme, "send_email", email).await;

    let config = WorkerConfig { secrets_key: Some(key), ..unpooled_config(2) };
    let worker = start_worker(&db, config);
    let task = api.get(&format!("/v1/tasks/{id}?wait=60s"), Some(&acme)).await.ok(200).clone();
    worker.stop().await;

    assert_eq!(task["state"], "succeeded", "{task}");
    assert_eq!(task["result"], json!({"message_id": "msg-1", "status": 200}));
    assert_eq!(task["usage"]["http_requests"], 1, "{task}");
    let sent = mail.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].header("authorization"), Some(format!("Bearer {value}").as_str()));
    let body: Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(body, json!({"to": "ada@example.com", "subject": "Shipped"}));
    for shown in [
        api.get(&format!("/v1/tasks/{id}"), Some(&acme)).await.text.clone(),
        api.get("/v1/secrets", Some(&acme)).await.text.clone(),
        api.get("/v1/modules/send_email", Some(&acme)).await.text.clone(),
    ] {
        assert!(!shown.contains(value), "the key is shown: {shown}");
    }
}
