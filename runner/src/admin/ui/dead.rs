//! Dead letters: the list (filter by task type, paginated by id), requeue one, requeue all
//! that match the filter.
//!
//! Requeue-all walks the filtered list a page at a time through the same
//! [`queue::requeue`] the API uses (one statement per task, so a task whose dedup key was
//! taken meanwhile stays dead and is counted, not an error for the rest), at most
//! [`MAX_REQUEUE_ALL`] per click.

use maud::html;
use warp::http::StatusCode;

use super::layout::{csrf_field, html_response, notice, page, see_other, time, POLL};
use super::session::Session;
use super::tasks::{encode, short};
use super::{query, Page, Pairs};
use crate::admin::error::ApiError;
use crate::admin::AdminState;
use crate::queue::{self, QueueError, TaskId};

const PAGE: i64 = 50;
/// Most tasks one "requeue all" click moves.
pub const MAX_REQUEUE_ALL: usize = 10_000;

fn task_type_param(raw: Option<String>) -> Result<Option<String>, ApiError> {
    if let Some(t) = &raw {
        queue::validate_task_type(t)
            .map_err(|e| ApiError::bad_request("invalid_task_type", e.to_string()))?;
    }
    Ok(raw)
}

/// `GET /ui/dead?task_type=&after=` (`tenant=` for the operator).
pub async fn list(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let tenant = s.caller().read_scope(q.take("tenant").as_deref())?;
    let task_type = task_type_param(q.take("task_type"))?;
    let after = q.take_positive("after")?.map(|a| TaskId::try_from(a).unwrap_or(TaskId::MAX));
    let requeued = q.take_positive("requeued")?;
    let kept = q.take_positive("kept")?;
    q.finish()?;
    let rows =
        queue::list_dead(state.store(), tenant.as_deref(), task_type.as_deref(), after, PAGE)
            .await?;
    let message = requeued.map(|n| match kept {
        Some(k) => format!("Requeued {n} tasks; {k} stayed dead (their dedup key is in use)."),
        None => format!("Requeued {n} tasks."),
    });
    let mut keep: Vec<(&str, String)> = Vec::new();
    if let (true, Some(t)) = (s.is_operator(), &tenant) {
        keep.push(("tenant", t.clone()));
    }
    if let Some(t) = &task_type {
        keep.push(("task_type", t.clone()));
    }
    let full = rows.len() == usize::try_from(PAGE).unwrap_or(0);
    let next = full.then(|| rows.last().map(|r| r.id)).flatten().map(|id| {
        let mut pairs = keep.clone();
        pairs.push(("after", id.to_string()));
        format!("/ui/dead?{}", encode(&pairs))
    });
    let body = html! {
        h1 { "Dead letters" }
        (notice(message))
        form.filters method="get" action="/ui/dead" {
            @if s.is_operator() {
                label { "tenant" input name="tenant" value=[tenant.as_deref()] size="12"; }
            }
            label { "task type" input name="task_type" value=[task_type.as_deref()] size="14"; }
            button type="submit" { "Filter" }
            a href="/ui/dead" { "clear" }
        }
        @if !s.read_only() && !rows.is_empty() {
            form.inline #requeue-all-form method="post" action="/ui/dead/requeue" {
                (csrf_field(&s))
                @if let (true, Some(t)) = (s.is_operator(), &tenant) { input type="hidden" name="tenant" value=(t); }
                @if let Some(t) = &task_type { input type="hidden" name="task_type" value=(t); }
                button #requeue-all type="submit" {
                    "Requeue all dead tasks"
                    @if let Some(t) = &task_type { " of type " (t) }
                }
            }
        }
        div #live hx-get="" hx-trigger=(POLL) hx-select="#live" hx-swap="outerHTML" {
            @if rows.is_empty() {
                p.muted #no-dead { "No dead tasks." }
            } @else {
                table #dead {
                    thead { tr {
                        th.num { "id" } @if s.is_operator() { th { "tenant" } }
                        th { "task type" } th { "reason" } th.num { "attempts" }
                        th { "died" } th { "last error" } th {}
                    } }
                    tbody {
                        @for r in &rows {
                            tr id=(format!("dead-{}", r.id)) {
                                td.num { a href=(format!("/ui/tasks/{}", r.id)) { (r.id) } }
                                @if s.is_operator() { td { (r.tenant) } }
                                td { (r.task_type) }
                                td { code { (r.reason) } }
                                td.num { (r.attempts) " / " (r.max_attempts) }
                                td { (time(r.died_at)) }
                                td.muted { (r.last_error.as_deref().map(|e| short(e, 80)).unwrap_or_default()) }
                                td {
                                    @if !s.read_only() {
                                        form.inline method="post" action=(format!("/ui/dead/{}/requeue", r.id)) {
                                            (csrf_field(&s))
                                            button type="submit" { "Requeue" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        div.pager { @if let Some(url) = next { a #next href=(url) { "more »" } } }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/dead", "Dead letters", body)))
}

/// `POST /ui/dead/{id}/requeue`: back to pending, then to the task's page.
pub async fn requeue_one(state: AdminState, s: Session, id: TaskId, form: Pairs) -> Page {
    query(form)?.finish()?;
    queue::requeue(state.store(), s.caller().scope(), id).await?;
    tracing::info!(id, who = %s.label(), "requeued from the dashboard");
    Ok(see_other(&format!("/ui/tasks/{id}?requeued=1")))
}

/// `POST /ui/dead/requeue` with the list's filter (`task_type`, operator `tenant`).
pub async fn requeue_all(state: AdminState, s: Session, form: Pairs) -> Page {
    let mut q = query(form)?;
    let tenant = s.caller().read_scope(q.take("tenant").as_deref())?;
    let task_type = task_type_param(q.take("task_type"))?;
    q.finish()?;
    let (mut moved, mut kept, mut after) = (0usize, 0usize, None);
    'pages: while moved + kept < MAX_REQUEUE_ALL {
        let page =
            queue::list_dead(state.store(), tenant.as_deref(), task_type.as_deref(), after, 500)
                .await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for task in &page {
            match queue::requeue(state.store(), s.caller().scope(), task.id).await {
                Ok(_) => moved += 1,
                // Taken by a live task meanwhile, or requeued by someone else: leave it.
                Err(QueueError::DedupKeyTaken { .. }) => kept += 1,
                Err(QueueError::TaskNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            if moved + kept >= MAX_REQUEUE_ALL {
                break 'pages;
            }
        }
    }
    tracing::info!(moved, kept, who = %s.label(), "requeued all matching from the dashboard");
    let mut pairs: Vec<(&str, String)> = vec![("requeued", moved.to_string())];
    if kept > 0 {
        pairs.push(("kept", kept.to_string()));
    }
    if let (true, Some(t)) = (s.is_operator(), &tenant) {
        pairs.push(("tenant", t.clone()));
    }
    if let Some(t) = &task_type {
        pairs.push(("task_type", t.clone()));
    }
    Ok(see_other(&format!("/ui/dead?{}", encode(&pairs))))
}
