//! What the host tells a handler about the task it is running.
//!
//! The host passes these as environment variables. Missing or unparsable
//! values never fail the handler: they fall back to "unknown" (`None`) or,
//! for the attempt number, to 1, which is what a run from a shell is.

/// Environment variable holding the task id.
pub const ENV_TASK_ID: &str = "SWEEP_TASK_ID";
/// Environment variable holding the task type (the module's registered name).
pub const ENV_TASK_TYPE: &str = "SWEEP_TASK_TYPE";
/// Environment variable holding the 1-based attempt number.
pub const ENV_ATTEMPT: &str = "SWEEP_ATTEMPT";
/// Environment variable holding the maximum number of attempts.
pub const ENV_MAX_ATTEMPTS: &str = "SWEEP_MAX_ATTEMPTS";

/// The running task, as described by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskContext {
    /// The task's id (`SWEEP_TASK_ID`), if known.
    pub task_id: Option<String>,
    /// The task's type (`SWEEP_TASK_TYPE`), if known.
    pub task_type: Option<String>,
    /// This attempt's number, starting at 1 (`SWEEP_ATTEMPT`; 1 if unset).
    pub attempt: u32,
    /// How many attempts the task gets in total (`SWEEP_MAX_ATTEMPTS`), if known.
    pub max_attempts: Option<u32>,
}

impl Default for TaskContext {
    /// The context of a run from a shell: first attempt, nothing else known.
    fn default() -> Self {
        Self { task_id: None, task_type: None, attempt: 1, max_attempts: None }
    }
}

impl TaskContext {
    /// Reads the context from the `SWEEP_*` environment variables.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds the context from any variable lookup (used by tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let text = |name| lookup(name).filter(|value| !value.trim().is_empty());
        let number = |name| text(name).and_then(|value| value.trim().parse::<u32>().ok());
        Self {
            task_id: text(ENV_TASK_ID),
            task_type: text(ENV_TASK_TYPE),
            attempt: number(ENV_ATTEMPT).filter(|&n| n >= 1).unwrap_or(1),
            max_attempts: number(ENV_MAX_ATTEMPTS).filter(|&n| n >= 1),
        }
    }

    /// True when a failure now would not be retried (the attempt count is
    /// used up). False when the maximum is unknown.
    pub fn is_last_attempt(&self) -> bool {
        self.max_attempts.is_some_and(|max| self.attempt >= max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(vars: &[(&str, &str)]) -> TaskContext {
        TaskContext::from_lookup(|name| {
            vars.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string())
        })
    }

    #[test]
    fn shell_run_gets_defaults() {
        assert_eq!(ctx(&[]), TaskContext::default());
        assert_eq!(ctx(&[]).attempt, 1);
        assert!(!ctx(&[]).is_last_attempt());
    }

    #[test]
    fn reads_all_variables() {
        let c = ctx(&[
            ("SWEEP_TASK_ID", "7f1c"),
            ("SWEEP_TASK_TYPE", "wordcount"),
            ("SWEEP_ATTEMPT", "3"),
            ("SWEEP_MAX_ATTEMPTS", "5"),
        ]);
        assert_eq!(c.task_id.as_deref(), Some("7f1c"));
        assert_eq!(c.task_type.as_deref(), Some("wordcount"));
        assert_eq!(c.attempt, 3);
        assert_eq!(c.max_attempts, Some(5));
        assert!(!c.is_last_attempt());
    }

    #[test]
    fn garbage_falls_back_instead_of_failing() {
        let c = ctx(&[
            ("SWEEP_TASK_ID", "  "),
            ("SWEEP_ATTEMPT", "zero"),
            ("SWEEP_MAX_ATTEMPTS", "-2"),
        ]);
        assert_eq!(c, TaskContext::default());
        assert_eq!(ctx(&[("SWEEP_ATTEMPT", "0")]).attempt, 1);
        assert_eq!(ctx(&[("SWEEP_ATTEMPT", " 4 ")]).attempt, 4);
    }

    #[test]
    fn last_attempt() {
        let c = ctx(&[("SWEEP_ATTEMPT", "5"), ("SWEEP_MAX_ATTEMPTS", "5")]);
        assert!(c.is_last_attempt());
    }
}
