//! Charts: throughput, failed attempts by kind, and enqueue-to-start latency (p50, p99) over
//! the last hour, day or week, for every task type in scope or one of them, and a table of the
//! same per task type. Read from the runners' per-minute counters (`queue::minute_series`),
//! summed per step by Postgres: a refresh reads at most a week of minutes, never task history.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use maud::html;
use warp::http::StatusCode;

use super::chart::{self, duration_label, Series, TimeAxis};
use super::layout::{html_response, page, svg};
use super::session::Session;
use super::tasks::encode;
use super::{query, Page, Pairs};
use crate::admin::error::ApiError;
use crate::admin::AdminState;
use crate::queue::{self, lag_quantile, MinuteRange, MinuteTotals, MINUTE_LAG_BUCKETS};

/// The ranges a chart shows: (name, length, step).
const RANGES: [(&str, i64, i64); 3] =
    [("1h", 3600, 60), ("24h", 24 * 3600, 15 * 60), ("7d", 7 * 24 * 3600, 3600)];

/// Colours of failure kinds, in the order of `FailureKind::ALL` (then grey).
const KIND_COLOURS: [&str; 13] = [
    "#d14343", "#e07b39", "#c98a00", "#8e44ad", "#2f5bd3", "#16a085", "#7f8c8d", "#b03a2e",
    "#5d6d7e", "#a04000", "#1f618d", "#117a65", "#6c3483",
];

