//! Bodies of the capability routes: a tenant's egress policy and HTTP limits, its secrets, and
//! usage. (The other routes' bodies are in `models.rs`; the same rules hold: unknown fields
//! refused, integers as JSON Schema counts them.)

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::json_input::optional_integer;
use crate::queue::{SecretInfo, TenantEgress, UsageDay};
use crate::sandbox::{HttpLimits, MAX_EGRESS_ENTRIES};

/// Most requests per task an override may allow.
pub const MAX_HTTP_REQUESTS: u32 = 10_000;
/// Most response bytes per task an override may allow (1 GiB).
pub const MAX_HTTP_RESPONSE_BYTES: u64 = 1 << 30;
/// Longest time per request an override may allow (10 minutes; the task's wall clock still
/// bounds it).
pub const MAX_HTTP_REQUEST_TIMEOUT_MS: u64 = 600_000;

const _: () = assert!(MAX_EGRESS_ENTRIES == 100);

/// `PUT /v1/tenants/{name}/egress` body: the whole policy (an override left out or `null` is
/// the deployment's default).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressRequest {
    /// Hosts the tenant's handlers may send HTTP requests to: `host`, `host:port`,
    /// `*.example.org` (any name under it), an IPv4 literal or a bracketed IPv6 literal
    /// (`[::1]:8080`). Loopback, private and link-local addresses are reachable only through
    /// an entry naming that exact IP literal. Empty: nothing.
    #[schema(max_items = 100)]
    pub allow: Vec<String>,
    /// Requests one task may send (refused ones count).
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 10000)]
    pub max_requests: Option<u32>,
    /// Response body bytes one task may receive, all its requests together.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 1073741824)]
    pub max_response_bytes: Option<u64>,
    /// How long one request may take, connect to last byte, in milliseconds.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 1, maximum = 600000)]
    pub request_timeout_ms: Option<u64>,
}

/// HTTP limits in force for a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct HttpLimitsView {
    pub max_requests: u32,
    pub max_response_bytes: u64,
    pub request_timeout_ms: u64,
}

impl From<HttpLimits> for HttpLimitsView {
    fn from(l: HttpLimits) -> Self {
        HttpLimitsView {
            max_requests: l.max_requests,
            max_response_bytes: l.max_response_bytes,
            request_timeout_ms: u64::try_from(l.request_timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// A tenant's egress policy (`GET`/`PUT /v1/tenants/{name}/egress`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct EgressResponse {
    pub tenant: String,
    /// The allow list in canonical form (lowercase, sorted, duplicates removed).
    pub allow: Vec<String>,
    /// The tenant's override (`null`: the deployment's default).
    #[schema(required)]
    pub max_requests: Option<i32>,
    #[schema(required)]
    pub max_response_bytes: Option<i64>,
    #[schema(required)]
    pub request_timeout_ms: Option<i64>,
    /// The limits its tasks run under: its overrides, else the deployment's defaults.
    pub effective: HttpLimitsView,
    /// When the policy was last set (`null`: never; nothing is allowed).
    #[schema(required)]
    pub updated_at: Option<DateTime<Utc>>,
}

impl EgressResponse {
    pub fn new(e: TenantEgress, defaults: HttpLimits) -> Self {
        let effective = e.http_limits(defaults).into();
        EgressResponse {
            tenant: e.tenant,
            allow: e.allow,
            max_requests: e.max_requests,
            max_response_bytes: e.max_response_bytes,
            request_timeout_ms: e.request_timeout_ms,
            effective,
            updated_at: e.updated_at,
        }
    }
}

/// `PUT /v1/secrets/{name}` body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRequest {
    /// The value: at most 16 KiB of UTF-8 (a longer one is `413`), no NUL. Stored
    /// encrypted; never shown again.
    #[schema(min_length = 1)]
    pub value: String,
}

/// `GET /v1/secrets`: names and times, never values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SecretsResponse {
    pub secrets: Vec<SecretInfo>,
}

/// One tenant's task type over the whole range of a usage answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct UsageTotal {
    pub tenant: String,
    pub task_type: String,
    pub attempts: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub wall_ms: i64,
    pub fuel: i64,
    pub peak_memory_bytes: i64,
    pub http_requests: i64,
    pub http_refused: i64,
    pub bytes_sent: i64,
    pub bytes_received: i64,
}

/// `GET /v1/usage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct UsageResponse {
    /// First day (UTC) of the range.
    pub from: NaiveDate,
    /// Last day (UTC) of the range, included.
    pub to: NaiveDate,
    /// Per tenant, task type and day, by day.
    pub days: Vec<UsageDay>,
    /// Per tenant and task type over the range.
    pub totals: Vec<UsageTotal>,
}

impl UsageResponse {
    pub fn new(from: NaiveDate, to: NaiveDate, days: Vec<UsageDay>) -> Self {
        let mut totals: Vec<UsageTotal> = Vec::new();
        let mut sorted: Vec<&UsageDay> = days.iter().collect();
        sorted.sort_by(|a, b| (&a.tenant, &a.task_type).cmp(&(&b.tenant, &b.task_type)));
        for d in sorted {
            let same =
                totals.last().is_some_and(|t| t.tenant == d.tenant && t.task_type == d.task_type);
            if !same {
                totals.push(UsageTotal {
                    tenant: d.tenant.clone(),
                    task_type: d.task_type.clone(),
                    ..UsageTotal::default()
                });
            }
            if let Some(t) = totals.last_mut() {
                let add = |a: &mut i64, b: i64| *a = a.saturating_add(b);
                add(&mut t.attempts, d.attempts);
                add(&mut t.succeeded, d.succeeded);
                add(&mut t.failed, d.failed);
                add(&mut t.wall_ms, d.wall_ms);
                add(&mut t.fuel, d.fuel);
                t.peak_memory_bytes = t.peak_memory_bytes.max(d.peak_memory_bytes);
                add(&mut t.http_requests, d.http_requests);
                add(&mut t.http_refused, d.http_refused);
                add(&mut t.bytes_sent, d.bytes_sent);
                add(&mut t.bytes_received, d.bytes_received);
            }
        }
        UsageResponse { from, to, days, totals }
    }
}
