//! Databases for tests and benches: `#[sqlx::test(migrations = false)]` hands a test its own
//! empty database as connect options; [`migrated`] runs the production migrate step on it and
//! opens the stores the way `sweep run` does. [`database_url`] names a database on the server
//! `DATABASE_URL` names, for what needs a URL (a `sweep` child process, a bench database).

use sqlx::{postgres::PgConnectOptions, PgPool};
use sweep::queue::{self, Role, Store};

/// The stores of one test database.
#[derive(Debug, Clone)]
pub struct Stores {
    pub runner: Store,
    pub admin: Store,
    pub options: PgConnectOptions,
}

impl Stores {
    /// The runner store's pool, for queue calls.
    pub fn pool(&self) -> PgPool {
        self.runner.pool().clone()
    }
}

/// Migrates the database `options` names and opens a runner and an admin store on it.
pub async fn migrated(options: PgConnectOptions) -> Stores {
    queue::migrate_with(options.clone()).await.expect("migrating the test database");
    let runner = Store::open_with(options.clone(), Role::Runner, 16)
        .await
        .expect("opening the runner store");
    let admin =
        Store::open_with(options.clone(), Role::Admin, 8).await.expect("opening the admin store");
    Stores { runner, admin, options }
}

/// Server used when `DATABASE_URL` is unset (the same default as `scripts/test.sh`).
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// `DATABASE_URL` (or the default), with its database name replaced by `database`.
pub fn database_url(database: &str) -> String {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    with_database(&url, database)
}

/// `url` with its database name replaced by `database` (any query string kept).
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    // The path starts at the first '/' after "scheme://authority".
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let server = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{server}/{database}?{q}"),
        None => format!("{server}/{database}"),
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_name() {
        assert_eq!(with_database("postgres://u@h:5432/test", "b"), "postgres://u@h:5432/b");
        assert_eq!(
            with_database("postgres://u@h/test?sslmode=disable", "b"),
            "postgres://u@h/b?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "b"), "postgres://u@h/b");
    }
}