/// `GET /ui/charts?range=1h|24h|7d&task_type=` (`tenant=` for the operator).
pub async fn charts(state: AdminState, s: Session, q: Pairs) -> Page {
    let mut q = query(q)?;
    let tenant = s.caller().read_scope(q.take("tenant").as_deref())?;
    let range_name = q.take("range").unwrap_or_else(|| "1h".to_owned());
    let task_type = q.take("task_type");
    q.finish()?;
    if let Some(t) = &task_type {
        queue::validate_task_type(t)
            .map_err(|e| ApiError::bad_request("invalid_task_type", e.to_string()))?;
    }
    let &(_, length, step) =
        RANGES.iter().find(|(name, _, _)| *name == range_name).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_parameter",
                format!("parameter `range` must be 1h, 24h or 7d, got {range_name:?}"),
            )
        })?;
    // Whole steps, the current one included.
    let step_delta = TimeDelta::seconds(step);
    let now = Utc::now();
    let to = now.duration_trunc(step_delta).unwrap_or(now) + step_delta;
    let from = to - TimeDelta::seconds(length);
    let range = MinuteRange {
        tenant: tenant.clone(),
        task_type: task_type.clone(),
        from,
        to,
        step: std::time::Duration::from_secs(step.unsigned_abs()),
    };
    let series = queue::minute_series(state.store(), &range).await?;
    let types =
        queue::minute_types(state.store(), &MinuteRange { task_type: None, ..range.clone() })
            .await?;
    let steps: Vec<DateTime<Utc>> =
        (0..length / step).map(|i| from + TimeDelta::seconds(i * step)).collect();
    let at = |t: DateTime<Utc>| series.iter().find(|m| m.at == t);
    let axis = TimeAxis { steps: steps.clone(), step_secs: step };
    let per = if step == 60 {
        "min".to_owned()
    } else {
        duration_label(step as f64 * 1000.0).replace(' ', "")
    };

    // Throughput: succeeded and failed attempts per step.
    let outcome = [
        Series { name: "succeeded".into(), colour: "#1f9d55" },
        Series { name: "failed attempts".into(), colour: "#d14343" },
    ];
    let outcomes: Vec<Vec<i64>> =
        steps.iter().map(|t| at(*t).map_or(vec![0, 0], |m| vec![m.succeeded, m.failed])).collect();

    // Failures by kind: the kinds seen in the range, in the vocabulary's order.
    let mut kinds: Vec<String> = queue::FailureKind::ALL
        .iter()
        .map(|k| k.as_str().to_owned())
        .filter(|k| series.iter().any(|m| m.failures.0.contains_key(k)))
        .collect();
    for m in &series {
        for k in m.failures.0.keys() {
            if !kinds.contains(k) {
                kinds.push(k.clone());
            }
        }
    }
    let kind_series: Vec<Series> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| Series {
            name: k.clone(),
            colour: KIND_COLOURS.get(i).copied().unwrap_or("#98a2b3"),
        })
        .collect();
    let by_kind: Vec<Vec<i64>> = steps
        .iter()
        .map(|t| {
            kinds
                .iter()
                .map(|k| at(*t).and_then(|m| m.failures.0.get(k).copied()).unwrap_or(0))
                .collect()
        })
        .collect();

    // Latency: p50 and p99 of enqueue (due) to start per step.
    let quantiles = [
        Series { name: "p50".into(), colour: "#2f5bd3" },
        Series { name: "p99".into(), colour: "#c98a00" },
    ];
    let latency: Vec<Vec<Option<f64>>> = steps
        .iter()
        .map(|t| {
            let h = at(*t).map(|m| m.lag_ms.clone()).unwrap_or_default();
            vec![lag_quantile(&h, 0.5), lag_quantile(&h, 0.99)]
        })
        .collect();

    let mut keep: Vec<(&str, String)> = Vec::new();
    if let (true, Some(t)) = (s.is_operator(), &tenant) {
        keep.push(("tenant", t.clone()));
    }
    let url = |range: &str, task_type: Option<&str>| {
        let mut pairs = keep.clone();
        pairs.push(("range", range.to_owned()));
        if let Some(t) = task_type {
            pairs.push(("task_type", t.to_owned()));
        }
        format!("/ui/charts?{}", encode(&pairs))
    };
    let scope = task_type
        .as_deref()
        .map_or_else(|| "every task type".to_owned(), |t| format!("task type {t}"));
    let totals = sum(&series);
    let body = html! {
        h1 { "Charts" }
        nav.tabs #ranges {
            @for (name, _, _) in RANGES {
                a id=(format!("range-{name}")) href=(url(name, task_type.as_deref())) class=[(name == range_name).then_some("here")] {
                    "last " (name)
                }
            }
            span.muted { " · " (scope) " · steps of " (duration_label(step as f64 * 1000.0)) " · UTC" }
            @if task_type.is_some() { " " a href=(url(&range_name, None)) { "all task types" } }
        }
        div #live hx-get="" hx-trigger="every 5s" hx-select="#live" hx-swap="outerHTML" {
            p.muted #chart-totals {
                (totals.succeeded) " succeeded, " (totals.failed) " failed attempts, " (totals.started) " started"
                @if let Some(p50) = lag_quantile(&totals.lag_ms, 0.5) { "; enqueue to start p50 " (duration_label(p50)) }
                @if let Some(p99) = lag_quantile(&totals.lag_ms, 0.99) { ", p99 " (duration_label(p99)) }
            }
            h2 { "Throughput" }
            (legend(&outcome))
            (svg(chart::stacked_bars("chart-throughput", "tasks succeeded and attempts failed per step", &format!("tasks / {per}"), &axis, &outcome, &outcomes)))
            h2 { "Failures by kind" }
            @if kinds.is_empty() { p.muted #no-failures { "No failed attempts in this range." } } @else { (legend(&kind_series)) }
            (svg(chart::stacked_bars("chart-failures", "failed attempts per step by kind", &format!("attempts / {per}"), &axis, &kind_series, &by_kind)))
            h2 { "Enqueue to start" }
            (legend(&quantiles))
            p.muted { "From the time a task was due (enqueued, or its run_at) to its start on a runner; p50 and p99 of the tasks started in each step." }
            (svg(chart::log_lines("chart-latency", "enqueue to start latency, p50 and p99", &axis, &quantiles, &latency)))
            h2 { "Per task type" }
            @if types.is_empty() {
                p.muted #no-chart-types { "Nothing ran in this range." }
            } @else {
                table #chart-types {
                    thead { tr {
                        th { "task type" } th.num { "succeeded" } th.num { "failed attempts" }
                        th { "failures by kind" } th.num { "started" } th.num { "p50 to start" } th.num { "p99 to start" }
                    } }
                    tbody {
                        @for t in &types {
                            tr id=(format!("chart-type-{}", t.task_type.replace(':', "_"))) {
                                td { a href=(url(&range_name, Some(&t.task_type))) { (t.task_type) } }
                                td.num { (t.succeeded) } td.num { (t.failed) }
                                td { @for (k, n) in &t.failures.0 { code { (k) } " " (n) " " } }
                                td.num { (t.started) }
                                td.num { (lag_quantile(&t.lag_ms, 0.5).map(duration_label).unwrap_or_default()) }
                                td.num { (lag_quantile(&t.lag_ms, 0.99).map(duration_label).unwrap_or_default()) }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(StatusCode::OK, page(&s, "/ui/charts", "Charts", body)))
}

fn legend(series: &[Series]) -> maud::Markup {
    html! {
        p.legend {
            @for s in series {
                span.key { span.swatch style=(format!("background:{}", s.colour)) {} (s.name) } " "
            }
        }
    }
}

/// Every step of a series added up.
fn sum(series: &[MinuteTotals]) -> MinuteTotals {
    let mut total = MinuteTotals { lag_ms: vec![0; MINUTE_LAG_BUCKETS], ..MinuteTotals::default() };
    for m in series {
        total.succeeded += m.succeeded;
        total.failed += m.failed;
        total.started += m.started;
        for (slot, n) in total.lag_ms.iter_mut().zip(&m.lag_ms) {
            *slot += n;
        }
    }
    total
}
