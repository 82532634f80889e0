//! Runners: every runner registered (alive, or silent and not yet pruned) with its heartbeat
//! age; the operator also sees host and process id.

use maud::html;
use warp::http::StatusCode;

use super::layout::{html_response, millis, page, time, POLL};
use super::session::Session;
use super::{query, Page, Pairs};
use crate::admin::AdminState;
use crate::queue;

/// A runner whose heartbeat is older than this is shown as silent (heartbeats come every
/// third of the lease, 10 s by default).
const SILENT_AFTER_MS: i64 = 30_000;

/// `GET /ui/runners`.
pub async fn list(state: AdminState, s: Session, q: Pairs) -> Page {
    query(q)?.finish()?;
    let runners = queue::list_runners(state.store()).await?;
    let now = chrono::Utc::now();
    let body = html! {
        h1 { "Runners" }
        p.muted { "Each " code { "sweep run" } " process claims and runs tasks and heartbeats every third of its lease. A runner that stops heartbeating loses its leases: its tasks run again elsewhere." }
        div #live hx-get="" hx-trigger=(POLL) hx-select="#live" hx-swap="outerHTML" {
            @if runners.is_empty() {
                p.muted #no-runners { "No runner is registered." }
            } @else {
                table #runners {
                    thead { tr {
                        th { "id" } @if s.is_operator() { th { "host" } th.num { "pid" } }
                        th { "started" } th.num { "up" } th.num { "last heartbeat" } th { "state" }
                    } }
                    tbody {
                        @for r in &runners {
                            @let age = (now - r.last_heartbeat_at).num_milliseconds().max(0);
                            tr id=(format!("runner-{}", r.id)) {
                                td { code { (r.id) } }
                                @if s.is_operator() { td { (r.host) } td.num { (r.pid) } }
                                td { (time(r.started_at)) }
                                td.num { (millis((now - r.started_at).num_milliseconds().max(0))) }
                                td.num { (millis(age)) " ago" }
                                td { @if age > SILENT_AFTER_MS { span.paused { "silent" } } @else { span.ok { "alive" } } }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/runners", "Runners", body)))
}
