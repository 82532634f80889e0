//! Sweep's vocabulary: the task states and the failure kinds, the one place that maps each to
//! its name in SQL, in the API and in metrics.
//!
//! Invariant: no state or kind is spelled as a string anywhere else in the Rust code. SQL
//! statements splice them in with [`state!`] (a quoted SQL literal, so the planner still sees a
//! constant and matches the partial indexes whose predicates name states); Rust code uses the
//! enums, and their `as_str` where it needs the name. The migrations spell them too: they are
//! the schema's half of this vocabulary (`tasks_state_live`, the claim functions).

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// A task state as a quoted SQL literal, for `concat!`-built statements:
/// `concat!("... where state = ", state!(running))`.
macro_rules! state {
    (pending) => {
        "'pending'"
    };
    (running) => {
        "'running'"
    };
    (retrying) => {
        "'retrying'"
    };
    (succeeded) => {
        "'succeeded'"
    };
    (cancelled) => {
        "'cancelled'"
    };
    (dead) => {
        "'dead'"
    };
    (blocked) => {
        "'blocked'"
    };
    (live) => {
        "('pending', 'running', 'retrying')"
    };
    (waiting) => {
        "('pending', 'retrying')"
    };
    (unclaimed) => {
        "('blocked', 'pending', 'retrying')"
    };
}

/// A failure kind as a quoted SQL literal, for the statements that write a history entry
/// themselves rather than from a report: `concat!("... 'kind', ", kind!(cancelled))`.
macro_rules! kind {
    (cancelled) => {
        "'cancelled'"
    };
}

/// Where a task is in its life. `blocked`, `pending`, `running` and `retrying` rows live in
/// `tasks`; `succeeded` and `cancelled` ones in `finished_tasks`; `dead` ones in `dead_tasks`.
///
/// `live` in SQL (`state!(live)`) is pending, running and retrying, the states the dedup
/// index covers: a blocked task holds no dedup key (an enqueue with `after` takes none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Waits for its parents (enqueued `after` them) to end. In: an enqueue with parents that
    /// have not all ended. Out: the end of its last parent (`pending`, with its parents'
    /// results in its input), the end of a parent that ended dead or cancelled (`cancelled`,
    /// unless it was enqueued to run anyway), or a cancel (`cancelled`). Never claimed.
    Blocked,
    /// Waiting for its first attempt. In: enqueue, a requeue from the dead-letter table, a
    /// runner handing an unstarted first attempt back (`release_batch`), the end of a blocked
    /// task's last parent. Out: a claim
    /// (`running`) or a cancel (`cancelled`).
    Pending,
    /// Leased by one runner, which is executing it. In: a claim. Out, fenced by lease owner
    /// and attempt: the runner's report (`succeeded`, `retrying`, `dead`), the reaper once the
    /// lease expired (`retrying` or `dead`, kind `lease_expired`), or a release (`pending` or
    /// `retrying`, the attempt not counted). Once a cancel was requested for it
    /// (`cancel_requested_at`), every one of those ends it `cancelled` instead (a release
    /// leaves it to its lease).
    Running,
    /// A failed attempt waits out its backoff. In: a failed attempt with attempts left (the
    /// runner's report or the reaper). Out: a claim once `run_at` is due, or a cancel.
    Retrying,
    /// Done; the result is kept until retention deletes the row. In: the runner's report of a
    /// successful attempt. Out: none.
    Succeeded,
    /// Stopped by a cancel. In: a cancel of a pending or retrying task; the end of a running
    /// attempt a cancel was requested for (the runner stopped it, or it finished first and its
    /// result was discarded, or its lease was reaped). Out: none.
    Cancelled,
    /// Out of attempts or failed permanently; kept with its whole error history. In: a failed
    /// last attempt or a permanent failure. Out: a requeue (`pending`).
    Dead,
}

impl TaskState {
    pub const ALL: [TaskState; 7] = [
        TaskState::Blocked,
        TaskState::Pending,
        TaskState::Running,
        TaskState::Retrying,
        TaskState::Succeeded,
        TaskState::Cancelled,
        TaskState::Dead,
    ];

    /// The name stored in the database, shown by the API and used as the `state` label.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Blocked => "blocked",
            TaskState::Pending => "pending",
            TaskState::Running => "running",
            TaskState::Retrying => "retrying",
            TaskState::Succeeded => "succeeded",
            TaskState::Cancelled => "cancelled",
            TaskState::Dead => "dead",
        }
    }

    /// True for the states of rows in `tasks`, the ones that can still run.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            TaskState::Blocked | TaskState::Pending | TaskState::Running | TaskState::Retrying
        )
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| format!("unknown task state {s:?}"))
    }
}

