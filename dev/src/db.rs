//! A migrated database with a store per role, for tests: `#[sqlx::test(migrations = false)]`
//! hands a test its own empty database as connect options; [`migrated`] runs the production
//! migrate step on it and opens the stores the way `sweep run` does.

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
