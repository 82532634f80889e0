//! Claim throughput: claim a batch, complete it, repeat; tasks per second through
//! `queue::claim_from` (each claimer with its cursor, as a runner's claim lane) +
//! `queue::complete_batch` against the real Postgres.
//!
//! run with `DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo bench -p sweep-benches --bench claim`
//!
//! - `claim/<C>_claimers/<B>`: C concurrent claimers (one tokio task and one connection each),
//!   each looping claim(B) -> complete(B), on a pre-filled table of due tasks. One criterion
//!   iteration = one round of every claimer, so the reported elements/s is B*C per round, timed
//!   by wall clock over all claimers (`iter_custom`).
//! - `claim_retained/<history>/4x50`: the same loop at C=4, B=50, on an otherwise identical
//!   queue that also keeps `SWEEP_BENCH_RETAINED` (default 1,000,000) finished tasks.
//!   Compare `empty` with `1M_finished`: the claim path must not slow down as history grows.
//!
//! The table is refilled (outside the timed region) whenever fewer due tasks are left than the
//! next measurement needs: live and finished bench tasks deleted (the retained history
//! stays), `SWEEP_BENCH_ROWS` (default 300,000) enqueued, vacuum analyze. Completed tasks
//! accumulate in `finished_tasks` between refills, as they would in a real queue, and so do
//! the dead entries at the head of the claim index that every claim walks past until the next
//! vacuum. `SWEEP_BENCH_VACUUM_MS=1000` vacuums the table every second *inside* the
//! timed region, to measure a runner that keeps its hot table vacuumed.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;
use sqlx::PgPool;
use sweep::queue::{self, ClaimCursor, ClaimMode, Completion};
use sweep_benches::{
    bench_pool, count_finished, env_usize, fill, insert_retained, reset_live_tasks, runtime,
    RETAINED_TASK_TYPE,
};
use uuid::Uuid;

const BATCHES: [usize; 4] = [1, 10, 50, 100];
const CLAIMERS: [usize; 2] = [1, 4];
const LEASE: Duration = Duration::from_secs(300);

/// The bench database plus how many due tasks it still holds.
struct Table {
    pool: PgPool,
    /// Keep the finished history rows when refilling.
    retained: bool,
    /// Due tasks left (this process is the only claimer).
    due: usize,
    fill_rows: usize,
    /// `SWEEP_BENCH_VACUUM_MS`: vacuum the table this often during measurements.
    vacuum_every: Option<Duration>,
}

impl Table {
    /// Makes sure at least `needed` due tasks are waiting; refills from scratch otherwise.
    async fn ensure(&mut self, needed: usize) {
        if self.due >= needed {
            return;
        }
        let rows = self.fill_rows.max(needed + needed / 2);
        reset_live_tasks(&self.pool, self.retained).await;
        fill(&self.pool, rows).await;
        sweep_benches::vacuum_analyze(&self.pool).await;
        self.due = rows;
    }
}

/// `vacuum tasks` every `every`, inside the timed region, until aborted: what a runner that
/// vacuums its hot table would pay, and what it gets back (a claim index without a long head
/// of dead entries).
async fn vacuum_loop(pool: PgPool, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        sweep_benches::vacuum(&pool).await;
    }
}

/// One claimer: `rounds` times claim `batch`, complete them all. Returns tasks completed.
async fn claimer(pool: PgPool, batch: usize, rounds: u64) -> usize {
    let runner = Uuid::new_v4();
    // Each claimer keeps its cursor, as each of a runner's claim lanes does.
    let mut cursor = ClaimCursor::default();
    let mut done = 0;
    for _ in 0..rounds {
        let tasks =
            queue::claim_from(&pool, runner, batch, &[], LEASE, ClaimMode::Fair, &mut cursor)
                .await
                .expect("claim");
        let completions: Vec<Completion> = tasks
            .iter()
            .map(|t| Completion {
                id: t.id,
                attempt: t.attempt,
                result: json!({}),
                module_sha256: None,
                logs: None,
                follow_ups: Vec::new(),
                usage: None,
            })
            .collect();
        let lost = queue::complete_batch(&pool, runner, &completions).await.expect("complete");
        assert!(lost.is_empty(), "bench lost {} leases", lost.len());
        done += tasks.len();
    }
    done
}

