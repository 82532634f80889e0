//! The login page and the overview: per tenant and task type counts by state, oldest due
//! task, failures and completions, the last hour's chart, and the runners alive.

use maud::html;
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::Response;

use super::layout::{bare, html_response, millis, page, see_other, svg, time, POLL};
use super::session::{self, Session};
use super::{chart, query, Page, Pairs};
use crate::admin::auth::identify_token;
use crate::admin::AdminState;
use crate::queue::{self, TaskState};

pub fn login_page(error: Option<&str>, status: StatusCode) -> Response {
    let body = html! {
        div.login {
            h1 { "Sweep dashboard" }
            @if let Some(e) = error { p.error #error { (e) } }
            form method="post" action="/ui/login" {
                label for="token" { "API token" }
                input #token type="password" name="token" autocomplete="off" required autofocus;
                button #login type="submit" { "Log in" }
            }
            p.muted { "A tenant token, a read-only token or the operator token. It is kept in an
                       HttpOnly cookie for this site only." }
        }
    };
    html_response(status, bare("Log in", body))
}

/// `POST /ui/login`: checks the token like a bearer token and, if it works, sets the cookie.
pub async fn login(
    state: AdminState,
    origin: Option<String>,
    host: Option<String>,
    form: Pairs,
) -> Response {
    if !session::origin_ok(origin.as_deref(), host.as_deref()) {
        return login_page(Some("cross-origin login refused"), StatusCode::FORBIDDEN);
    }
    let token = form.iter().find(|(k, _)| k == "token").map(|(_, v)| v.trim()).unwrap_or("");
    let cookie = match identify_token(&state, token).await {
        Ok(_) => session::open(&state, token).await,
        Err(e) => Err(e),
    };
    match cookie {
        Ok(cookie) => {
            let mut r = see_other("/ui");
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            login_page(Some("That token is not valid."), StatusCode::UNAUTHORIZED)
        }
        Err(e) => login_page(Some(&e.message), e.status),
    }
}

/// `POST /ui/logout`: the session ends on the server, and the cookie goes.
pub async fn logout(state: &AdminState, s: &Session) -> Page {
    session::close(state, s).await?;
    let mut r = see_other("/ui/login");
    if let Ok(v) = HeaderValue::from_str(&session::logout_cookie()) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// `GET /ui` (`?tenant=` narrows the operator's view).
pub async fn overview(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let scope = s.caller().read_scope(q.take("tenant").as_deref())?;
    q.finish()?;
    let scope = scope.as_deref();
    let types = queue::queue_stats(state.store(), scope).await?;
    let minutes = queue::throughput_last_hour(state.store(), scope).await?;
    let runners = queue::list_runners(state.store()).await?;
    let controls = queue::list_queues(state.store(), scope).await?;
    let control = |tenant: &str, task_type: &str| {
        controls.iter().find(|q| q.paused && q.tenant == tenant && q.task_type == task_type)
    };
    let now = chrono::Utc::now();
    let succeeded: i64 = minutes.iter().map(|m| m.succeeded).sum();
    let failed: i64 = minutes.iter().map(|m| m.failed).sum();
    let due: i64 = types.iter().map(|t| t.pending + t.retrying).sum();
    let oldest = types.iter().map(|t| t.oldest_due_ms).max().unwrap_or(0);
    let body = html! {
        h1 { "Overview" }
        div #live hx-get="" hx-trigger=(POLL) hx-select="#live" hx-swap="outerHTML" {
            div.cards {
                div.card { b #due { (due) } "waiting (pending + retrying)" }
                div.card { b #oldest { (millis(oldest)) } "oldest due task waiting" }
                div.card { b #succeeded-hour { (succeeded) } "succeeded, last hour" }
                div.card { b #failed-hour { (failed) } "failed attempts, last hour" }
                div.card { b #runners-alive { (runners.len()) } "runners alive" }
            }
            h2 { "Last hour, per minute" }
            p.legend { span.key { span.swatch style="background:#1f9d55" {} "succeeded" } " " span.key { span.swatch style="background:#d14343" {} "failed attempts" } " " a href="/ui/charts" { "more charts »" } }
            (svg(chart::throughput(&minutes)))
            h2 { "Queues" }
            @if types.is_empty() {
                p.muted #no-queues { "No tasks yet." }
            } @else {
                table #queues {
                    thead { tr {
                        th { "tenant" } th { "task type" }
                        @for state in TaskState::ALL { th.num { (state.as_str()) } }
                        th.num { "oldest due" } th.num { "failures 1 h" } th.num { "done 1 min" }
                    } }
                    tbody {
                        @for t in &types {
                            tr id=(format!("overview-{}-{}", t.tenant, t.task_type.replace(':', "_"))) {
                                td { (t.tenant) }
                                td {
                                    a href=(format!("/ui/tasks?task_type={}", t.task_type)) { (t.task_type) }
                                    @if let Some(q) = control(&t.tenant, &t.task_type) { " " (super::queues::pause_badge(q)) }
                                }
                                td.num { (t.blocked) } td.num { (t.pending) } td.num { (t.running) }
                                td.num { (t.retrying) } td.num { (t.succeeded) } td.num { (t.cancelled) }
                                td.num { a href=(format!("/ui/dead?task_type={}", t.task_type)) { (t.dead) } }
                                td.num { (millis(t.oldest_due_ms)) }
                                td.num { (t.failures_last_hour) } td.num { (t.completed_last_minute) }
                            }
                        }
                    }
                }
            }
            h2 { "Runners" }
            @if runners.is_empty() {
                p.muted #no-runners { "No runner is alive." }
            } @else {
                table #runners {
                    thead { tr {
                        @if s.is_operator() { th { "host" } th.num { "pid" } }
                        th { "id" } th { "started" } th.num { "last heartbeat" }
                    } }
                    tbody {
                        @for r in &runners {
                            tr {
                                @if s.is_operator() { td { (r.host) } td.num { (r.pid) } }
                                td { code { (r.id) } }
                                td { (time(r.started_at)) }
                                td.num { (millis((now - r.last_heartbeat_at).num_milliseconds().max(0))) " ago" }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui", "Overview", body)))
}
