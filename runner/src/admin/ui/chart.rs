//! Charts as inline SVG rendered on the server (no chart library, no script): stacked bars
//! over time (throughput, failures by kind) and lines over time (latency quantiles, on a log
//! scale), each with its axes, tick labels and unit.
//!
//! Invariant: the output holds only numbers, fixed markup and labels passed through
//! [`escape`], so it is safe to embed as is.

use std::fmt::Write;

use chrono::{DateTime, Utc};

use crate::queue::MinuteCounts;

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 220.0;
/// Room for the axes' labels: left, right, top, bottom.
const LEFT: f64 = 64.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;

/// Text for SVG: `&`, `<`, `>` and quotes escaped.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// One series of a chart: a name for the legend and the title tooltips, and a colour.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub colour: &'static str,
}

/// A time axis: the start of each step and the step's length in seconds.
#[derive(Debug, Clone)]
pub struct TimeAxis {
    pub steps: Vec<DateTime<Utc>>,
    pub step_secs: i64,
}

impl TimeAxis {
    fn x(&self, i: usize) -> f64 {
        let n = self.steps.len().max(1) as f64;
        LEFT + (WIDTH - LEFT - RIGHT) * i as f64 / n
    }

    fn slot(&self) -> f64 {
        (WIDTH - LEFT - RIGHT) / self.steps.len().max(1) as f64
    }

    /// About six labels along the bottom, by the step's length: hours and minutes within a
    /// day, day and hour beyond.
    fn labels(&self, svg: &mut String) {
        let n = self.steps.len();
        if n == 0 {
            return;
        }
        let every = (n / 6).max(1);
        let format = if self.step_secs >= 3600 { "%a %H:%M" } else { "%H:%M" };
        // The first label sits a step in, clear of the y axis's labels.
        for (i, at) in self.steps.iter().enumerate().skip(every / 2).step_by(every) {
            let x = self.x(i);
            let _ = write!(
                svg,
                r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{y1}" stroke="#98a2b3"/><text x="{x:.1}" y="{ty}" class="tick" text-anchor="middle">{}</text>"##,
                at.format(format),
                y0 = HEIGHT - BOTTOM,
                y1 = HEIGHT - BOTTOM + 4.0,
                ty = HEIGHT - BOTTOM + 16.0,
            );
        }
    }
}

/// A round upper bound for a linear axis reaching `max`, and its tick step.
fn nice_max(max: f64) -> (f64, f64) {
    if max <= 0.0 {
        return (1.0, 1.0);
    }
    let magnitude = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        let top = m * magnitude;
        if top >= max {
            let step = top / if m == 2.5 || m == 5.0 { 5.0 } else { 4.0 };
            // Counts: whole ticks once the axis reaches a few.
            let step = if top >= 4.0 && step < 1.0 { 1.0 } else { step };
            return (top, step);
        }
    }
    (10.0 * magnitude, 2.5 * magnitude)
}

fn frame(svg: &mut String, id: &str, label: &str) {
    let _ = write!(
        svg,
        r##"<svg class="chart" id="{id}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{}">"##,
        escape(label)
    );
}

fn y_axis_label(svg: &mut String, unit: &str) {
    let _ = write!(
        svg,
        r##"<text class="unit" x="12" y="{y}" transform="rotate(-90 12 {y})" text-anchor="middle">{}</text>"##,
        escape(unit),
        y = TOP + (HEIGHT - TOP - BOTTOM) / 2.0,
    );
}

fn axes(svg: &mut String) {
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{b}" stroke="#667085"/><line x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}" stroke="#667085"/>"##,
        b = HEIGHT - BOTTOM,
        r = WIDTH - RIGHT,
    );
}

