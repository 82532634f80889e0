//! Statements through a transaction pooler (PgBouncer with `pool_mode = transaction`): a
//! [`Store`] opened as pooled runs every statement so that no server-side state has to outlive
//! the transaction it ran in.
//!
//! Why it takes more than turning sqlx's statement cache off (sqlx-postgres 0.8, read from its
//! `connection/executor.rs`): a query with parameters goes out as `Parse` (+ `Describe`) +
//! `Sync`, then, after the server's `ReadyForQuery`, as `Bind` + `Execute` + `Close portal` +
//! `Sync`. A transaction pooler hands the server connection back to its pool at every
//! `ReadyForQuery` that says "idle" (outside a transaction block), so the two halves of one
//! query can run on different server connections. With the cache at its default, the statement
//! is named (`sqlx_s_N`), prepared once on whichever server the first half met, and later
//! executions of it meet servers that never saw it: 'prepared statement "sqlx_s_1" does not
//! exist'. `statement_cache_capacity(0)` does not change the name: the query is still
//! persistent, so it is still parsed as `sqlx_s_N`, just never cached and never closed; it
//! leaks on that server, and another client whose counter reaches the same N there fails with
//! '... already exists'. `persistent(false)` parses the unnamed statement instead, but outside
//! a transaction the `Bind` may still reach another server, which either has no unnamed
//! statement or, worse, another client's, which would then run with our parameters.
//!
//! So a pooled store sends each statement with parameters unnamed and inside its own explicit
//! transaction (`BEGIN`, the statement, `COMMIT`): the pooler keeps one server linked while a
//! transaction is open, both halves land on it, and nothing named is left behind. For a single
//! statement that is exactly autocommit, just three more round trips; a direct store keeps
//! sqlx's cached, named statements (one round trip). A statement sent without parameters as a
//! plain string goes as one simple `Query` message, which a pooler cannot split, and runs as is
//! (`VACUUM` cannot run inside a transaction block). Sweep's schema has no enum or domain types,
//! so sqlx never runs its own (named) type lookups on these connections.
//!
//! Invariants: through a pooled store or a [`Conn`] taken from one, no statement is named and
//! none with parameters runs outside a transaction of its own; a statement that fails rolls
//! its transaction back before the connection is used or returned again, so the pooler never
//! sees a client idle in a transaction.

use std::{fmt::Debug, ops::DerefMut};

use futures::{
    future::BoxFuture, stream::BoxStream, FutureExt, StreamExt, TryFutureExt, TryStreamExt,
};
use sqlx::{
    postgres::{PgArguments, PgQueryResult, PgRow, PgStatement, PgTypeInfo},
    Connection, Describe, Either, Execute, Executor, PgConnection, Postgres,
};

use super::Store;

type Step = Either<PgQueryResult, PgRow>;

/// A query re-sent as an unnamed statement (never cached, never named on the server).
struct Unnamed<'q> {
    sql: &'q str,
    arguments: Option<PgArguments>,
}

impl<'q> Execute<'q, Postgres> for Unnamed<'q> {
    fn sql(&self) -> &'q str {
        self.sql
    }

    fn statement(&self) -> Option<&PgStatement<'q>> {
        None
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, sqlx::error::BoxDynError> {
        Ok(self.arguments.take())
    }

    fn persistent(&self) -> bool {
        false
    }
}

/// Runs `query` on `conn` the pooler-safe way (see the module header) and collects what it
/// returned: a statement in a transaction yields nothing before its commit anyway.
async fn run_pooled<'q, E>(conn: &mut PgConnection, mut query: E) -> Result<Vec<Step>, sqlx::Error>
where
    E: 'q + Execute<'q, Postgres>,
{
    let sql = query.sql();
    let Some(arguments) = query.take_arguments().map_err(sqlx::Error::Encode)? else {
        return conn.fetch_many(sql).try_collect().await;
    };
    let mut tx = conn.begin().await?;
    let steps =
        (&mut *tx).fetch_many(Unnamed { sql, arguments: Some(arguments) }).try_collect().await;
    match steps {
        Ok(steps) => {
            tx.commit().await?;
            Ok(steps)
        }
        Err(e) => {
            // Dropping the transaction would only queue the ROLLBACK until the connection's
            // next use, leaving the pooler's server linked to an idle client meanwhile.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

fn stream_of<'e>(
    steps: impl std::future::Future<Output = Result<Vec<Step>, sqlx::Error>> + Send + 'e,
) -> BoxStream<'e, Result<Step, sqlx::Error>> {
    futures::stream::once(steps)
        .map_ok(|steps| futures::stream::iter(steps.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
}

/// The first row of a pooled statement, as `fetch_optional`.
fn first_row<'e>(
    steps: impl std::future::Future<Output = Result<Vec<Step>, sqlx::Error>> + Send + 'e,
) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>> {
    steps.map_ok(|steps| steps.into_iter().find_map(|step| step.right())).boxed()
}

/// Preparing ahead names a statement on one server connection of the pooler's; refused.
fn no_prepared_statements<'e, T: 'e>() -> BoxFuture<'e, Result<T, sqlx::Error>> {
    Box::pin(async {
        Err(sqlx::Error::Configuration(
            "a store opened through a transaction pooler cannot prepare statements ahead: \
             run the query instead"
                .into(),
        ))
    })
}

/// [`run_pooled`] on a connection taken from `pool` for this one statement.
async fn run_acquired<'q, E>(pool: sqlx::PgPool, query: E) -> Result<Vec<Step>, sqlx::Error>
where
    E: 'q + Execute<'q, Postgres>,
{
    run_pooled(&mut *pool.acquire().await?, query).await
}

/// A store is an executor for the queue functions: pass `&store`. Direct, it is its pool;
/// pooled, each statement runs as the module header says. (For any lifetime, as `&Pool`: see
/// the `Connects` impl.)
impl<'c> Executor<'c> for &'_ Store {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Step, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled() {
            return self.pool().fetch_many(query);
        }
        stream_of(run_acquired(self.pool().clone(), query))
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled() {
            return self.pool().fetch_optional(query);
        }
        first_row(run_acquired(self.pool().clone(), query))
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        if !self.pooled() {
            return self.pool().prepare_with(sql, parameters);
        }
        no_prepared_statements()
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        if !self.pooled() {
            return self.pool().describe(sql);
        }
        no_prepared_statements()
    }
}

