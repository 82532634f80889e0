//! The page shell (head, nav, CSRF header for htmx), error pages and small rendering helpers
//! shared by every dashboard page.

use chrono::{DateTime, Utc};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::{Reply, Response};

use super::session::Session;
use crate::queue::TaskState;

/// How often live regions poll, in htmx's syntax.
pub const POLL: &str = "every 1s";

/// Sections in the nav: (path, label).
const NAV: [(&str, &str); 11] = [
    ("/ui", "Overview"),
    ("/ui/tasks", "Tasks"),
    ("/ui/queues", "Queues"),
    ("/ui/charts", "Charts"),
    ("/ui/dead", "Dead letters"),
    ("/ui/schedules", "Schedules"),
    ("/ui/workflows", "Workflows"),
    ("/ui/modules", "Modules"),
    ("/ui/runners", "Runners"),
    ("/ui/tenants", "Tenants"),
    ("/ui/usage", "Usage"),
];

/// A full page for a logged-in session; `here` is the nav entry to highlight.
pub fn page(session: &Session, here: &str, title: &str, body: Markup) -> Markup {
    let csrf = format!(r#"{{"X-CSRF-Token": "{}"}}"#, session.csrf);
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body hx-headers=(csrf) {
                header {
                    strong { "Sweep" }
                    nav {
                        @for (path, label) in NAV {
                            a href=(path) class=[(path == here).then_some("here")] { (label) }
                            " "
                        }
                    }
                    div.who {
                        span #who { (session.label()) }
                        form.inline method="post" action="/ui/logout" {
                            input type="hidden" name="csrf" value=(session.csrf);
                            button.quiet type="submit" { "Log out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

pub fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · Sweep" }
            link rel="stylesheet" href="/ui/static/style.css?v=2";
            script src="/ui/static/htmx.min.js?v=2.0.11" {}
        }
    }
}

/// A page shown without a session (login, errors before login).
pub fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" { (head(title)) body { main { (body) } } }
    }
}

pub fn html_response(status: StatusCode, markup: Markup) -> Response {
    let mut r =
        warp::reply::with_status(warp::reply::html(markup.into_string()), status).into_response();
    // Pages show live, per-session data.
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// 303 to `location` (after a form post).
pub fn see_other(location: &str) -> Response {
    let mut r = warp::reply::with_status(warp::reply(), StatusCode::SEE_OTHER).into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// An error page with the status and message the API would have answered.
pub fn error_page(session: Option<&Session>, status: StatusCode, message: &str) -> Response {
    let title = status.canonical_reason().unwrap_or("Error");
    let body = html! {
        h1 { (status.as_u16()) " " (title) }
        p.error #error { (message) }
        p { a href="/ui" { "Back to the overview" } }
    };
    let markup = match session {
        Some(s) => page(s, "", title, body),
        None => bare(title, body),
    };
    html_response(status, markup)
}

pub fn state_badge(state: TaskState) -> Markup {
    html! { span class=(format!("state state-{state}")) { (state.as_str()) } }
}

pub fn time(t: DateTime<Utc>) -> Markup {
    html! { time datetime=(t.to_rfc3339()) { (t.format("%Y-%m-%d %H:%M:%S")) } }
}

/// A duration in milliseconds, human-sized.
pub fn millis(ms: i64) -> String {
    match ms {
        ms if ms < 1_000 => format!("{ms} ms"),
        ms if ms < 120_000 => format!("{:.1} s", ms as f64 / 1000.0),
        ms if ms < 7_200_000 => format!("{} min", ms / 60_000),
        ms => format!("{:.1} h", ms as f64 / 3_600_000.0),
    }
}

/// Pretty-printed JSON in a `<pre>`.
pub fn json_block(id: &str, value: &serde_json::Value) -> Markup {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    html! { pre id=(id) { (text) } }
}

/// The CSRF field every mutation form carries.
pub fn csrf_field(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf); }
}

/// A notice line (e.g. after a requeue).
pub fn notice(text: Option<String>) -> Markup {
    html! { @if let Some(t) = text { p.notice #notice { (t) } } }
}

/// Raw SVG produced by [`super::chart`] (already escaped there).
pub fn svg(s: String) -> Markup {
    PreEscaped(s)
}
