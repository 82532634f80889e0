//! Where guests execute: a tokio runtime of their own, apart from the control plane.
//!
//! Owns: the guest runtime (one worker thread per core, named `sweep-guest`) on which each
//! claimed task's execution is spawned.
//!
//! Why: a spinning guest holds its thread until its next epoch yield. On the runtime that also
//! runs the claim loop, the NOTIFY listener, heartbeats, the reporter and the admin API, a few
//! spinning guests delay all of them. Here they only delay each other, and the operating system
//! shares the cores between these threads and the control plane's.
//!
//! Guest threads run at a lower scheduling priority (nice +[`GUEST_NICE`]): when the cores are
//! short, the control plane and a Postgres on the same host get them first, and guests get
//! whatever is left, which is all of it when nothing else wants it.
//!
//! Invariants:
//! - nothing here touches Postgres: a task's execution sends its one read (module bytes) to
//!   the control runtime, and its report goes to the reporter over a channel (a connection
//!   opened here would be driven by threads that guests keep busy);
//! - the scheduler looks at newly spawned runs before every task it resumes
//!   (`global_queue_interval(1)`), so a task that just got a slot starts at the next epoch
//!   yield of any guest, not after a round of every spinning guest;
//! - dropping the last handle shuts the runtime down without blocking (runs still in flight
//!   are dropped, which frees their instances).

use std::sync::Arc;

use tokio::runtime::{Builder, Runtime};

/// How much lower guest threads' priority is than the process's (Linux nice increments).
pub const GUEST_NICE: i32 = 10;

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
            .on_thread_start(lower_priority)
            .enable_all()
            .build()?;
        Ok(Guests { runtime: Arc::new(GuestRuntime(Some(runtime))) })
    }

    /// One worker thread per core the process may use.
    pub fn start_default() -> std::io::Result<Self> {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        Self::start(cores)
    }

    /// Spawns `task` on the guest runtime.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.runtime.0.as_ref() {
            Some(runtime) => runtime.spawn(task),
            // Only `Drop` takes the runtime, and no handle outlives it.
            None => tokio::spawn(task),
        }
    }
}

/// Lowers the calling thread's priority by [`GUEST_NICE`] (on Linux `setpriority` on a thread
/// id applies to that thread alone). Where it cannot, guests simply run at normal priority.
fn lower_priority() {
    let thread = Some(rustix::thread::gettid());
    let current = rustix::process::getpriority_process(thread).unwrap_or(0);
    if let Err(e) = rustix::process::setpriority_process(thread, current + GUEST_NICE) {
        tracing::debug!(error = %e, "guest thread keeps its priority");
    }
}
