//! The route table: [`Route`] lists every operation of the admin API once. The server is the
//! fold of [`Route::ALL`] into one warp filter ([`routes`]), and the OpenAPI document is built
//! from the same list ([`Route::doc`], which takes each operation from its handler's
//! `#[utoipa::path]`), so a route cannot be served without being documented, or documented
//! without being served. Both matches on `Route` are exhaustive: a new variant needs a filter
//! and a document entry before it compiles.
//!
//! Invariants: every route matches path, then method, before it authenticates or reads a body
//! (so an unknown path costs nothing and answers 404); every `/v1` route except
//! `/v1/openapi.json` and `/metrics` authenticate; a rejection from any route becomes a JSON
//! error in [`recover`]; a 405 carries `Allow` with the methods its path serves.

use std::convert::Infallible;

use utoipa::openapi::path::{HttpMethod, Operation};
use warp::filters::path::FullPath;
use warp::filters::BoxedFilter;
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::{Reply, Response};
use warp::{Filter, Rejection};

use super::auth::{authenticate, Caller};
use super::body;
use super::capability_models::{EgressRequest, SecretRequest};
use super::enqueue_input;
use super::error::{recover, ApiError};
use super::handlers::{
    egress, modules, ops, queues, schedules, secrets, tasks, tenants, usage, workflows, Answer,
};
use super::models::{
    ActivateRequest, CancelTasksRequest, CapsRequest, CreateScheduleRequest, CreateWorkflowRequest,
    EnqueueRequest, RateLimitRequest, WeightRequest,
};
use super::openapi;
use super::params::PathText;
use super::AdminState;
use crate::queue::TaskId;

type Pairs = Vec<(String, String)>;

/// One operation of the admin API (a method on a path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    Healthz,
    Readyz,
    Metrics,
    OpenApi,
    Upload,
    ModuleList,
    ModuleVersions,
    Activate,
    Enqueue,
    EnqueueBatch,
    TaskShow,
    TaskList,
    TaskCancel,
    TasksCancel,
    DeadList,
    DeadRequeue,
    Stats,
    TenantList,
    TenantWeight,
    TenantCaps,
    TenantToken,
    ScheduleCreate,
    ScheduleList,
    ScheduleShow,
    SchedulePause,
    ScheduleResume,
    ScheduleDelete,
    QueuePause,
    QueueResume,
    TenantPause,
    TenantResume,
    QueueRateLimit,
    QueueRateLimitClear,
    WorkflowCreate,
    WorkflowList,
    WorkflowShow,
    WorkflowCancel,
    TenantEgress,
    TenantEgressSet,
    SecretPut,
    SecretList,
    SecretDelete,
    Usage,
}

impl Route {
    /// Every route, in the order the server tries them.
    pub const ALL: [Route; 43] = [
        Route::Healthz,
        Route::Readyz,
        Route::Metrics,
        Route::OpenApi,
        Route::Upload,
        Route::ModuleList,
        Route::ModuleVersions,
        Route::Activate,
        Route::Enqueue,
        Route::EnqueueBatch,
        Route::TaskShow,
        Route::TaskList,
        Route::TaskCancel,
        Route::TasksCancel,
        Route::DeadList,
        Route::DeadRequeue,
        Route::Stats,
        Route::TenantList,
        Route::TenantWeight,
        Route::TenantCaps,
        Route::TenantToken,
        Route::ScheduleCreate,
        Route::ScheduleList,
        Route::ScheduleShow,
        Route::SchedulePause,
        Route::ScheduleResume,
        Route::ScheduleDelete,
        Route::QueuePause,
        Route::QueueResume,
        Route::TenantPause,
        Route::TenantResume,
        Route::QueueRateLimit,
        Route::QueueRateLimitClear,
        Route::WorkflowCreate,
        Route::WorkflowList,
        Route::WorkflowShow,
        Route::WorkflowCancel,
        Route::TenantEgress,
        Route::TenantEgressSet,
        Route::SecretPut,
        Route::SecretList,
        Route::SecretDelete,
        Route::Usage,
    ];

