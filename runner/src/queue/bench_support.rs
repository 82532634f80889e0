//! Statements only the benchmarks use: filling history, counting what is left, and reading
//! the enqueue-to-start latency distribution from the database clock.

use sqlx::PgExecutor;

use super::QueueError;

/// Inserts `n` already-succeeded tasks of `task_type`, as months of retained history would
/// leave them, then refreshes the planner's statistics.
pub async fn fill_finished(
    pool: &sqlx::PgPool,
    task_type: &str,
    n: usize,
) -> Result<(), QueueError> {
    sqlx::query(
        r#"
        insert into tasks (task_type, payload, state, attempts, result, finished_at)
        select $1, jsonb_build_object('i', g), 'succeeded', 1, '{}', now()
        from generate_series(1, $2) g
        "#,
    )
    .bind(task_type)
    .bind(super::sql_count(n))
    .execute(pool)
    .await?;
    sqlx::query(r#"vacuum analyze tasks"#).execute(pool).await?;
    Ok(())
}

/// Tasks not finished yet (pending, retrying or running), counted through the small partial
/// indexes so it stays cheap however much history the table holds.
pub async fn count_unfinished<'c, E: PgExecutor<'c>>(executor: E) -> Result<i64, QueueError> {
    Ok(sqlx::query_scalar(
        r#"
        select (select count(*) from tasks where state in ('pending', 'retrying'))
             + (select count(*) from tasks where state = 'running')
        "#,
    )
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
        from tasks
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
    Ok(sqlx::query_as(r#"select id, started_at from tasks where id = any($1) order by id"#)
        .bind(ids)
        .fetch_all(executor)
        .await?)
}
