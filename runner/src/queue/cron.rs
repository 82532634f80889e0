//! Cron expressions and their ticks, pure: parsing an expression (optional seconds) in an IANA
//! time zone, the next and latest tick, and what a due schedule does at a given moment
//! ([`plan_tick`]). No database here; `schedules.rs` keeps the rows and runs the ticks.
//!
//! Invariant: expressions are parsed and evaluated by croner in the zone's wall clock
//! (chrono-tz), never by a parser of our own; [`CronSpec::next_after`] and
//! [`CronSpec::latest_until`] are the whole tick computation.

use std::{fmt, str::FromStr, time::Duration};

use chrono::{DateTime, Utc};
use croner::parser::{CronParser, Seconds, Year};
use serde::{Deserialize, Serialize};

/// A tick reached later than this after its time is late: `catch_up = skip` drops it. The
/// scheduler runs every second and wakes at the next due tick, so only downtime (or an outage
/// of Postgres) makes a tick late.
pub const LATE_AFTER: Duration = Duration::from_secs(10);
pub const MAX_CRON_LEN: usize = 256;

/// What a tick does while the schedule's previous task is still live.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// No task for this tick (counted in `skipped_ticks`).
    #[default]
    Skip,
    /// A task for every tick.
    Allow,
}

/// What the scheduler does with ticks it reaches late (after downtime).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// The latest due tick runs once, however many were missed.
    #[default]
    Latest,
    /// A tick more than 10 s late does not run; the schedule waits for its next tick.
    Skip,
}

impl Overlap {
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
        }
    }
}

impl CatchUp {
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Latest => "latest",
            CatchUp::Skip => "skip",
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Overlap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Overlap::Skip, Overlap::Allow]
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| format!("overlap must be skip or allow, got {s:?}"))
    }
}

impl FromStr for CatchUp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [CatchUp::Latest, CatchUp::Skip]
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("catch_up must be latest or skip, got {s:?}"))
    }
}

impl TryFrom<String> for Overlap {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl TryFrom<String> for CatchUp {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// Why a cron expression or its time zone was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidCron {
    #[error("cron {expr:?} is not a cron expression ([seconds] minute hour day-of-month month day-of-week): {reason}")]
    BadCron { expr: String, reason: String },
    #[error("cron {0:?} never fires")]
    NeverFires(String),
    #[error("timezone {0:?} is not an IANA time zone name (e.g. UTC, Europe/Berlin)")]
    UnknownTimezone(String),
}

/// A parsed cron expression in its time zone: when it ticks.
#[derive(Debug, Clone)]
pub struct CronSpec {
    cron: croner::Cron,
    tz: chrono_tz::Tz,
}

impl CronSpec {
    /// Five fields (minute hour day-of-month month day-of-week) or six (seconds first), as
    /// croner reads them (names like `MON`, `L`, `#`, `W` included; day of month and day of week
    /// are ORed as in Vixie cron), in IANA zone `timezone`. An expression that never fires is
    /// refused too.
    pub fn parse(expr: &str, timezone: &str) -> Result<CronSpec, InvalidCron> {
        let bad = |reason: String| InvalidCron::BadCron { expr: expr.to_owned(), reason };
        if expr.len() > MAX_CRON_LEN {
            return Err(bad(format!("longer than {MAX_CRON_LEN} bytes")));
        }
        // croner reads an alias such as `@hourly` too; `@reboot` has no ticks.
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expr)
            .map_err(|e| bad(e.to_string()))?;
        let tz: chrono_tz::Tz =
            timezone.parse().map_err(|_| InvalidCron::UnknownTimezone(timezone.to_owned()))?;
        let spec = CronSpec { cron, tz };
        if spec.next_after(Utc::now()).is_none() {
            return Err(InvalidCron::NeverFires(expr.to_owned()));
        }
        Ok(spec)
    }

    /// The first tick strictly after `t`; `None` when there is none.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.tz);
        self.cron.find_next_occurrence(&local, false).ok().map(|n| n.with_timezone(&Utc))
    }

    /// The latest tick at or before `t`; `None` when there is none.
    pub fn latest_until(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.tz);
        self.cron.find_previous_occurrence(&local, true).ok().map(|p| p.with_timezone(&Utc))
    }

    /// The zone's IANA name.
    pub fn timezone(&self) -> &'static str {
        self.tz.name()
    }
}

