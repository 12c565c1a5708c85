//! The queries of the operator commands and the maintenance tasks: backlog
//! gauges, `status`, `quarantine list/release`, `replay` and retention.
//!
//! Each runs in a short transaction that first bounds its statements on the
//! server (`sql/set_local_timeouts.sql`), and the whole exchange is bounded
//! on the client too: a statement the client gave up on must not go on
//! running on a pooled connection the relay uses next.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use uuid::Uuid;

use super::pooler::{Param, Pooler, Session};
use super::TableName;
use super::{Store, StoreError};

/// Bound on the cheap, index-served reads (gauges, `status`, one retention
/// batch of 1,000 rows): far above their normal milliseconds, well below
/// the gauge refresh interval times a few.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on the operator commands (`quarantine list`, `release --all`, a
/// `replay` of a wide window): they may touch many rows, but must still end.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(300);

/// Slack between the server-side statement timeout and the client's own,
/// so the server's cancellation (with its clear error) normally wins.
const CLIENT_SLACK: Duration = Duration::from_secs(2);

/// The backlog as the gauges and `status` report it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    /// Rows not yet published and not quarantined, due or backing off.
    pub unpublished: i64,
    /// Now minus the oldest such row's `created_at`, in seconds; 0 when none.
    pub oldest_unpublished_age_seconds: f64,
    /// Quarantined rows waiting for an operator.
    pub quarantined: i64,
    /// Aggregates whose oldest unpublished row has failed or is quarantined:
    /// held back under `OUTBOX_ORDERING=aggregate`.
    pub stuck_aggregates: i64,
}

/// One quarantined row, as `quarantine list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantinedRow {
    /// The event id.
    pub id: Uuid,
    /// Its event type.
    pub event_type: String,
    /// Attempts made before it was quarantined.
    pub attempt_count: i32,
    /// Why the last attempt failed, or why the sink rejected it.
    pub last_error: Option<String>,
    /// When it was quarantined.
    pub quarantined_at: DateTime<Utc>,
}

/// What one retention batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionBatch {
    /// This replica held the retention lock and deleted this many rows.
    Deleted(u64),
    /// Another replica holds the retention lock for this table right now.
    Busy,
}

/// The statements of this module, rendered for one table.
struct AdminStatements {
    backlog: String,
    published_since: String,
    list_quarantined: String,
    release_quarantined: String,
    release_all_quarantined: String,
    replay: String,
    delete_retained: String,
}

impl AdminStatements {
    // Rendering is a few string replacements; doing it per call keeps the
    // `Store` struct unchanged, and the statement cache keys on the text anyway.
    fn for_table(table: &TableName) -> Self {
        let quoted = table.quoted();
        let render = |sql: &str| sql.replace("{table}", &quoted);
        Self {
            backlog: render(include_str!("sql/backlog.sql")),
            published_since: render(include_str!("sql/published_since.sql")),
            list_quarantined: render(include_str!("sql/list_quarantined.sql")),
            release_quarantined: render(include_str!("sql/release_quarantined.sql")),
            release_all_quarantined: render(include_str!("sql/release_all_quarantined.sql")),
            replay: render(include_str!("sql/replay.sql")),
            delete_retained: render(include_str!("sql/delete_retained.sql")),
        }
    }
}

const SET_LOCAL_TIMEOUTS: &str = include_str!("sql/set_local_timeouts.sql");
const RETENTION_LOCK: &str = include_str!("sql/retention_lock.sql");

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Bounds `work` on the client side, a little after the server's own
/// statement timeout would have fired.
async fn within<T>(
    timeout: Duration,
    work: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let limit = timeout + CLIENT_SLACK;
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or(Err(StoreError::Timeout(limit)))
}

/// Starts a transaction whose statements the server cancels after `timeout`.
async fn begin(
    client: &mut deadpool_postgres::Object,
    pooler: Pooler,
    timeout: Duration,
) -> Result<deadpool_postgres::Transaction<'_>, StoreError> {
    let tx = client.transaction().await?;
    Session::transaction(pooler, &tx)
        .query_one(SET_LOCAL_TIMEOUTS, &[(&millis(timeout).to_string(), Type::TEXT)])
        .await?;
    Ok(tx)
}

impl Store {
    fn admin_sql(&self) -> AdminStatements {
        AdminStatements::for_table(&self.table)
    }