/// Stacked bars, one stack per step: `values[i][s]` is series `s` in step `i`. The y axis is
/// linear from 0 with round ticks, labelled with `unit`.
pub fn stacked_bars(
    id: &str,
    label: &str,
    unit: &str,
    axis: &TimeAxis,
    series: &[Series],
    values: &[Vec<i64>],
) -> String {
    let peak = values.iter().map(|v| v.iter().sum::<i64>()).max().unwrap_or(0);
    let (top, tick) = nice_max(peak as f64);
    let plot = HEIGHT - TOP - BOTTOM;
    let y = |v: f64| HEIGHT - BOTTOM - plot * v / top;
    let mut svg = String::new();
    frame(&mut svg, id, label);
    let mut t = 0.0;
    while t <= top + tick / 2.0 {
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{r}" y2="{yy:.1}" stroke="#eef0f4"/><text x="{tx}" y="{ty:.1}" class="tick" text-anchor="end">{}</text>"##,
            round_label(t),
            yy = y(t),
            r = WIDTH - RIGHT,
            tx = LEFT - 6.0,
            ty = y(t) + 4.0,
        );
        t += tick;
    }
    let slot = axis.slot();
    let bar = (slot - 1.0).max(1.0);
    for (i, stack) in values.iter().enumerate() {
        let x = axis.x(i);
        let mut base = 0.0;
        let at =
            axis.steps.get(i).map(|t| t.format("%Y-%m-%d %H:%M").to_string()).unwrap_or_default();
        let mut title = format!("{at} UTC");
        for (s, &v) in stack.iter().enumerate() {
            if let Some(series) = series.get(s) {
                let _ = write!(title, ", {}: {v}", series.name);
            }
        }
        let _ = write!(svg, "<g><title>{}</title>", escape(&title));
        for (s, &v) in stack.iter().enumerate() {
            if v <= 0 {
                continue;
            }
            let colour = series.get(s).map_or("#667085", |s| s.colour);
            let (y0, y1) = (y(base), y(base + v as f64));
            let _ = write!(
                svg,
                r##"<rect x="{x:.1}" y="{y1:.1}" width="{bar:.1}" height="{h:.1}" fill="{colour}"/>"##,
                h = (y0 - y1).max(0.5),
            );
            base += v as f64;
        }
        svg.push_str("</g>");
    }
    axes(&mut svg);
    axis.labels(&mut svg);
    y_axis_label(&mut svg, unit);
    svg.push_str("</svg>");
    svg
}

/// Lines over time on a log scale of milliseconds (1 ms to the largest value, by decades);
/// `values[i][s]` is series `s` in step `i`, `None` where the step had nothing.
pub fn log_lines(
    id: &str,
    label: &str,
    axis: &TimeAxis,
    series: &[Series],
    values: &[Vec<Option<f64>>],
) -> String {
    let peak = values.iter().flatten().flatten().fold(1.0f64, |a, &b| a.max(b));
    let decades = peak.log10().ceil().max(1.0);
    let plot = HEIGHT - TOP - BOTTOM;
    let y = |ms: f64| HEIGHT - BOTTOM - plot * ms.max(1.0).log10() / decades;
    let mut svg = String::new();
    frame(&mut svg, id, label);
    for d in 0..=(decades as i32) {
        let ms = 10f64.powi(d);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{r}" y2="{yy:.1}" stroke="#eef0f4"/><text x="{tx}" y="{ty:.1}" class="tick" text-anchor="end">{}</text>"##,
            duration_label(ms),
            yy = y(ms),
            r = WIDTH - RIGHT,
            tx = LEFT - 6.0,
            ty = y(ms) + 4.0,
        );
    }
    let half = axis.slot() / 2.0;
    for (s, series_info) in series.iter().enumerate() {
        let mut path = String::new();
        let mut dots = String::new();
        let mut pen_down = false;
        for (i, row) in values.iter().enumerate() {
            match row.get(s).copied().flatten() {
                Some(ms) => {
                    let (x, yy) = (axis.x(i) + half, y(ms));
                    let _ = write!(path, "{}{x:.1},{yy:.1} ", if pen_down { "L" } else { "M" });
                    let at = axis
                        .steps
                        .get(i)
                        .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
                        .unwrap_or_default();
                    let _ = write!(
                        dots,
                        r##"<circle cx="{x:.1}" cy="{yy:.1}" r="2.2" fill="{c}"><title>{}</title></circle>"##,
                        escape(&format!("{at} UTC, {}: {}", series_info.name, duration_label(ms))),
                        c = series_info.colour,
                    );
                    pen_down = true;
                }
                None => pen_down = false,
            }
        }
        if !path.is_empty() {
            let _ = write!(
                svg,
                r##"<path d="{}" fill="none" stroke="{}" stroke-width="1.6"/>{dots}"##,
                path.trim_end(),
                series_info.colour
            );
        }
    }
    axes(&mut svg);
    axis.labels(&mut svg);
    y_axis_label(&mut svg, "enqueue to start (log)");
    svg.push_str("</svg>");
    svg
}

