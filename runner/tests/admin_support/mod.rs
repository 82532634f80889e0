//! Helpers for the admin API tests: an API over a fresh test database (driven in-process
//! with `warp::test::request()`), tenants, module bytes and hand-written `.wat` fixtures.
#![allow(dead_code, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
pub mod common;
pub use common::*;

use serde_json::Value;
use sqlx::PgPool;
use sweep::admin::{self, AdminConfig, AdminState};
use sweep::queue::TenantCaps;
use sweep::sandbox::{Sandbox, SandboxConfig};
use tokio::sync::oneshot;
use warp::http::StatusCode;

/// The operator token every test API is configured with.
pub const OPERATOR: &str = "test-operator-token-0123456789";

pub fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig { pooling: false, ..SandboxConfig::default() }).expect("sandbox")
}

pub fn state(db: &Stores, config: AdminConfig) -> AdminState {
    AdminState::new(&db.admin, sandbox(), config).expect("admin state")
}

/// An admin API with an operator token and default limits.
pub fn api(db: &Stores) -> Api {
    api_with(db, AdminConfig::default())
}

pub fn api_with(db: &Stores, config: AdminConfig) -> Api {
    let config = AdminConfig { operator_token: Some(OPERATOR.into()), ..config };
    Api { state: state(db, config), pool: db.pool() }
}

/// An answer: status and JSON body (`Value::Null` when the body is not JSON), raw body too.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub json: Value,
    pub text: String,
    pub content_type: String,
    pub headers: warp::http::HeaderMap,
}

impl Answer {
    pub fn code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("<no error code>")
    }
    pub fn message(&self) -> &str {
        self.json["error"]["message"].as_str().unwrap_or("<no error message>")
    }
    /// Asserts the status and, for errors, the error code; returns self for more checks.
    #[track_caller]
    pub fn expect(&self, status: u16, code: &str) -> &Self {
        assert_eq!(
            (self.status.as_u16(), self.code()),
            (status, code),
            "unexpected answer: {}",
            self.text
        );
        self
    }
    #[track_caller]
    pub fn ok(&self, status: u16) -> &Value {
        assert_eq!(self.status.as_u16(), status, "unexpected answer: {}", self.text);
        &self.json
    }
}

pub struct Api {
    pub state: AdminState,
    pub pool: PgPool,
}

pub struct Req {
    inner: warp::test::RequestBuilder,
}

impl Req {
    pub fn header(self, name: &str, value: &str) -> Self {
        Req { inner: self.inner.header(name, value) }
    }
    pub fn json(self, body: &Value) -> Self {
        Req { inner: self.inner.json(body) }
    }
    pub fn body(self, content_type: &str, body: impl AsRef<[u8]>) -> Self {
        Req { inner: self.inner.header("content-type", content_type).body(body) }
    }
    pub fn wasm(self, body: impl AsRef<[u8]>) -> Self {
        self.body("application/wasm", body)
    }
}

impl Api {
    /// A request with `token` as bearer (none when `None`).
    pub fn req(&self, method: &str, path: &str, token: Option<&str>) -> Req {
        let mut inner = warp::test::request().method(method).path(path);
        if let Some(token) = token {
            inner = inner.header("authorization", format!("Bearer {token}"));
        }
        Req { inner }
    }

    pub async fn send(&self, req: Req) -> Answer {
        let routes = admin::routes(self.state.clone());
        let response = req.inner.reply(&routes).await;
        let status = response.status();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = String::from_utf8_lossy(response.body()).into_owned();
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        let headers = response.headers().clone();
        Answer { status, json, text, content_type, headers }
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        self.send(self.req("GET", path, token)).await
    }

    pub async fn post(&self, path: &str, token: Option<&str>, body: &Value) -> Answer {
        self.send(self.req("POST", path, token).json(body)).await
    }

    pub async fn put_wasm(&self, path: &str, token: Option<&str>, bytes: &[u8]) -> Answer {
        self.send(self.req("PUT", path, token).wasm(bytes)).await
    }

    /// Creates a tenant and returns its token.
    pub async fn tenant(&self, name: &str, caps: TenantCaps) -> String {
        admin::create_tenant(&self.pool, name, &caps).await.expect("create tenant").1
    }

    /// Uploads module `file` as `task_type` with `token` and expects a new version.
    pub async fn upload(&self, token: &str, task_type: &str, file: &str) -> Value {
        let a =
            self.put_wasm(&format!("/v1/modules/{task_type}"), Some(token), &module(file)).await;
        a.ok(201).clone()
    }

    /// Enqueues `{task_type, payload}` with `token`; returns the task id.
    pub async fn enqueue(&self, token: &str, task_type: &str, payload: Value) -> i64 {
        let body = serde_json::json!({ "task_type": task_type, "payload": payload });
        let a = self.post("/v1/tasks", Some(token), &body).await;
        a.ok(201)["id"].as_i64().expect("task id")
    }
}

/// The bytes of a module built by `scripts/build-modules.sh` (one locator for every test).
pub use common::module_bytes as module;

/// A module from WebAssembly text.
pub fn wat(text: &str) -> Vec<u8> {
    wat::parse_str(text).expect("valid wat")
}

/// A WASI command in miniature: exports `_start` and `memory`, imports nothing.
pub fn tiny_command() -> Vec<u8> {
    sweep_dev::modules::empty_module()
}

/// Makes a dead task directly in the database (as a runner would after the last attempt).
pub async fn make_dead(pool: &PgPool, tenant: &str, task_type: &str) -> i64 {
    sqlx::query_scalar(
        r#"
        insert into sweep.dead_tasks (id, tenant, task_type, payload, priority, attempts,
                                      max_attempts, errors, reason, created_at)
        values (nextval(pg_get_serial_sequence('sweep.tasks', 'id')), $1, $2, '{}', 0, 1, 1,
                jsonb_build_array(jsonb_build_object('kind', $3::text, 'message', 'boom')),
                $3, now())
        returning id
        "#,
    )
    .bind(tenant)
    .bind(task_type)
    .bind(FailureKind::Trap.as_str())
    .fetch_one(pool)
    .await
    .expect("insert dead task")
}

/// The API on an ephemeral port; dropping the sender stops it.
pub async fn serve(db: &Stores) -> (String, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let config = AdminConfig { operator_token: Some(OPERATOR.into()), ..AdminConfig::default() };
    let state = AdminState::new(&db.admin, sandbox(), config).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        sweep::admin::serve_on(listener, state, shutdown).await.expect("serve");
    });
    (url, stop, server)
}
