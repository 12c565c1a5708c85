//! Every query the relay runs, one function each. The SQL lives in
//! `sql/*.sql`, one statement per file, with `{table}` standing for the
//! validated, quoted outbox table name.

mod admin;
mod connect;
mod listen;
mod migrate;
mod pooler;
mod table;

use std::time::Duration;

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use thiserror::Error;
use tokio_postgres::types::Type;
use uuid::Uuid;

use crate::event::Event;

pub use admin::{Backlog, QuarantinedRow, RetentionBatch, ADMIN_TIMEOUT, READ_TIMEOUT};
pub use connect::{PgTls, SslMode};
pub use listen::listen;
pub use migrate::{migrate, MIGRATIONS};
pub use pooler::Pooler;
pub use table::{describe_pg, DatabaseConfig, Endpoint, TableName};

use pooler::{Param, Session};

/// A database failure. The messages come from PostgreSQL or the driver and
/// never include the connection password.
#[derive(Debug, Error)]
pub enum StoreError {
    /// No connection could be had from the pool.
    #[error("database unavailable: {}", with_causes(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A statement failed.
    #[error("database error: {}", with_causes(.0))]
    Query(#[from] tokio_postgres::Error),
    /// The server closed the connection.
    #[error("database connection closed")]
    Closed,
    /// A statement did not finish in time.
    #[error("database query timed out after {0:?}")]
    Timeout(Duration),
}

/// The driver's top-level messages ("db error", "error connecting to
/// server") hide the reason in their sources; logs need the whole chain.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // rustls names a certificate problem by its enum variant
        // (UnknownIssuer); an operator needs the words.
        let cause_text = crate::tls::describe(cause).unwrap_or_else(|| cause.to_string());
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Which rows a claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// Any due row; maximum throughput.
    None,
    /// Per `aggregate_id`, in `(created_at, id)` order: only a row whose
    /// predecessors in its aggregate are all published.
    Aggregate,
}

/// Rendered statements for one table.
#[derive(Debug)]
struct Statements {
    claim: String,
    claim_ordered: String,
    claim_ordered_by_sequence: String,
    mark_published: String,
    delete_published: String,
    reschedule: String,
    quarantine: String,
}

impl Statements {
    fn for_table(table: &TableName) -> Self {
        let quoted = table.quoted();
        let render = |sql: &str| sql.replace("{table}", &quoted);
        Self {
            claim: render(include_str!("sql/claim.sql")),
            claim_ordered: render(include_str!("sql/claim_ordered.sql"))
                .replace("{predecessor_key}", "(p.created_at, p.id)")
                .replace("{row_key}", "(t.created_at, t.id)"),
            // A row without a sequence number sorts first in its aggregate.
            claim_ordered_by_sequence: render(include_str!("sql/claim_ordered.sql"))
                .replace(
                    "{predecessor_key}",
                    "(COALESCE(p.sequence_number, -9223372036854775808), p.created_at, p.id)",
                )
                .replace(
                    "{row_key}",
                    "(COALESCE(t.sequence_number, -9223372036854775808), t.created_at, t.id)",
                ),
            mark_published: render(include_str!("sql/mark_published.sql")),
            delete_published: render(include_str!("sql/delete_published.sql")),
            reschedule: render(include_str!("sql/reschedule.sql")),
            quarantine: render(include_str!("sql/quarantine.sql")),
        }
    }
}

/// Default bound on one statement; a hung database must not hang the relay.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

const PLANNER_SETTINGS: &str = include_str!("sql/planner_settings.sql");

/// Opens the pool's connections with the URL's TLS settings and libpq's
/// `sslmode` fallbacks.
struct TlsConnect(PgTls);

impl deadpool_postgres::Connect for TlsConnect {
    fn connect(
        &self,
        pg: &tokio_postgres::Config,
    ) -> futures::future::BoxFuture<
        '_,
        Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        let pg = pg.clone();
        Box::pin(async move {
            let (client, connection) = self.0.connect(&pg).await?;
            let task = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(error = %with_causes(&e), "database connection failed");
                }
            });
            Ok((client, task))
        })
    }
}

