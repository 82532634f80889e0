//! Enqueue throughput: tasks per second through `queue::enqueue` (one task per call, one
//! statement and one commit each) and `queue::enqueue_many` (one statement for the batch).
//!
//! run with `DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo bench -p sweep-benches --bench enqueue`
//!
//! - `enqueue/single`: one connection, sequential `enqueue` calls;
//! - `enqueue/bulk/<N>`: one `enqueue_many` call of N tasks (1,000 and 10,000; the default
//!   method, which takes COPY from `COPY_MIN_BATCH` on);
//! - `enqueue/{insert,copy}/<N>`: the same call by one method (`enqueue_many_using`), N = 100,
//!   1,000, 10,000: where COPY starts to pay is `COPY_MIN_BATCH`.
//!
//! Payloads are small (`{"i": n}`), no dedup keys. The table is truncated (outside the timed
//! region) whenever it passes `SWEEP_BENCH_MAX_ROWS` (default 2,000,000) rows.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sqlx::PgPool;
use sweep::queue::{self, EnqueueMethod, NewTask};
use sweep_benches::{bench_pool, bench_tasks, env_usize, reset_live_tasks, runtime};

struct Table {
    pool: PgPool,
    rows: usize,
    max_rows: usize,
}

impl Table {
    async fn make_room(&mut self, incoming: usize) {
        if self.rows + incoming > self.max_rows {
            reset_live_tasks(&self.pool, false).await;
            self.rows = 0;
        }
    }
}

async fn timed_single(table: &mut Table, iters: u64) -> Duration {
    let n = usize::try_from(iters).unwrap_or(usize::MAX);
    table.make_room(n).await;
    let tasks = bench_tasks(n, table.rows);
    let start = Instant::now();
    for task in tasks {
        queue::enqueue(&table.pool, task).await.expect("enqueue");
    }
    let elapsed = start.elapsed();
    table.rows += n;
    elapsed
}

async fn timed_bulk(
    table: &mut Table,
    batches: &[Vec<NewTask>],
    method: EnqueueMethod,
    iters: u64,
) -> Duration {
    let mut elapsed = Duration::ZERO;
    for _ in 0..iters {
        let batch = &batches[table.rows % batches.len()];
        table.make_room(batch.len()).await;
        let start = Instant::now();
        queue::enqueue_many_using(&table.pool, batch, usize::MAX, method)
            .await
            .expect("enqueue_many");
        elapsed += start.elapsed();
        table.rows += batch.len();
    }
    elapsed
}

fn enqueue(c: &mut Criterion) {
    let rt = runtime();
    let pool = rt.block_on(bench_pool(2));
    rt.block_on(reset_live_tasks(&pool, false));
    let mut table = Table { pool, rows: 0, max_rows: env_usize("SWEEP_BENCH_MAX_ROWS", 2_000_000) };

    let mut group = c.benchmark_group("enqueue");
    group.throughput(Throughput::Elements(1));
    group.bench_function("single", |b| {
        b.iter_custom(|iters| rt.block_on(timed_single(&mut table, iters)))
    });
    // A 10,000-task call takes tens of milliseconds: 10 samples keep a run to seconds.
    group.sample_size(10);
    let cases = [
        ("bulk", EnqueueMethod::Auto, 1_000),
        ("bulk", EnqueueMethod::Auto, 10_000),
        ("insert", EnqueueMethod::Insert, 100),
        ("copy", EnqueueMethod::Copy, 100),
        ("insert", EnqueueMethod::Insert, 1_000),
        ("copy", EnqueueMethod::Copy, 1_000),
        ("insert", EnqueueMethod::Insert, 10_000),
        ("copy", EnqueueMethod::Copy, 10_000),
    ];
    for (name, method, n) in cases {
        // Payloads are built once, outside the timed region (the caller's cost, not the queue's).
        let batches: Vec<Vec<NewTask>> = (0..4).map(|k| bench_tasks(n, k * n)).collect();
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::new(name, n), |b| {
            b.iter_custom(|iters| rt.block_on(timed_bulk(&mut table, &batches, method, iters)))
        });
    }
    group.finish();
}

criterion_group!(benches, enqueue);
criterion_main!(benches);
