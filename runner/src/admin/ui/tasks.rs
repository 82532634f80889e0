//! Task pages: the list (filter by state, type, creation time; newest first, paginated by id)
//! and one task's detail (payload, result, every attempt with its failure kind, duration,
//! fuel and stderr tail), both live.

use chrono::{DateTime, NaiveDateTime, Utc};
use maud::{html, Markup};
use serde_json::Value;
use warp::http::StatusCode;

use super::layout::{csrf_field, html_response, json_block, page, state_badge, time, POLL};
use super::session::Session;
use super::{query, Page, Pairs};
use crate::admin::error::ApiError;
use crate::admin::AdminState;
use crate::queue::{self, TaskFilter, TaskId, TaskState};

/// Rows per page of the task list.
pub const PAGE: i64 = 50;

fn bad(name: &str, message: String) -> ApiError {
    ApiError::bad_request("invalid_parameter", format!("parameter `{name}`: {message}"))
}

/// `2026-12-01T10:00` (what `<input type="datetime-local">` sends, read as UTC) or RFC 3339.
fn parse_time(name: &str, raw: &str) -> Result<DateTime<Utc>, ApiError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(t.with_timezone(&Utc));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(raw, f).ok())
        .map(|n| n.and_utc())
        .ok_or_else(|| bad(name, format!("expected a time like 2026-12-01T10:00, got {raw:?}")))
}

