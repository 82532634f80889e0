//! The OpenAPI document against the server: every route it serves is documented with its
//! methods (and nothing else is), every `$ref` resolves, and real answers of a live server
//! (over TCP, against Postgres, a runner running the tasks) validate against the schema the
//! document gives for their status, which must be a documented one.

#![allow(clippy::unwrap_used)]

mod admin_support;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use admin_support::*;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sweep::admin::{self, AdminConfig, Route};
use sweep::queue::TenantCaps;

use admin_support::common;

const METHODS: [&str; 5] = ["get", "put", "post", "patch", "delete"];

fn document() -> Value {
    serde_json::from_str(admin::document_json()).unwrap()
}

/// `template` with its parameters filled in.
fn fill(template: &str) -> String {
    template.replace("{task_type}", "t").replace("{id}", "1").replace("{name}", "acme")
}

/// The value `pointer` (`#/a/b`) names in `doc`.
fn resolve<'a>(doc: &'a Value, pointer: &str) -> &'a Value {
    let path = pointer.strip_prefix('#').unwrap_or_else(|| panic!("external $ref {pointer}"));
    doc.pointer(path).unwrap_or_else(|| panic!("$ref {pointer} does not resolve"))
}

fn refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r.clone()),
                    _ => refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[sqlx::test(migrations = false)]
async fn every_route_is_documented_with_its_methods_and_nothing_else(
    _: PgPoolOptions,
    db: PgConnectOptions,
) {
    let db = migrated(db).await;
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");

    // The document's operations are exactly the route table's.
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in METHODS {
            if item.get(method).is_some() {
                documented.insert((path.clone(), method.to_owned()));
            }
        }
    }
    let mut served = BTreeSet::new();
    for route in Route::ALL {
        let (path, methods, _) = route.doc();
        assert_eq!(methods.len(), 1, "{route:?}");
        let method = serde_json::to_value(&methods[0]).unwrap();
        served.insert((path, method.as_str().unwrap().to_owned()));
    }
    assert_eq!(documented, served);

    // The server answers each documented operation at its path, with its method (whatever
    // the answer, it is not "no such route" or "method not allowed"), and no other method on
    // a documented path.
    let api = api(&db);
    let paths: BTreeSet<&String> = served.iter().map(|(p, _)| p).collect();
    for path in paths {
        for method in METHODS {
            let a = api.send(api.req(&method.to_uppercase(), &fill(path), None)).await;
            let unrouted =
                matches!((a.status.as_u16(), a.message()), (404, "no such route") | (405, _));
            let documented = served.contains(&(path.clone(), method.to_owned()));
            assert_eq!(!unrouted, documented, "{method} {path}: {} {}", a.status, a.text);
            // A 405 names exactly the documented methods of its path in `Allow`.
            if a.status == 405 {
                let allow = a.headers.get("allow").map(|v| v.to_str().unwrap().to_owned());
                let mut methods: Vec<String> = served
                    .iter()
                    .filter(|(p, _)| p == path)
                    .map(|(_, m)| m.to_uppercase())
                    .collect();
                methods.sort();
                assert_eq!(allow, Some(methods.join(", ")), "{method} {path}");
            }
        }
    }

    // Every reference resolves; every authenticated operation says so and lists 401; every
    // JSON body lists what a bad body gets.
    let mut all_refs = Vec::new();
    refs(&doc, &mut all_refs);
    assert!(all_refs.len() > 20);
    for r in &all_refs {
        resolve(&doc, r);
    }
    for (path, method) in &served {
        let op = &doc["paths"][path][method];
        let responses = op["responses"].as_object().unwrap();
        let open = ["/healthz", "/readyz", "/v1/openapi.json"].contains(&path.as_str());
        assert_eq!(op.get("security").is_none(), open, "{method} {path}");
        assert_eq!(!responses.contains_key("401"), open, "{method} {path}");
        let body = &op["requestBody"]["content"];
        if body.get("application/json").is_some() {
            for status in ["400", "413", "415"] {
                assert!(responses.contains_key(status), "{method} {path} lacks {status}");
            }
        }
        assert!(op["tags"].as_array().is_some_and(|t| !t.is_empty()), "{method} {path}");
        // A read-only token is refused on every write, a tenant naming another tenant
        // wherever `?tenant=` is taken: both are 403s (the fuzzer found them undocumented).
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        let names_tenant = params.iter().any(|p| p["in"] == "query" && p["name"] == "tenant");
        if (method != "get" && !open) || names_tenant {
            assert!(responses.contains_key("403"), "{method} {path} lacks 403");
        }
    }
    let ids: BTreeSet<&str> = served
        .iter()
        .map(|(path, method)| doc["paths"][path][method]["operationId"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), served.len(), "operation ids are unique: {ids:?}");
    let upload = &doc["paths"]["/v1/modules/{task_type}"]["put"];
    // Raw bytes, as generated clients send files (application/wasm is accepted too).
    assert!(upload["requestBody"]["content"].get("application/octet-stream").is_some());
}