    /// The documented path template, methods and operation, from the handler's
    /// `#[utoipa::path]`.
    pub fn doc(self) -> (String, Vec<HttpMethod>, Operation) {
        // `#[utoipa::path(tag = ...)]` keeps its tags apart from the operation, for the
        // `OpenApi` derive; this table builds the paths itself, so it adds them here
        // (`__dev::Tags` is utoipa-gen's own interface; the admin_openapi test checks tags).
        fn of<P>() -> (String, Vec<HttpMethod>, Operation)
        where
            P: utoipa::Path + for<'t> utoipa::__dev::Tags<'t>,
        {
            let mut operation = P::operation();
            let tags = P::tags().into_iter().map(str::to_owned).collect();
            operation.tags = Some(tags);
            let methods = P::methods();
            for method in &methods {
                openapi::add_common_errors(&mut operation, method);
            }
            (P::path(), methods, operation)
        }
        match self {
            Route::Healthz => of::<ops::__path_healthz>(),
            Route::Readyz => of::<ops::__path_readyz>(),
            Route::Metrics => of::<ops::__path_metrics>(),
            Route::OpenApi => of::<openapi::__path_serve>(),
            Route::Upload => of::<modules::__path_upload>(),
            Route::ModuleList => of::<modules::__path_list>(),
            Route::ModuleVersions => of::<modules::__path_versions>(),
            Route::Activate => of::<modules::__path_activate>(),
            Route::Enqueue => of::<tasks::__path_enqueue>(),
            Route::EnqueueBatch => of::<tasks::__path_enqueue_batch>(),
            Route::TaskShow => of::<tasks::__path_show>(),
            Route::TaskList => of::<tasks::__path_list>(),
            Route::TaskCancel => of::<tasks::__path_cancel>(),
            Route::TasksCancel => of::<tasks::__path_cancel_many>(),
            Route::DeadList => of::<ops::__path_dead>(),
            Route::DeadRequeue => of::<ops::__path_requeue>(),
            Route::Stats => of::<ops::__path_stats>(),
            Route::TenantList => of::<tenants::__path_list>(),
            Route::TenantWeight => of::<tenants::__path_set_weight>(),
            Route::TenantCaps => of::<tenants::__path_change_caps>(),
            Route::TenantToken => of::<tenants::__path_rotate_token>(),
            Route::ScheduleCreate => of::<schedules::__path_create>(),
            Route::ScheduleList => of::<schedules::__path_list>(),
            Route::ScheduleShow => of::<schedules::__path_show>(),
            Route::SchedulePause => of::<schedules::__path_pause>(),
            Route::ScheduleResume => of::<schedules::__path_resume>(),
            Route::ScheduleDelete => of::<schedules::__path_delete>(),
            Route::QueuePause => of::<queues::__path_pause>(),
            Route::QueueResume => of::<queues::__path_resume>(),
            Route::TenantPause => of::<queues::__path_pause_tenant>(),
            Route::TenantResume => of::<queues::__path_resume_tenant>(),
            Route::QueueRateLimit => of::<queues::__path_set_rate_limit>(),
            Route::QueueRateLimitClear => of::<queues::__path_clear_rate_limit>(),
            Route::WorkflowCreate => of::<workflows::__path_create>(),
            Route::WorkflowList => of::<workflows::__path_list>(),
            Route::WorkflowShow => of::<workflows::__path_show>(),
            Route::WorkflowCancel => of::<workflows::__path_cancel>(),
            Route::TenantEgress => of::<egress::__path_show>(),
            Route::TenantEgressSet => of::<egress::__path_set>(),
            Route::SecretPut => of::<secrets::__path_put>(),
            Route::SecretList => of::<secrets::__path_list>(),
            Route::SecretDelete => of::<secrets::__path_delete>(),
            Route::Usage => of::<usage::__path_usage>(),
        }
    }

