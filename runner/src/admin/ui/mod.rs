//! The web dashboard at `/ui`: server-rendered HTML (maud) with vendored htmx for live
//! regions, on the same authentication, tenant scoping and queue functions as the JSON API.
//!
//! Files: `session` (cookie login, CSRF), `layout` (page shell, errors, helpers), `chart`
//! (inline SVG), `overview`, `tasks` (list, detail), `dead` (dead letters, requeue), `manage`
//! (modules and activation, tenants and weights), `usage` (usage per task type and day),
//! `static/` (htmx, CSS).
//!
//! Invariants:
//! - every page but the login and static files needs a session; without one it redirects to
//!   `/ui/login`; another tenant's task is a 404 page, as in the API;
//! - every mutation is a POST that passes [`post`]: a session that may write (read-only
//!   tokens get a 403 page), a matching `Origin`, and the session's CSRF token;
//! - every `/ui` request is answered with HTML (the JSON `recover` never sees one), and no
//!   input panics: bad parameters are 400 pages.

mod bulk;
mod chart;
mod charts;
mod dead;
mod layout;
mod manage;
mod overview;
mod queues;
mod runners;
mod schedules;
mod session;
mod tasks;
mod usage;
mod workflows;

use std::convert::Infallible;
use std::future::Future;

use warp::filters::BoxedFilter;
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::{Reply, Response};
use warp::{Filter, Rejection};

use self::layout::{error_page, see_other};
use self::session::{NoSession, Session};
use super::error::ApiError;
use super::params::{PathText, Query};
use super::AdminState;
use crate::queue::TaskId;

pub type Pairs = Vec<(String, String)>;
/// What a page or action answers; an error becomes an HTML error page.
pub type Page = Result<Response, ApiError>;

/// Largest form body accepted.
const MAX_FORM_BYTES: u64 = 16 * 1024;

/// The query string with empty values dropped (an untouched filter field means "any").
pub fn query(pairs: Pairs) -> Result<Query, ApiError> {
    Query::new(pairs.into_iter().filter(|(_, v)| !v.trim().is_empty()).collect())
}

/// Everything a POST is checked with.
#[derive(Debug)]
struct PostMeta {
    cookie: Option<String>,
    csrf_header: Option<String>,
    origin: Option<String>,
    host: Option<String>,
}

async fn with_session<F, Fut>(state: AdminState, cookie: Option<String>, f: F) -> Response
where
    F: FnOnce(AdminState, Session) -> Fut,
    Fut: Future<Output = Page>,
{
    let session = match session::from_cookie(&state, cookie.as_deref()).await {
        Ok(s) => s,
        Err(NoSession::Login) => return see_other("/ui/login"),
        Err(NoSession::Failed(e)) => return error_page(None, e.status, &e.message),
    };
    match f(state, session.clone()).await {
        Ok(r) => r,
        Err(e) => error_page(Some(&session), e.status, &e.message),
    }
}

/// A GET page: session, then `f`.
async fn get<F, Fut>(state: AdminState, cookie: Option<String>, q: Pairs, f: F) -> Response
where
    F: FnOnce(AdminState, Session, Pairs) -> Fut,
    Fut: Future<Output = Page>,
{
    with_session(state, cookie, |state, s| f(state, s, q)).await
}

/// A mutation: session that may write, same origin, CSRF token; then `f` with the form.
async fn post<F, Fut>(state: AdminState, meta: PostMeta, form: Pairs, f: F) -> Response
where
    F: FnOnce(AdminState, Session, Pairs) -> Fut,
    Fut: Future<Output = Page>,
{
    checked_post(state, meta, form, true, f).await
}

/// Like [`post`]; `writes: false` (logging out) lets read-only sessions through too.
async fn checked_post<F, Fut>(
    state: AdminState,
    meta: PostMeta,
    mut form: Pairs,
    writes: bool,
    f: F,
) -> Response
where
    F: FnOnce(AdminState, Session, Pairs) -> Fut,
    Fut: Future<Output = Page>,
{
    let field = form.iter().position(|(k, _)| k == "csrf").map(|i| form.remove(i).1);
    with_session(state, meta.cookie, |state, s| async move {
        if writes && s.read_only() {
            return Err(super::auth::read_only_refusal());
        }
        if !session::origin_ok(meta.origin.as_deref(), meta.host.as_deref()) {
            return Err(forbidden("cross-origin request refused"));
        }
        if !session::csrf_ok(&s, meta.csrf_header.as_deref(), field.as_deref()) {
            return Err(forbidden("missing or stale CSRF token: reload the page and try again"));
        }
        f(state, s, form).await
    })
    .await
}

