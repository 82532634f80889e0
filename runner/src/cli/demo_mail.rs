//! The demos' mail provider: a loopback HTTP server standing in for a mail API, and the
//! setup that lets tenant's `send_email` handler (the `send-email` component) reach it the
//! way a real deployment would: an egress list naming the server's exact address, the API key
//! as a sealed tenant secret, the module naming that secret.
//!
//! Invariants:
//! - the server listens on 127.0.0.1 only and answers `POST /send` with `{"id": "demo-<n>"}`
//!   when the request carries the demo's bearer key, 401 otherwise (so a result with a message
//!   id shows the secret arrived);
//! - the key is random per run and printed nowhere; the server stops when dropped.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use rand::RngCore;
use serde_json::json;
use sweep::{
    queue::{self, ModuleSettings, NewTask, PutSecret, TenantEgress},
    sandbox::{EgressPolicy, Sandbox},
    secrets::SecretsKey,
};
use tokio::sync::oneshot;
use warp::Filter;

/// The task type the demos register the `send-email` component as.
pub const TASK_TYPE: &str = "send_email";
/// The secret the component reads its API key from.
const KEY_SECRET: &str = "MAIL_API_KEY";

/// The running stand-in; stops when dropped.
#[derive(Debug)]
pub struct DemoMail {
    addr: SocketAddr,
    key: String,
    sent: Arc<AtomicU64>,
    _stop: oneshot::Sender<()>,
}

impl DemoMail {
    /// Starts the server on a free loopback port with a fresh random key.
    pub async fn start() -> anyhow::Result<DemoMail> {
        let mut raw = [0u8; 16];
        rand::rng().fill_bytes(&mut raw);
        let key = format!("demo-{}", hex::encode(raw));
        let sent = Arc::new(AtomicU64::new(0));
        let (expected, counter) = (format!("Bearer {key}"), Arc::clone(&sent));
        let send = warp::post()
            .and(warp::path!("send"))
            .and(warp::header::optional::<String>("authorization"))
            .map(move |auth: Option<String>| {
                if auth.as_deref() != Some(expected.as_str()) {
                    let body = warp::reply::json(&json!({"error": "bad or missing API key"}));
                    return warp::reply::with_status(body, warp::http::StatusCode::UNAUTHORIZED);
                }
                let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
                let body = warp::reply::json(&json!({"id": format!("demo-{n}")}));
                warp::reply::with_status(body, warp::http::StatusCode::OK)
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("starting the demo mail server on 127.0.0.1")?;
        let addr = listener.local_addr().context("the demo mail server's address")?;
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(
            warp::serve(send)
                .incoming(listener)
                .graceful(async {
                    let _ = stopped.await;
                })
                .run(),
        );
        Ok(DemoMail { addr, key, sent, _stop: stop })
    }

    /// The URL the handler posts to.
    pub fn url(&self) -> String {
        format!("http://{}/send", self.addr)
    }

    /// Emails accepted so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Lets `tenant` send mail through this server: allows its exact address in the tenant's
    /// egress list (a loopback address is refused unless named so), stores the API key as
    /// the tenant's sealed `MAIL_API_KEY` and registers the component at `path` as
    /// [`TASK_TYPE`] receiving that secret.
    pub async fn register(
        &self,
        pool: &sqlx::PgPool,
        sandbox: &Sandbox,
        key: &SecretsKey,
        tenant: &str,
        path: &Path,
    ) -> anyhow::Result<()> {
        let policy = EgressPolicy::parse(&[self.addr.to_string()])
            .map_err(|e| anyhow::anyhow!("the demo mail server's address: {e}"))?;
        let egress = TenantEgress {
            tenant: tenant.to_owned(),
            allow: policy.entries(),
            ..Default::default()
        };
        queue::set_egress(pool, &egress).await.context("setting the demo tenant's egress")?;
        let sealed = key.seal(tenant, KEY_SECRET, &self.key);
        if let PutSecret::TooMany = queue::put_secret(pool, tenant, KEY_SECRET, &sealed).await? {
            anyhow::bail!("tenant {tenant} holds too many secrets to add {KEY_SECRET}");
        }
        let secrets = [KEY_SECRET.to_owned()];
        let settings = ModuleSettings::default();
        super::demo::register_example_with_secrets(
            pool, sandbox, tenant, TASK_TYPE, path, &settings, &secrets,
        )
        .await?;
        Ok(())
    }

    /// An email for the handler to send through this server.
    pub fn task(&self) -> NewTask {
        NewTask::new(
            TASK_TYPE,
            json!({
                "mail_api_url": self.url(),
                "to": "ada@example.com",
                "subject": "Your order has shipped",
                "text": "Order #1815 left the warehouse today.",
            }),
        )
    }
}
