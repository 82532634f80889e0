//! `sweep-bench workflow`: what dependencies and follow-ups cost, each against its plain
//! counterpart in the same run (ratios, not absolute targets).
//!
//! - Drain: N independent no-op tasks through one runner, then a 3-level workflow of N no-op
//!   steps (`--roots` steps, the middle steps each after one root, `--joins` steps each after
//!   an equal share of the middle ones) through a fresh runner of the same settings; the
//!   drain rates and their ratio. The workflow's creation is timed apart.
//! - Follow-ups: one completion carrying `--follow-ups` follow-up tasks (the statement a
//!   handler's success with `$enqueue` runs), against `enqueue_many` of as many tasks through
//!   the library, best of `--rounds` each; the ratio.

use std::time::Duration;

use anyhow::bail;
use serde_json::json;
use sweep::{
    args::WorkerArgs,
    queue::{self, Completion, NewStep, NewTask, Store},
    worker::Worker,
};
use tokio::{sync::oneshot, time::Instant};

use crate::fixtures;

#[derive(Debug, clap::Args)]
pub struct WorkflowArgs {
    /// Tasks (and workflow steps) to drain.
    #[arg(long, default_value_t = 10_000)]
    pub steps: usize,
    /// Steps of the workflow's first level.
    #[arg(long, default_value_t = 100)]
    pub roots: usize,
    /// Steps of its last level (each waits for an equal share of the middle ones).
    #[arg(long, default_value_t = 100)]
    pub joins: usize,
    /// Follow-up tasks carried by one completion.
    #[arg(long, default_value_t = 10_000)]
    pub follow_ups: usize,
    /// Rounds of the follow-up comparison (the best of each is kept).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    #[command(flatten)]
    pub worker: WorkerArgs,
}

pub async fn workflow(store: &Store, args: &WorkflowArgs) -> anyhow::Result<()> {
    let pool = store.pool();
    let n = args.steps;
    if args.roots + args.joins >= n || args.roots == 0 || args.joins == 0 {
        bail!("--roots and --joins must be at least 1 and leave middle steps");
    }

    // Independent tasks.
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let tasks: Vec<NewTask> =
            chunk.iter().map(|i| NewTask::new("noop", json!({ "i": i }))).collect();
        queue::enqueue_many(pool, &tasks).await?;
    }
    let plain = drain(store, args).await?;
    println!("independent: {n} tasks drained in {plain:.2}s ({:.0} tasks/s)", n as f64 / plain);

    // The 3-level workflow.
    let middle = n - args.roots - args.joins;
    let mut steps = Vec::with_capacity(n);
    let step = |name: String, after: Vec<String>| NewStep {
        name,
        task: NewTask::new("noop", json!({})),
        after,
    };
    for r in 0..args.roots {
        steps.push(step(format!("r{r}"), vec![]));
    }
    for m in 0..middle {
        steps.push(step(format!("m{m}"), vec![format!("r{}", m % args.roots)]));
    }
    for j in 0..args.joins {
        let share: Vec<String> =
            (0..middle).filter(|m| m % args.joins == j).map(|m| format!("m{m}")).collect();
        steps.push(step(format!("j{j}"), share));
    }
    let created = Instant::now();
    queue::create_workflow(pool, queue::DEFAULT_TENANT, &steps, usize::MAX).await?;
    let create_secs = created.elapsed().as_secs_f64();
    let flow = drain(store, args).await?;
    println!(
        "workflow: {n} steps ({} -> {middle} -> {}) created in {create_secs:.2}s, drained in \
         {flow:.2}s ({:.0} steps/s)",
        args.roots,
        args.joins,
        n as f64 / flow
    );
    println!("workflow drain rate / independent drain rate: {:.2}x", plain / flow);

    // Follow-ups against a bulk enqueue.
    let k = args.follow_ups;
    let tasks: Vec<NewTask> = (0..k).map(|i| NewTask::new("noop", json!({ "i": i }))).collect();
    let (mut best_enqueue, mut best_follow) = (f64::MAX, f64::MAX);
    for _ in 0..args.rounds {
        fixtures::reset(pool, None).await?;
        let t = Instant::now();
        queue::enqueue_many(pool, &tasks).await?;
        best_enqueue = best_enqueue.min(t.elapsed().as_secs_f64());

        fixtures::reset(pool, None).await?;
        queue::enqueue(pool, NewTask::new("parent", json!({}))).await?;
        let runner = uuid::Uuid::new_v4();
        let claimed =
            queue::claim_batch(pool, runner, 1, &["parent".to_owned()], Duration::from_secs(60))
                .await?;
        let Some(c) = claimed.first() else { bail!("the parent task was not claimed") };
        let done = Completion {
            id: c.id,
            attempt: c.attempt,
            result: json!({}),
            module_sha256: None,
            logs: None,
            follow_ups: tasks.clone(),
            usage: None,
        };
        let t = Instant::now();
        let lost = queue::complete_batch(pool, runner, std::slice::from_ref(&done)).await?;
        best_follow = best_follow.min(t.elapsed().as_secs_f64());
        if !lost.is_empty() {
            bail!("the parent's completion was fenced out");
        }
    }
    fixtures::reset(pool, None).await?;
    println!(
        "{k} follow-ups committed with one completion: {:.1} ms; enqueue_many of {k}: {:.1} ms \
         (best of {}); follow-ups / enqueue: {:.2}x",
        best_follow * 1e3,
        best_enqueue * 1e3,
        args.rounds,
        best_follow / best_enqueue
    );
    Ok(())
}

/// Runs a runner until no task is left; the seconds it took.
async fn drain(store: &Store, args: &WorkflowArgs) -> anyhow::Result<f64> {
    let worker = Worker::new(store, args.worker.to_config())?;
    let (stop, stopped) = oneshot::channel::<()>();
    let started = Instant::now();
    let runner = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    while fixtures::any_unfinished(store.pool()).await? {
        if runner.is_finished() {
            bail!("the runner stopped early");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let _ = stop.send(());
    runner.await??;
    Ok(secs)
}
