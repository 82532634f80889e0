//! Where guests execute: a tokio runtime of their own, apart from the control plane.
//!
//! Owns: the guest runtime (one worker thread per core, named `sweep-guest`) and the hand-off
//! of one sandbox run to it.
//!
//! Why: a spinning guest holds its thread until its next epoch yield. On the runtime that also
//! runs the claim loop, the NOTIFY listener, heartbeats, the reporter and the admin API, a few
//! spinning guests delay all of them. Here they only delay each other, and the operating system
//! shares the cores between these threads and the control plane's.
//!
//! Invariants:
//! - only [`Sandbox::run`] executes here; everything that touches Postgres stays on the caller's
//!   runtime (a connection opened here would be driven by threads that guests keep busy);
//! - the scheduler looks at newly spawned runs before every task it resumes
//!   (`global_queue_interval(1)`), so a task that just got a slot starts at the next epoch
//!   yield of any guest, not after a round of every spinning guest;
//! - dropping the last handle shuts the runtime down without blocking (runs still in flight
//!   are dropped, which frees their instances).

use std::sync::Arc;

use tokio::runtime::{Builder, Runtime};

use crate::sandbox::{CompiledModule, Execution, Limits, Outcome, Sandbox, TaskInput};

/// A handle to the guest runtime; clones share it.
#[derive(Debug, Clone)]
pub struct Guests {
    runtime: Arc<GuestRuntime>,
}

#[derive(Debug)]
struct GuestRuntime(Option<Runtime>);

impl Drop for GuestRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl Guests {
    /// Starts the guest runtime with `threads` worker threads.
    pub fn start(threads: usize) -> std::io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("sweep-guest")
            .global_queue_interval(1)
            .enable_all()
            .build()?;
        Ok(Guests { runtime: Arc::new(GuestRuntime(Some(runtime))) })
    }

    /// One worker thread per core the process may use.
    pub fn start_default() -> std::io::Result<Self> {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        Self::start(cores)
    }

    /// Runs `module` for `input` on the guest runtime and waits for the outcome there.
    pub async fn run(
        &self,
        sandbox: Sandbox,
        module: Arc<CompiledModule>,
        input: TaskInput,
        limits: Limits,
    ) -> Execution {
        let Some(runtime) = self.runtime.0.as_ref() else {
            return lost("the guest runtime is shut down");
        };
        let mut run =
            AbortOnDrop(runtime.spawn(async move { sandbox.run(&module, &input, &limits).await }));
        match (&mut run.0).await {
            Ok(execution) => execution,
            Err(e) => lost(&format!("guest run did not finish: {e}")),
        }
    }
}

/// The run belongs to the task that awaits it: when that task is aborted (a shutdown past its
/// grace period), the guest stops too instead of running on unobserved.
struct AbortOnDrop(tokio::task::JoinHandle<Execution>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn lost(why: &str) -> Execution {
    Execution {
        outcome: Outcome::RunnerError(why.to_owned()),
        stderr: String::new(),
        stderr_truncated: false,
        duration: std::time::Duration::ZERO,
        fuel_used: 0,
    }
}