fn forbidden(message: &str) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Versioned URLs (`?v=`): a new file gets a new URL.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    r
}

const HTMX: &str = include_str!("static/htmx.min.js");
const CSS: &str = include_str!("static/style.css");

fn with(state: &AdminState) -> impl Filter<Extract = (AdminState,), Error = Infallible> + Clone {
    let state = state.clone();
    warp::any().map(move || state.clone())
}

fn post_meta() -> impl Filter<Extract = (PostMeta,), Error = Rejection> + Clone {
    warp::header::optional::<String>("cookie")
        .and(warp::header::optional::<String>("x-csrf-token"))
        .and(warp::header::optional::<String>("origin"))
        .and(warp::header::optional::<String>("host"))
        .map(|cookie, csrf_header, origin, host| PostMeta { cookie, csrf_header, origin, host })
}

fn form() -> impl Filter<Extract = (Pairs,), Error = Rejection> + Clone {
    warp::body::content_length_limit(MAX_FORM_BYTES).and(warp::body::form::<Pairs>())
}

/// Every `/ui` route; anything under `/ui` that matches none is an HTML 404.
pub fn routes(state: AdminState) -> BoxedFilter<(Response,)> {
    let cookie = || warp::header::optional::<String>("cookie");
    let q = || warp::query::<Pairs>();

    let htmx = warp::path!("static" / "htmx.min.js")
        .and(warp::get())
        .map(|| asset(HTMX, "text/javascript; charset=utf-8"));
    let css = warp::path!("static" / "style.css")
        .and(warp::get())
        .map(|| asset(CSS, "text/css; charset=utf-8"));

    let login_page =
        warp::path!("login").and(warp::get()).map(|| overview::login_page(None, StatusCode::OK));
    let login =
        warp::path!("login").and(warp::post()).and(with(&state)).and(post_meta()).and(form()).then(
            |state, meta: PostMeta, form| async move {
                overview::login(state, meta.origin, meta.host, form).await
            },
        );
    let logout = warp::path!("logout")
        .and(warp::post())
        .and(with(&state))
        .and(post_meta())
        .and(form())
        .then(|state, meta, form| {
            checked_post(state, meta, form, false, |state, s, _| async move {
                overview::logout(&state, &s).await
            })
        });

    let home = warp::path::end()
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, overview::overview));
    let task_list = warp::path!("tasks")
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, tasks::list));
    let task = warp::path!("tasks" / TaskId)
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|id, state, cookie, q| {
            get(state, cookie, q, move |state, s, q| tasks::show(state, s, id, q))
        });
    let cancel_task = warp::path!("tasks" / TaskId / "cancel")
        .and(warp::post())
        .and(with(&state))
        .and(post_meta())
        .and(form())
        .then(|id, state, meta, form| {
            post(state, meta, form, move |state, s, form| tasks::cancel(state, s, id, form))
        });
    let bulk = warp::path!("tasks" / "bulk")
        .and(warp::post())
        .and(with(&state))
        .and(post_meta())
        .and(form())
        .then(|state, meta, form| post(state, meta, form, bulk::bulk));
    let dead_list = warp::path!("dead")
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, dead::list));
    let requeue_one = warp::path!("dead" / TaskId / "requeue")
        .and(warp::post())
        .and(with(&state))
        .and(post_meta())
        .and(form())
        .then(|id, state, meta, form| {
            post(state, meta, form, move |state, s, form| dead::requeue_one(state, s, id, form))
        });
    let requeue_all = warp::path!("dead" / "requeue")
        .and(warp::post())
        .and(with(&state))
        .and(post_meta())
        .and(form())
        .then(|state, meta, form| post(state, meta, form, dead::requeue_all));
    let modules = warp::path!("modules")
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, manage::modules));
    let activate = warp::path!("modules" / PathText / PathText / "activate")
        .and(warp::post())
        .and(with(&state))
        .and(post_meta())
        .and(form())
        .then(|PathText(tenant), PathText(task_type), state, meta, form| {
            post(state, meta, form, move |state, s, form| {
                manage::activate(state, s, tenant, task_type, form)
            })
        });
    let tenants = warp::path!("tenants")
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, manage::tenants));
    let queue_list = warp::path!("queues")
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, queues::list));
    let queue_act = warp::path!("queues" / PathText / PathText / String)
        .and(warp::post())
        .and(with(&state))
        .and(post_meta())
        .and(form())
        .then(|PathText(tenant), PathText(task_type), act: String, state, meta, form| {
            post(state, meta, form, move |state, s, form| async move {
                match act.as_str() {
                    "pause" => queues::pause(state, s, tenant, task_type, true, form).await,
                    "resume" => queues::pause(state, s, tenant, task_type, false, form).await,
                    "rate-limit" => queues::rate_limit(state, s, tenant, task_type, form).await,
                    "max-running" => queues::max_running(state, s, tenant, task_type, form).await,
                    _ => Err(ApiError::not_found("no such queue action")),
                }
            })
        });
    let tenant_pause = warp::path!("tenants" / PathText / String)
        .and(warp::post())
        .and(with(&state))
        .and(post_meta())
        .and(form())
        .then(|PathText(name), act: String, state, meta, form| {
            post(state, meta, form, move |state, s, form| async move {
                match act.as_str() {
                    "pause" => queues::pause_tenant(state, s, name, true, form).await,
                    "resume" => queues::pause_tenant(state, s, name, false, form).await,
                    "weight" => manage::set_weight(state, s, name, form).await,
                    _ => Err(ApiError::not_found("no such tenant action")),
                }
            })
        });
    let schedule_list = warp::path!("schedules")
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, schedules::list));
    let schedule_act = warp::path!("schedules" / PathText / PathText / String)
        .and(warp::post())
        .and(with(&state))
        .and(post_meta())
        .and(form())
        .then(|PathText(tenant), PathText(name), act: String, state, meta, form| {
            post(state, meta, form, move |state, s, form| async move {
                let act = match act.as_str() {
                    "pause" => schedules::Act::Pause,
                    "resume" => schedules::Act::Resume,
                    "delete" => schedules::Act::Delete,
                    _ => return Err(ApiError::not_found("no such schedule action")),
                };
                schedules::act(state, s, tenant, name, act, form).await
            })
        });
    let workflow_list = warp::path!("workflows")
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, workflows::list));
    let workflow = warp::path!("workflows" / i64)
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|id, state, cookie, q| {
            get(state, cookie, q, move |state, s, q| workflows::show(state, s, id, q))
        });
    let workflow_cancel = warp::path!("workflows" / i64 / "cancel")
        .and(warp::post())
        .and(with(&state))
        .and(post_meta())
        .and(form())
        .then(|id, state, meta, form| {
            post(state, meta, form, move |state, s, form| workflows::cancel(state, s, id, form))
        });
    let chart_page = warp::path!("charts")
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, charts::charts));
    let runner_list = warp::path!("runners")
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, runners::list));
    let usage_page = warp::path!("usage")
        .and(warp::get())
        .and(with(&state))
        .and(cookie())
        .and(q())
        .then(|state, cookie, q| get(state, cookie, q, usage::page_usage));
    let console = queue_list
        .or(queue_act)
        .unify()
        .or(tenant_pause)
        .unify()
        .or(schedule_list)
        .unify()
        .or(schedule_act)
        .unify()
        .or(runner_list)
        .unify()
        .or(chart_page)
        .unify()
        .or(workflow_list)
        .unify()
        .or(workflow)
        .unify()
        .or(workflow_cancel)
        .unify()
        .or(usage_page)
        .unify();

    let assets = htmx.or(css).unify().or(login_page).unify().or(login).unify().or(logout).unify();
    let pages = home
        .or(task_list)
        .unify()
        .or(task)
        .unify()
        .or(cancel_task)
        .unify()
        .or(bulk)
        .unify()
        .or(dead_list)
        .unify()
        .or(requeue_one)
        .unify()
        .or(requeue_all)
        .unify();
    let admin = modules.or(activate).unify().or(tenants).unify();
    let inner = assets
        .boxed()
        .or(pages.boxed())
        .unify()
        .or(admin.boxed())
        .unify()
        .or(console.boxed())
        .unify()
        .recover(|r: Rejection| async move { Ok::<_, Infallible>(rejected(&r)) })
        .unify();
    warp::path("ui").and(inner).boxed()
}

/// Any rejection under `/ui` (no such page, wrong method, bad form) as an HTML page.
fn rejected(r: &Rejection) -> Response {
    let (status, message) = if r.is_not_found() {
        (StatusCode::NOT_FOUND, "no such page")
    } else if r.find::<warp::reject::MethodNotAllowed>().is_some() {
        (StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this page")
    } else if r.find::<warp::reject::PayloadTooLarge>().is_some() {
        (StatusCode::PAYLOAD_TOO_LARGE, "form too large")
    } else {
        (StatusCode::BAD_REQUEST, "bad request: the form or query could not be read")
    };
    error_page(None, status, message)
}