/// `GET /ui/tasks?state=&task_type=&since=&until=&before=` (`tenant=` for the operator).
pub async fn list(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let tenant = s.caller().read_scope(q.take("tenant").as_deref())?;
    let task_state = match q.take("state") {
        Some(raw) => Some(raw.parse::<TaskState>().map_err(|e| bad("state", e))?),
        None => None,
    };
    let task_type = q.take("task_type");
    if let Some(t) = &task_type {
        queue::validate_task_type(t).map_err(|e| bad("task_type", e.to_string()))?;
    }
    let (since_raw, until_raw) = (q.take("since"), q.take("until"));
    let since = since_raw.as_deref().map(|r| parse_time("since", r)).transpose()?;
    let until = until_raw.as_deref().map(|r| parse_time("until", r)).transpose()?;
    let before = q.take_positive("before")?.map(|b| TaskId::try_from(b).unwrap_or(TaskId::MAX));
    q.finish()?;
    let filter = TaskFilter {
        tenant: tenant.clone(),
        state: task_state,
        task_type: task_type.clone(),
        since,
        until,
        before,
        limit: PAGE,
    };
    let rows = queue::list_tasks(state.store(), &filter).await?;
    let next =
        (rows.len() == usize::try_from(PAGE).unwrap_or(0)).then(|| rows.last().map(|r| r.id));
    let mut keep: Vec<(&str, String)> = Vec::new();
    if s.is_operator() {
        if let Some(t) = &tenant {
            keep.push(("tenant", t.clone()));
        }
    }
    if let Some(st) = task_state {
        keep.push(("state", st.as_str().to_owned()));
    }
    for (k, v) in [("task_type", &task_type), ("since", &since_raw), ("until", &until_raw)] {
        if let Some(v) = v {
            keep.push((k, v.clone()));
        }
    }
    let next_url = next.flatten().map(|id| {
        let mut pairs = keep.clone();
        pairs.push(("before", id.to_string()));
        format!("/ui/tasks?{}", encode(&pairs))
    });
    let body = html! {
        h1 { "Tasks" }
        form.filters method="get" action="/ui/tasks" {
            @if s.is_operator() {
                label { "tenant" input name="tenant" value=[tenant.as_deref()] size="12"; }
            }
            label { "state"
                select name="state" {
                    option value="" { "any" }
                    @for st in TaskState::ALL {
                        option value=(st.as_str()) selected[task_state == Some(st)] { (st.as_str()) }
                    }
                }
            }
            label { "task type" input name="task_type" value=[task_type.as_deref()] size="14"; }
            label { "created from (UTC)" input type="datetime-local" name="since" value=[since_raw.as_deref()]; }
            label { "until (UTC)" input type="datetime-local" name="until" value=[until_raw.as_deref()]; }
            button type="submit" { "Filter" }
            a href="/ui/tasks" { "clear" }
        }
        div #live hx-get="" hx-trigger=(POLL) hx-select="#live" hx-swap="outerHTML" {
            @if rows.is_empty() {
                p.muted #no-tasks { "No tasks match." }
            } @else {
                table #tasks {
                    thead { tr {
                        th.num { "id" } @if s.is_operator() { th { "tenant" } }
                        th { "task type" } th { "state" } th.num { "attempts" }
                        th { "created" } th { "due / ended" } th { "last error" }
                    } }
                    tbody {
                        @for r in &rows {
                            tr id=(format!("task-{}", r.id)) {
                                td.num { a href=(format!("/ui/tasks/{}", r.id)) { (r.id) } }
                                @if s.is_operator() { td { (r.tenant) } }
                                td { (r.task_type) }
                                td { (state_badge(r.state)) }
                                td.num { (r.attempts) " / " (r.max_attempts) }
                                td { (time(r.created_at)) }
                                td { (time(r.at)) }
                                td.muted { (r.last_error.as_deref().map(|e| short(e, 80)).unwrap_or_default()) }
                            }
                        }
                    }
                }
            }
        }
        div.pager {
            @if before.is_some() { a href={"/ui/tasks?" (encode(&keep))} { "« newest" } " " }
            @if let Some(url) = next_url { a #next href=(url) { "older »" } }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/tasks", "Tasks", body)))
}

/// Query-string encoding of simple pairs.
pub fn encode(pairs: &[(&str, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}={}", percent(v))).collect::<Vec<_>>().join("&")
}

fn percent(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let cut: String = s.chars().take(max).collect();
    format!("{cut}…")
}

/// `GET /ui/tasks/{id}`: another tenant's task is a 404 page.
pub async fn show(state: AdminState, s: Session, id: TaskId, q: Pairs) -> Page {
    let mut q = query(q)?;
    let notice = q.take("requeued").map(|_| "Requeued: the task is pending again.".to_owned());
    q.finish()?;
    let task = queue::get_task(state.store(), s.caller().scope(), id).await?;
    let attempts = task.errors.as_array().cloned().unwrap_or_default();
    let can_requeue = task.state == TaskState::Dead && !s.read_only();
    let body = html! {
        h1 { "Task " (task.id) }
        (super::layout::notice(notice))
        div #live hx-get="" hx-trigger=(POLL) hx-select="#live" hx-swap="outerHTML" {
            table.facts {
                tr { th { "state" } td #state { (state_badge(task.state)) } }
                tr { th { "tenant" } td { (task.tenant) } }
                tr { th { "task type" } td { (task.task_type) } }
                tr { th { "attempts" } td #attempts { (task.attempts) " of " (task.max_attempts) } }
                tr { th { "priority" } td { (task.priority) } }
                tr { th { "created" } td { (time(task.created_at)) } }
                @if let Some(t) = task.run_at { tr { th { "due" } td { (time(t)) } } }
                @if let Some(t) = task.started_at { tr { th { "last started" } td { (time(t)) } } }
                @if let Some(t) = task.finished_at { tr { th { "ended" } td { (time(t)) } } }
                @if let Some(k) = &task.dedup_key { tr { th { "dedup key" } td { (k) } } }
                @if let Some(m) = &task.module_sha256 { tr { th { "module sha256" } td { code { (m) } } } }
            }
            @if can_requeue {
                form.inline #requeue-form method="post" action=(format!("/ui/dead/{}/requeue", task.id)) {
                    (csrf_field(&s))
                    button #requeue type="submit" { "Requeue" }
                }
            }
            h2 { "Payload" }
            (json_block("payload", &task.payload))
            @if let Some(result) = &task.result {
                h2 { "Result" }
                (json_block("result", result))
            }
            @if let Some(logs) = &task.logs {
                h2 { "Logs (stderr tail)" }
                pre #logs { (logs) }
            }
            h2 { "Failed attempts" }
            @if attempts.is_empty() {
                p.muted #no-attempts { "None." }
            } @else {
                table #history {
                    thead { tr {
                        th.num { "#" } th { "at" } th { "kind" } th { "message" }
                        th.num { "duration" } th.num { "fuel" } th { "stderr tail" }
                    } }
                    tbody { @for (i, e) in attempts.iter().enumerate() { (attempt_row(i + 1, e)) } }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/tasks", &format!("Task {id}"), body)))
}

fn attempt_row(n: usize, e: &Value) -> Markup {
    let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let number = |k: &str| e.get(k).and_then(Value::as_u64);
    html! {
        tr.attempt {
            td.num { (n) }
            td { (text("at")) }
            td.kind { code { (text("kind")) } }
            td { (text("message")) }
            td.num { @if let Some(ms) = number("duration_ms") { (ms) " ms" } }
            td.num { @if let Some(f) = number("fuel_used") { (f) } }
            td { @let tail = text("stderr"); @if !tail.is_empty() { pre { (tail) } } }
        }
    }
}
