//! Statements only benchmarks and tests use: filling history, counting what is left, reading
//! the enqueue-to-start latency distribution from the database clock. They read Sweep's tables
//! directly, which the product never lets a user do; that is why they live here.

use sqlx::PgExecutor;

use sweep::queue::{QueueError, TaskState};

/// Days the history [`fill_finished`] writes is spread over, ending now: so it lands in
/// several day partitions of `finished_tasks`, as retained history does.
pub const FILL_DAYS: i32 = 4;
/// Rows per fill statement; two statements run at once.
const FILL_CHUNK: i64 = 500_000;

/// Inserts `n` already-succeeded tasks of `task_type`, as days of retained history would
/// leave them: finish times spread evenly over the last [`FILL_DAYS`] days (oldest first, ids
/// rising with them), no start time (so they stay out of the latency percentiles). Creates
/// the day partitions first, so no row lands in the default partition; then vacuums and
/// analyzes and takes a checkpoint, so a measurement that follows neither pays for vacuuming
/// fresh pages nor shares the disk with the fill's checkpoint.
pub async fn fill_finished(
    pool: &sqlx::PgPool,
    task_type: &str,
    n: usize,
) -> Result<(), QueueError> {
    fill_finished_among(pool, &["default".to_owned()], &[task_type.to_owned()], n).await
}

