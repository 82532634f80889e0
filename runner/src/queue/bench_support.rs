//! Statements only the benchmarks use: filling history, counting what is left, and reading
//! the enqueue-to-start latency distribution from the database clock.

use sqlx::PgExecutor;

use super::QueueError;

/// Inserts `n` already-succeeded tasks of `task_type`, as months of retained history would
/// leave them (with no start time, so they stay out of the latency percentiles), then
/// refreshes the planner's statistics.
pub async fn fill_finished(
    pool: &sqlx::PgPool,
    task_type: &str,
    n: usize,
) -> Result<(), QueueError> {
    sqlx::query(
        r#"
        insert into finished_tasks (id, tenant, task_type, payload, state, priority,
                                    attempts, max_attempts, run_at, errors, result,
                                    created_at, started_at)
        select nextval('tasks_id_seq'), 'default', $1, jsonb_build_object('i', g),
               'succeeded', 0, 1, 5, now(), '[]', '{}', now(), null
        from generate_series(1, $2) g
        "#,
    )
    .bind(task_type)
    .bind(super::sql_count(n))
    .execute(pool)
    .await?;
    sqlx::query(r#"vacuum analyze finished_tasks"#).execute(pool).await?;
    Ok(())
}

/// Tasks not finished yet (pending, retrying or running): `tasks` holds nothing else.
pub async fn count_unfinished<'c, E: PgExecutor<'c>>(executor: E) -> Result<i64, QueueError> {
    Ok(sqlx::query_scalar(
        r#"
        select count(*) from tasks
        "#,
    )
    .fetch_one(executor)
    .await?)
}

/// Whether any task is not finished yet: cheap enough to ask every few milliseconds, unlike
/// [`count_unfinished`], which reads the whole backlog.
pub async fn any_unfinished<'c, E: PgExecutor<'c>>(executor: E) -> Result<bool, QueueError> {
    Ok(sqlx::query_scalar(r#"select exists (select 1 from tasks)"#).fetch_one(executor).await?)
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
        from finished_tasks
        where state = 'succeeded' and started_at is not null
        "#,
    )
    .bind(fractions)
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
        select id, started_at from tasks where id = any($1)
        union all
        select id, started_at from finished_tasks where id = any($1)
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
    sqlx::query(r#"truncate tasks"#).execute(pool).await?;
    match keep_type {
        Some(keep) => {
            sqlx::query(r#"delete from finished_tasks where task_type <> $1"#)
                .bind(keep)
                .execute(pool)
                .await?;
        }
        None => {
            sqlx::query(r#"truncate finished_tasks"#).execute(pool).await?;
        }
    }
    sqlx::query(r#"vacuum analyze tasks, finished_tasks"#).execute(pool).await?;
    Ok(())
}

/// `vacuum tasks`, with `analyze` when asked.
pub async fn vacuum_tasks(pool: &sqlx::PgPool, analyze: bool) -> Result<(), QueueError> {
    let statement = if analyze { r#"vacuum analyze tasks"# } else { r#"vacuum tasks"# };
    sqlx::query(statement).execute(pool).await?;
    Ok(())
}

/// Finished tasks of `task_type`.
pub async fn count_finished<'c, E: PgExecutor<'c>>(
    executor: E,
    task_type: &str,
) -> Result<i64, QueueError> {
    Ok(sqlx::query_scalar(r#"select count(*) from finished_tasks where task_type = $1"#)
        .bind(task_type)
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
        select extract(epoch from started_at - run_at)::float8 from tasks
        where id = any($1) and started_at is not null
        union all
        select extract(epoch from started_at - run_at)::float8 from finished_tasks
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
    Ok(sqlx::query_scalar(r#"select count(*) from tasks where id = any($1)"#)
        .bind(ids)
        .fetch_one(executor)
        .await?)
}

/// Tasks running right now per tenant, across all runners.
pub async fn running_by_tenant<'c, E: PgExecutor<'c>>(
    executor: E,
) -> Result<Vec<(String, i64)>, QueueError> {
    Ok(sqlx::query_as(
        r#"select tenant, count(*) from tasks where state = 'running' group by tenant"#,
    )
    .fetch_all(executor)
    .await?)
}

/// The runner's last heartbeat, in the database clock.
pub async fn last_heartbeat<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: uuid::Uuid,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, QueueError> {
    Ok(sqlx::query_scalar(r#"select last_heartbeat_at from runners where id = $1"#)
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
            insert into tenants (name, token_sha256)
            select $1 || g, encode(sha256(convert_to($1 || g, 'UTF8')), 'hex')
            from generate_series(1, $2) g
            returning name
        )
        insert into queues (tenant, task_type) select name, 'noop' from made
        "#,
    )
    .bind(prefix)
    .bind(super::sql_count(n))
    .execute(pool)
    .await?;
    Ok(())
}