impl TryFrom<String> for TaskState {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// Why an attempt failed, as recorded in a task's error history (`kind`) and, for a dead task,
/// its `reason`. The sandbox classifies what the guest did; the worker and the reaper add the
/// kinds that are about the runner, not the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The handler exited non-zero (exit 100 makes it permanent). Set by the sandbox.
    HandlerError,
    /// The guest used up its fuel. Set by the sandbox.
    OutOfFuel,
    /// The guest ran past its wall-clock limit. Set by the sandbox.
    Timeout,
    /// The guest tried to grow its memory past the limit. Set by the sandbox.
    MemoryLimit,
    /// The guest's call stack overflowed. Set by the sandbox.
    StackOverflow,
    /// Any other trap. Set by the sandbox.
    Trap,
    /// The guest wrote more than its output limit to stdout. Set by the sandbox.
    OutputTooLarge,
    /// Exit 0 with something other than JSON on stdout. Set by the sandbox.
    InvalidOutput,
    /// No module is registered for the task type. Set by the worker.
    ModuleMissing,
    /// The runner holding the lease stopped heartbeating. Set by the reaper.
    LeaseExpired,
    /// The runner could not run the task; not the guest's fault. Set by the worker.
    RunnerError,
    /// The handler succeeded, but a follow-up task it asked for (`$enqueue` in its result)
    /// could not be enqueued: invalid, over the tenant's payload limit, or of a task type
    /// with no module. Nothing of the attempt was kept. Set by the worker.
    FollowUpRejected,
    /// A cancel stopped the attempt: the runner interrupted the instance, or the attempt ended
    /// (or its lease was reaped) after the cancel was requested. Always the last entry of a
    /// task that ended `cancelled` while running. Set by the sandbox, the queue and the reaper.
    Cancelled,
    /// The task's module names secrets the runner could not give it: the runner has no
    /// `SWEEP_SECRETS_KEY` (or another key than the one they were sealed under), or a named
    /// secret was deleted since the upload. The guest did not run. Set by the worker.
    SecretsUnavailable,
}

impl FailureKind {
    pub const ALL: [FailureKind; 14] = [
        FailureKind::HandlerError,
        FailureKind::OutOfFuel,
        FailureKind::Timeout,
        FailureKind::MemoryLimit,
        FailureKind::StackOverflow,
        FailureKind::Trap,
        FailureKind::OutputTooLarge,
        FailureKind::InvalidOutput,
        FailureKind::ModuleMissing,
        FailureKind::LeaseExpired,
        FailureKind::RunnerError,
        FailureKind::FollowUpRejected,
        FailureKind::Cancelled,
        FailureKind::SecretsUnavailable,
    ];

    /// The name stored in the error history and shown by the API and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::HandlerError => "handler_error",
            FailureKind::OutOfFuel => "out_of_fuel",
            FailureKind::Timeout => "timeout",
            FailureKind::MemoryLimit => "memory_limit",
            FailureKind::StackOverflow => "stack_overflow",
            FailureKind::Trap => "trap",
            FailureKind::OutputTooLarge => "output_too_large",
            FailureKind::InvalidOutput => "invalid_output",
            FailureKind::ModuleMissing => "module_missing",
            FailureKind::LeaseExpired => "lease_expired",
            FailureKind::RunnerError => "runner_error",
            FailureKind::FollowUpRejected => "follow_up_rejected",
            FailureKind::Cancelled => "cancelled",
            FailureKind::SecretsUnavailable => "secrets_unavailable",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailureKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FailureKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| format!("unknown failure kind {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_literals_match_the_rust_names() {
        let sql = [
            (TaskState::Pending, state!(pending)),
            (TaskState::Running, state!(running)),
            (TaskState::Retrying, state!(retrying)),
            (TaskState::Succeeded, state!(succeeded)),
            (TaskState::Cancelled, state!(cancelled)),
            (TaskState::Dead, state!(dead)),
            (TaskState::Blocked, state!(blocked)),
        ];
        for (state, literal) in sql {
            assert_eq!(literal, format!("'{state}'"));
        }
        let live: Vec<String> = TaskState::ALL
            .iter()
            .filter(|s| s.is_live() && **s != TaskState::Blocked)
            .map(|s| format!("'{s}'"))
            .collect();
        assert_eq!(state!(live), format!("({})", live.join(", ")));
        let unclaimed: Vec<String> = TaskState::ALL
            .iter()
            .filter(|s| s.is_live() && **s != TaskState::Running)
            .map(|s| format!("'{s}'"))
            .collect();
        assert_eq!(state!(unclaimed), format!("({})", unclaimed.join(", ")));
        assert_eq!(
            state!(waiting),
            format!("('{}', '{}')", TaskState::Pending, TaskState::Retrying)
        );
        assert_eq!(kind!(cancelled), format!("'{}'", FailureKind::Cancelled));
    }

    #[test]
    fn names_round_trip_through_serde_and_from_str() {
        for state in TaskState::ALL {
            assert_eq!(state.as_str().parse::<TaskState>(), Ok(state));
            assert_eq!(serde_json::to_value(state).ok(), Some(state.as_str().into()));
        }
        for kind in FailureKind::ALL {
            assert_eq!(kind.as_str().parse::<FailureKind>(), Ok(kind));
            assert_eq!(serde_json::to_value(kind).ok(), Some(kind.as_str().into()));
        }
        assert!("nope".parse::<TaskState>().is_err());
        assert!("nope".parse::<FailureKind>().is_err());
    }
}
