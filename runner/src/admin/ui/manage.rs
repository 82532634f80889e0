//! Modules (every version with its limits; activate one) and tenants (weights and caps;
//! the operator changes a weight). Writes go through the same queue functions and checks
//! as `POST /v1/modules/{t}/activate` and `PUT /v1/tenants/{name}/weight`.

use maud::{html, Markup};
use warp::http::StatusCode;

use super::layout::{csrf_field, html_response, notice, page, see_other, time, POLL};
use super::session::Session;
use super::{query, Page, Pairs};
use crate::admin::auth::Caller;
use crate::admin::error::ApiError;
use crate::admin::AdminState;
use crate::queue::{self, CompileState, MAX_WEIGHT};

fn limit(v: Option<i64>) -> String {
    v.map_or_else(|| "default".to_owned(), |v| v.to_string())
}

/// `GET /ui/modules`.
pub async fn modules(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let scope = s.caller().read_scope(q.take("tenant").as_deref())?;
    let activated = q.take("activated");
    q.finish()?;
    let versions = queue::list_versions(state.store(), scope.as_deref(), None, false).await?;
    let body = html! {
        h1 { "Modules" }
        (notice(activated.map(|v| format!("Activated {v}."))))
        @if versions.is_empty() {
            p.muted #no-modules { "No module uploaded yet (PUT /v1/modules/{task_type})." }
        } @else {
            // While a version compiles, the table refreshes itself (the page's own URL, so a
            // tenant filter stays) until the compile ends.
            @let compiling = versions.iter().any(|m| m.compile_state == CompileState::Compiling);
            table #modules hx-get=[compiling.then_some("")] hx-trigger=[compiling.then_some(POLL)]
                hx-select=[compiling.then_some("#modules")] hx-swap=[compiling.then_some("outerHTML")] {
                thead { tr {
                    th { "tenant" } th { "task type" } th.num { "version" } th { "state" }
                    th { "sha256" } th.num { "size" } th.num { "fuel" } th.num { "timeout ms" }
                    th.num { "memory bytes" } th.num { "max attempts" } th.num { "backoff ms" }
                    th.num { "max running" } th { "secrets" }
                    th.num title="tasks per kept instance" { "reuse" } th { "uploaded" } th {}
                } }
                tbody {
                    @for m in &versions {
                        tr id=(format!("module-{}-{}-{}", m.tenant, m.task_type, m.version)) {
                            td { (m.tenant) } td { (m.task_type) } td.num { (m.version) }
                            td.compile {
                                @if m.active { strong.active { "active" } " " }
                                (compile_state(m.compile_state))
                            }
                            td { code title=(m.sha256) { (&m.sha256[..m.sha256.len().min(12)]) } }
                            td.num { (m.size) }
                            td.num { (limit(m.settings.fuel)) }
                            td.num { (limit(m.settings.timeout_ms)) }
                            td.num { (limit(m.settings.memory_bytes)) }
                            td.num { (limit(m.settings.max_attempts.map(i64::from))) }
                            td.num { (limit(m.settings.backoff_base_ms)) " – " (limit(m.settings.backoff_cap_ms)) }
                            td.num { (limit(m.settings.max_running.map(i64::from))) }
                            td { @if m.secrets.is_empty() { "-" } @else { code { (m.secrets.join(", ")) } } }
                            td.num { (m.reuse.map_or_else(|| "-".to_owned(), |n| n.to_string())) }
                            td { (time(m.created_at)) }
                            td {
                                @if !m.active && !s.read_only() && m.compile_state == CompileState::Ready {
                                    form.inline method="post" action=(format!("/ui/modules/{}/{}/activate", m.tenant, m.task_type)) {
                                        (csrf_field(&s))
                                        input type="hidden" name="version" value=(m.version);
                                        button.activate type="submit" { "Activate" }
                                    }
                                }
                            }
                        }
                        @if let Some(why) = &m.compile_error {
                            tr.reason id=(format!("module-{}-{}-{}-why", m.tenant, m.task_type, m.version)) {
                                td colspan="16" { span.muted { "rejected: " } (why) }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/modules", "Modules", body)))
}

/// A version's compile state as a badge (a rejected version's reason is on the row below it).
fn compile_state(state: CompileState) -> Markup {
    html! {
        @match state {
            CompileState::Ready => span.ok { "ready" },
            CompileState::Compiling => span.paused { "compiling" },
            CompileState::Rejected => span.state.state-dead { "rejected" },
        }
    }
}

/// `POST /ui/modules/{tenant}/{task_type}/activate` with `version`.
pub async fn activate(
    state: AdminState,
    s: Session,
    tenant: String,
    task_type: String,
    form: Pairs,
) -> Page {
    let mut q = query(form)?;
    let version = q.take_positive("version")?.ok_or_else(|| {
        ApiError::bad_request("invalid_parameter", "parameter `version` is required")
    })?;
    q.finish()?;
    queue::validate_task_type(&task_type)
        .map_err(|e| ApiError::bad_request("invalid_task_type", e.to_string()))?;
    // A tenant may only name itself; the operator names the module's tenant.
    let (tenant, _) = s.caller().write_target(state.store(), Some(&tenant)).await?;
    let version = i32::try_from(version).map_err(|_| {
        ApiError::not_found(format!("task_type {task_type:?} has no version {version}"))
    })?;
    queue::activate_version(state.store(), &tenant, &task_type, version).await?;
    tracing::info!(%tenant, %task_type, version, who = %s.label(), "activated from the dashboard");
    Ok(see_other(&format!("/ui/modules?activated={task_type}%20v{version}")))
}

/// `GET /ui/tenants`: every tenant for the operator, a tenant sees itself.
pub async fn tenants(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let changed = q.take("changed");
    q.finish()?;
    let tenants = match s.caller() {
        Caller::Operator => queue::list_tenants(state.store()).await?,
        Caller::Tenant(t) => vec![t.clone()],
    };
    let cap = |v: Option<i64>| v.map_or_else(|| "none".to_owned(), |v| v.to_string());
    let body = html! {
        h1 { "Tenants" }
        (notice(changed.map(|n| format!("Weight of {n} changed."))))
        p.muted { "Weight: a tenant's share of the runners' slots while several have due work." }
        table #tenants {
            thead { tr {
                th { "tenant" } th.num { "weight" } th.num { "max running" }
                th.num { "max module bytes" } th.num { "max fuel" } th.num { "max timeout ms" }
                th.num { "max memory bytes" } th.num { "max payload bytes" }
                th.num { "max result bytes" } th { "created" }
                @if s.is_operator() { th { "change weight" } }
            } }
            tbody {
                @for t in &tenants {
                    tr id=(format!("tenant-{}", t.name)) {
                        td { (t.name) }
                        td.num.weight { (t.weight) }
                        td.num { (cap(t.caps.max_running.map(i64::from))) }
                        td.num { (cap(t.caps.max_module_bytes)) }
                        td.num { (cap(t.caps.max_fuel)) }
                        td.num { (cap(t.caps.max_timeout_ms)) }
                        td.num { (cap(t.caps.max_memory_bytes)) }
                        td.num { (cap(t.caps.max_payload_bytes)) }
                        td.num { (cap(t.caps.max_result_bytes)) }
                        td { (time(t.created_at)) }
                        @if s.is_operator() {
                            td {
                                form.inline method="post" action=(format!("/ui/tenants/{}/weight", t.name)) {
                                    (csrf_field(&s))
                                    input type="number" name="weight" min="1" max=(MAX_WEIGHT) value=(t.weight) size="5";
                                    button type="submit" { "Set" }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/tenants", "Tenants", body)))
}

/// `POST /ui/tenants/{name}/weight` (operator) with `weight`.
pub async fn set_weight(state: AdminState, s: Session, name: String, form: Pairs) -> Page {
    if !s.is_operator() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            "tenant weights are set by the operator",
        ));
    }
    let mut q = query(form)?;
    let weight = q.take_positive("weight")?.ok_or_else(|| {
        ApiError::bad_request("invalid_parameter", "parameter `weight` is required")
    })?;
    q.finish()?;
    let weight = i32::try_from(weight).unwrap_or(i32::MAX);
    let tenant = queue::set_tenant_weight(state.store(), &name, weight).await?;
    tracing::info!(tenant = %tenant.name, weight, "tenant weight set from the dashboard");
    Ok(see_other(&format!("/ui/tenants?changed={}", tenant.name)))
}