#[sqlx::test(migrations = false)]
async fn every_documented_query_parameter_is_accepted(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let doc = document();
    let api = api(&db);
    for route in Route::ALL {
        let (path, methods, _) = route.doc();
        let method = serde_json::to_value(&methods[0]).unwrap();
        let method = method.as_str().unwrap();
        let op = &doc["paths"][&path][method];
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        for p in params.iter().filter(|p| p["in"] == "query") {
            let name = p["name"].as_str().unwrap();
            let value = match p["schema"]["type"].as_str() {
                Some("boolean") => "true",
                Some("integer") => "1",
                _ if name == "tenant" => "default",
                // Strings with a shape of their own.
                _ if name == "wait" => "1s",
                _ if name == "state" => "pending",
                _ if name == "payload" => "a=1",
                _ if name == "since" || name == "until" => "2026-01-01T00:00:00Z",
                _ if name == "from" || name == "to" => "2026-01-01",
                _ => "t",
            };
            let url = format!("{}?{name}={value}", fill(&path));
            let a = api.send(api.req(&method.to_uppercase(), &url, Some(OPERATOR))).await;
            assert_ne!(a.code(), "unknown_parameter", "{method} {url}: {}", a.text);
            assert_ne!(a.code(), "invalid_parameter", "{method} {url}: {}", a.text);
        }
    }
}

/// Validates live answers against the document and remembers which operations answered
/// with which statuses.
struct Checker {
    doc: Value,
    http: reqwest::Client,
    base: String,
    seen: HashMap<(String, String), BTreeSet<u16>>,
    checked: usize,
}

impl Checker {
    /// Sends `method template` (filled in as `path`) and checks the answer; returns its JSON.
    async fn call(
        &mut self,
        method: &str,
        template: &str,
        path: &str,
        token: Option<&str>,
        body: Option<(&str, Vec<u8>)>,
    ) -> (u16, Value) {
        let method_upper: reqwest::Method = method.to_uppercase().parse().unwrap();
        let mut req = self.http.request(method_upper, format!("{}{path}", self.base));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some((content_type, bytes)) = body {
            req = req.header("content-type", content_type).body(bytes);
        }
        let response = req.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = response.text().await.unwrap();
        let op = &self.doc["paths"][template][method];
        assert!(op.is_object(), "{method} {template} is not documented");
        let documented = &op["responses"][status.to_string()];
        assert!(
            documented.is_object(),
            "{method} {path}: status {status} is not documented: {text}"
        );
        let documented = match documented.get("$ref").and_then(Value::as_str) {
            Some(r) => resolve(&self.doc, r).clone(),
            None => documented.clone(),
        };
        let content = documented["content"].as_object().unwrap();
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        let media = content
            .get(essence)
            .unwrap_or_else(|| panic!("{method} {path} {status}: {essence} is not documented"));
        let json: Value = if essence == "application/json" {
            serde_json::from_str(&text).unwrap()
        } else {
            Value::Null
        };
        if essence == "application/json" {
            let errors = schema_errors(&self.doc, &media["schema"], &json);
            assert!(
                errors.is_empty(),
                "{method} {path} {status}: answer does not match its schema: {errors:?}\n{text}"
            );
        }
        self.checked += 1;
        self.seen.entry((template.to_owned(), method.to_owned())).or_default().insert(status);
        (status, json)
    }

    async fn json(
        &mut self,
        method: &str,
        template: &str,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> (u16, Value) {
        let bytes = serde_json::to_vec(body).unwrap();
        self.call(method, template, path, token, Some(("application/json", bytes))).await
    }

    async fn get(&mut self, template: &str, path: &str, token: Option<&str>) -> (u16, Value) {
        self.call("get", template, path, token, None).await
    }
}

/// Why `value` does not match `schema` (whose `$ref`s point into `doc`); empty if it does.
fn schema_errors(doc: &Value, schema: &Value, value: &Value) -> Vec<String> {
    let mut schema = schema.clone();
    schema.as_object_mut().unwrap().insert("components".into(), doc["components"].clone());
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&schema)
        .unwrap_or_else(|e| panic!("bad schema {schema}: {e}"));
    validator.iter_errors(value).map(|e| e.to_string()).collect()
}

