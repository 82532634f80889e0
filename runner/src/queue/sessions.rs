//! Dashboard sessions (`ui_sessions`, migration 0003): a browser's login, kept on the server.
//!
//! Invariants: only SHA-256 hex digests are stored, of the session id (the cookie's value,
//! drawn by the admin layer) and of the token that logged in; a session is found only before
//! it expires; the admin layer checks on every request that its token still authenticates, so
//! a rotated or removed token ends its sessions at once, and logging out deletes the row.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::{sql_millis, QueueError};

/// A live session: the token it was opened with and when it ends.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct UiSession {
    pub token_sha256: String,
    pub expires_at: DateTime<Utc>,
}

/// Most expired sessions removed per login (each login tidies a little; none is ever read).
const EXPIRED_BATCH: i64 = 100;

/// Opens a session for the token hashing to `token_sha256`, valid for `ttl`, and removes a few
/// expired ones.
pub async fn open_ui_session<'c, E: PgExecutor<'c>>(
    executor: E,
    id_sha256: &str,
    token_sha256: &str,
    ttl: std::time::Duration,
) -> Result<(), QueueError> {
    sqlx::query(OPEN_SESSION)
        .bind(id_sha256)
        .bind(token_sha256)
        .bind(sql_millis(ttl))
        .bind(EXPIRED_BATCH)
        .execute(executor)
        .await?;
    Ok(())
}

/// The unexpired session whose id hashes to `id_sha256`.
pub async fn find_ui_session<'c, E: PgExecutor<'c>>(
    executor: E,
    id_sha256: &str,
) -> Result<Option<UiSession>, QueueError> {
    Ok(sqlx::query_as(FIND_SESSION).bind(id_sha256).fetch_optional(executor).await?)
}

/// Ends a session (logging out). Ending one that is gone is not an error.
pub async fn close_ui_session<'c, E: PgExecutor<'c>>(
    executor: E,
    id_sha256: &str,
) -> Result<(), QueueError> {
    sqlx::query(CLOSE_SESSION).bind(id_sha256).execute(executor).await?;
    Ok(())
}

const OPEN_SESSION: &str = r#"
    with tidied as (
        delete from sweep.ui_sessions
        where id_sha256 in (select id_sha256 from sweep.ui_sessions
                            where expires_at < now() order by expires_at limit $4)
    )
    insert into sweep.ui_sessions (id_sha256, token_sha256, expires_at)
    values ($1, $2, now() + $3 * interval '1 millisecond')
    "#;

const FIND_SESSION: &str = r#"
    select token_sha256, expires_at from sweep.ui_sessions
    where id_sha256 = $1 and expires_at > now()
    "#;

const CLOSE_SESSION: &str = r#"delete from sweep.ui_sessions where id_sha256 = $1"#;

#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] =
    statements![OPEN_SESSION, FIND_SESSION, CLOSE_SESSION];