/// One connection for a queue function that runs several statements on it (see
/// [`Connects`]); an executor (`&mut conn`) that runs them the way its source needs.
#[derive(Debug)]
pub struct Conn<C> {
    conn: C,
    pooled: bool,
}

/// What a queue function that runs several statements on one connection takes: anything sqlx
/// can acquire a connection from (a pool, a connection, a transaction: the statements run as
/// sqlx runs them) or a [`Store`] (`&store`: pooled or not, as it was opened).
pub trait Connects<'c>: Send {
    type Connection: DerefMut<Target = PgConnection> + Send + Debug;

    fn connect(self) -> BoxFuture<'c, Result<Conn<Self::Connection>, sqlx::Error>>;
}

// No `A: 'c` here (the acquire future carries what it borrows): with it, a future spawned with
// `&pool` inside would need the pool borrowed for every lifetime.
impl<'c, A> Connects<'c> for A
where
    A: sqlx::Acquire<'c, Database = Postgres> + Send,
    A::Connection: Debug + 'c,
{
    type Connection = A::Connection;

    fn connect(self) -> BoxFuture<'c, Result<Conn<A::Connection>, sqlx::Error>> {
        self.acquire().map_ok(Conn::direct).boxed()
    }
}

impl<C> Conn<C> {
    fn direct(conn: C) -> Self {
        Conn { conn, pooled: false }
    }
}

impl<C> Conn<C>
where
    C: DerefMut<Target = PgConnection> + Send + Debug,
{
    /// A transaction on this connection, for a queue function whose statements must commit
    /// together (the scheduler's lock, enqueue and advance). Through a pooler too: `BEGIN` goes
    /// as a simple query, the pooler keeps one server linked until `COMMIT`, and each statement
    /// still runs unnamed (in a savepoint of its own, which is what `run_pooled`'s own
    /// transaction becomes inside this one).
    pub(crate) async fn begin(
        &mut self,
    ) -> Result<Conn<sqlx::Transaction<'_, Postgres>>, sqlx::Error> {
        let pooled = self.pooled;
        Ok(Conn { conn: (*self.conn).begin().await?, pooled })
    }
}

impl Conn<sqlx::Transaction<'_, Postgres>> {
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        self.conn.commit().await
    }

    /// Rolls back now, not at the connection's next use: a pooler must never see this client
    /// idle in a transaction.
    pub(crate) async fn rollback(self) -> Result<(), sqlx::Error> {
        self.conn.rollback().await
    }
}

impl<C: DerefMut<Target = PgConnection>> Conn<C> {
    /// The connection itself and whether it is a pooler's, for what an executor cannot carry
    /// (`COPY`, `queue/copy.rs`): statements sent on it must then keep this module's rules
    /// themselves (unnamed, inside a transaction, when pooled).
    pub(super) fn raw(&mut self) -> (&mut PgConnection, bool) {
        (&mut self.conn, self.pooled)
    }
}

// For every pair of lifetimes (the future owns a pool handle), as sqlx does for `&Pool`: a
// future spawned with `&store` inside must be `Send` for lifetimes the compiler cannot name.
impl<'c> Connects<'c> for &'_ Store {
    type Connection = sqlx::pool::PoolConnection<Postgres>;

    fn connect(self) -> BoxFuture<'c, Result<Conn<Self::Connection>, sqlx::Error>> {
        let (pool, pooled) = (self.pool().clone(), self.pooled());
        Box::pin(async move { Ok(Conn { conn: pool.acquire().await?, pooled }) })
    }
}

impl<'a, C> Executor<'a> for &'a mut Conn<C>
where
    C: DerefMut<Target = PgConnection> + Send + Debug,
{
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Step, sqlx::Error>>
    where
        'a: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled {
            return (&mut *self.conn).fetch_many(query);
        }
        stream_of(run_pooled(&mut self.conn, query))
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'a: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled {
            return (&mut *self.conn).fetch_optional(query);
        }
        first_row(run_pooled(&mut self.conn, query))
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'a: 'e,
    {
        if !self.pooled {
            return (&mut *self.conn).prepare_with(sql, parameters);
        }
        no_prepared_statements()
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'a: 'e,
    {
        if !self.pooled {
            return (&mut *self.conn).describe(sql);
        }
        no_prepared_statements()
    }
}
