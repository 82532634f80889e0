//! CPU time spent by the benchmark's own process (the runner under test) and by the local
//! Postgres server's processes, read from `/proc` (Linux): what a task costs each side.
//!
//! `/proc/<pid>/stat` counts in clock ticks (100 per second on Linux), so over a run of a few
//! seconds the figures are good to about a percent. Postgres backends that exit during the run
//! take their time with them; the runner's pool keeps its connections, so that is only the
//! benchmark's own short-lived probes.

use std::time::Duration;

/// Linux's `USER_HZ`, which `/proc` reports in regardless of the kernel's own tick rate.
const TICKS_PER_SECOND: u64 = 100;

/// User and system CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cpu {
    pub user: Duration,
    pub system: Duration,
}

impl Cpu {
    pub fn total(&self) -> Duration {
        self.user + self.system
    }

    /// What was spent between `earlier` and `self`.
    pub fn since(&self, earlier: &Cpu) -> Cpu {
        Cpu {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }

    /// This process, all threads.
    pub fn this_process() -> Cpu {
        std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
            .unwrap_or_default()
    }

    /// Every process named `postgres` (the server and its backends) visible in `/proc`.
    pub fn postgres() -> Cpu {
        let mut sum = Cpu::default();
        let Ok(entries) = std::fs::read_dir("/proc") else { return sum };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            if stat.split_once(" (").is_some_and(|(_, rest)| rest.starts_with("postgres)")) {
                if let Some(cpu) = parse_stat(&stat) {
                    sum.user += cpu.user;
                    sum.system += cpu.system;
                }
            }
        }
        sum
    }
}

/// Minor page faults of this process so far (field 10 of `/proc/self/stat`).
pub fn minor_faults_of_this_process() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    stat_fields(&stat)?.nth(7)?.parse().ok()
}

/// The fields of a `/proc/<pid>/stat` line from field 3 on: the command name, field 2, is in
/// parentheses and may hold spaces, so fields are counted after its closing one.
fn stat_fields(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    let (_, after_name) = stat.rsplit_once(')')?;
    Some(after_name.split_whitespace())
}

/// utime and stime from a `/proc/<pid>/stat` line (fields 14 and 15).
fn parse_stat(stat: &str) -> Option<Cpu> {
    let mut fields = stat_fields(stat)?.skip(11);
    let ticks = |t: &str| t.parse::<u64>().ok();
    let user = ticks(fields.next()?)?;
    let system = ticks(fields.next()?)?;
    let to_time = |t: u64| Duration::from_micros(t * 1_000_000 / TICKS_PER_SECOND);
    Some(Cpu { user: to_time(user), system: to_time(system) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_user_and_system_time_after_a_name_with_spaces() {
        let line = "42 (my (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0";
        let cpu = parse_stat(line).expect("parsed");
        assert_eq!(cpu.user, Duration::from_millis(2500));
        assert_eq!(cpu.system, Duration::from_millis(750));
    }

    #[test]
    fn this_process_has_spent_something() {
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {}
        assert!(Cpu::this_process().total() > Duration::ZERO);
    }
}
