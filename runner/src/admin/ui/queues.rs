//! Queues: every (tenant, task type) with its counts and its flow control, and the controls:
//! pause and resume a queue (its tenant, or the operator) and a whole tenant (the operator),
//! set or clear a queue's rate limit, set a module's running limit. Writes go through the same
//! queue functions and checks as `POST /v1/queues/{t}/pause`, `PUT /v1/queues/{t}/rate-limit`
//! and `POST /v1/tenants/{name}/pause`; a running limit is a module setting, so changing it
//! registers the active module's bytes again with the new limit (a new version, activated, as
//! an upload with `?max_running=` would).

use std::collections::BTreeMap;

use maud::{html, Markup};
use warp::http::StatusCode;

use super::layout::{csrf_field, html_response, millis, notice, page, see_other, time, POLL};
use super::session::Session;
use super::tasks::encode;
use super::{query, Page, Pairs};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::AdminState;
use crate::queue::{self, QueueRow, RateLimit, TypeStats};

/// Who paused something, for people: `operator` or the tenant's own token.
pub fn paused_by(by: Option<&str>) -> String {
    match by {
        Some("operator") => "the operator".to_owned(),
        Some(other) => other
            .strip_prefix("tenant:")
            .map_or_else(|| other.to_owned(), |t| format!("tenant {t}")),
        None => "someone".to_owned(),
    }
}

/// The pause of a queue as a badge: who and since when (its own, or its tenant's).
pub fn pause_badge(q: &QueueRow) -> Markup {
    html! {
        @if let Some(at) = q.paused_at {
            span.paused title={"paused by " (paused_by(q.paused_by.as_deref())) " since " (at.to_rfc3339())} {
                "paused by " (paused_by(q.paused_by.as_deref())) " since " (time(at))
            }
        } @else if let Some(at) = q.tenant_paused_at {
            span.paused title="its whole tenant is paused" {
                "tenant paused by " (paused_by(q.tenant_paused_by.as_deref())) " since " (time(at))
            }
        } @else if q.module_compiling {
            a.paused href="/ui/modules" title="its tasks wait until the module's compile ends" {
                "waiting for its module to compile"
            }
        }
    }
}

