//! Usage: what the tenant's tasks used per task type over a range of UTC days (the current
//! month by default), then per day: attempts, wall time, fuel, peak memory, HTTP requests
//! and bytes. The same totals as `GET /v1/usage`; a tenant sees its own, the operator every
//! tenant's (or one, with `tenant=`).

use chrono::{Datelike, NaiveDate, Utc};
use maud::html;
use warp::http::StatusCode;

use super::layout::{html_response, millis, page};
use super::session::Session;
use super::{query, Page, Pairs};
use crate::admin::error::ApiError;
use crate::admin::AdminState;
use crate::queue::{self, UsageDay, MAX_USAGE_DAYS};

fn day(name: &str, raw: &str) -> Result<NaiveDate, ApiError> {
    NaiveDate::parse_from_str(raw, "%Y-%m-%d").map_err(|_| {
        ApiError::bad_request("invalid_parameter", format!("{name} must be a date, YYYY-MM-DD"))
    })
}

fn bytes(n: i64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n.max(0) as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{n} B"),
        _ => format!("{value:.1} {}", UNITS[unit]),
    }
}

/// `GET /ui/usage?from=&to=&tenant=`.
pub async fn page_usage(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let requested = q.take("tenant");
    let from = q.take("from").map(|v| day("from", &v)).transpose()?;
    let to = q.take("to").map(|v| day("to", &v)).transpose()?;
    q.finish()?;
    let scope = s.caller().read_scope(requested.as_deref())?;
    let to = to.unwrap_or_else(|| Utc::now().date_naive());
    let from = from.unwrap_or_else(|| to.with_day(1).unwrap_or(to));
    if from > to || (to - from).num_days() >= MAX_USAGE_DAYS {
        return Err(ApiError::bad_request(
            "invalid_range",
            format!("from must not be after to, and a range is at most {MAX_USAGE_DAYS} days"),
        ));
    }
    let days = queue::usage_days(state.store(), scope.as_deref(), None, from, to).await?;
    let totals = crate::admin::capability_models::UsageResponse::new(from, to, days.clone()).totals;
    let row = |u: &UsageDay| {
        html! {
            td.num { (u.attempts) } td.num { (u.failed) } td.num { (millis(u.wall_ms)) }
            td.num { (u.fuel) } td.num { (bytes(u.peak_memory_bytes)) }
            td.num { (u.http_requests) } td.num { (u.http_refused) }
            td.num { (bytes(u.bytes_sent)) } td.num { (bytes(u.bytes_received)) }
        }
    };
    let heads = html! {
        th.num { "attempts" } th.num { "failed" } th.num { "wall time" } th.num { "fuel" }
        th.num { "peak memory" } th.num { "HTTP requests" } th.num { "refused" }
        th.num { "sent" } th.num { "received" }
    };
    let body = html! {
        h1 { "Usage" }
        p.muted { "What tasks used, per task type and UTC day: every attempt that ran, counted when its runner reported it. Kept apart from the task history, so retention does not shorten it." }
        form.filters method="get" action="/ui/usage" {
            label { "from " input type="date" name="from" value=(from); }
            " "
            label { "to " input type="date" name="to" value=(to); }
            @if s.is_operator() {
                " "
                label { "tenant " input type="text" name="tenant" value=[requested.as_deref()] placeholder="all"; }
            }
            " "
            button type="submit" { "Show" }
        }
        h2 { "From " (from) " to " (to) }
        @if totals.is_empty() {
            p.muted #no-usage { "Nothing ran in this range." }
        } @else {
            table #usage-totals {
                thead { tr { th { "tenant" } th { "task type" } (heads) } }
                tbody {
                    @for t in &totals {
                        @let u = UsageDay {
                            tenant: t.tenant.clone(), task_type: t.task_type.clone(), day: from,
                            attempts: t.attempts, succeeded: t.succeeded, failed: t.failed,
                            wall_ms: t.wall_ms, fuel: t.fuel, peak_memory_bytes: t.peak_memory_bytes,
                            http_requests: t.http_requests, http_refused: t.http_refused,
                            bytes_sent: t.bytes_sent, bytes_received: t.bytes_received,
                        };
                        tr { td { (t.tenant) } td { code { (t.task_type) } } (row(&u)) }
                    }
                }
            }
            h2 { "By day" }
            table #usage-days {
                thead { tr { th { "day" } th { "tenant" } th { "task type" } (heads) } }
                tbody {
                    @for u in &days {
                        tr { td { (u.day) } td { (u.tenant) } td { code { (u.task_type) } } (row(u)) }
                    }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/usage", "Usage", body)))
}