    /// The methods served at `path` (as requested, e.g. `/v1/tasks/7`), for the `Allow`
    /// header of a 405.
    pub fn allowed_at(path: &str) -> Vec<&'static str> {
        let mut allowed: Vec<&'static str> = Route::ALL
            .into_iter()
            .map(Route::doc)
            .filter(|(template, _, _)| matches_template(template, path))
            .flat_map(|(_, methods, _)| methods.into_iter().map(method_name))
            .collect();
        allowed.sort_unstable();
        allowed.dedup();
        allowed
    }

    /// The warp filter serving this route.
    fn filter(self, state: &AdminState) -> BoxedFilter<(Response,)> {
        let auth = || authenticate(state.clone());
        let json_limit = state.config().max_json_bytes;
        let max_batch = state.config().max_batch;
        match self {
            Route::Healthz => warp::path!("healthz").and(warp::get()).map(ops::healthz).boxed(),
            Route::Readyz => warp::path!("readyz")
                .and(warp::get())
                .and(with(state))
                .and_then(|state| async move { respond(ops::readyz(state).await) })
                .boxed(),
            Route::Metrics => warp::path!("metrics")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and_then(|state, caller| async move { respond(ops::metrics(state, caller).await) })
                .boxed(),
            Route::OpenApi => {
                warp::path!("v1" / "openapi.json").and(warp::get()).map(openapi::serve).boxed()
            }
            Route::Upload => warp::path!("v1" / "modules" / PathText)
                .and(warp::put())
                .and(with(state))
                .and(auth())
                .and(query())
                .and(warp::header::optional::<String>("content-type"))
                .and(warp::header::optional::<u64>("content-length"))
                .and(warp::body::stream())
                .and_then(
                    |PathText(task_type), state, caller, q, content_type, length, body| async move {
                        let answer = modules::upload(
                            state,
                            caller,
                            task_type,
                            q,
                            content_type,
                            length,
                            body,
                        );
                        respond(answer.await)
                    },
                )
                .boxed(),
            Route::ModuleList => warp::path!("v1" / "modules")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|state, caller, q| async move {
                    respond(modules::list(state, caller, q).await)
                })
                .boxed(),
            Route::ModuleVersions => warp::path!("v1" / "modules" / PathText)
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|PathText(task_type), state, caller, q| async move {
                    respond(modules::versions(state, caller, task_type, q).await)
                })
                .boxed(),
            Route::Activate => warp::path!("v1" / "modules" / PathText / "activate")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and(query())
                .and(body::json::<ActivateRequest>(json_limit))
                .and_then(|PathText(task_type), state, caller, q, request| async move {
                    respond(modules::activate(state, caller, task_type, q, request).await)
                })
                .boxed(),
            Route::Enqueue => warp::path!("v1" / "tasks")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and(query())
                .and(body::json::<EnqueueRequest>(json_limit))
                .and_then(|state, caller, q, request| async move {
                    respond(tasks::enqueue(state, caller, q, request).await)
                })
                .boxed(),
            Route::EnqueueBatch => warp::path!("v1" / "tasks" / "batch")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and(query())
                .and(body::json_with(json_limit, move |bytes| {
                    enqueue_input::parse_batch(bytes, max_batch)
                }))
                .and_then(|state, caller, q, requests| async move {
                    respond(tasks::enqueue_batch(state, caller, q, requests).await)
                })
                .boxed(),
            Route::TaskShow => warp::path!("v1" / "tasks" / TaskId)
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|id, state, caller, q| async move {
                    respond(tasks::show(state, caller, id, q).await)
                })
                .boxed(),
            Route::TaskList => warp::path!("v1" / "tasks")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(
                    |state, caller, q| async move { respond(tasks::list(state, caller, q).await) },
                )
                .boxed(),
            Route::TaskCancel => warp::path!("v1" / "tasks" / TaskId / "cancel")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and_then(|id, state, caller| async move {
                    respond(tasks::cancel(state, caller, id).await)
                })
                .boxed(),
            Route::TasksCancel => warp::path!("v1" / "tasks" / "cancel")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and(query())
                .and(body::json::<CancelTasksRequest>(json_limit))
                .and_then(|state, caller, q, request| async move {
                    respond(tasks::cancel_many(state, caller, q, request).await)
                })
                .boxed(),
            Route::DeadList => warp::path!("v1" / "dead")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(
                    |state, caller, q| async move { respond(ops::dead(state, caller, q).await) },
                )
                .boxed(),
            Route::DeadRequeue => warp::path!("v1" / "dead" / TaskId / "requeue")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and_then(|id, state, caller| async move {
                    respond(ops::requeue(state, caller, id).await)
                })
                .boxed(),
            Route::Stats => warp::path!("v1" / "stats")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(
                    |state, caller, q| async move { respond(ops::stats(state, caller, q).await) },
                )
                .boxed(),
            Route::TenantList => warp::path!("v1" / "tenants")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and_then(|state, caller: Caller| async move {
                    respond(tenants::list(state, caller).await)
                })
                .boxed(),
            Route::TenantWeight => warp::path!("v1" / "tenants" / PathText / "weight")
                .and(warp::put())
                .and(with(state))
                .and(auth())
                .and(body::json::<WeightRequest>(json_limit))
                .and_then(|PathText(name), state, caller, request| async move {
                    respond(tenants::set_weight(state, caller, name, request).await)
                })
                .boxed(),
            Route::TenantCaps => warp::path!("v1" / "tenants" / PathText / "caps")
                .and(warp::patch())
                .and(with(state))
                .and(auth())
                .and(body::json::<CapsRequest>(json_limit))
                .and_then(|PathText(name), state, caller, request| async move {
                    respond(tenants::change_caps(state, caller, name, request).await)
                })
                .boxed(),
            Route::TenantToken => warp::path!("v1" / "tenants" / PathText / "token")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and_then(|PathText(name), state, caller| async move {
                    respond(tenants::rotate_token(state, caller, name).await)
                })
                .boxed(),
            Route::ScheduleCreate => warp::path!("v1" / "schedules")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and(query())
                .and(body::json::<CreateScheduleRequest>(json_limit))
                .and_then(|state, caller, q, request| async move {
                    respond(schedules::create(state, caller, q, request).await)
                })
                .boxed(),
            Route::ScheduleList => warp::path!("v1" / "schedules")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|state, caller, q| async move {
                    respond(schedules::list(state, caller, q).await)
                })
                .boxed(),
            Route::ScheduleShow => warp::path!("v1" / "schedules" / PathText)
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|PathText(name), state, caller, q| async move {
                    respond(schedules::show(state, caller, name, q).await)
                })
                .boxed(),
            Route::SchedulePause => warp::path!("v1" / "schedules" / PathText / "pause")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|PathText(name), state, caller, q| async move {
                    respond(schedules::pause(state, caller, name, q).await)
                })
                .boxed(),
            Route::ScheduleResume => warp::path!("v1" / "schedules" / PathText / "resume")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|PathText(name), state, caller, q| async move {
                    respond(schedules::resume(state, caller, name, q).await)
                })
                .boxed(),
            Route::ScheduleDelete => warp::path!("v1" / "schedules" / PathText)
                .and(warp::delete())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|PathText(name), state, caller, q| async move {
                    respond(schedules::delete(state, caller, name, q).await)
                })
                .boxed(),
            Route::QueuePause => warp::path!("v1" / "queues" / PathText / "pause")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|PathText(task_type), state, caller, q| async move {
                    respond(queues::pause(state, caller, task_type, q).await)
                })
                .boxed(),
            Route::QueueResume => warp::path!("v1" / "queues" / PathText / "resume")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|PathText(task_type), state, caller, q| async move {
                    respond(queues::resume(state, caller, task_type, q).await)
                })
                .boxed(),
            Route::TenantPause => warp::path!("v1" / "tenants" / PathText / "pause")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and_then(|PathText(name), state, caller| async move {
                    respond(queues::pause_tenant(state, caller, name).await)
                })
                .boxed(),
            Route::TenantResume => warp::path!("v1" / "tenants" / PathText / "resume")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and_then(|PathText(name), state, caller| async move {
                    respond(queues::resume_tenant(state, caller, name).await)
                })
                .boxed(),
            Route::QueueRateLimit => warp::path!("v1" / "queues" / PathText / "rate-limit")
                .and(warp::put())
                .and(with(state))
                .and(auth())
                .and(query())
                .and(body::json::<RateLimitRequest>(json_limit))
                .and_then(|PathText(task_type), state, caller, q, request| async move {
                    respond(queues::set_rate_limit(state, caller, task_type, q, request).await)
                })
                .boxed(),
            Route::QueueRateLimitClear => warp::path!("v1" / "queues" / PathText / "rate-limit")
                .and(warp::delete())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|PathText(task_type), state, caller, q| async move {
                    respond(queues::clear_rate_limit(state, caller, task_type, q).await)
                })
                .boxed(),
            Route::WorkflowCreate => warp::path!("v1" / "workflows")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and(query())
                .and(body::json::<CreateWorkflowRequest>(json_limit))
                .and_then(|state, caller, q, request| async move {
                    respond(workflows::create(state, caller, q, request).await)
                })
                .boxed(),
            Route::WorkflowList => warp::path!("v1" / "workflows")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|state, caller, q| async move {
                    respond(workflows::list(state, caller, q).await)
                })
                .boxed(),
            Route::WorkflowShow => warp::path!("v1" / "workflows" / i64)
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and_then(|id, state, caller| async move {
                    respond(workflows::show(state, caller, id).await)
                })
                .boxed(),
            Route::WorkflowCancel => warp::path!("v1" / "workflows" / i64 / "cancel")
                .and(warp::post())
                .and(with(state))
                .and(auth())
                .and_then(|id, state, caller| async move {
                    respond(workflows::cancel(state, caller, id).await)
                })
                .boxed(),
            Route::TenantEgress => warp::path!("v1" / "tenants" / PathText / "egress")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and_then(|PathText(name), state, caller| async move {
                    respond(egress::show(state, caller, name).await)
                })
                .boxed(),
            Route::TenantEgressSet => warp::path!("v1" / "tenants" / PathText / "egress")
                .and(warp::put())
                .and(with(state))
                .and(auth())
                .and(body::json::<EgressRequest>(json_limit))
                .and_then(|PathText(name), state, caller, request| async move {
                    respond(egress::set(state, caller, name, request).await)
                })
                .boxed(),
            Route::SecretPut => warp::path!("v1" / "secrets" / PathText)
                .and(warp::put())
                .and(with(state))
                .and(auth())
                .and(query())
                .and(body::json::<SecretRequest>(json_limit))
                .and_then(|PathText(name), state, caller, q, request| async move {
                    respond(secrets::put(state, caller, name, q, request).await)
                })
                .boxed(),
            Route::SecretList => warp::path!("v1" / "secrets")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|state, caller, q| async move {
                    respond(secrets::list(state, caller, q).await)
                })
                .boxed(),
            Route::SecretDelete => warp::path!("v1" / "secrets" / PathText)
                .and(warp::delete())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|PathText(name), state, caller, q| async move {
                    respond(secrets::delete(state, caller, name, q).await)
                })
                .boxed(),
            Route::Usage => warp::path!("v1" / "usage")
                .and(warp::get())
                .and(with(state))
                .and(auth())
                .and(query())
                .and_then(|state, caller, q| async move {
                    respond(usage::usage(state, caller, q).await)
                })
                .boxed(),
        }
    }
}