/// `GET /ui/queues` (`tenant=` narrows the operator's view).
pub async fn list(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let scope = s.caller().read_scope(q.take("tenant").as_deref())?;
    let done = q.take("done");
    q.finish()?;
    let queues = queue::list_queues(state.store(), scope.as_deref()).await?;
    let stats: BTreeMap<(String, String), TypeStats> =
        queue::queue_stats(state.store(), scope.as_deref())
            .await?
            .into_iter()
            .map(|t| ((t.tenant.clone(), t.task_type.clone()), t))
            .collect();
    let tenants = match s.caller() {
        Caller::Operator => queue::list_tenants(state.store()).await?,
        Caller::Tenant(_) => Vec::new(),
    };
    let paused_tenants = queue::list_paused_tenants(state.store(), scope.as_deref()).await?;
    let writer = !s.read_only();
    let body = html! {
        h1 { "Queues" }
        (notice(done))
        p.muted { "A queue is one task type of one tenant. Paused: no runner claims its tasks; enqueues are still accepted and wait, running tasks finish." }
        div #live hx-get="" hx-trigger=(format!("{POLL} [!document.activeElement || document.activeElement.tagName != 'INPUT']")) hx-select="#live" hx-swap="outerHTML" {
            @if queues.is_empty() {
                p.muted #no-queues { "No queues yet: upload a module (PUT /v1/modules/{task_type})." }
            } @else {
                table #queues {
                    thead { tr {
                        th { "tenant" } th { "task type" } th.num { "blocked" } th.num { "pending" } th.num { "running" }
                        th.num { "retrying" } th.num { "dead" } th.num { "oldest due" } th { "state" }
                        th { "rate limit" } th { "max running" } @if writer { th {} }
                    } }
                    tbody {
                        @for r in &queues {
                            @let t = stats.get(&(r.tenant.clone(), r.task_type.clone())).cloned().unwrap_or_default();
                            @let id = format!("{}-{}", r.tenant, r.task_type.replace(':', "_"));
                            @let base = format!("/ui/queues/{}/{}", r.tenant, r.task_type);
                            tr id=(format!("queue-{id}")) class=[r.paused.then_some("is-paused")] {
                                td { (r.tenant) }
                                td { a href={"/ui/tasks?" (encode(&[("tenant", r.tenant.clone()), ("task_type", r.task_type.clone())]))} { (r.task_type) } }
                                td.num { (t.blocked) } td.num { (t.pending) } td.num { (t.running) }
                                td.num { (t.retrying) } td.num { (t.dead) } td.num { (millis(t.oldest_due_ms)) }
                                td.state-cell { @if r.paused { (pause_badge(r)) } @else { span.ok { "running" } } }
                                td {
                                    @if writer {
                                        form.inline.rate method="post" action={(base) "/rate-limit"} {
                                            (csrf_field(&s))
                                            input name="rate_per_sec" type="number" step="any" min="0" size="6" placeholder="none"
                                                value=[r.rate_per_sec.map(|v| v.to_string())] title="starts per second on average (empty: no limit)";
                                            " /s, burst "
                                            input name="burst" type="number" min="1" size="4" value=[r.burst] title="most starts at once";
                                            " " button.small type="submit" { "Set" }
                                        }
                                    } @else {
                                        @match (r.rate_per_sec, r.burst) {
                                            (Some(rate), Some(burst)) => { (rate) " /s, burst " (burst) }
                                            _ => span.muted { "none" },
                                        }
                                    }
                                }
                                td {
                                    @if writer {
                                        form.inline.max-running method="post" action={(base) "/max-running"} {
                                            (csrf_field(&s))
                                            input name="max_running" type="number" min="1" size="5" placeholder="none"
                                                value=[r.max_running] title="most tasks of this type running at once, across runners (empty: no limit)";
                                            " " button.small type="submit" { "Set" }
                                        }
                                    } @else {
                                        (r.max_running.map_or_else(|| "none".to_owned(), |v| v.to_string()))
                                    }
                                }
                                @if writer {
                                    td {
                                        @if r.paused_at.is_some() {
                                            form.inline method="post" action={(base) "/resume"} {
                                                (csrf_field(&s)) button.pause type="submit" { "Resume" }
                                            }
                                        } @else {
                                            form.inline method="post" action={(base) "/pause"} {
                                                (csrf_field(&s)) button.pause.quiet type="submit" { "Pause" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if s.is_operator() && !tenants.is_empty() {
                h2 { "Tenants" }
                table #tenant-pauses {
                    thead { tr { th { "tenant" } th { "state" } @if writer { th {} } } }
                    tbody {
                        @for t in &tenants {
                            @let pause = paused_tenants.iter().find(|p| p.tenant == t.name);
                            tr id=(format!("tenant-pause-{}", t.name)) {
                                td { (t.name) }
                                td {
                                    @if let Some(p) = pause {
                                        span.paused { "paused by " (paused_by(p.paused_by.as_deref()))
                                            @if let Some(at) = p.paused_at { " since " (time(at)) } }
                                    } @else { span.ok { "running" } }
                                }
                                @if writer {
                                    td {
                                        @let action = if pause.is_some() { "resume" } else { "pause" };
                                        form.inline method="post" action=(format!("/ui/tenants/{}/{action}", t.name)) {
                                            (csrf_field(&s))
                                            button.pause.quiet type="submit" { @if pause.is_some() { "Resume tenant" } @else { "Pause tenant" } }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            } @else if let Some(p) = paused_tenants.first() {
                p.paused #tenant-paused { "Your tenant is paused by " (paused_by(p.paused_by.as_deref()))
                    @if let Some(at) = p.paused_at { " since " (time(at)) } ": no task of it runs until the operator resumes it." }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/queues", "Queues", body)))
}

fn back(message: String) -> Page {
    Ok(see_other(&format!("/ui/queues?{}", encode(&[("done", message)]))))
}

/// The tenant a queue action acts on: a tenant may only name itself.
async fn target(
    state: &AdminState,
    s: &Session,
    tenant: &str,
    task_type: &str,
) -> Result<String, ApiError> {
    queue::validate_task_type(task_type)
        .map_err(|e| ApiError::bad_request("invalid_task_type", e.to_string()))?;
    let (tenant, _) = s.caller().write_target(state.store(), Some(tenant)).await?;
    Ok(tenant)
}

fn by(s: &Session) -> String {
    match s.caller() {
        Caller::Operator => queue::paused_by_operator(),
        Caller::Tenant(t) => queue::paused_by_tenant(&t.name),
    }
}

/// `POST /ui/queues/{tenant}/{task_type}/pause` or `.../resume`.
pub async fn pause(
    state: AdminState,
    s: Session,
    tenant: String,
    task_type: String,
    pause: bool,
    form: Pairs,
) -> Page {
    query(form)?.finish()?;
    let tenant = target(&state, &s, &tenant, &task_type).await?;
    if pause {
        queue::pause_queue(state.store(), &tenant, &task_type, &by(&s)).await?;
    } else {
        queue::resume_queue(state.store(), &tenant, &task_type).await?;
    }
    let done = if pause { "Paused" } else { "Resumed" };
    tracing::info!(%tenant, %task_type, who = %s.label(), "queue {} from the dashboard", done.to_lowercase());
    back(format!("{done} {tenant}/{task_type}."))
}

/// `POST /ui/queues/{tenant}/{task_type}/rate-limit` with `rate_per_sec` and `burst` (an empty
/// rate clears the limit; an empty burst is the rate rounded up, at least 1).
pub async fn rate_limit(
    state: AdminState,
    s: Session,
    tenant: String,
    task_type: String,
    form: Pairs,
) -> Page {
    let mut q = query(form)?;
    let rate = q.take("rate_per_sec");
    let burst = q.take("burst");
    q.finish()?;
    let tenant = target(&state, &s, &tenant, &task_type).await?;
    let limit = match rate {
        None => None,
        Some(raw) => {
            let rate: f64 = raw.trim().parse().map_err(|_| {
                ApiError::unprocessable(
                    "invalid_rate_limit",
                    format!("rate_per_sec must be a number, got {raw:?}"),
                )
            })?;
            let burst = match burst {
                Some(b) => b.trim().parse::<i32>().map_err(|_| {
                    ApiError::unprocessable(
                        "invalid_rate_limit",
                        format!("burst must be a whole number, got {b:?}"),
                    )
                })?,
                None => rate.ceil().clamp(1.0, f64::from(queue::MAX_BURST)) as i32,
            };
            let limit = RateLimit { rate_per_sec: rate, burst };
            limit.validate()?;
            Some(limit)
        }
    };
    let control = queue::set_rate_limit(state.store(), &tenant, &task_type, limit).await?;
    tracing::info!(%tenant, %task_type, rate = ?control.rate_per_sec, burst = ?control.burst, who = %s.label(), "rate limit set from the dashboard");
    back(match limit {
        Some(l) => format!(
            "Rate limit of {tenant}/{task_type}: {} per second, burst {}.",
            l.rate_per_sec, l.burst
        ),
        None => format!("Rate limit of {tenant}/{task_type} cleared."),
    })
}

/// `POST /ui/queues/{tenant}/{task_type}/max-running` with `max_running` (empty: no limit):
/// the active module again, with that limit, as a new active version.
pub async fn max_running(
    state: AdminState,
    s: Session,
    tenant: String,
    task_type: String,
    form: Pairs,
) -> Page {
    let mut q = query(form)?;
    let limit = q.take_positive("max_running")?;
    q.finish()?;
    let tenant = target(&state, &s, &tenant, &task_type).await?;
    let limit = limit
        .map(|n| i32::try_from(n).ok().filter(|n| *n <= 1_000_000))
        .map(|n| {
            n.ok_or_else(|| {
                ApiError::unprocessable("limit_too_high", "max_running = at most 1000000")
            })
        })
        .transpose()?;
    let active = queue::list_versions(state.store(), Some(&tenant), Some(&task_type), true)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| {
            ApiError::not_found(format!("no module is registered for task_type {task_type:?}"))
        })?;
    let bytes = queue::module_bytes(state.store(), &active.sha256).await?.ok_or_else(|| {
        ApiError::not_found(format!("the module of {task_type:?} vanished from the registry"))
    })?;
    let settings = queue::ModuleSettings { max_running: limit, ..active.settings };
    let registered = queue::register_module(
        state.store(),
        &tenant,
        &task_type,
        &active.sha256,
        &bytes,
        &settings,
    )
    .await?;
    tracing::info!(%tenant, %task_type, max_running = ?limit, version = registered.module.version, who = %s.label(), "running limit set from the dashboard");
    back(format!(
        "Max running of {tenant}/{task_type}: {} (version {} active).",
        limit.map_or_else(|| "no limit".to_owned(), |n| n.to_string()),
        registered.module.version
    ))
}

/// `POST /ui/tenants/{name}/pause` or `.../resume` (operator).
pub async fn pause_tenant(
    state: AdminState,
    s: Session,
    name: String,
    pause: bool,
    form: Pairs,
) -> Page {
    query(form)?.finish()?;
    if !s.is_operator() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            "a whole tenant is paused and resumed by the operator",
        ));
    }
    if pause {
        queue::pause_tenant(state.store(), &name, &by(&s)).await?;
    } else {
        queue::resume_tenant(state.store(), &name).await?;
    }
    let done = if pause { "Paused" } else { "Resumed" };
    tracing::info!(tenant = %name, "tenant {} from the dashboard", done.to_lowercase());
    back(format!("{done} tenant {name}."))
}