/// The outbox table, through a connection pool.
pub struct Store {
    pool: Pool,
    pooler: Pooler,
    table: TableName,
    sql: Statements,
    /// Whether the table has a `sequence_number` column, looked up at the
    /// first ordered claim (the database may be down at start-up).
    has_sequence_column: tokio::sync::OnceCell<bool>,
}

impl Store {
    /// Builds the pool; it connects lazily, so this never fails on an
    /// unreachable database.
    pub fn new(config: &DatabaseConfig, pool_size: usize) -> Self {
        let mut pg = config.pg.clone();
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(5));
        }
        if pg.get_application_name().is_none() {
            pg.application_name("outbox-relay");
        }
        let manager = Manager::from_connect(
            pg,
            TlsConnect(config.tls.clone()),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let builder = Pool::builder(manager)
            .max_size(pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(10)))
            .recycle_timeout(Some(Duration::from_secs(5)));
        // Two planner settings for the relay's own connections, both
        // found under load in the benchmark:
        //
        // - plan_cache_mode: plan every statement for its parameters and
        //   the table as it is now. A prepared statement otherwise
        //   settles on a generic plan after five runs, costed for the
        //   table as it was: a relay started beside an empty outbox kept
        //   a mark plan that walked every unpublished row.
        // - enable_bitmapscan: an outbox swings from almost nothing
        //   unpublished (when ANALYZE usually samples it) to a large
        //   backlog (when speed matters). On such stale estimates the
        //   claim chose a bitmap scan of the whole backlog and a sort,
        //   136 ms a batch at 50,000 rows behind, instead of walking the
        //   pending index in order and stopping after a batch. Every
        //   statement here is written for a plain index scan.
        //
        // set_config, not startup options, so poolers that refuse startup
        // options still connect. Behind a transaction pooler they are set
        // in the claim's own transaction instead (see `claim`).
        let builder = match config.pooler {
            Pooler::None => builder.post_create(Hook::async_fn(|client, _| {
                Box::pin(async move {
                    client
                        .query_typed(PLANNER_SETTINGS, &[(&false, Type::BOOL)])
                        .await
                        .map_err(HookError::Backend)?;
                    Ok(())
                })
            })),
            Pooler::Transaction => builder,
        };
        let pool = builder
            .build()
            // Building only fails without a runtime for the timeouts, and
            // one is set just above.
            .expect("pool has a runtime for its timeouts");
        Self {
            pool,
            pooler: config.pooler,
            table: config.table.clone(),
            sql: Statements::for_table(&config.table),
            has_sequence_column: tokio::sync::OnceCell::new(),
        }
    }

    /// The outbox table this store works on.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// A pooled connection, for callers with queries of their own.
    pub async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        bounded(async {
            let client = self.pool.get().await?;
            client.simple_query("SELECT 1").await?;
            Ok(())
        })
        .await
    }

    /// Claims up to `limit` due rows and leases them for `lease`; returns them
    /// in `(created_at, id)` order. With [`Ordering::Aggregate`] only rows
    /// whose predecessors in their aggregate are all published qualify.
    pub async fn claim(
        &self,
        limit: u32,
        lease: Duration,
        ordering: Ordering,
    ) -> Result<Vec<Event>, StoreError> {
        let sql = match ordering {
            Ordering::None => &self.sql.claim,
            Ordering::Aggregate if self.orders_by_sequence().await? => &self.sql.claim_ordered_by_sequence,
            Ordering::Aggregate => &self.sql.claim_ordered,
        };
        bounded(async {
            let mut client = self.pool.get().await?;
            let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
            let params: [Param<'_>; 2] = [(&i64::from(limit), Type::INT8), (&lease_ms, Type::INT8)];
            let rows = match self.pooler {
                Pooler::None => Session::client(self.pooler, &client).query(sql, &params).await?,
                // The planner settings hold for this transaction only, so
                // the claim gets a transaction of its own to carry them.
                Pooler::Transaction => {
                    let tx = client.transaction().await?;
                    let session = Session::transaction(self.pooler, &tx);
                    session.query(PLANNER_SETTINGS, &[(&true, Type::BOOL)]).await?;
                    let rows = session.query(sql, &params).await?;
                    tx.commit().await?;
                    rows
                }
            };
            let mut events: Vec<Event> = rows
                .iter()
                .map(|row| Event {
                    id: row.get(0),
                    causation_id: row.get(1),
                    event_type: row.get(2),
                    aggregate_id: row.get(3),
                    payload: row.get(4),
                    created_at: row.get(5),
                    attempt_count: row.get(6),
                })
                .collect();
            // UPDATE … RETURNING gives no order guarantee.
            events.sort_by_key(|e| (e.created_at, e.id));
            Ok(events)
        })
        .await
    }

    /// Whether rows are ordered within an aggregate by the producer's
    /// `sequence_number` column (present on the table) before `created_at`.
    pub async fn orders_by_sequence(&self) -> Result<bool, StoreError> {
        self.has_sequence_column
            .get_or_try_init(|| {
                bounded(async {
                    let client = self.pool.get().await?;
                    let row = Session::client(self.pooler, &client)
                        .query_one(
                            include_str!("sql/has_sequence_column.sql"),
                            &[(&self.table.quoted(), Type::TEXT)],
                        )
                        .await?;
                    Ok(row.get(0))
                })
            })
            .await
            .copied()
    }

    /// Marks confirmed rows published.
    pub async fn mark_published(&self, ids: &[Uuid]) -> Result<u64, StoreError> {
        self.execute(&self.sql.mark_published, &[(&ids, Type::UUID_ARRAY)])
            .await
    }

    /// Deletes confirmed rows (`OUTBOX_ON_PUBLISH=delete`).
    pub async fn delete_published(&self, ids: &[Uuid]) -> Result<u64, StoreError> {
        self.execute(&self.sql.delete_published, &[(&ids, Type::UUID_ARRAY)])
            .await
    }

    /// Records failed attempts: each row's error and its delay before the
    /// next attempt (the three slices are columns of the same rows).
    pub async fn reschedule(
        &self,
        ids: &[Uuid],
        errors: &[&str],
        delays: &[Duration],
    ) -> Result<u64, StoreError> {
        let errors = last_errors(errors);
        let delays: Vec<i64> = delays
            .iter()
            .map(|delay| i64::try_from(delay.as_millis()).unwrap_or(i64::MAX))
            .collect();
        self.execute(
            &self.sql.reschedule,
            &[
                (&ids, Type::UUID_ARRAY),
                (&errors, Type::TEXT_ARRAY),
                (&delays, Type::INT8_ARRAY),
            ],
        )
        .await
    }

    /// Quarantines rows with their reasons (columns of the same rows).
    pub async fn quarantine(&self, ids: &[Uuid], errors: &[&str]) -> Result<u64, StoreError> {
        let errors = last_errors(errors);
        self.execute(
            &self.sql.quarantine,
            &[(&ids, Type::UUID_ARRAY), (&errors, Type::TEXT_ARRAY)],
        )
        .await
    }

    async fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        bounded(async {
            let client = self.pool.get().await?;
            Ok(Session::client(self.pooler, &client).execute(sql, params).await?)
        })
        .await
    }
}

/// `last_error` is for a person reading `quarantine list`: one line, and
/// bounded, whatever a broker or driver put in its error text.
fn last_errors(reasons: &[&str]) -> Vec<String> {
    const MAX: usize = 1000;
    reasons
        .iter()
        .map(|reason| {
            let one_line = reason.replace(['\n', '\r'], " ");
            if one_line.len() <= MAX {
                return one_line;
            }
            let mut end = MAX;
            while !one_line.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…", &one_line[..end])
        })
        .collect()
}

async fn bounded<T>(work: impl std::future::Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    tokio::time::timeout(QUERY_TIMEOUT, work)
        .await
        .unwrap_or(Err(StoreError::Timeout(QUERY_TIMEOUT)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_errors_are_single_line_and_bounded() {
        assert_eq!(last_errors(&["a\nb"]), vec!["a b"]);
        let long = "é".repeat(2000);
        let cut = &last_errors(&[&long])[0];
        assert!(cut.len() <= 1000 + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }
}
