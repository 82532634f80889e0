//! Workflows: the tenant's workflows with their steps counted by state, and one workflow drawn
//! as its steps (boxes by dependency level, coloured by state, lines from each step to the
//! steps it waits for) with a table of each step's state, attempts and result; cancel it.
//! Reads and the cancel go through the same queue functions as `/v1/workflows`.

use std::collections::HashMap;

use maud::{html, Markup};
use warp::http::StatusCode;

use super::layout::{csrf_field, html_response, notice, page, see_other, state_badge, time, POLL};
use super::session::Session;
use super::tasks::encode;
use super::{query, Page, Pairs};
use crate::admin::AdminState;
use crate::queue::{self, StepView, WorkflowView};

/// Most steps drawn; a larger workflow is shown as its table only.
const MAX_DRAWN: usize = 400;

/// `GET /ui/workflows` (`tenant=` narrows the operator's view).
pub async fn list(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let scope = s.caller().read_scope(q.take("tenant").as_deref())?;
    q.finish()?;
    let workflows = queue::list_workflows(state.store(), scope.as_deref(), None, 50).await?;
    let body = html! {
        h1 { "Workflows" }
        p.muted { "Steps with dependencies, created together with POST /v1/workflows or " code { "sweep workflow create" } "." }
        div #live hx-get="" hx-trigger=(POLL) hx-select="#live" hx-swap="outerHTML" {
            @if workflows.is_empty() {
                p.muted #no-workflows { "No workflows." }
            } @else {
                table #workflows {
                    thead { tr {
                        th { "id" } @if s.is_operator() { th { "tenant" } }
                        th.num { "steps" } th.num { "not ended" } th.num { "succeeded" }
                        th.num { "cancelled" } th.num { "dead" } th { "created" }
                    } }
                    tbody {
                        @for w in &workflows {
                            tr id=(format!("workflow-{}", w.id)) {
                                td { a href=(format!("/ui/workflows/{}", w.id)) { (w.id) } }
                                @if s.is_operator() { td { (w.tenant) } }
                                td.num { (w.steps) } td.num { (w.live) } td.num { (w.succeeded) }
                                td.num { (w.cancelled) } td.num { (w.dead) }
                                td { (time(w.created_at)) }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/workflows", "Workflows", body)))
}

/// `GET /ui/workflows/{id}`.
pub async fn show(state: AdminState, s: Session, id: i64, q: Pairs) -> Page {
    let mut q = query(q)?;
    let done = q.take("done");
    q.finish()?;
    let w = queue::get_workflow(state.store(), s.caller().scope(), id).await?;
    let state_name = serde_json::to_value(w.state).ok();
    let state_name = state_name.as_ref().and_then(|v| v.as_str()).unwrap_or_default();
    let body = html! {
        h1 { "Workflow " (w.id) }
        (notice(done))
        div #live hx-get="" hx-trigger=(POLL) hx-select="#live" hx-swap="outerHTML" {
            p #workflow-state {
                "State: " strong { (state_name) } " · created " (time(w.created_at))
                @if let Some(at) = w.cancelled_at { " · cancel asked " (time(at)) }
                @if s.is_operator() { " · tenant " (w.tenant) }
            }
            @if !s.read_only() && w.state == queue::WorkflowState::Running {
                form.inline method="post" action=(format!("/ui/workflows/{}/cancel", w.id))
                    onsubmit="return confirm('Cancel every step that has not ended?')" {
                    (csrf_field(&s)) button.danger type="submit" { "Cancel workflow" }
                }
            }
            @if w.steps.len() <= MAX_DRAWN { (drawing(&w)) }
            @else { p.muted { (w.steps.len()) " steps: too many to draw; the table has them all." } }
            table #steps {
                thead { tr {
                    th { "step" } th { "task" } th { "task type" } th { "state" }
                    th.num { "attempts" } th { "after" } th { "result / error" }
                } }
                tbody {
                    @for step in &w.steps {
                        tr id=(format!("step-{}", step.name.replace(':', "_"))) {
                            td { (step.name) }
                            td { a href=(format!("/ui/tasks/{}", step.task)) { (step.task) } }
                            td { (step.task_type.as_deref().unwrap_or("")) }
                            td {
                                @if let Some(st) = step.state.0 { (state_badge(st)) } @else { span.muted { "removed" } }
                                @if let Some(n) = step.blocked_on { " " span.muted { "(" (n) " to go)" } }
                            }
                            td.num { (step.attempts.map(|a| a.to_string()).unwrap_or_default()) }
                            td { (step.after.join(", ")) }
                            td.clip {
                                @if let Some(r) = &step.result { code { (short(&r.to_string(), 120)) } }
                                @if let Some(e) = &step.last_error { span.muted { (short(e, 120)) } }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/workflows", &format!("Workflow {id}"), body)))
}

/// `POST /ui/workflows/{id}/cancel`.
pub async fn cancel(state: AdminState, s: Session, id: i64, form: Pairs) -> Page {
    query(form)?.finish()?;
    if s.read_only() {
        return Err(crate::admin::auth::read_only_refusal());
    }
    let done = queue::cancel_workflow(state.store(), s.caller().scope(), id).await?;
    tracing::info!(workflow = id, who = %s.label(), "workflow cancelled from the dashboard");
    let message = format!(
        "Cancelled {} steps; {} running steps asked to stop.",
        done.cancelled, done.cancel_requested
    );
    Ok(see_other(&format!("/ui/workflows/{id}?{}", encode(&[("done", message)]))))
}

fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

/// The steps as an SVG: a column per dependency level (a step one level right of its
/// deepest parent), a line from each step to each parent.
fn drawing(w: &WorkflowView) -> Markup {
    const BOX_W: i64 = 150;
    const BOX_H: i64 = 36;
    const GAP_X: i64 = 60;
    const GAP_Y: i64 = 14;
    const PAD: i64 = 10;
    let index: HashMap<&str, usize> =
        w.steps.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    // Steps come in dependency order (by task id: parents were written first).
    let mut level = vec![0usize; w.steps.len()];
    for (i, step) in w.steps.iter().enumerate() {
        level[i] = step
            .after
            .iter()
            .filter_map(|p| index.get(p.as_str()))
            .map(|&p| level[p] + 1)
            .max()
            .unwrap_or(0);
    }
    let mut row = vec![0usize; w.steps.len()];
    let mut per_level: HashMap<usize, usize> = HashMap::new();
    for (i, &l) in level.iter().enumerate() {
        let n = per_level.entry(l).or_insert(0);
        row[i] = *n;
        *n += 1;
    }
    let at = |i: usize| -> (i64, i64) {
        (PAD + level[i] as i64 * (BOX_W + GAP_X), PAD + row[i] as i64 * (BOX_H + GAP_Y))
    };
    let columns = level.iter().max().map_or(1, |m| m + 1) as i64;
    let rows = per_level.values().max().copied().unwrap_or(1) as i64;
    let (width, height) =
        (2 * PAD + columns * (BOX_W + GAP_X) - GAP_X, 2 * PAD + rows * (BOX_H + GAP_Y) - GAP_Y);
    let class = |s: &StepView| s.state.0.map_or("state".to_owned(), |st| format!("state-{st}"));
    html! {
        svg.workflow #workflow-drawing width=(width) height=(height) viewBox=(format!("0 0 {width} {height}"))
            xmlns="http://www.w3.org/2000/svg" role="img" aria-label="the workflow's steps and their states" {
            @for (i, step) in w.steps.iter().enumerate() {
                @for p in step.after.iter().filter_map(|p| index.get(p.as_str())) {
                    @let ((px, py), (cx, cy)) = (at(*p), at(i));
                    line x1=(px + BOX_W) y1=(py + BOX_H / 2) x2=(cx) y2=(cy + BOX_H / 2) {}
                }
            }
            @for (i, step) in w.steps.iter().enumerate() {
                @let (x, y) = at(i);
                a href=(format!("/ui/tasks/{}", step.task)) {
                    rect class=(class(step)) x=(x) y=(y) width=(BOX_W) height=(BOX_H) rx="4" {
                        title { (step.name) ": " (step.state.0.map_or("removed".to_owned(), |s| s.to_string())) }
                    }
                    text x=(x + 6) y=(y + 14) { (short(&step.name, 22)) }
                    text.sub x=(x + 6) y=(y + 29) {
                        (step.state.0.map_or("removed".to_owned(), |s| s.to_string()))
                    }
                }
            }
        }
    }
}
