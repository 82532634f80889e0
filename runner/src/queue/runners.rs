//! The `runners` table: who is alive. A runner registers at start, heartbeats (together with
//! its leases, see [`super::heartbeat_leases`]) and deregisters on a clean shutdown.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::QueueError;

#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct RunnerInfo {
    pub id: Uuid,
    pub host: String,
    pub pid: i32,
    pub started_at: DateTime<Utc>,
    pub last_heartbeat_at: DateTime<Utc>,
}

pub async fn register_runner<'c, E: PgExecutor<'c>>(
    executor: E,
    id: Uuid,
    host: &str,
    pid: u32,
) -> Result<(), QueueError> {
    sqlx::query(REGISTER)
        .bind(id)
        .bind(host)
        .bind(i32::try_from(pid).unwrap_or(i32::MAX))
        .execute(executor)
        .await?;
    Ok(())
}

pub async fn deregister_runner<'c, E: PgExecutor<'c>>(
    executor: E,
    id: Uuid,
) -> Result<(), QueueError> {
    sqlx::query(DEREGISTER).bind(id).execute(executor).await?;
    Ok(())
}

pub async fn list_runners<'c, E: PgExecutor<'c>>(
    executor: E,
) -> Result<Vec<RunnerInfo>, QueueError> {
    Ok(sqlx::query_as(LIST_RUNNERS).fetch_all(executor).await?)
}

const REGISTER: &str = r#"
    insert into sweep.runners (id, host, pid) values ($1, $2, $3)
    on conflict (id) do update set last_heartbeat_at = now()
    "#;

const DEREGISTER: &str = r#"delete from sweep.runners where id = $1"#;

const LIST_RUNNERS: &str =
    r#"select id, host, pid, started_at, last_heartbeat_at from sweep.runners order by started_at"#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![REGISTER, DEREGISTER, LIST_RUNNERS];