/// Polls `GET /v1/tasks/{id}` until the task is in `state`, for at most a minute.
async fn wait_state(c: &mut Checker, token: &str, id: i64, state: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, task) = c.get("/v1/tasks/{id}", &format!("/v1/tasks/{id}"), Some(token)).await;
        assert_eq!(status, 200);
        if task["state"] == state {
            return task;
        }
        assert!(tokio::time::Instant::now() < deadline, "task {id} never became {state}: {task}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn live_answers_validate_against_the_document(_: PgPoolOptions, db: PgConnectOptions) {
    let db = migrated(db).await;
    let pool = db.pool();
    let config = AdminConfig {
        operator_token: Some(OPERATOR.into()),
        max_json_bytes: 64 << 10,
        max_batch: 10,
        secrets_key: Some(sweep::secrets::SecretsKey::generate().0),
        ..AdminConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(admin::serve_on(listener, state(&db, config), async {
        let _ = stopped.await;
    }));
    let worker = common::start_worker(&db, common::test_config());
    let acme = admin::create_tenant(&pool, "acme", &TenantCaps::default()).await.unwrap().1;
    let small_caps = TenantCaps { max_module_bytes: Some(1024), ..TenantCaps::default() };
    let small = admin::create_tenant(&pool, "small", &small_caps).await.unwrap().1;
    let (t, op) = (Some(acme.as_str()), Some(OPERATOR));
    let mut c = Checker {
        doc: document(),
        http: reqwest::Client::new(),
        base: format!("http://{addr}"),
        seen: HashMap::new(),
        checked: 0,
    };

    // Probes and the document itself.
    assert_eq!(c.get("/healthz", "/healthz", None).await.0, 200);
    assert_eq!(c.get("/readyz", "/readyz", None).await.0, 200);
    let (status, served) = c.get("/v1/openapi.json", "/v1/openapi.json", None).await;
    assert_eq!((status, &served), (200, &c.doc));
    assert_eq!(c.get("/metrics", "/metrics", op).await.0, 200);
    assert_eq!(c.get("/metrics", "/metrics", t).await.0, 403);
    assert_eq!(c.get("/metrics", "/metrics", None).await.0, 401);

    // Modules.
    let up = "/v1/modules/{task_type}";
    let wasm = |bytes: Vec<u8>| Some(("application/wasm", bytes));
    let (s, _) = c.call("put", up, "/v1/modules/wordcount", t, wasm(module("wordcount"))).await;
    assert_eq!(s, 201);
    let (s, _) = c.call("put", up, "/v1/modules/wordcount", t, wasm(module("wordcount"))).await;
    assert_eq!(s, 200);
    let (s, _) = c.call("put", up, "/v1/modules/fails", t, wasm(module("permanent"))).await;
    assert_eq!(s, 201);
    let (s, _) = c.call("put", up, "/v1/modules/x?fuel=0", t, wasm(tiny_command())).await;
    assert_eq!(s, 400);
    let (s, _) = c.call("put", up, "/v1/modules/x", None, wasm(tiny_command())).await;
    assert_eq!(s, 401);
    let (s, _) = c.call("put", up, "/v1/modules/x?tenant=nobody", op, wasm(tiny_command())).await;
    assert_eq!(s, 404);
    let (s, _) = c.call("put", up, "/v1/modules/x", Some(&small), wasm(vec![0; 2048])).await;
    assert_eq!(s, 413);
    let (s, _) = c.call("put", up, "/v1/modules/x", t, Some(("text/plain", vec![1]))).await;
    assert_eq!(s, 415);
    let (s, e) = c.call("put", up, "/v1/modules/x", t, wasm(b"nonsense".to_vec())).await;
    assert_eq!((s, e["error"]["code"].as_str()), (422, Some("not_wasm")));
    // The task list, with each kind of filter, and a wait that ends at once (the task ended).
    for query in [
        "",
        "?state=succeeded&limit=2",
        "?type_prefix=word&payload=text%3Dx",
        "?id=1&since=2020-01-01T00:00:00Z",
    ] {
        let (s, page) = c.get("/v1/tasks", &format!("/v1/tasks{query}"), t).await;
        assert_eq!(s, 200, "{query}: {page}");
    }
    assert_eq!(c.get("/v1/tasks", "/v1/tasks?payload=nope", t).await.0, 400);
    let (s, _) = c.get("/v1/modules", "/v1/modules?all=true", t).await;
    assert_eq!(s, 200);
    assert_eq!(c.get("/v1/modules", "/v1/modules?bogus=1", t).await.0, 400);
    assert_eq!(c.get("/v1/modules", "/v1/modules", None).await.0, 401);
    assert_eq!(c.get("/v1/modules/{task_type}", "/v1/modules/wordcount", t).await.0, 200);
    assert_eq!(c.get("/v1/modules/{task_type}", "/v1/modules/nope", t).await.0, 404);
    assert_eq!(c.get("/v1/modules/{task_type}", "/v1/modules/a%20b", t).await.0, 400);
    let act = "/v1/modules/{task_type}/activate";
    let path = "/v1/modules/wordcount/activate";
    assert_eq!(c.json("post", act, path, t, &json!({"version": 1})).await.0, 200);
    assert_eq!(c.json("post", act, path, t, &json!({"version": 99})).await.0, 404);
    assert_eq!(c.json("post", act, path, t, &json!({"version": "one"})).await.0, 400);
    let (s, _) = c.call("post", act, path, t, Some(("text/plain", b"{}".to_vec()))).await;
    assert_eq!(s, 415);
    let (s, _) = c.json("post", act, path, t, &json!({"pad": "x".repeat(70_000)})).await;
    assert_eq!(s, 413);

    // Tasks: one that succeeds, one that dies, one that waits; dedup; bad input.
    let tasks = "/v1/tasks";
    let task = json!({"task_type": "wordcount", "payload": {"text": "a b a"}});
    let (s, done) = c.json("post", tasks, tasks, t, &task).await;
    assert_eq!(s, 201);
    let later = json!({"task_type": "wordcount", "delay_ms": 3_600_000, "dedup_key": "later"});
    let (s, waiting) = c.json("post", tasks, tasks, t, &later).await;
    assert_eq!(s, 201);
    assert_eq!(c.json("post", tasks, tasks, t, &later).await.0, 200);
    let (s, dying) = c.json("post", tasks, tasks, t, &json!({"task_type": "fails"})).await;
    assert_eq!(s, 201);
    let keyed = json!({"task_type": "fails", "dedup_key": "k"});
    let (s, dying_keyed) = c.json("post", tasks, tasks, t, &keyed).await;
    assert_eq!(s, 201);
    assert_eq!(c.json("post", tasks, tasks, t, &json!({"task_type": "nope"})).await.0, 422);
    assert_eq!(c.json("post", tasks, tasks, t, &json!({"task_type": "t", "x": 1})).await.0, 400);
    assert_eq!(c.json("post", tasks, tasks, None, &task).await.0, 401);
    assert_eq!(c.json("post", "/v1/tasks", "/v1/tasks?tenant=nobody", op, &task).await.0, 404);
    let (s, _) = c.call("post", tasks, tasks, t, Some(("text/plain", b"{}".to_vec()))).await;
    assert_eq!(s, 415);
    let big = json!({"task_type": "wordcount", "payload": {"text": "x".repeat(70_000)}});
    assert_eq!(c.json("post", tasks, tasks, t, &big).await.0, 413);
    let batch = "/v1/tasks/batch";
    let (s, _) = c.json("post", batch, batch, t, &json!([task, later])).await;
    assert_eq!(s, 201);
    let eleven = Value::Array(vec![task.clone(); 11]);
    assert_eq!(c.json("post", batch, batch, t, &eleven).await.0, 422);
    assert_eq!(c.json("post", batch, batch, t, &json!({"not": "an array"})).await.0, 400);

    let one = "/v1/tasks/{id}";
    let id = |v: &Value| v["id"].as_i64().unwrap();
    let succeeded = wait_state(&mut c, &acme, id(&done), "succeeded").await;
    assert!(succeeded["result"].is_object());
    wait_state(&mut c, &acme, id(&dying), "dead").await;
    let dead = wait_state(&mut c, &acme, id(&dying_keyed), "dead").await;
    assert!(dead["errors"].as_array().is_some_and(|e| !e.is_empty()));
    assert_eq!(c.get(one, &format!("/v1/tasks/{}", id(&waiting)), t).await.0, 200);
    assert_eq!(c.get(one, "/v1/tasks/999999", t).await.0, 404);
    assert_eq!(c.get(one, "/v1/tasks/1", None).await.0, 401);
    let cancel = "/v1/tasks/{id}/cancel";
    let path = format!("/v1/tasks/{}/cancel", id(&waiting));
    assert_eq!(c.call("post", cancel, &path, t, None).await.0, 200);
    assert_eq!(c.call("post", cancel, &path, t, None).await.0, 409);
    assert_eq!(c.call("post", cancel, "/v1/tasks/999999/cancel", t, None).await.0, 404);
    let bulk = "/v1/tasks/cancel";
    let (s, counts) = c.json("post", bulk, bulk, t, &json!({"task_type": "nothing-here"})).await;
    assert_eq!((s, counts), (200, json!({"cancelled": 0, "cancel_requested": 0})));
    let bad_state = json!({"task_type": "wordcount", "state": "dead"});
    assert_eq!(c.json("post", bulk, bulk, t, &bad_state).await.0, 400);
    assert_eq!(c.json("post", bulk, bulk, None, &bad_state).await.0, 401);

    // The dead-letter table.
    let (s, page) = c.get("/v1/dead", "/v1/dead?limit=1", t).await;
    assert_eq!(s, 200);
    assert!(page["next_after"].is_i64());
    let (s, page) = c.get("/v1/dead", "/v1/dead?task_type=fails", t).await;
    assert_eq!((s, page["next_after"].is_null()), (200, true));
    assert_eq!(c.get("/v1/dead", "/v1/dead?limit=5000", t).await.0, 400);
    let past_int64 = "/v1/dead?after=9223372036854775808";
    assert_eq!(c.get("/v1/dead", past_int64, t).await.0, 400);
    assert_eq!(c.get("/v1/dead", "/v1/dead", None).await.0, 401);
    let requeue = "/v1/dead/{id}/requeue";
    let keyed_live = json!({"task_type": "wordcount", "dedup_key": "k", "delay_ms": 3_600_000});
    assert_eq!(c.json("post", tasks, tasks, t, &keyed_live).await.0, 201);
    let path = format!("/v1/dead/{}/requeue", id(&dying_keyed));
    assert_eq!(c.call("post", requeue, &path, t, None).await.0, 409);
    let path = format!("/v1/dead/{}/requeue", id(&dying));
    assert_eq!(c.call("post", requeue, &path, t, None).await.0, 200);
    let not_dead = format!("/v1/dead/{}/requeue", id(&done));
    assert_eq!(c.call("post", requeue, &not_dead, t, None).await.0, 404);
    assert_eq!(c.call("post", requeue, &path, None, None).await.0, 401);

    // Cron schedules.
    let schedules = "/v1/schedules";
    let nightly = json!({"name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Berlin",
                         "task_type": "wordcount", "payload": {"text": "a b"}});
    assert_eq!(c.json("post", schedules, schedules, t, &nightly).await.0, 201);
    assert_eq!(c.json("post", schedules, schedules, t, &nightly).await.0, 409);
    let bad_cron = json!({"name": "x", "cron": "61 * * * *", "task_type": "wordcount"});
    assert_eq!(c.json("post", schedules, schedules, t, &bad_cron).await.0, 422);
    assert_eq!(c.json("post", schedules, schedules, t, &json!({"name": "x"})).await.0, 400);
    let (s, _) =
        c.call("post", schedules, schedules, t, Some(("text/plain", b"{}".to_vec()))).await;
    assert_eq!(s, 415);
    let huge = json!({"name": "x", "cron": "* * * * *", "task_type": "wordcount",
                      "payload": {"text": "x".repeat(70_000)}});
    assert_eq!(c.json("post", schedules, schedules, t, &huge).await.0, 413);
    assert_eq!(c.get(schedules, schedules, t).await.0, 200);
    assert_eq!(c.get(schedules, "/v1/schedules?tenant=acme", op).await.0, 200);
    assert_eq!(c.get(schedules, schedules, None).await.0, 401);
    let one_schedule = "/v1/schedules/{name}";
    assert_eq!(c.get(one_schedule, "/v1/schedules/nightly", t).await.0, 200);
    assert_eq!(c.get(one_schedule, "/v1/schedules/absent", t).await.0, 404);
    assert_eq!(c.get(one_schedule, "/v1/schedules/a%20b", t).await.0, 400);
    for action in ["pause", "resume"] {
        let template = format!("/v1/schedules/{{name}}/{action}");
        let path = format!("/v1/schedules/nightly/{action}");
        assert_eq!(c.call("post", &template, &path, t, None).await.0, 200);
        let absent = format!("/v1/schedules/absent/{action}");
        assert_eq!(c.call("post", &template, &absent, t, None).await.0, 404);
    }
    assert_eq!(c.call("delete", one_schedule, "/v1/schedules/absent", t, None).await.0, 404);
    let kept = json!({"name": "kept", "cron": "*/5 * * * * *", "task_type": "wordcount"});
    assert_eq!(c.json("post", schedules, schedules, t, &kept).await.0, 201);
    assert_eq!(c.call("delete", one_schedule, "/v1/schedules/nightly", t, None).await.0, 200);
    // Workflows.
    let workflows = "/v1/workflows";
    let flow = json!({"steps": [
        {"name": "a", "task_type": "wordcount", "payload": {"text": "a b"}},
        {"name": "b", "task_type": "wordcount", "payload": {"text": "c"}, "after": ["a"]},
    ]});
    let (s, created) = c.json("post", workflows, workflows, t, &flow).await;
    assert_eq!(s, 201);
    let cycle = json!({"steps": [{"name": "a", "task_type": "wordcount", "after": ["a"]}]});
    assert_eq!(c.json("post", workflows, workflows, t, &cycle).await.0, 422);
    assert_eq!(c.json("post", workflows, workflows, t, &json!({"steps": 1})).await.0, 400);
    assert_eq!(c.get(workflows, workflows, t).await.0, 200);
    let one_workflow = "/v1/workflows/{id}";
    let path = format!("/v1/workflows/{}", created["id"]);
    assert_eq!(c.get(one_workflow, &path, t).await.0, 200);
    assert_eq!(c.get(one_workflow, "/v1/workflows/999999", t).await.0, 404);
    let cancel_workflow = "/v1/workflows/{id}/cancel";
    let cancel_path = format!("{path}/cancel");
    assert_eq!(c.call("post", cancel_workflow, &cancel_path, t, None).await.0, 200);
    // Flow control (pauses are lifted again: the worker runs the tasks below).
    let pause = "/v1/queues/{task_type}/pause";
    let resume = "/v1/queues/{task_type}/resume";
    assert_eq!(c.call("post", pause, "/v1/queues/wordcount/pause", t, None).await.0, 200);
    assert_eq!(c.call("post", pause, "/v1/queues/nothing/pause", t, None).await.0, 404);
    assert_eq!(c.call("post", pause, "/v1/queues/bad%20type/pause", t, None).await.0, 400);
    assert_eq!(c.call("post", pause, "/v1/queues/wordcount/pause", None, None).await.0, 401);
    let (s, stats) = c.get("/v1/stats", "/v1/stats", t).await;
    assert_eq!((s, &stats["queues"][0]["paused_by"]), (200, &json!("tenant:acme")));
    assert_eq!(c.call("post", resume, "/v1/queues/wordcount/resume", t, None).await.0, 200);
    assert_eq!(c.call("post", resume, "/v1/queues/nothing/resume", t, None).await.0, 404);
    let rate = "/v1/queues/{task_type}/rate-limit";
    let path = "/v1/queues/wordcount/rate-limit";
    let limit = json!({"rate_per_sec": 1000.5, "burst": 100});
    let (s, q) = c.json("put", rate, path, t, &limit).await;
    assert_eq!((s, &q["rate_per_sec"], &q["burst"]), (200, &json!(1000.5), &json!(100)));
    let zero = json!({"rate_per_sec": 0, "burst": 1});
    assert_eq!(c.json("put", rate, path, t, &zero).await.0, 422);
    assert_eq!(c.json("put", rate, path, t, &json!({"rate_per_sec": 1})).await.0, 400);
    let nothing = "/v1/queues/nothing/rate-limit";
    assert_eq!(c.json("put", rate, nothing, t, &limit).await.0, 404);
    let (s, _) = c.call("put", rate, path, t, Some(("text/plain", b"{}".to_vec()))).await;
    assert_eq!(s, 415);
    let (s, stats) = c.get("/v1/stats", "/v1/stats", t).await;
    assert_eq!((s, &stats["queues"][0]["burst"]), (200, &json!(100)));
    let (s, q) = c.call("delete", rate, path, t, None).await;
    assert_eq!((s, &q["rate_per_sec"]), (200, &Value::Null));
    assert_eq!(c.call("delete", rate, nothing, t, None).await.0, 404);
    let tpause = "/v1/tenants/{name}/pause";
    let tresume = "/v1/tenants/{name}/resume";
    assert_eq!(c.call("post", tpause, "/v1/tenants/acme/pause", t, None).await.0, 403);
    assert_eq!(c.call("post", tpause, "/v1/tenants/nobody/pause", op, None).await.0, 404);
    assert_eq!(c.call("post", tpause, "/v1/tenants/acme/pause", op, None).await.0, 200);
    let (s, stats) = c.get("/v1/stats", "/v1/stats", op).await;
    assert_eq!((s, &stats["paused_tenants"][0]["tenant"]), (200, &json!("acme")));
    assert_eq!(c.call("post", tresume, "/v1/tenants/acme/resume", t, None).await.0, 403);
    assert_eq!(c.call("post", tresume, "/v1/tenants/acme/resume", op, None).await.0, 200);

    // Statistics and tenants.
    assert_eq!(c.get("/v1/stats", "/v1/stats", t).await.0, 200);
    let (s, stats) = c.get("/v1/stats", "/v1/stats", op).await;
    assert_eq!(s, 200);
    assert!(stats["runners"][0]["host"].is_string(), "the operator sees hosts: {stats}");
    assert_eq!(c.get("/v1/stats", "/v1/stats?tenant=other", t).await.0, 403);
    assert_eq!(c.get("/v1/tenants", "/v1/tenants", op).await.0, 200);
    assert_eq!(c.get("/v1/tenants", "/v1/tenants", t).await.0, 200);
    assert_eq!(c.get("/v1/tenants", "/v1/tenants", None).await.0, 401);
    let weight = "/v1/tenants/{name}/weight";
    let path = "/v1/tenants/acme/weight";
    assert_eq!(c.json("put", weight, path, op, &json!({"weight": 3})).await.0, 200);
    assert_eq!(c.json("put", weight, path, op, &json!({"weight": 0})).await.0, 422);
    assert_eq!(c.json("put", weight, path, op, &json!({"weight": "x"})).await.0, 400);
    assert_eq!(c.json("put", weight, path, op, &json!([3])).await.0, 400);
    let (s, tenant) = c.json("put", weight, path, op, &json!({"weight": 2.0})).await;
    assert_eq!((s, &tenant["weight"]), (200, &json!(2)));
    assert_eq!(c.json("put", weight, path, t, &json!({"weight": 3})).await.0, 403);
    let nobody = "/v1/tenants/nobody/weight";
    assert_eq!(c.json("put", weight, nobody, op, &json!({"weight": 3})).await.0, 404);
    let (s, _) = c.call("put", weight, path, op, Some(("text/plain", b"{}".to_vec()))).await;
    assert_eq!(s, 415);
    let (s, _) = c.json("put", weight, path, op, &json!({"pad": "x".repeat(70_000)})).await;
    assert_eq!(s, 413);
    let caps = "/v1/tenants/{name}/caps";
    let path = "/v1/tenants/acme/caps";
    let (s, tenant) = c.json("patch", caps, path, op, &json!({"max_fuel": 1000})).await;
    assert_eq!((s, &tenant["max_fuel"]), (200, &json!(1000)));
    let (s, tenant) = c.json("patch", caps, path, op, &json!({"max_fuel": null})).await;
    assert_eq!((s, &tenant["max_fuel"]), (200, &Value::Null));
    assert_eq!(c.json("patch", caps, path, op, &json!({"max_fuel": -1})).await.0, 422);
    assert_eq!(c.json("patch", caps, path, op, &json!({"max_fool": 1})).await.0, 400);
    assert_eq!(c.json("patch", caps, path, t, &json!({})).await.0, 403);
    assert_eq!(c.json("patch", caps, "/v1/tenants/nobody/caps", op, &json!({})).await.0, 404);
    let (s, _) = c.call("patch", caps, path, op, Some(("text/plain", b"{}".to_vec()))).await;
    assert_eq!(s, 415);
    let (s, _) = c.json("patch", caps, path, op, &json!({"pad": "x".repeat(70_000)})).await;
    assert_eq!(s, 413);
    let token = "/v1/tenants/{name}/token";
    assert_eq!(c.call("post", token, "/v1/tenants/acme/token", t, None).await.0, 403);
    assert_eq!(c.call("post", token, "/v1/tenants/nobody/token", op, None).await.0, 404);
    let (s, rotated) = c.call("post", token, "/v1/tenants/acme/token", op, None).await;
    assert_eq!(s, 200);
    assert_eq!(c.get("/v1/tenants", "/v1/tenants", t).await.0, 401, "the old token is dead");
    let new = rotated["token"].as_str().unwrap().to_owned();
    assert_eq!(c.get("/v1/tenants", "/v1/tenants", Some(&new)).await.0, 200);

    // Refusals of what a token may do are 403s, and documented: a read-only token on every
    // write, a tenant token naming another tenant on every route that takes `?tenant=`.
    let viewer = admin::create_read_only_token(&pool, "acme").await.unwrap();
    for route in Route::ALL {
        let (path, methods, _) = route.doc();
        let method = serde_json::to_value(&methods[0]).unwrap();
        let method = method.as_str().unwrap();
        if method == "get" || c.doc["paths"][&path][method].get("security").is_none() {
            continue;
        }
        let (s, e) = c.call(method, &path, &fill(&path), Some(&viewer), None).await;
        assert_eq!((s, e["error"]["code"].as_str()), (403, Some("read_only")), "{route:?}");
    }
    let t = Some(new.as_str());
    let other = |path: &str| format!("{path}?tenant=other");
    let task = json!({"task_type": "wordcount"});
    for (method, template, body) in [
        ("get", "/v1/modules", None),
        ("get", "/v1/modules/{task_type}", None),
        ("put", "/v1/modules/{task_type}", Some(("application/wasm", tiny_command()))),
        ("post", act, Some(("application/json", json!({"version": 1}).to_string().into_bytes()))),
        ("post", tasks, Some(("application/json", task.to_string().into_bytes()))),
        ("post", batch, Some(("application/json", json!([task]).to_string().into_bytes()))),
        ("get", "/v1/dead", None),
        ("get", "/v1/stats", None),
        ("get", "/v1/schedules", None),
        ("get", "/v1/secrets", None),
        ("get", "/v1/usage", None),
    ] {
        let (s, e) = c.call(method, template, &other(&fill(template)), t, body).await;
        assert_eq!(
            (s, e["error"]["code"].as_str()),
            (403, Some("tenant_not_allowed")),
            "{template}"
        );
    }

    // Egress, secrets, usage.
    let egress = "/v1/tenants/{name}/egress";
    let policy = json!({"allow": ["api.mail.example", "127.0.0.1:8025"], "max_requests": 5});
    assert_eq!(c.get(egress, "/v1/tenants/acme/egress", t).await.0, 200);
    assert_eq!(c.get(egress, "/v1/tenants/other/egress", t).await.0, 404);
    assert_eq!(c.json("put", egress, "/v1/tenants/acme/egress", op, &policy).await.0, 200);
    assert_eq!(c.json("put", egress, "/v1/tenants/acme/egress", t, &policy).await.0, 403);
    let bad = json!({"allow": ["https://x.example"]});
    assert_eq!(c.json("put", egress, "/v1/tenants/acme/egress", op, &bad).await.0, 422);
    assert_eq!(c.json("put", egress, "/v1/tenants/acme/egress", op, &json!({})).await.0, 400);
    let secret = "/v1/secrets/{name}";
    let value = json!({"value": "s3cr3t-value"});
    assert_eq!(c.json("put", secret, "/v1/secrets/MAIL_API_KEY", t, &value).await.0, 201);
    assert_eq!(c.json("put", secret, "/v1/secrets/MAIL_API_KEY", t, &value).await.0, 200);
    let huge = json!({"value": "x".repeat(20_000)});
    assert_eq!(c.json("put", secret, "/v1/secrets/BIG", t, &huge).await.0, 413);
    assert_eq!(c.json("put", secret, "/v1/secrets/SWEEP_X", t, &value).await.0, 422);
    assert_eq!(c.json("put", secret, "/v1/secrets/a-b", t, &value).await.0, 400);
    let (s, listed) = c.get("/v1/secrets", "/v1/secrets", t).await;
    assert_eq!((s, listed["secrets"][0]["name"].as_str()), (200, Some("MAIL_API_KEY")));
    let (s, _) =
        c.call("put", up, "/v1/modules/mail?secrets=MAIL_API_KEY", t, wasm(module("noop"))).await;
    assert_eq!(s, 201);
    let (s, _) = c.call("put", up, "/v1/modules/mail?secrets=NOPE", t, wasm(module("noop"))).await;
    assert_eq!(s, 422);
    assert_eq!(c.call("delete", secret, "/v1/secrets/MAIL_API_KEY", t, None).await.0, 200);
    assert_eq!(c.call("delete", secret, "/v1/secrets/MAIL_API_KEY", t, None).await.0, 404);
    let usage = "/v1/usage";
    let (s, used) = c.get(usage, usage, t).await;
    assert_eq!(s, 200);
    assert!(used["totals"].as_array().is_some_and(|t| !t.is_empty()), "{used}");
    assert_eq!(c.get(usage, "/v1/usage?from=2026-02-01&to=2026-01-01", t).await.0, 422);
    assert_eq!(c.get(usage, "/v1/usage?from=soon", t).await.0, 400);
    assert_eq!(c.get(usage, "/v1/usage?tenant=other", t).await.0, 403);

    // Every operation answered at least once, and once with success.
    for route in Route::ALL {
        let (path, methods, _) = route.doc();
        let method = serde_json::to_value(&methods[0]).unwrap();
        let statuses = c.seen.get(&(path.clone(), method.as_str().unwrap().to_owned()));
        assert!(
            statuses.is_some_and(|s| s.iter().any(|s| (200..300).contains(s))),
            "{route:?} ({path}) never answered with success: {statuses:?}"
        );
    }
    assert!(c.checked > 90, "{} answers checked", c.checked);

    // The checks bite: a task without its state, a null where a value is required, an
    // error without the envelope, a stray field in a request body do not validate.
    let task_schema = json!({"$ref": "#/components/schemas/TaskView"});
    let mut broken = succeeded.clone();
    broken.as_object_mut().unwrap().remove("state");
    assert!(!schema_errors(&c.doc, &task_schema, &broken).is_empty());
    let mut broken = succeeded.clone();
    broken["created_at"] = Value::Null;
    assert!(!schema_errors(&c.doc, &task_schema, &broken).is_empty());
    let error_schema = json!({"$ref": "#/components/schemas/ErrorResponse"});
    let bare = json!({"code": "x", "message": "y"});
    assert!(!schema_errors(&c.doc, &error_schema, &bare).is_empty());
    let enqueue_schema = json!({"$ref": "#/components/schemas/EnqueueRequest"});
    let stray = json!({"task_type": "t", "delay": 5});
    assert!(!schema_errors(&c.doc, &enqueue_schema, &stray).is_empty());
    assert!(schema_errors(&c.doc, &task_schema, &succeeded).is_empty());

    worker.stop().await;
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
