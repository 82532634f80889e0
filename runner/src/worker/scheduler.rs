//! The scheduler: each runner's loop that enqueues the tasks of due cron schedules
//! (`queue::run_due_schedules`, which makes a tick yield one task however many runners run
//! this loop).
//!
//! Timing: after each pass it sleeps until the earliest next tick by the database's clock,
//! at most `period` (a schedule created or resumed meanwhile is seen within one period), so a
//! tick is enqueued within milliseconds of its time. A tick another runner has locked is
//! looked at again after [`CONTENDED`].

use std::time::Duration;

use tokio::sync::watch;

use crate::queue::{self, Store};

/// How soon to look again at a tick that is due but was not ours to take (another runner holds
/// it and is about to advance it).
const CONTENDED: Duration = Duration::from_millis(100);
/// The shortest sleep between passes.
const MIN_WAIT: Duration = Duration::from_millis(5);

pub(super) async fn run(store: Store, period: Duration, mut stop: watch::Receiver<bool>) {
    loop {
        let wait = match queue::run_due_schedules(&store).await {
            Ok(report) => {
                if report.enqueued > 0 || report.skipped > 0 || report.stopped > 0 {
                    tracing::debug!(
                        enqueued = report.enqueued,
                        skipped = report.skipped,
                        stopped = report.stopped,
                        "scheduler pass"
                    );
                }
                match report.next_due_in {
                    None => period,
                    Some(d) if d.is_zero() => CONTENDED,
                    Some(d) => d.clamp(MIN_WAIT, period),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "scheduler pass failed");
                period
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            // The flag only ever turns true (or its sender goes away): any change means stop.
            _ = stop.changed() => return,
        }
    }
}