/// What a due schedule does at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickPlan {
    /// Enqueue the task of `tick`, then wait for `next` (`None`: no tick left).
    Run { tick: DateTime<Utc>, next: Option<DateTime<Utc>> },
    /// Nothing for `tick` (`overlapped`: the previous task is live; else it is late).
    Skip { tick: DateTime<Utc>, next: Option<DateTime<Utc>>, overlapped: bool },
}

/// The decision for a schedule due at `next_run_at`, seen at `now` (the pure part of a tick).
pub fn plan_tick(
    spec: &CronSpec,
    next_run_at: DateTime<Utc>,
    now: DateTime<Utc>,
    catch_up: CatchUp,
    overlap: Overlap,
    previous_live: bool,
) -> TickPlan {
    // `next_run_at` is a tick itself; a later one up to `now` means the earlier were missed.
    let tick = spec.latest_until(now).filter(|t| *t >= next_run_at).unwrap_or(next_run_at);
    let next = spec.next_after(now.max(tick));
    let late = (now - tick).to_std().is_ok_and(|d| d > LATE_AFTER);
    if catch_up == CatchUp::Skip && late {
        return TickPlan::Skip { tick, next, overlapped: false };
    }
    if overlap == Overlap::Skip && previous_live {
        return TickPlan::Skip { tick, next, overlapped: true };
    }
    TickPlan::Run { tick, next }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(super) mod tests {
    use super::*;
    use chrono::TimeZone;

    /// A UTC time, for the tests here and in `schedules.rs`.
    pub(in crate::queue) fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    #[test]
    fn a_daily_local_time_follows_the_zone_across_dst() {
        // 09:00 in New York is 14:00 UTC in winter (EST) and 13:00 UTC in summer (EDT); the
        // clocks went forward on 2026-03-08 at 02:00 and back on 2026-11-01 at 02:00.
        let spec = CronSpec::parse("0 9 * * *", "America/New_York").unwrap();
        let before_spring = utc(2026, 3, 7, 14, 0, 0);
        assert_eq!(spec.next_after(before_spring), Some(utc(2026, 3, 8, 13, 0, 0)));
        assert_eq!(spec.latest_until(utc(2026, 3, 8, 13, 30, 0)), Some(utc(2026, 3, 8, 13, 0, 0)));
        let before_autumn = utc(2026, 10, 31, 13, 0, 0);
        assert_eq!(spec.next_after(before_autumn), Some(utc(2026, 11, 1, 14, 0, 0)));
        // The same expression in UTC ignores New York's clocks.
        let plain = CronSpec::parse("0 9 * * *", "UTC").unwrap();
        assert_eq!(plain.next_after(before_spring), Some(utc(2026, 3, 8, 9, 0, 0)));
    }

    #[test]
    fn a_tick_inside_the_spring_gap_runs_once_and_the_repeated_hour_once() {
        // 02:30 does not exist in New York on 2026-03-08 (02:00 -> 03:00 EDT): croner runs it
        // at the first instant after the gap, 03:00 EDT = 07:00 UTC, then 02:30 EDT the next day.
        let spec = CronSpec::parse("30 2 * * *", "America/New_York").unwrap();
        let first = spec.next_after(utc(2026, 3, 8, 5, 0, 0)).unwrap();
        assert_eq!(first, utc(2026, 3, 8, 7, 0, 0));
        assert_eq!(spec.next_after(first), Some(utc(2026, 3, 9, 6, 30, 0)));
        // 01:30 happens twice on 2026-11-01 (EDT at 05:30 UTC, then EST at 06:30 UTC): one tick.
        let spec = CronSpec::parse("30 1 * * *", "America/New_York").unwrap();
        let first = spec.next_after(utc(2026, 11, 1, 4, 0, 0)).unwrap();
        assert_eq!(first, utc(2026, 11, 1, 5, 30, 0));
        assert_eq!(spec.next_after(first), Some(utc(2026, 11, 2, 6, 30, 0)));
    }

    #[test]
    fn seconds_are_optional() {
        let every_second = CronSpec::parse("* * * * * *", "UTC").unwrap();
        let t = utc(2026, 12, 1, 0, 0, 0);
        assert_eq!(every_second.next_after(t), Some(utc(2026, 12, 1, 0, 0, 1)));
        let every_minute = CronSpec::parse("* * * * *", "UTC").unwrap();
        assert_eq!(every_minute.next_after(t), Some(utc(2026, 12, 1, 0, 1, 0)));
        let at_fifteen = CronSpec::parse("15 * * * * *", "UTC").unwrap();
        assert_eq!(at_fifteen.next_after(t), Some(utc(2026, 12, 1, 0, 0, 15)));
    }

    #[test]
    fn bad_expressions_and_zones_are_named() {
        for bad in ["", "* * *", "61 * * * *", "* * * * * * *", "nonsense", "*/0 * * * *"] {
            assert!(
                matches!(CronSpec::parse(bad, "UTC"), Err(InvalidCron::BadCron { .. })),
                "{bad:?} parsed"
            );
        }
        let e = CronSpec::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert_eq!(e, InvalidCron::UnknownTimezone("Mars/Olympus".into()));
        assert!(e.to_string().starts_with("timezone "), "{e}");
        assert!(CronSpec::parse("0 0 0 30 2 *", "UTC")
            .unwrap_err()
            .to_string()
            .starts_with("cron "));
    }

    #[test]
    fn odd_expressions_parse_or_are_refused_without_panicking() {
        let odd = [
            "@",
            "@reboot",
            "@hourly",
            "L",
            "#",
            "5#",
            "1-",
            "-1",
            "*/",
            "/",
            "/5 * * * *",
            "ÄÖ * * * *",
            "0 0 L * *",
            "0 0 * * 5#9",
            "0 0 31W * *",
            "? ? ? ? ?",
            "1,,2 * * * *",
            "99999999999999999999 * * * *",
            " ",
            "\u{0}",
            "W",
            "LW * * * *",
            "* * * * 7#L",
            "* * * * +MON",
            "0 0 29 2 *",
            "5-1 * * * *",
            "*/60 * * * *",
            "* * * * * * * *",
            "0 0 1-31/0 * *",
            "0 0 * * MON-SUN#2",
            "٣ * * * *",
            "0x10 * * * *",
        ];
        for expr in odd {
            if let Ok(spec) = CronSpec::parse(expr, "UTC") {
                let t = utc(2026, 12, 1, 0, 0, 0);
                let next = spec.next_after(t);
                assert!(next.is_some_and(|n| n > t), "{expr:?}: {next:?}");
            }
        }
    }

    #[test]
    fn missed_ticks_follow_the_catch_up_policy() {
        let spec = CronSpec::parse("0 * * * * *", "UTC").unwrap();
        let due = utc(2026, 12, 1, 10, 0, 0);
        // On time: the due tick itself.
        let now = utc(2026, 12, 1, 10, 0, 0) + chrono::Duration::milliseconds(300);
        let on_time = TickPlan::Run { tick: due, next: Some(utc(2026, 12, 1, 10, 1, 0)) };
        assert_eq!(plan_tick(&spec, due, now, CatchUp::Latest, Overlap::Allow, false), on_time);
        assert_eq!(plan_tick(&spec, due, now, CatchUp::Skip, Overlap::Allow, false), on_time);
        // An hour down: latest runs the 10:59 tick once and waits for 11:00 ...
        let now = utc(2026, 12, 1, 10, 59, 30);
        let latest = TickPlan::Run {
            tick: utc(2026, 12, 1, 10, 59, 0),
            next: Some(utc(2026, 12, 1, 11, 0, 0)),
        };
        assert_eq!(plan_tick(&spec, due, now, CatchUp::Latest, Overlap::Allow, false), latest);
        // ... skip runs nothing (10:59 is 30 s late).
        let skipped = TickPlan::Skip {
            tick: utc(2026, 12, 1, 10, 59, 0),
            next: Some(utc(2026, 12, 1, 11, 0, 0)),
            overlapped: false,
        };
        assert_eq!(plan_tick(&spec, due, now, CatchUp::Skip, Overlap::Allow, false), skipped);
        // A live previous task with overlap skip: nothing, counted as overlapped.
        let now = utc(2026, 12, 1, 10, 0, 1);
        assert_eq!(
            plan_tick(&spec, due, now, CatchUp::Latest, Overlap::Skip, true),
            TickPlan::Skip { tick: due, next: Some(utc(2026, 12, 1, 10, 1, 0)), overlapped: true }
        );
        assert!(matches!(
            plan_tick(&spec, due, now, CatchUp::Latest, Overlap::Allow, true),
            TickPlan::Run { .. }
        ));
    }
}