fn round_label(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{:.1}M", v / 1_000_000.0)
    } else if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Milliseconds as people read them: `250 ms`, `1.5 s`, `2 min`, `1 h`.
pub fn duration_label(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if ms < 60_000.0 {
        format!("{} s", round_label(ms / 1000.0))
    } else if ms < 3_600_000.0 {
        format!("{} min", round_label(ms / 60_000.0))
    } else {
        format!("{} h", round_label(ms / 3_600_000.0))
    }
}

/// The overview's small chart: per-minute successes and failed attempts over the last hour.
pub fn throughput(minutes: &[MinuteCounts]) -> String {
    let axis = TimeAxis { steps: minutes.iter().map(|m| m.minute).collect(), step_secs: 60 };
    let series = [
        Series { name: "succeeded".into(), colour: "#1f9d55" },
        Series { name: "failed attempts".into(), colour: "#d14343" },
    ];
    let values: Vec<Vec<i64>> = minutes.iter().map(|m| vec![m.succeeded, m.failed]).collect();
    stacked_bars(
        "throughput",
        "succeeded and failed per minute, last hour",
        "tasks / min",
        &axis,
        &series,
        &values,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    #[test]
    fn bars_have_axes_ticks_and_titles() {
        let now = Utc::now();
        let minutes = vec![
            MinuteCounts { minute: now, succeeded: 0, failed: 0 },
            MinuteCounts { minute: now, succeeded: 10, failed: 5 },
        ];
        let svg = throughput(&minutes);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("succeeded: 10, failed attempts: 5"), "{svg}");
        assert!(svg.contains(">tasks / min</text>"), "unit on the y axis: {svg}");
        assert!(svg.contains(">20</text>"), "round top tick (15 -> 20): {svg}");
        assert!(!throughput(&[]).is_empty());
    }

    #[test]
    fn round_axes_and_durations() {
        assert_eq!(nice_max(15.0), (20.0, 5.0));
        assert_eq!(nice_max(0.0), (1.0, 1.0));
        assert_eq!(nice_max(100.0), (100.0, 25.0));
        assert_eq!(duration_label(250.0), "250 ms");
        assert_eq!(duration_label(1500.0), "1.5 s");
        assert_eq!(duration_label(120_000.0), "2 min");
        assert_eq!(escape("<a&\"b\">"), "&lt;a&amp;&quot;b&quot;&gt;");
    }

    #[test]
    fn log_lines_skip_empty_steps() {
        let now = Utc::now();
        let axis = TimeAxis { steps: vec![now, now, now], step_secs: 60 };
        let series = [Series { name: "p50".into(), colour: "#000" }];
        let svg = log_lines(
            "lat",
            "x",
            &axis,
            &series,
            &[vec![Some(10.0)], vec![None], vec![Some(2000.0)]],
        );
        assert_eq!(svg.matches("<circle").count(), 2);
        assert_eq!(
            svg.matches(" M").count() + svg.matches("\"M").count(),
            2,
            "the gap lifts the pen: {svg}"
        );
        assert!(svg.contains(">1 s</text>") && svg.contains(">10 ms</text>"), "{svg}");
    }
}