    /// The backlog gauges: one statement, each part served by a partial
    /// index (see `sql/backlog.sql`).
    pub async fn backlog(&self) -> Result<Backlog, StoreError> {
        let sql = self.admin_sql().backlog;
        within(READ_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin(&mut client, self.pooler, READ_TIMEOUT).await?;
            let row = Session::transaction(self.pooler, &tx)
                .query_one(&sql, &[])
                .await?;
            tx.commit().await?;
            Ok(Backlog {
                unpublished: row.get(0),
                oldest_unpublished_age_seconds: row.get(1),
                quarantined: row.get(2),
                stuck_aggregates: row.get(3),
            })
        })
        .await
    }

    /// Rows published within the last `window`.
    pub async fn published_within(&self, window: Duration) -> Result<i64, StoreError> {
        let sql = self.admin_sql().published_since;
        within(READ_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin(&mut client, self.pooler, READ_TIMEOUT).await?;
            let row = Session::transaction(self.pooler, &tx)
                .query_one(&sql, &[(&millis(window), Type::INT8)])
                .await?;
            tx.commit().await?;
            Ok(row.get(0))
        })
        .await
    }

    /// Every quarantined row, oldest quarantine first.
    pub async fn quarantined_rows(&self) -> Result<Vec<QuarantinedRow>, StoreError> {
        let sql = self.admin_sql().list_quarantined;
        within(ADMIN_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin(&mut client, self.pooler, ADMIN_TIMEOUT).await?;
            let rows = Session::transaction(self.pooler, &tx).query(&sql, &[]).await?;
            tx.commit().await?;
            Ok(rows
                .iter()
                .map(|row| QuarantinedRow {
                    id: row.get(0),
                    event_type: row.get(1),
                    attempt_count: row.get(2),
                    last_error: row.get(3),
                    quarantined_at: row.get(4),
                })
                .collect())
        })
        .await
    }

    /// Puts the given quarantined rows back in the queue (due now, attempts
    /// reset); returns the ids that were quarantined and now are not.
    pub async fn release_quarantined(&self, ids: &[Uuid]) -> Result<Vec<Uuid>, StoreError> {
        let sql = self.admin_sql().release_quarantined;
        within(ADMIN_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin(&mut client, self.pooler, ADMIN_TIMEOUT).await?;
            let rows = Session::transaction(self.pooler, &tx)
                .query(&sql, &[(&ids, Type::UUID_ARRAY)])
                .await?;
            tx.commit().await?;
            Ok(rows.iter().map(|row| row.get(0)).collect())
        })
        .await
    }

    /// Puts every quarantined row back in the queue; returns how many.
    pub async fn release_all_quarantined(&self) -> Result<u64, StoreError> {
        let sql = self.admin_sql().release_all_quarantined;
        self.admin_write(&sql, &[]).await
    }

    /// Re-queues rows published in `[since, until)` (`until` defaults to
    /// the database's now), optionally of one event type; returns how many.
    pub async fn replay(
        &self,
        since: DateTime<Utc>,
        until: Option<DateTime<Utc>>,
        event_type: Option<&str>,
    ) -> Result<u64, StoreError> {
        let sql = self.admin_sql().replay;
        self.admin_write(
            &sql,
            &[
                (&since, Type::TIMESTAMPTZ),
                (&until, Type::TIMESTAMPTZ),
                (&event_type, Type::TEXT),
            ],
        )
        .await
    }

    /// One retention batch: deletes up to `limit` rows published more than
    /// `older_than` ago, in its own transaction, if no other replica is
    /// running retention on this table at the same moment.
    pub async fn delete_retained(
        &self,
        older_than: Duration,
        limit: i64,
    ) -> Result<RetentionBatch, StoreError> {
        let sql = self.admin_sql().delete_retained;
        let table = self.table.quoted();
        within(READ_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin(&mut client, self.pooler, READ_TIMEOUT).await?;
            let session = Session::transaction(self.pooler, &tx);
            let locked: bool = session
                .query_one(RETENTION_LOCK, &[(&table, Type::TEXT)])
                .await?
                .get(0);
            if !locked {
                // Dropping the transaction rolls it back; nothing was done.
                return Ok(RetentionBatch::Busy);
            }
            let deleted = session
                .execute(&sql, &[(&millis(older_than), Type::INT8), (&limit, Type::INT8)])
                .await?;
            tx.commit().await?;
            Ok(RetentionBatch::Deleted(deleted))
        })
        .await
    }

    async fn admin_write(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        within(ADMIN_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin(&mut client, self.pooler, ADMIN_TIMEOUT).await?;
            let changed = Session::transaction(self.pooler, &tx)
                .execute(sql, params)
                .await?;
            tx.commit().await?;
            Ok(changed)
        })
        .await
    }
}