/// [`fill_finished`] over several tenants and task types: row g is of tenant
/// `tenants[g % tenants.len()]` and type `task_types[(g / tenants.len()) % task_types.len()]`,
/// so every (tenant, type) gets its share on every day.
pub async fn fill_finished_among(
    pool: &sqlx::PgPool,
    tenants: &[String],
    task_types: &[String],
    n: usize,
) -> Result<(), QueueError> {
    let n = sql_count(n);
    if n == 0 {
        return Ok(());
    }
    let (start, first_id): (chrono::DateTime<chrono::Utc>, i64) = sqlx::query_as(
        r#"
        select now() - $2 * interval '1 day',
               setval('sweep.tasks_id_seq', nextval('sweep.tasks_id_seq') + $1 - 1) - $1 + 1
        "#,
    )
    .bind(n)
    .bind(FILL_DAYS)
    .fetch_one(pool)
    .await?;
    sqlx::query(r#"select sweep.sweep_finished_add_partitions($1, now())"#)
        .bind(start)
        .execute(pool)
        .await?;
    let chunks: Vec<(i64, i64)> =
        (0..n).step_by(FILL_CHUNK as usize).map(|lo| (lo, (lo + FILL_CHUNK).min(n))).collect();
    let half = |which: usize| {
        let mine: Vec<(i64, i64)> = chunks.iter().skip(which).step_by(2).copied().collect();
        async move {
            for (lo, hi) in mine {
                // Row g (0-based) finished g/n of the way from `start` to now. One constant
                // payload: building a distinct one per row would cost more than the insert.
                sqlx::query(
                    r#"
                    insert into sweep.finished_tasks (id, tenant, task_type, payload, state,
                                                priority, attempts, max_attempts, run_at, errors,
                                                result, created_at, started_at, finished_at)
                    select $1 + g, $9[(1 + g % cardinality($9))::int4],
                           $2[(1 + (g / cardinality($9)) % cardinality($2))::int4], '{"i": 0}',
                           $3, 0, 1, 5, t, '[]', '{}', t, null, t
                    from generate_series($4::int8, $5::int8 - 1) g,
                         lateral (select $6::timestamptz
                                         + g * ($7 * interval '1 day' / $8::int8) as t) f
                    "#,
                )
                .bind(first_id)
                .bind(task_types)
                .bind(TaskState::Succeeded.as_str())
                .bind(lo)
                .bind(hi)
                .bind(start)
                .bind(FILL_DAYS)
                .bind(n)
                .bind(tenants)
                .execute(pool)
                .await?;
            }
            Ok::<(), QueueError>(())
        }
    };
    tokio::try_join!(half(0), half(1))?;
    sqlx::query(r#"vacuum analyze sweep.finished_tasks"#).execute(pool).await?;
    sqlx::query(r#"checkpoint"#).execute(pool).await?;
    Ok(())
}

/// `n` dead tasks spread over `tenants` and `task_types` as [`fill_finished_among`] spreads
/// history, all died now.
pub async fn fill_dead_among(
    pool: &sqlx::PgPool,
    tenants: &[String],
    task_types: &[String],
    n: usize,
) -> Result<(), QueueError> {
    sqlx::query(
        r#"
        insert into sweep.dead_tasks (id, tenant, task_type, payload, priority, attempts,
                                      max_attempts, errors, reason, created_at)
        select nextval('sweep.tasks_id_seq'), $1[(1 + g % cardinality($1))::int4],
               $2[(1 + (g / cardinality($1)) % cardinality($2))::int4], '{}', 0, 1, 1, '[]',
               'exhausted', now()
        from generate_series(0, $3 - 1) g
        "#,
    )
    .bind(tenants)
    .bind(task_types)
    .bind(sql_count(n))
    .execute(pool)
    .await?;
    Ok(())
}

/// The per-minute counters busy runners leave for every (tenant, type) over the last hour
/// and the minute now running: 100 successes, one failed attempt and its start in each.
pub async fn fill_minutes_among(
    pool: &sqlx::PgPool,
    tenants: &[String],
    task_types: &[String],
) -> Result<(), QueueError> {
    sqlx::query(
        r#"
        insert into sweep.task_minutes (tenant, task_type, minute, succeeded, failed, failures,
                                        started)
        select t, ty, date_trunc('minute', now()) - m * interval '1 minute', 100, 1,
               '{"trap": 1}', 101
        from unnest($1::text[]) t, unnest($2::text[]) ty, generate_series(0, 60) m
        "#,
    )
    .bind(tenants)
    .bind(task_types)
    .execute(pool)
    .await?;
    Ok(())
}

/// Tasks not finished yet (pending, retrying or running): `tasks` holds nothing else.
pub async fn count_unfinished<'c, E: PgExecutor<'c>>(executor: E) -> Result<i64, QueueError> {
    Ok(sqlx::query_scalar(
        r#"
        select count(*) from sweep.tasks
        "#,
    )
    .fetch_one(executor)
    .await?)
}

/// Whether any task is not finished yet: cheap enough to ask every few milliseconds, unlike
/// [`count_unfinished`], which reads the whole backlog.
pub async fn any_unfinished<'c, E: PgExecutor<'c>>(executor: E) -> Result<bool, QueueError> {
    // The last id by the primary key. Not `exists (select 1 ...)`: a sequential scan reads
    // every dead row at the front of the heap. Not the first id either: runners take tasks
    // about in id order, so the front of the index is the entries of finished tasks until a
    // vacuum, which every probe walked (0.6-1.05 ms a probe in `pg_stat_statements`, with the
    // progress bar's counts 2-3% of Postgres's time in a drain); the back is the tasks taken
    // last, live until the end.
    let last: Option<i64> =
        sqlx::query_scalar(r#"select id from sweep.tasks order by id desc limit 1"#)
            .fetch_optional(executor)
            .await?;
    Ok(last.is_some())
}

/// The lowest id of a task not finished yet, if any: a drain's progress where tasks are taken
/// about in id order, for the price of a walk over the finished ones' index entries instead of
/// [`count_unfinished`]'s read of the whole backlog.
pub async fn first_unfinished<'c, E: PgExecutor<'c>>(
    executor: E,
) -> Result<Option<i64>, QueueError> {
    Ok(sqlx::query_scalar(r#"select id from sweep.tasks order by id limit 1"#)
        .fetch_optional(executor)
        .await?)
}

/// Seconds from the first start to the last end of the finished tasks from id `first` on: the
/// first claim's and the last completion's transaction times, the database's clock. A drain's
/// work without the runner's start or the commit of its last report, which is the span
/// Graphile Worker's bench times in its own process (its first job's start to its last job's
/// end).
pub async fn work_span<'c, E: PgExecutor<'c>>(
    executor: E,
    first: i64,
) -> Result<Option<f64>, QueueError> {
    Ok(sqlx::query_scalar(
        r#"
        select extract(epoch from max(finished_at) - min(started_at))::float8
        from sweep.finished_tasks
        where id >= $1
        "#,
    )
    .bind(first)
    .fetch_one(executor)
    .await?)
}

/// Percentiles (in seconds) of `started_at - run_at` over succeeded tasks that recorded a
/// start.
pub async fn start_latency_percentiles<'c, E: PgExecutor<'c>>(
    executor: E,
    fractions: &[f64],
) -> Result<Vec<f64>, QueueError> {
    let values: Option<Vec<f64>> = sqlx::query_scalar(
        r#"
        select percentile_cont($1::float8[]) within group (
                   order by extract(epoch from started_at - run_at)::float8)
        from sweep.finished_tasks
        where state = $2 and started_at is not null
        "#,
    )
    .bind(fractions)
    .bind(TaskState::Succeeded.as_str())
    .fetch_one(executor)
    .await?;
    Ok(values.unwrap_or_else(|| vec![0.0; fractions.len()]))
}

/// When each of `ids` last started (`None` if it never did).
pub async fn started_at<'c, E: PgExecutor<'c>>(
    executor: E,
    ids: &[i64],
) -> Result<Vec<(i64, Option<chrono::DateTime<chrono::Utc>>)>, QueueError> {
    Ok(sqlx::query_as(
        r#"
        select id, started_at from sweep.tasks where id = any($1)
        union all
        select id, started_at from sweep.finished_tasks where id = any($1)
        order by id
        "#,
    )
    .bind(ids)
    .fetch_all(executor)
    .await?)
}

/// Empties the live table and the finished history, except finished tasks of `keep_type`
/// (the retained history a bench measures against), then vacuums and analyzes both tables so
/// each measurement starts from the same physical state.
pub async fn reset(pool: &sqlx::PgPool, keep_type: Option<&str>) -> Result<(), QueueError> {
    sqlx::query(r#"truncate sweep.tasks"#).execute(pool).await?;
    match keep_type {
        Some(keep) => {
            sqlx::query(r#"delete from sweep.finished_tasks where task_type <> $1"#)
                .bind(keep)
                .execute(pool)
                .await?;
        }
        None => {
            sqlx::query(r#"truncate sweep.finished_tasks"#).execute(pool).await?;
        }
    }
    sqlx::query(r#"vacuum analyze sweep.tasks, sweep.finished_tasks"#).execute(pool).await?;
    Ok(())
}

/// `vacuum tasks`, with `analyze` when asked.
pub async fn vacuum_tasks(pool: &sqlx::PgPool, analyze: bool) -> Result<(), QueueError> {
    let statement = if analyze { r#"vacuum analyze sweep.tasks"# } else { r#"vacuum sweep.tasks"# };
    sqlx::query(statement).execute(pool).await?;
    Ok(())
}

/// Finished tasks of `task_type`.
pub async fn count_finished<'c, E: PgExecutor<'c>>(
    executor: E,
    task_type: &str,
) -> Result<i64, QueueError> {
    Ok(sqlx::query_scalar(r#"select count(*) from sweep.finished_tasks where task_type = $1"#)
        .bind(task_type)
        .fetch_one(executor)
        .await?)
}

/// Succeeded tasks, and how many distinct module versions (by sha256) ran them.
pub async fn succeeded_and_versions<'c, E: PgExecutor<'c>>(
    executor: E,
) -> Result<(i64, i64), QueueError> {
    Ok(sqlx::query_as(
        r#"select count(*), count(distinct module_sha256) from sweep.finished_tasks
           where state = 'succeeded'"#,
    )
    .fetch_one(executor)
    .await?)
}

/// `started_at - run_at` in seconds for each of `ids` that started (live or finished).
pub async fn start_waits<'c, E: PgExecutor<'c>>(
    executor: E,
    ids: &[i64],
) -> Result<Vec<f64>, QueueError> {
    Ok(sqlx::query_scalar(
        r#"
        select extract(epoch from started_at - run_at)::float8 from sweep.tasks
        where id = any($1) and started_at is not null
        union all
        select extract(epoch from started_at - run_at)::float8 from sweep.finished_tasks
        where id = any($1) and started_at is not null
        "#,
    )
    .bind(ids)
    .fetch_all(executor)
    .await?)
}

/// How many of `ids` are still live (pending, retrying or running).
pub async fn count_live<'c, E: PgExecutor<'c>>(
    executor: E,
    ids: &[i64],
) -> Result<i64, QueueError> {
    Ok(sqlx::query_scalar(r#"select count(*) from sweep.tasks where id = any($1)"#)
        .bind(ids)
        .fetch_one(executor)
        .await?)
}

/// Tasks running right now per tenant, across all runners.
pub async fn running_by_tenant<'c, E: PgExecutor<'c>>(
    executor: E,
) -> Result<Vec<(String, i64)>, QueueError> {
    Ok(sqlx::query_as(
        r#"select tenant, count(*) from sweep.tasks where state = $1 group by tenant"#,
    )
    .bind(TaskState::Running.as_str())
    .fetch_all(executor)
    .await?)
}

/// The runner's last heartbeat, in the database clock.
pub async fn last_heartbeat<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: uuid::Uuid,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, QueueError> {
    Ok(sqlx::query_scalar(r#"select last_heartbeat_at from sweep.runners where id = $1"#)
        .bind(runner)
        .fetch_optional(executor)
        .await?)
}

/// `n` tenants named `<prefix><i>` with nothing to do, each with one empty queue: the crowd a
/// claim must not slow down with.
pub async fn add_idle_tenants(
    pool: &sqlx::PgPool,
    prefix: &str,
    n: usize,
) -> Result<(), QueueError> {
    sqlx::query(
        r#"
        with made as (
            insert into sweep.tenants (name, token_sha256)
            select $1 || g, encode(sha256(convert_to($1 || g, 'UTF8')), 'hex')
            from generate_series(1, $2) g
            returning name
        )
        insert into sweep.queues (tenant, task_type) select name, 'noop' from made
        "#,
    )
    .bind(prefix)
    .bind(sql_count(n))
    .execute(pool)
    .await?;
    Ok(())
}

/// A count or limit for SQL, saturating.
fn sql_count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `n` tenants named `<prefix><i>` (0-based), each with `task_type` registered (version 1 of
/// `bytes`) and active: a many-tenant bench's setup in one statement instead of two calls per
/// tenant.
pub async fn add_busy_tenants(
    pool: &sqlx::PgPool,
    prefix: &str,
    n: usize,
    task_type: &str,
    sha256: &str,
    bytes: &[u8],
) -> Result<(), QueueError> {
    sqlx::query(
        r#"
        with made as (
            insert into sweep.tenants (name, token_sha256)
            select $1 || g, encode(sha256(convert_to($1 || g, 'UTF8')), 'hex')
            from generate_series(0, $2 - 1) g
            returning name
        ),
        versions as (
            insert into sweep.modules (tenant, task_type, version, sha256, bytes)
            select name, $3, 1, $4, $5 from made
            returning tenant, task_type, version
        )
        insert into sweep.active_modules (tenant, task_type, version)
        select tenant, task_type, version from versions
        "#,
    )
    .bind(prefix)
    .bind(sql_count(n))
    .bind(task_type)
    .bind(sha256)
    .bind(bytes)
    .execute(pool)
    .await?;
    Ok(())
}

/// Statement statistics from `pg_stat_statements`, when the server preloads it: the extension
/// is created in the bench database and its counters reset. `None` when it is not available.
pub async fn statement_stats_reset(pool: &sqlx::PgPool) -> Option<()> {
    sqlx::query(r#"create extension if not exists pg_stat_statements"#).execute(pool).await.ok()?;
    sqlx::query(r#"select pg_stat_statements_reset()"#).execute(pool).await.ok()?;
    Some(())
}

/// The `limit` statements of this database with the most total execution time since
/// [`statement_stats_reset`]: (calls, total ms, mean ms, rows, the query's first line).
pub async fn statement_stats_top(
    pool: &sqlx::PgPool,
    limit: usize,
) -> Result<Vec<(i64, f64, f64, i64, String)>, QueueError> {
    Ok(sqlx::query_as(
        r#"
        select s.calls, s.total_exec_time, s.mean_exec_time, s.rows,
               left(regexp_replace(s.query, '\s+', ' ', 'g'), 110)
        from pg_stat_statements s
        join pg_database d on d.oid = s.dbid
        where d.datname = current_database()
        order by s.total_exec_time desc
        limit $1
        "#,
    )
    .bind(sql_count(limit))
    .fetch_all(pool)
    .await?)
}
