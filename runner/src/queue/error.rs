//! Errors of the queue layer: invalid input (rejected before any write) and database failures.

use super::{TaskId, TaskState};

/// Why a task could not be enqueued. Nothing was written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidTask {
    #[error("task_type must not be empty")]
    EmptyTaskType,
    #[error("task_type is {len} bytes long; the limit is {max}")]
    TaskTypeTooLong { len: usize, max: usize },
    #[error("task_type {0:?} may only contain letters, digits, '.', '-', '_' and ':'")]
    TaskTypeCharacters(String),
    #[error("tenant must be 1 to {max} bytes of letters, digits, '.', '-' or '_'")]
    BadTenant { max: usize },
    #[error("payload must be a JSON object, got {0}")]
    PayloadNotObject(&'static str),
    #[error("max_attempts must be between 1 and {max}, got {got}")]
    MaxAttemptsOutOfRange { got: i64, max: i32 },
    #[error("run_at {0} is out of range (from 2000-01-01 to ten years from now)")]
    RunAtOutOfRange(String),
    #[error("delay of {0:?} is out of range (at most ten years)")]
    DelayOutOfRange(std::time::Duration),
    #[error("dedup_key must be 1 to {max} bytes")]
    BadDedupKey { max: usize },
    #[error("payload is {size} bytes of JSON; the limit is {limit} bytes")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("a batch holds at most {max} tasks, got {got}")]
    BatchTooLarge { got: usize, max: usize },
    #[error("after lists {got} tasks; the limit is {max}")]
    TooManyParents { got: usize, max: usize },
    #[error("dedup_key cannot be given with after (a blocked task holds no dedup key)")]
    DedupKeyWithParents,
    #[error("after[{index}]: no task {id} of this tenant")]
    UnknownParent { index: usize, id: TaskId },
    #[error(
        "after[{index}]: task {id} already ended {state}, so this task would be cancelled; \
         enqueue it with on_parent_failure \"run\" to run it anyway"
    )]
    ParentFailed { index: usize, id: TaskId, state: TaskState },
    #[error("task {index} of the batch: {source}")]
    InBatch {
        index: usize,
        #[source]
        source: Box<InvalidTask>,
    },
}

impl InvalidTask {
    /// The error itself, for a batch's error: the one of the task it names.
    pub fn innermost(&self) -> &InvalidTask {
        match self {
            InvalidTask::InBatch { source, .. } => source.innermost(),
            other => other,
        }
    }

    /// [`innermost`](Self::innermost), owned: for a batch of one, whose index says nothing.
    pub fn into_innermost(self) -> InvalidTask {
        match self {
            InvalidTask::InBatch { source, .. } => source.into_innermost(),
            other => other,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    #[error(transparent)]
    Invalid(#[from] InvalidTask),
    #[error("task {0} not found")]
    TaskNotFound(TaskId),
    #[error("task_type {task_type:?} has no version {version}")]
    ModuleVersionNotFound { task_type: String, version: i32 },
    #[error("version {version} of task_type {task_type:?} is {} and cannot be activated", state.as_str())]
    ModuleNotReady { task_type: String, version: i32, state: super::CompileState },
    #[error("task {id} is {state} and cannot be cancelled")]
    NotCancellable { id: i64, state: TaskState },
    #[error("task {id} cannot be requeued: another live task holds its dedup_key")]
    DedupKeyTaken { id: i64 },
    #[error(transparent)]
    InvalidWorkflow(#[from] super::InvalidWorkflow),
    #[error("workflow {0} not found")]
    WorkflowNotFound(i64),
    /// Shown to API clients as "internal error"; logged in full.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    #[error("database returned an unexpected value: {0}")]
    Corrupt(String),
}

impl QueueError {
    /// True when the database could not be reached (see [`is_unreachable`]), as opposed to a
    /// statement it refused. Callers that retry until Postgres is back, or hold off after it
    /// came back, look at this.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, QueueError::Database(e) if is_unreachable(e))
    }
}

/// True when `e` says the database could not be reached: no connection, the connection broke,
/// the server is shutting down or starting up.
pub fn is_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // Class 08: connection exception; 57P01-57P03: admin shutdown, crash shutdown, cannot
        // connect now (starting up or shutting down).
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            c.starts_with("08") || matches!(c.as_ref(), "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

/// Runs `attempt` again, `pause` apart, for as long as it fails with an error `unreachable`
/// says is a database that cannot be reached; saying so once. Any other outcome is returned:
/// a process that starts during an outage comes up when Postgres does.
pub async fn while_unreachable<T, E, Fut>(
    pause: std::time::Duration,
    unreachable: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Fut,
) -> Result<T, E>
where
    E: std::fmt::Display,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut logged = false;
    loop {
        match attempt().await {
            Err(e) if unreachable(&e) => {
                if !logged {
                    tracing::warn!(error = %e, "Postgres cannot be reached; waiting for it");
                    logged = true;
                }
                tokio::time::sleep(pause).await;
            }
            done => return done,
        }
    }
}

impl From<sqlx::Error> for QueueError {
    fn from(e: sqlx::Error) -> Self {
        QueueError::Database(e)
    }
}

/// True when `e` is a unique violation of the named constraint or index.
pub(crate) fn is_unique_violation(e: &sqlx::Error, constraint: &str) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("23505") && db.constraint() == Some(constraint)
        }
        _ => false,
    }
}