/// Times `rounds` rounds of `claimers` concurrent claimers (wall clock, all of them).
async fn timed_rounds(table: &mut Table, claimers: usize, batch: usize, rounds: u64) -> Duration {
    let needed = usize::try_from(rounds).unwrap_or(usize::MAX) * claimers * batch;
    table.ensure(needed).await;
    let start = Instant::now();
    let handles: Vec<_> =
        (0..claimers).map(|_| tokio::spawn(claimer(table.pool.clone(), batch, rounds))).collect();
    let vacuumer =
        table.vacuum_every.map(|every| tokio::spawn(vacuum_loop(table.pool.clone(), every)));
    let mut done = 0;
    for h in handles {
        done += h.await.expect("claimer panicked");
    }
    let elapsed = start.elapsed();
    if let Some(v) = vacuumer {
        v.abort();
        let _ = v.await;
    }
    assert_eq!(done, needed, "claims came back short: the table ran dry");
    table.due -= done;
    elapsed
}

async fn open(claimers: usize, retained: usize) -> Table {
    // One connection per claimer, one for the fixture work and one for the optional vacuumer.
    let pool = bench_pool(u32::try_from(claimers + 2).unwrap_or(8)).await;
    reset_live_tasks(&pool, false).await;
    if retained > 0 {
        insert_retained(&pool, retained).await;
    }
    let mut table = Table {
        pool,
        retained: retained > 0,
        due: 0,
        fill_rows: env_usize("SWEEP_BENCH_ROWS", 300_000),
        vacuum_every: match env_usize("SWEEP_BENCH_VACUUM_MS", 0) {
            0 => None,
            ms => Some(Duration::from_millis(ms as u64)),
        },
    };
    table.ensure(1).await;
    table
}

fn claim(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("claim");
    // A round at batch 100 takes milliseconds: 20 samples keep each bench near its
    // measurement time.
    group.sample_size(20);
    for &claimers in &CLAIMERS {
        let mut table = rt.block_on(open(claimers, 0));
        for &batch in &BATCHES {
            group.throughput(Throughput::Elements((batch * claimers) as u64));
            group.bench_function(BenchmarkId::new(format!("{claimers}_claimers"), batch), |b| {
                b.iter_custom(|rounds| {
                    rt.block_on(timed_rounds(&mut table, claimers, batch, rounds))
                })
            });
        }
    }
    group.finish();
}

fn claim_retained(c: &mut Criterion) {
    let rt = runtime();
    let (claimers, batch) = (4, 50);
    let retained = env_usize("SWEEP_BENCH_RETAINED", 1_000_000);
    let mut group = c.benchmark_group("claim_retained");
    group.sample_size(20);
    group.throughput(Throughput::Elements((batch * claimers) as u64));
    for (label, history) in [("empty", 0), ("1M_finished", retained)] {
        // Setting up a million rows takes a while: skip it when the filter excludes this one.
        let id = BenchmarkId::new(label, format!("{claimers}x{batch}"));
        let mut table: Option<Table> = None;
        group.bench_function(id, |b| {
            let table = table.get_or_insert_with(|| rt.block_on(open_retained(claimers, history)));
            b.iter_custom(|rounds| rt.block_on(timed_rounds(table, claimers, batch, rounds)))
        });
    }
    group.finish();
}

async fn open_retained(claimers: usize, history: usize) -> Table {
    let table = open(claimers, history).await;
    let kept = count_finished(&table.pool, RETAINED_TASK_TYPE).await;
    eprintln!("claim_retained: {kept} finished tasks retained");
    table
}

criterion_group!(benches, claim, claim_retained);
criterion_main!(benches);
