//! What the database URL points at, and so how statements may be sent.
//!
//! Directly at PostgreSQL (or a session-pooling proxy), the relay keeps
//! named prepared statements per connection and sets its planner settings
//! once per session. Behind a transaction-pooling proxy (PgBouncer in
//! transaction mode, RDS Proxy), consecutive transactions of one client
//! connection run on different server connections: a named statement
//! prepared on one is missing on the next ("prepared statement s3 does not
//! exist") or collides with another client's ("already exists"), and a
//! session `SET` stays behind on a server connection other clients then get.
//! So in that mode every statement is sent unnamed with its parameter types
//! (parse, bind and execute in one round trip), and settings are
//! `set_config(…, true)`, local to the one transaction that needs them.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Row, RowStream};

/// `OUTBOX_DATABASE_POOLER`: what kind of connection pooler, if any, the
/// database URL goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// A direct connection (or a session pooler): prepared statements are
    /// cached per connection, planner settings are set per session.
    #[default]
    None,
    /// A transaction-pooling proxy: no named prepared statements, no
    /// session settings, no session advisory locks, no LISTEN.
    Transaction,
}

/// A parameter with its PostgreSQL type, as unnamed statements need them.
pub type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// Runs `sql` on a session with `$prepared` (a cached named statement, on a
/// direct connection) or `$unnamed` (an unnamed typed statement, behind a
/// transaction pooler), on whichever of a client or a transaction it holds.
/// A macro because the client and transaction types share no trait that
/// has the typed calls.
macro_rules! run {
    ($session:expr, $sql:expr, $params:expr, $prepared:ident, $unnamed:ident) => {
        match ($session.pooler, &$session.on) {
            (Pooler::None, On::Client(client)) => {
                let (types, values) = split($params);
                let statement = client.prepare_typed_cached($sql, &types).await?;
                client.$prepared(&statement, &values).await
            }
            (Pooler::None, On::Transaction(tx)) => {
                let (types, values) = split($params);
                let statement = tx.prepare_typed_cached($sql, &types).await?;
                tx.$prepared(&statement, &values).await
            }
            (Pooler::Transaction, On::Client(client)) => client.$unnamed($sql, $params).await,
            (Pooler::Transaction, On::Transaction(tx)) => tx.$unnamed($sql, $params).await,
        }
    };
}

/// A connection or transaction to run statements on, in the pooler mode's
/// way.
pub(super) struct Session<'c, 't> {
    pooler: Pooler,
    on: On<'c, 't>,
}

enum On<'c, 't> {
    Client(&'c deadpool_postgres::Object),
    Transaction(&'c deadpool_postgres::Transaction<'t>),
}

impl<'c> Session<'c, 'static> {
    /// Statements on a pooled connection, each in its own implicit
    /// transaction.
    pub(super) fn client(pooler: Pooler, client: &'c deadpool_postgres::Object) -> Self {
        Self {
            pooler,
            on: On::Client(client),
        }
    }
}

impl<'c, 't> Session<'c, 't> {
    /// Statements inside `tx`.
    pub(super) fn transaction(pooler: Pooler, tx: &'c deadpool_postgres::Transaction<'t>) -> Self {
        Self {
            pooler,
            on: On::Transaction(tx),
        }
    }

    /// The rows `sql` returns.
    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        run!(self, sql, params, query, query_typed)
    }

    /// The one row `sql` returns (an error if it returns another number).
    pub(super) async fn query_one(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Row, tokio_postgres::Error> {
        run!(self, sql, params, query_one, query_typed_one)
    }

    /// The rows `sql` returns, as they arrive: for results too long to
    /// hold in memory.
    pub(super) async fn query_stream(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<RowStream, tokio_postgres::Error> {
        let typed = params.iter().map(|(value, ty)| (*value, ty.clone()));
        match self.pooler {
            Pooler::None => {
                let (types, values) = split(params);
                match self.on {
                    On::Client(client) => {
                        let statement = client.prepare_typed_cached(sql, &types).await?;
                        client.query_raw(&statement, values).await
                    }
                    On::Transaction(tx) => {
                        let statement = tx.prepare_typed_cached(sql, &types).await?;
                        tx.query_raw(&statement, values).await
                    }
                }
            }
            Pooler::Transaction => match self.on {
                On::Client(client) => client.query_typed_raw(sql, typed).await,
                On::Transaction(tx) => tx.query_typed_raw(sql, typed).await,
            },
        }
    }

    /// The number of rows `sql` changed.
    pub(super) async fn execute(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<u64, tokio_postgres::Error> {
        run!(self, sql, params, execute, execute_typed)
    }
}

/// The types to prepare a statement with, and the values to run it with.
fn split<'a>(params: &[Param<'a>]) -> (Vec<Type>, Vec<&'a (dyn ToSql + Sync)>) {
    params.iter().map(|(value, ty)| (ty.clone(), *value)).unzip()
}

/// Runs `sql` on a direct connection in a transaction of its own that
/// `begin` opens (with its `SET LOCAL` settings) and `COMMIT` closes, the
/// three sent together: one round trip, as for the statement alone. A
/// statement that fails leaves the transaction aborted, so the `COMMIT`
/// behind it rolls back.
///
/// A plan that took longer than `slow` is taken for one made on a table
/// that has grown since (see sql/claim_generic_begin.sql): the statement
/// is dropped from the connection's cache, so the next run prepares it
/// again and its plan is made on the table as it is then.
pub(super) async fn query_in_own_transaction(
    client: &deadpool_postgres::Object,
    begin: &str,
    sql: &str,
    params: &[Param<'_>],
    slow: std::time::Duration,
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let (types, values) = split(params);
    // Prepared before anything is sent: a statement still to be prepared
    // would be parsed after the COMMIT had gone out, outside the
    // transaction.
    let statement = client.prepare_typed_cached(sql, &types).await?;
    let started = std::time::Instant::now();
    let (_, rows, _) = tokio::try_join!(
        client.batch_execute(begin),
        client.query(&statement, &values),
        client.batch_execute("COMMIT"),
    )?;
    forget_if_slow(client, sql, &types, started, slow);
    Ok(rows)
}

/// As [`query_in_own_transaction`], for a statement that returns no rows:
/// the number of rows it changed.
pub(super) async fn execute_in_own_transaction(
    client: &deadpool_postgres::Object,
    begin: &str,
    sql: &str,
    params: &[Param<'_>],
    slow: std::time::Duration,
) -> Result<u64, tokio_postgres::Error> {
    let (types, values) = split(params);
    let statement = client.prepare_typed_cached(sql, &types).await?;
    let started = std::time::Instant::now();
    let (_, changed, _) = tokio::try_join!(
        client.batch_execute(begin),
        client.execute(&statement, &values),
        client.batch_execute("COMMIT"),
    )?;
    forget_if_slow(client, sql, &types, started, slow);
    Ok(changed)
}

fn forget_if_slow(
    client: &deadpool_postgres::Object,
    sql: &str,
    types: &[Type],
    started: std::time::Instant,
    slow: std::time::Duration,
) {
    if started.elapsed() > slow {
        tracing::debug!(took = ?started.elapsed(), "a statement under a generic plan was slow; its plan is made again on the next run");
        client.statement_cache.remove(sql, types);
    }
}
