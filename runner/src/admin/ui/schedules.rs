//! Schedules: every cron schedule in scope with its next and last run, the task its last tick
//! enqueued and the ticks it skipped; pause, resume and delete one. Writes go through the same
//! queue functions as `POST /v1/schedules/{name}/pause` and friends.

use maud::html;
use warp::http::StatusCode;

use super::layout::{csrf_field, html_response, notice, page, see_other, time, POLL};
use super::session::Session;
use super::tasks::encode;
use super::{query, Page, Pairs};
use crate::admin::AdminState;
use crate::queue;

/// `GET /ui/schedules` (`tenant=` narrows the operator's view).
pub async fn list(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let scope = s.caller().read_scope(q.take("tenant").as_deref())?;
    let done = q.take("done");
    q.finish()?;
    let schedules = queue::list_schedules(state.store(), scope.as_deref()).await?;
    let writer = !s.read_only();
    let body = html! {
        h1 { "Schedules" }
        (notice(done))
        p.muted { "Each tick of a cron schedule enqueues one task. Create them with POST /v1/schedules or " code { "sweep schedule create" } "." }
        div #live hx-get="" hx-trigger=(POLL) hx-select="#live" hx-swap="outerHTML" {
            @if schedules.is_empty() {
                p.muted #no-schedules { "No schedules." }
            } @else {
                table #schedules {
                    thead { tr {
                        @if s.is_operator() { th { "tenant" } }
                        th { "name" } th { "cron" } th { "task type" } th { "next run" }
                        th { "last run" } th { "last task" } th.num { "skipped ticks" } th { "state" }
                        @if writer { th {} }
                    } }
                    tbody {
                        @for c in &schedules {
                            @let base = format!("/ui/schedules/{}/{}", c.tenant, c.name);
                            tr id=(format!("schedule-{}-{}", c.tenant, c.name.replace(':', "_"))) class=[c.paused.then_some("is-paused")] {
                                @if s.is_operator() { td { (c.tenant) } }
                                td { (c.name) }
                                td { code { (c.cron) } " " span.muted { (c.timezone) } }
                                td { (c.task_type) }
                                td { @if c.paused { span.muted { "—" } } @else { (time(c.next_run_at)) } }
                                td { @if let Some(t) = c.last_run_at { (time(t)) } @else { span.muted { "never" } } }
                                td { @if let Some(id) = c.last_task_id { a href=(format!("/ui/tasks/{id}")) { (id) } } }
                                td.num { (c.skipped_ticks) }
                                td { @if let Some(at) = c.paused_at { span.paused { "paused since " (time(at)) } } @else { span.ok { "active" } } }
                                @if writer {
                                    td {
                                        @if c.paused {
                                            form.inline method="post" action={(base) "/resume"} { (csrf_field(&s)) button.small type="submit" { "Resume" } }
                                        } @else {
                                            form.inline method="post" action={(base) "/pause"} { (csrf_field(&s)) button.small.quiet type="submit" { "Pause" } }
                                        }
                                        " "
                                        form.inline method="post" action={(base) "/delete"}
                                            onsubmit=(format!("return confirm('Delete schedule {}? The tasks it enqueued stay.')", c.name)) {
                                            (csrf_field(&s)) button.small.danger type="submit" { "Delete" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/schedules", "Schedules", body)))
}

/// What a schedule action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Pause,
    Resume,
    Delete,
}

/// `POST /ui/schedules/{tenant}/{name}/pause|resume|delete`.
pub async fn act(
    state: AdminState,
    s: Session,
    tenant: String,
    name: String,
    act: Act,
    form: Pairs,
) -> Page {
    query(form)?.finish()?;
    // A tenant may only name itself; the operator names the schedule's tenant.
    let (tenant, _) = s.caller().write_target(state.store(), Some(&tenant)).await?;
    let (store, what) = (
        state.store(),
        match act {
            Act::Pause => "Paused",
            Act::Resume => "Resumed",
            Act::Delete => "Deleted",
        },
    );
    match act {
        Act::Pause => drop(queue::pause_schedule(store, &tenant, &name).await?),
        Act::Resume => drop(queue::resume_schedule(store, &tenant, &name).await?),
        Act::Delete => drop(queue::delete_schedule(store, &tenant, &name).await?),
    }
    tracing::info!(%tenant, schedule = %name, who = %s.label(), "schedule {} from the dashboard", what.to_lowercase());
    Ok(see_other(&format!(
        "/ui/schedules?{}",
        encode(&[("done", format!("{what} schedule {name}."))])
    )))
}
