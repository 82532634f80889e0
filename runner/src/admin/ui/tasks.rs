//! Task pages: the list (state tabs with counts; search by id, type prefix, payload and
//! creation time; newest first, paginated by id; every filter in the URL; rows to select for
//! the bulk actions of `bulk.rs`) and one task's detail (payload, result, each attempt with
//! its failure kind, duration, fuel and stderr tail, a cancellation shown as one; cancel and
//! requeue), both live.

use maud::{html, Markup};
use serde_json::Value;
use warp::http::StatusCode;

use super::layout::{csrf_field, html_response, json_block, notice, page, state_badge, time, POLL};
use super::session::Session;
use super::{query, Page, Pairs};
use crate::admin::params::TaskQuery;
use crate::admin::AdminState;
use crate::queue::{self, StateCounts, TaskId, TaskState, COUNT_CAP};

/// `GET /ui/tasks?state=&task_type=&type_prefix=&id=&payload=&since=&until=&before=`
/// (`tenant=` for the operator): the same filter as `GET /v1/tasks`.
pub async fn list(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let tenant = s.caller().read_scope(q.take("tenant").as_deref())?;
    let notice_text = q.take("done");
    let TaskQuery { filter, given } = TaskQuery::take(&mut q, tenant.clone())?;
    q.finish()?;
    let rows = queue::list_tasks(state.store(), &filter).await?;
    let counts = queue::count_tasks(state.store(), &filter).await?;
    // A paused queue of the type in view says so here too, where its counts are.
    let paused: Vec<queue::QueueRow> = match &filter.task_type {
        Some(t) => queue::list_queues(state.store(), tenant.as_deref())
            .await?
            .into_iter()
            .filter(|q| q.paused && &q.task_type == t)
            .collect(),
        None => Vec::new(),
    };
    let full = rows.len() == usize::try_from(filter.limit).unwrap_or(0);
    // The view's parameters, as given: tabs, pages and bulk actions keep them.
    let mut keep: Vec<(&str, String)> = Vec::new();
    if let (true, Some(t)) = (s.is_operator(), &tenant) {
        keep.push(("tenant", t.clone()));
    }
    keep.extend(given.iter().cloned());
    let without_state: Vec<(&str, String)> =
        keep.iter().filter(|(k, _)| *k != "state").cloned().collect();
    let next_url = full.then(|| rows.last().map(|r| r.id)).flatten().map(|id| {
        let mut pairs = keep.clone();
        pairs.push(("before", id.to_string()));
        format!("/ui/tasks?{}", encode(&pairs))
    });
    let value = |name: &str| given.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone());
    let total: i64 = TaskState::ALL.iter().map(|st| counts.of(*st)).sum();
    let writer = !s.read_only();
    let body = html! {
        h1 { "Tasks" }
        (notice(notice_text))
        @for q in &paused {
            p.paused-banner #paused-banner {
                "Queue " (q.tenant) "/" (q.task_type)
                @if q.paused_at.is_none() && q.tenant_paused_at.is_none() {
                    " has no module ready yet: its tasks wait until its first version's compile \
                     ends ("
                    a href="/ui/modules" { "Modules" } ")."
                } @else {
                    " is " (super::queues::pause_badge(q)) ": its tasks wait until it is resumed ("
                    a href="/ui/queues" { "Queues" } ")."
                }
            }
        }
        form.filters #search method="get" action="/ui/tasks" {
            @if s.is_operator() {
                label { "tenant" input name="tenant" value=[tenant.as_deref()] size="12"; }
            }
            @if let Some(st) = filter.state { input type="hidden" name="state" value=(st.as_str()); }
            @if let Some(t) = &filter.task_type {
                label { "task type" input name="task_type" value=(t) size="14"; }
            }
            label { "type starts with" input #type-prefix name="type_prefix" value=[value("type_prefix")] size="14" placeholder="mail."; }
            label { "id" input #search-id name="id" value=[value("id")] size="8" inputmode="numeric"; }
            label { "payload contains" input #search-payload name="payload" value=[value("payload")] size="24" placeholder=r#"user.id=42 or {"to": "a@b"}"#; }
            label { "created from (UTC)" input type="datetime-local" name="since" value=[value("since")]; }
            label { "until (UTC)" input type="datetime-local" name="until" value=[value("until")]; }
            button type="submit" { "Search" }
            a href="/ui/tasks" { "clear" }
        }
        nav.tabs #state-tabs {
            a href={"/ui/tasks?" (encode(&without_state))} class=[filter.state.is_none().then_some("here")] id="tab-all" {
                "all " span.count { (count_text(total, total >= COUNT_CAP)) }
            }
            @for st in TaskState::ALL {
                a href=(tab_url(&without_state, st)) id=(format!("tab-{st}"))
                    class=[(filter.state == Some(st)).then_some("here")] {
                    (st.as_str()) " " span.count { (count_text(counts.of(st), counts.of(st) >= COUNT_CAP)) }
                }
            }
        }
        @if writer {
            (bulk_bar(&s, &keep, &counts, filter.state))
        }
        div #live hx-get="" hx-trigger=(format!("{POLL} [!document.querySelector('input.pick:checked')]")) hx-select="#live" hx-swap="outerHTML" {
            @if rows.is_empty() {
                p.muted #no-tasks { "No tasks match." }
            } @else {
                table #tasks {
                    thead { tr {
                        @if writer { th.pick { input #pick-all type="checkbox" title="select every row on this page"
                            onclick="document.querySelectorAll('input.pick').forEach(b => b.checked = this.checked)"; } }
                        th.num { "id" } @if s.is_operator() { th { "tenant" } }
                        th { "task type" } th { "state" } th.num { "attempts" }
                        th { "created" } th { "due / ended" } th { "last error" }
                    } }
                    tbody {
                        @for r in &rows {
                            tr id=(format!("task-{}", r.id)) {
                                @if writer { td.pick { input.pick type="checkbox" name="task" value=(r.id) form="bulk"; } }
                                td.num { a href=(format!("/ui/tasks/{}", r.id)) { (r.id) } }
                                @if s.is_operator() { td { (r.tenant) } }
                                td { (r.task_type) }
                                td { (state_badge(r.state)) }
                                td.num { (r.attempts) " / " (r.max_attempts) }
                                td { (time(r.created_at)) }
                                td { (time(r.at)) }
                                td.muted.clip { (r.last_error.as_deref().map(|e| short(e, 80)).unwrap_or_default()) }
                            }
                        }
                    }
                }
            }
        }
        div.pager {
            @if filter.before.is_some() { a href={"/ui/tasks?" (encode(&keep))} { "« newest" } " " }
            @if let Some(url) = next_url { a #next href=(url) { "older »" } }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/tasks", "Tasks", body)))
}

/// The list of `pairs` (a view without its state) in state `st`.
fn tab_url(pairs: &[(&str, String)], st: TaskState) -> String {
    let mut pairs = pairs.to_vec();
    pairs.push(("state", st.as_str().to_owned()));
    format!("/ui/tasks?{}", encode(&pairs))
}

fn count_text(n: i64, capped: bool) -> String {
    if capped {
        format!("{n}+")
    } else {
        n.to_string()
    }
}

/// The bulk actions: on the selected rows, or on everything the filter matches (each asks
/// for a confirmation with the count first, see `bulk.rs`).
fn bulk_bar(
    s: &Session,
    keep: &[(&str, String)],
    counts: &StateCounts,
    state: Option<TaskState>,
) -> Markup {
    let in_view = |states: &[TaskState]| -> i64 {
        states
            .iter()
            .filter(|st| state.is_none_or(|want| want == **st))
            .map(|st| counts.of(*st))
            .sum()
    };
    let live =
        in_view(&[TaskState::Blocked, TaskState::Pending, TaskState::Running, TaskState::Retrying]);
    let dead = in_view(&[TaskState::Dead]);
    let ended = in_view(&[TaskState::Succeeded, TaskState::Cancelled, TaskState::Dead]);
    html! {
        form.bulk #bulk method="post" action="/ui/tasks/bulk" {
            (csrf_field(s))
            @for (k, v) in keep { input type="hidden" name={"f_" (k)} value=(v); }
            span.muted { "Selected: " }
            button.quiet #cancel-selected type="submit" name="action" value="cancel" { "Cancel" }
            button.quiet #requeue-selected type="submit" name="action" value="requeue" { "Requeue" }
            button.danger #delete-selected type="submit" name="action" value="delete" { "Delete" }
            span.muted { " · Everything matching: " }
            @if live > 0 { button.quiet #cancel-matching type="submit" name="action" value="cancel-matching" { "Cancel " (count_text(live, live >= COUNT_CAP)) } " " }
            @if dead > 0 { button.quiet #requeue-matching type="submit" name="action" value="requeue-matching" { "Requeue " (count_text(dead, dead >= COUNT_CAP)) " dead" } " " }
            @if ended > 0 { button.danger #delete-matching type="submit" name="action" value="delete-matching" { "Delete " (count_text(ended, ended >= COUNT_CAP)) " ended" } }
        }
    }
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
    let notice_text = match (q.take("requeued"), q.take("cancel")) {
        (Some(_), _) => Some("Requeued: the task is pending again.".to_owned()),
        (_, Some(how)) if how == "requested" => {
            Some("Cancel requested: its runner is stopping it; it ends cancelled.".to_owned())
        }
        (_, Some(_)) => Some("Cancelled.".to_owned()),
        _ => None,
    };
    q.finish()?;
    let task = queue::get_task(state.store(), s.caller().scope(), id).await?;
    let entries = task.errors.as_array().cloned().unwrap_or_default();
    let history = History::of(&entries);
    let writer = !s.read_only();
    let can_requeue = task.state == TaskState::Dead && writer;
    let can_cancel = task.state.is_live() && writer && task.cancel_requested_at.is_none();
    let body = html! {
        h1 { "Task " (task.id) }
        (notice(notice_text))
        div #live hx-get="" hx-trigger=(POLL) hx-select="#live" hx-swap="outerHTML" {
            table.facts {
                tr { th { "state" } td #state {
                    (state_badge(task.state))
                    @if let Some(at) = task.cancel_requested_at { " " span.muted #cancel-requested { "cancel requested " (time(at)) } }
                } }
                tr { th { "tenant" } td { (task.tenant) } }
                tr { th { "task type" } td { (task.task_type) } }
                tr { th { "attempts" } td #attempts {
                    (task.attempts) " of " (task.max_attempts)
                    @if history.rounds > 1 {
                        span.muted { " since its last requeue (requeued " (history.rounds - 1) "×; "
                            (history.earlier + usize::try_from(task.attempts).unwrap_or(0)) " attempts in all)" }
                    }
                } }
                tr { th { "priority" } td { (task.priority) } }
                tr { th { "created" } td { (time(task.created_at)) } }
                @if let Some(t) = task.run_at { tr { th { "due" } td { (time(t)) } } }
                @if let Some(t) = task.started_at { tr { th { "last started" } td { (time(t)) } } }
                @if let Some(t) = task.finished_at { tr { th { "ended" } td { (time(t)) } } }
                @if let Some(k) = &task.dedup_key { tr { th { "dedup key" } td { (k) } } }
                @if let Some(m) = &task.module_sha256 { tr { th { "module sha256" } td { code { (m) } } } }
            }
            div.actions {
                @if can_requeue {
                    form.inline #requeue-form method="post" action=(format!("/ui/dead/{}/requeue", task.id)) {
                        (csrf_field(&s))
                        button #requeue type="submit" { "Requeue" }
                    }
                }
                @if can_cancel {
                    form.inline #cancel-form method="post" action=(format!("/ui/tasks/{}/cancel", task.id))
                        onsubmit="return confirm('Cancel this task?')" {
                        (csrf_field(&s))
                        button.danger #cancel type="submit" {
                            @if task.state == TaskState::Running { "Cancel (stop it)" } @else { "Cancel" }
                        }
                    }
                }
            }
            @if let Some(c) = &history.cancellation { (cancellation(c)) }
            h2 { "Payload" }
            (json_block("payload", &task.payload))
            @if let Some(result) = &task.result {
                h2 { "Result" }
                (json_block("result", result))
            }
            @if let Some(logs) = &task.logs {
                h2 { "Logs (stderr tail)" }
                (stderr_block("logs", logs))
            }
            h2 { "Failed attempts" }
            @if history.failed.is_empty() {
                p.muted #no-attempts { "None." }
            } @else {
                table #history {
                    thead { tr {
                        th.num { "#" } th { "at" } th { "kind" } th { "message" }
                        th.num { "duration" } th.num { "fuel" } th.wide { "stderr tail" }
                    } }
                    tbody {
                        @for item in &history.failed {
                            @match item {
                                Item::Attempt(e) => (attempt_row(e)),
                                Item::Requeued => tr.requeued { td colspan="7" { "requeued: attempts counted from 1 again" } },
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/tasks", &format!("Task {id}"), body)))
}

/// `POST /ui/tasks/{id}/cancel`: as `POST /v1/tasks/{id}/cancel`, then back to the task.
pub async fn cancel(state: AdminState, s: Session, id: TaskId, form: Pairs) -> Page {
    query(form)?.finish()?;
    let done = queue::cancel(state.store(), s.caller().scope(), id).await?;
    tracing::info!(id, who = %s.label(), "cancelled from the dashboard");
    let how = match done {
        queue::Cancel::Cancelled => "done",
        queue::Cancel::Requested { .. } => "requested",
    };
    Ok(super::layout::see_other(&format!("/ui/tasks/{id}?cancel={how}")))
}

/// A task's error history read for people: failed attempts in order, a marker where a requeue
/// started the count again (an attempt number not above the one before), and the
/// cancellation apart (it is how the task ended, not a failure).
struct History<'a> {
    failed: Vec<Item<'a>>,
    cancellation: Option<&'a Value>,
    rounds: usize,
    /// Attempts made before the last requeue.
    earlier: usize,
    failed_in_last_round: usize,
}

enum Item<'a> {
    Attempt(&'a Value),
    Requeued,
}

impl<'a> History<'a> {
    fn of(entries: &'a [Value]) -> Self {
        let mut h = History {
            failed: Vec::new(),
            cancellation: None,
            rounds: 1,
            earlier: 0,
            failed_in_last_round: 0,
        };
        let mut last_attempt = 0;
        for e in entries {
            let attempt = e.get("attempt").and_then(Value::as_i64).unwrap_or(0);
            if attempt <= last_attempt && last_attempt > 0 {
                h.failed.push(Item::Requeued);
                h.rounds += 1;
                h.earlier += h.failed_in_last_round;
                h.failed_in_last_round = 0;
            }
            last_attempt = attempt;
            if e.get("kind").and_then(Value::as_str) == Some("cancelled") {
                h.cancellation = Some(e);
            } else {
                h.failed.push(Item::Attempt(e));
                h.failed_in_last_round += 1;
            }
        }
        h
    }
}

fn cancellation(e: &Value) -> Markup {
    let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let stop = e.get("stop_ms").and_then(Value::as_f64);
    let requested = chrono::DateTime::parse_from_rfc3339(&text("requested_at"))
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc));
    html! {
        div.cancelled #cancellation {
            h2 { "Cancelled" }
            p {
                "Attempt " (e.get("attempt").and_then(Value::as_i64).unwrap_or(0))
                " was cancelled while running"
                @if let Some(at) = requested { " (requested " (time(at)) ")" }
                @if let Some(ms) = stop { "; its runner stopped it in " (format!("{ms:.1}")) " ms" }
                "."
            }
            @if !text("ended_as").is_empty() {
                p.muted { "The attempt ended on its own first (" code { (text("ended_as")) } "); the cancel applied all the same." }
            }
            @if !text("message").is_empty() { p.muted { (text("message")) } }
            @if !text("stderr").is_empty() { (stderr_block("cancel-stderr", &text("stderr"))) }
        }
    }
}

/// A stderr tail: wrapped, and collapsed to its last line when longer than a few lines.
fn stderr_block(id: &str, tail: &str) -> Markup {
    let lines = tail.lines().count();
    let last = tail.lines().last().unwrap_or("");
    html! {
        @if lines <= 3 && tail.len() <= 300 {
            pre.wrap id=(id) { (tail) }
        } @else {
            details.stderr id=(id) {
                summary { (short(last, 100)) span.muted { " (" (lines) " lines)" } }
                pre.wrap { (tail) }
            }
        }
    }
}

fn attempt_row(e: &Value) -> Markup {
    let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let number = |k: &str| e.get(k).and_then(Value::as_u64);
    html! {
        tr.attempt {
            td.num { (number("attempt").unwrap_or(0)) }
            td {
                @match chrono::DateTime::parse_from_rfc3339(&text("at")) {
                    Ok(at) => (time(at.with_timezone(&chrono::Utc))),
                    Err(_) => (text("at")),
                }
            }
            td.kind { code { (text("kind")) } }
            td.clip { (text("message")) }
            td.num { @if let Some(ms) = number("duration_ms") { (ms) " ms" } }
            td.num { @if let Some(f) = number("fuel_used") { (f) } }
            td.wide { @let tail = text("stderr"); @if !tail.is_empty() { (stderr_block("", &tail)) } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn history_marks_requeues_and_keeps_cancellations_apart() {
        let entries = vec![
            json!({"attempt": 1, "kind": "timeout"}),
            json!({"attempt": 2, "kind": "trap"}),
            json!({"attempt": 1, "kind": "handler_error"}),
            json!({"attempt": 2, "kind": "cancelled"}),
        ];
        let h = History::of(&entries);
        assert_eq!(h.rounds, 2);
        assert_eq!(h.failed.len(), 4, "three attempts and one requeue marker");
        assert!(matches!(h.failed[2], Item::Requeued));
        assert_eq!((h.earlier, h.failed_in_last_round), (2, 1));
        assert!(h.cancellation.is_some());
    }
}
