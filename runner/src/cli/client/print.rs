//! Plain-text output for the client commands: aligned tables and short values.

use serde_json::Value;

/// Prints `rows` under `headers`, each column as wide as its widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> =
            cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// A JSON value as a table cell: strings bare, null as `-`.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// At most `max` characters of `s`, with an ellipsis when cut.
pub fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A timestamp cell without sub-second digits (`2026-01-02 03:04:05`).
pub fn time(v: &Value) -> String {
    match v.as_str() {
        Some(t) => t.get(..19).unwrap_or(t).replace('T', " "),
        None => cell(v),
    }
}

/// A byte count in the largest unit that keeps it readable.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Milliseconds as a short duration (`850ms`, `12.5s`, `3m20s`, `2h5m`).
pub fn millis(ms: i64) -> String {
    match ms {
        ms if ms < 1000 => format!("{ms}ms"),
        ms if ms < 60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        ms if ms < 3_600_000 => format!("{}m{}s", ms / 60_000, ms % 60_000 / 1000),
        ms => format!("{}h{}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// Pretty JSON for `--json` and for payloads and results.
pub fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_short_and_readable() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(millis(850), "850ms");
        assert_eq!(millis(12_500), "12.5s");
        assert_eq!(millis(200_000), "3m20s");
        assert_eq!(short("abcdef", 4), "abc…");
        assert_eq!(time(&Value::from("2026-01-02T03:04:05.123Z")), "2026-01-02 03:04:05");
        assert_eq!(cell(&Value::Null), "-");
    }
}