/// Whether request path `path` is an instance of `template` (`/v1/tasks/{id}`): literal
/// segments equal, `{id}` a task id (as the route parses it), any other `{...}` non-empty.
fn matches_template(template: &str, path: &str) -> bool {
    let (mut want, mut got) = (template.split('/'), path.split('/'));
    loop {
        match (want.next(), got.next()) {
            (None, None) => return true,
            (Some(w), Some(g)) => {
                let matched = match w {
                    "{id}" => g.parse::<TaskId>().is_ok(),
                    w if w.starts_with('{') => !g.is_empty(),
                    w => w == g,
                };
                if !matched {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

fn method_name(method: HttpMethod) -> &'static str {
    match method {
        HttpMethod::Get => "GET",
        HttpMethod::Post => "POST",
        HttpMethod::Put => "PUT",
        HttpMethod::Delete => "DELETE",
        HttpMethod::Options => "OPTIONS",
        HttpMethod::Head => "HEAD",
        HttpMethod::Patch => "PATCH",
        HttpMethod::Trace => "TRACE",
    }
}

/// A 405 names the methods its path serves (`Allow`, which RFC 9110 requires of a 405).
fn with_allow(path: FullPath, mut response: Response) -> Response {
    if response.status() == StatusCode::METHOD_NOT_ALLOWED {
        let allowed = Route::allowed_at(path.as_str()).join(", ");
        if let (false, Ok(value)) = (allowed.is_empty(), HeaderValue::from_str(&allowed)) {
            response.headers_mut().insert(header::ALLOW, value);
        }
    }
    response
}

fn respond(answer: Answer) -> Result<Response, Rejection> {
    answer.map_err(ApiError::reject)
}

fn with(state: &AdminState) -> impl Filter<Extract = (AdminState,), Error = Infallible> + Clone {
    let state = state.clone();
    warp::any().map(move || state.clone())
}

/// The query string as name/value pairs (empty without one).
fn query() -> impl Filter<Extract = (Pairs,), Error = Rejection> + Clone {
    warp::query::<Pairs>()
}

/// Every route of the admin API, errors included: what [`super::serve`] serves and what tests
/// drive with `warp::test::request()`.
pub fn routes(
    state: AdminState,
) -> impl Filter<Extract = (impl Reply,), Error = Infallible> + Clone + Send + Sync + 'static {
    let [first, rest @ ..] = Route::ALL;
    let api = rest
        .iter()
        .fold(first.filter(&state), |served, next| served.or(next.filter(&state)).unify().boxed());
    // The dashboard (`/ui`) first: its pages answer HTML, never the API's JSON errors.
    let served = super::ui::routes(state.clone()).or(api).unify().recover(recover).unify();
    warp::path::full().and(served).map(with_allow).with(warp::log::custom(|info| {
        let (method, path, status) = (info.method(), info.path(), info.status().as_u16());
        let elapsed_ms = info.elapsed().as_secs_f64() * 1000.0;
        if status >= 500 {
            tracing::warn!(%method, path, status, elapsed_ms, "admin API request failed");
        } else {
            tracing::debug!(%method, path, status, elapsed_ms, "admin API request");
        }
    }))
}
