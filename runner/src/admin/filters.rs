//! The route table: which method and path go to which handler, with what authentication and
//! body, and the one `recover` at the end.
//!
//! Invariants: every route matches path, then method, before it authenticates or reads a body
//! (so an unknown path costs nothing and answers 404); every `/v1` route and `/metrics`
//! authenticate; a rejection from any route becomes a JSON error in [`recover`].

use std::convert::Infallible;

use warp::reply::{Reply, Response};
use warp::{Filter, Rejection};

use super::auth::{authenticate, Caller};
use super::body;
use super::error::{recover, ApiError};
use super::handlers::{modules, ops, tasks, Answer};
use super::models::{ActivateRequest, EnqueueRequest, WeightRequest};
use super::AdminState;
use crate::queue::TaskId;

type Pairs = Vec<(String, String)>;

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
    let auth = || authenticate(state.clone());
    let json_limit = state.config().max_json_bytes;

    let healthz = warp::path!("healthz").and(warp::get()).map(ops::healthz);
    let readyz = warp::path!("readyz")
        .and(warp::get())
        .and(with(&state))
        .and_then(|state| async move { respond(ops::readyz(state).await) });
    let metrics = warp::path!("metrics")
        .and(warp::get())
        .and(with(&state))
        .and(auth())
        .and_then(|state, caller| async move { respond(ops::metrics(state, caller).await) });

    let upload = warp::path!("v1" / "modules" / String)
        .and(warp::put())
        .and(with(&state))
        .and(auth())
        .and(query())
        .and(warp::header::optional::<String>("content-type"))
        .and(warp::header::optional::<u64>("content-length"))
        .and(warp::body::stream())
        .and_then(|task_type, state, caller, q, content_type, length, body| async move {
            respond(modules::upload(state, caller, task_type, q, content_type, length, body).await)
        });
    let module_list = warp::path!("v1" / "modules")
        .and(warp::get())
        .and(with(&state))
        .and(auth())
        .and(query())
        .and_then(|state, caller, q| async move { respond(modules::list(state, caller, q).await) });
    let module_versions = warp::path!("v1" / "modules" / String)
        .and(warp::get())
        .and(with(&state))
        .and(auth())
        .and(query())
        .and_then(|task_type, state, caller, q| async move {
            respond(modules::versions(state, caller, task_type, q).await)
        });
    let activate = warp::path!("v1" / "modules" / String / "activate")
        .and(warp::post())
        .and(with(&state))
        .and(auth())
        .and(query())
        .and(body::json::<ActivateRequest>(json_limit))
        .and_then(|task_type, state, caller, q, request| async move {
            respond(modules::activate(state, caller, task_type, q, request).await)
        });

    let enqueue = warp::path!("v1" / "tasks")
        .and(warp::post())
        .and(with(&state))
        .and(auth())
        .and(query())
        .and(body::json::<EnqueueRequest>(json_limit))
        .and_then(|state, caller, q, request| async move {
            respond(tasks::enqueue(state, caller, q, request).await)
        });
    let batch = warp::path!("v1" / "tasks" / "batch")
        .and(warp::post())
        .and(with(&state))
        .and(auth())
        .and(query())
        .and(body::json::<Vec<EnqueueRequest>>(json_limit))
        .and_then(|state, caller, q, requests| async move {
            respond(tasks::enqueue_batch(state, caller, q, requests).await)
        });
    let task_show = warp::path!("v1" / "tasks" / TaskId)
        .and(warp::get())
        .and(with(&state))
        .and(auth())
        .and_then(|id, state, caller| async move { respond(tasks::show(state, caller, id).await) });
    let cancel = warp::path!("v1" / "tasks" / TaskId / "cancel")
        .and(warp::post())
        .and(with(&state))
        .and(auth())
        .and_then(
            |id, state, caller| async move { respond(tasks::cancel(state, caller, id).await) },
        );

    let dead = warp::path!("v1" / "dead")
        .and(warp::get())
        .and(with(&state))
        .and(auth())
        .and(query())
        .and_then(|state, caller, q| async move { respond(ops::dead(state, caller, q).await) });
    let requeue = warp::path!("v1" / "dead" / TaskId / "requeue")
        .and(warp::post())
        .and(with(&state))
        .and(auth())
        .and_then(
            |id, state, caller| async move { respond(ops::requeue(state, caller, id).await) },
        );
    let stats = warp::path!("v1" / "stats")
        .and(warp::get())
        .and(with(&state))
        .and(auth())
        .and(query())
        .and_then(|state, caller, q| async move { respond(ops::stats(state, caller, q).await) });
    let tenants =
        warp::path!("v1" / "tenants").and(warp::get()).and(with(&state)).and(auth()).and_then(
            |state, caller: Caller| async move { respond(ops::tenants(state, caller).await) },
        );

    let weight = warp::path!("v1" / "tenants" / String / "weight")
        .and(warp::put())
        .and(with(&state))
        .and(auth())
        .and(body::json::<WeightRequest>(json_limit))
        .and_then(|name, state, caller, request| async move {
            respond(ops::set_weight(state, caller, name, request).await)
        });

    let probes = healthz.or(readyz).unify().or(metrics).unify();
    let module_routes =
        upload.or(module_list).unify().or(module_versions).unify().or(activate).unify();
    let task_routes = enqueue.or(batch).unify().or(task_show).unify().or(cancel).unify();
    let ops_routes =
        dead.or(requeue).unify().or(stats).unify().or(tenants).unify().or(weight).unify();
    let ui = super::ui::routes(state.clone());
    probes
        .or(ui.boxed())
        .unify()
        .or(module_routes.boxed())
        .unify()
        .or(task_routes.boxed())
        .unify()
        .or(ops_routes.boxed())
        .unify()
        .recover(recover)
        .unify()
        .with(warp::log::custom(|info| {
            let (method, path, status) = (info.method(), info.path(), info.status().as_u16());
            let elapsed_ms = info.elapsed().as_secs_f64() * 1000.0;
            if status >= 500 {
                tracing::warn!(%method, path, status, elapsed_ms, "admin API request failed");
            } else {
                tracing::debug!(%method, path, status, elapsed_ms, "admin API request");
            }
        }))
}
