//! The overview's chart: per-minute successes and failed attempts over the last hour, as
//! inline SVG rendered on the server (no chart library, no script).
//!
//! Invariant: the output contains only numbers and fixed markup, so it needs no escaping.

use std::fmt::Write;

use crate::queue::MinuteCounts;

const WIDTH: u32 = 600;
const HEIGHT: u32 = 120;
const BAR_GAP: u32 = 2;

/// Two bars per minute (succeeded above the axis, failed below), scaled to the busiest minute.
pub fn throughput(minutes: &[MinuteCounts]) -> String {
    let half = HEIGHT / 2;
    let peak = minutes.iter().map(|m| m.succeeded.max(m.failed)).max().unwrap_or(0).max(1);
    let slot = WIDTH / u32::try_from(minutes.len().max(1)).unwrap_or(60).max(1);
    let bar = slot.saturating_sub(BAR_GAP).max(1);
    let scale = |n: i64| -> u32 {
        let h = (n as f64 / peak as f64 * f64::from(half - 4)).round();
        if n > 0 {
            (h as u32).max(1)
        } else {
            0
        }
    };
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg class="chart" id="throughput" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="succeeded and failed per minute, last hour">"##
    );
    let _ =
        write!(svg, r##"<line x1="0" y1="{half}" x2="{WIDTH}" y2="{half}" stroke="#c8cdd6"/>"##);
    for (i, m) in minutes.iter().enumerate() {
        let x = u32::try_from(i).unwrap_or(0) * slot;
        let (up, down) = (scale(m.succeeded), scale(m.failed));
        let minute = m.minute.format("%H:%M");
        let _ = write!(
            svg,
            r##"<g><title>{minute}: {} succeeded, {} failed</title><rect x="{x}" y="{}" width="{bar}" height="{up}" fill="#1f9d55"/><rect x="{x}" y="{half}" width="{bar}" height="{down}" fill="#d14343"/></g>"##,
            m.succeeded,
            m.failed,
            half - up,
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    #[test]
    fn bars_scale_to_the_busiest_minute() {
        let now = Utc::now();
        let minutes = vec![
            MinuteCounts { minute: now, succeeded: 0, failed: 0 },
            MinuteCounts { minute: now, succeeded: 10, failed: 5 },
        ];
        let svg = throughput(&minutes);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("10 succeeded, 5 failed"));
        // Busiest bar fills the upper half (60 - 4 = 56), the failure half of that.
        assert!(svg.contains(r#"height="56""#), "{svg}");
        assert!(svg.contains(r#"height="28""#), "{svg}");
        assert!(!throughput(&[]).is_empty());
    }
}
