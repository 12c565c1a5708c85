//! The queries of the operator commands and retention: `status`'s extras,
//! `quarantine list/release`, `replay`, and the retention batches. The
//! backlog gauges are in `backlog.rs`.
//!
//! Each runs in a short transaction that first bounds its statements on the
//! server (`sql/set_local_timeouts.sql`), and the whole exchange is bounded
//! on the client too: a statement the client gave up on must not go on
//! running on a pooled connection the relay uses next.

use std::ops::ControlFlow;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
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

/// Where a page of `quarantine list` starts: after this row, in
/// `(quarantined_at, id)` order. Written `<quarantined_at>,<id>`, the
/// timestamp in RFC 3339 with microseconds (PostgreSQL's precision, so the
/// key round-trips exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuarantineCursor {
    /// The last row's `quarantined_at`.
    pub quarantined_at: DateTime<Utc>,
    /// The last row's id.
    pub id: Uuid,
}

impl QuarantineCursor {
    /// The cursor that continues after `row`.
    pub fn after(row: &QuarantinedRow) -> Self {
        Self {
            quarantined_at: row.quarantined_at,
            id: row.id,
        }
    }
}

impl std::fmt::Display for QuarantineCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self
            .quarantined_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        write!(f, "{at},{}", self.id)
    }
}

impl std::str::FromStr for QuarantineCursor {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let shape = "expected <quarantined_at>,<id> as printed for the next page";
        let (at, id) = raw.trim().rsplit_once(',').ok_or_else(|| shape.to_owned())?;
        let quarantined_at = DateTime::parse_from_rfc3339(at)
            .map_err(|e| format!("'{at}' is not an RFC 3339 time ({e}); {shape}"))?
            .with_timezone(&Utc);
        let id = id
            .parse()
            .map_err(|e| format!("'{id}' is not a UUID ({e}); {shape}"))?;
        Ok(Self { quarantined_at, id })
    }
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
pub(super) struct AdminStatements {
    pub(super) backlog: String,
    pub(super) gauges_read: String,
    pub(super) gauges_store: String,
    pub(super) published_since: String,
    pub(super) list_quarantined: String,
    pub(super) release_quarantined: String,
    pub(super) release_all_quarantined: String,
    pub(super) replay: String,
    pub(super) delete_retained: String,
}

impl AdminStatements {
    // Rendering is a few string replacements; doing it per call keeps the
    // `Store` struct unchanged, and the statement cache keys on the text anyway.
    fn for_table(table: &TableName) -> Self {
        let quoted = table.quoted();
        let gauges = table.beside(super::migrate::GAUGES_TABLE);
        let render = |sql: &str| {
            super::casts::render(&sql.replace("{table}", &quoted).replace("{gauges_table}", &gauges))
        };
        Self {
            backlog: render(include_str!("sql/backlog.sql")),
            gauges_read: render(include_str!("sql/gauges_read.sql")),
            gauges_store: render(include_str!("sql/gauges_store.sql")),
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
pub(super) const GAUGES_LOCK: &str = include_str!("sql/gauges_lock.sql");
pub(super) const SET_LOCAL_INDEX_SCANS: &str = include_str!("sql/set_local_index_scans.sql");

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Bounds `work` on the client side, a little after the server's own
/// statement timeout would have fired.
pub(super) async fn within<T>(
    timeout: Duration,
    work: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let limit = timeout + CLIENT_SLACK;
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or(Err(StoreError::Timeout(limit)))
}

/// Starts a transaction whose statements the server cancels after `timeout`.
pub(super) async fn begin(
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
    pub(super) fn admin_sql(&self) -> AdminStatements {
        AdminStatements::for_table(&self.table)
    }

    /// Unpublished rows per route (index 0: rows no route matches, then
    /// each route of `patterns`, its `LIKE` pattern, in order), counted
    /// among the [`super::COUNT_CAP`] oldest; `true` when that was all of
    /// them (exact). The event type is compared as text, as the claim's
    /// route filter compares it (an enum column has no `LIKE`).
    pub async fn backlog_by_route(&self, patterns: &[String]) -> Result<(Vec<i64>, bool), StoreError> {
        let arms: String = (1..=patterns.len())
            .map(|route| format!(" WHEN event_type::text LIKE ($2::text[])[{route}] THEN {route}"))
            .collect();
        let sql = super::casts::render(
            &include_str!("sql/backlog_by_route.sql")
                .replace("{table}", &self.table.quoted())
                .replace("{route}", &format!("CASE{arms} ELSE 0 END")),
        );
        within(READ_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin(&mut client, self.pooler, READ_TIMEOUT).await?;
            let rows = Session::transaction(self.pooler, &tx)
                .query(
                    &sql,
                    &[(&super::COUNT_CAP, Type::INT8), (&patterns, Type::TEXT_ARRAY)],
                )
                .await?;
            tx.commit().await?;
            let mut counts = vec![0; patterns.len() + 1];
            for row in rows {
                let route: i32 = row.try_get(0)?;
                if let Some(count) = usize::try_from(route)
                    .ok()
                    .and_then(|route| counts.get_mut(route))
                {
                    *count = row.try_get(1)?;
                }
            }
            let exact = counts.iter().sum::<i64>() < super::COUNT_CAP;
            Ok((counts, exact))
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
            Ok(row.try_get(0)?)
        })
        .await
    }

    /// Up to `limit` quarantined rows after `after` (from the first when
    /// `None`), oldest quarantine first, handed to `each` as they arrive
    /// from the server, so a long page is never held in memory. `each`
    /// may stop taking rows (`ControlFlow::Break`, e.g. when the reader went
    /// away). Returns how many rows `each` took.
    pub async fn quarantined_rows(
        &self,
        after: Option<QuarantineCursor>,
        limit: i64,
        mut each: impl FnMut(QuarantinedRow) -> ControlFlow<()>,
    ) -> Result<u64, StoreError> {
        let sql = self.admin_sql().list_quarantined;
        let at = after.map(|cursor| cursor.quarantined_at);
        let id = after.map(|cursor| cursor.id);
        within(ADMIN_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin(&mut client, self.pooler, ADMIN_TIMEOUT).await?;
            let mut rows = Box::pin(
                Session::transaction(self.pooler, &tx)
                    .query_stream(
                        &sql,
                        &[(&at, Type::TIMESTAMPTZ), (&id, Type::UUID), (&limit, Type::INT8)],
                    )
                    .await?,
            );
            let mut taken = 0;
            let mut stopped = false;
            let mut unreadable = None;
            while let Some(row) = rows.try_next().await? {
                if stopped {
                    // The rest of the page is read and discarded. Dropping
                    // a half-read stream and committing left the commit
                    // unanswered until the timeout (seen with `| head`),
                    // and the page is bounded by `limit` anyway.
                    continue;
                }
                match quarantined_row(&row) {
                    Ok(row) => {
                        taken += 1;
                        stopped = each(row).is_break();
                    }
                    Err(e) => {
                        unreadable = Some(e);
                        stopped = true;
                    }
                }
            }
            drop(rows);
            tx.commit().await?;
            match unreadable {
                Some(e) => Err(e.into()),
                None => Ok(taken),
            }
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
            Ok(rows.iter().map(|row| row.try_get(0)).collect::<Result<_, _>>()?)
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
        self.delete_retained_from(None, older_than, limit).await
    }

    /// [`Store::delete_retained`] in one partition of a partitioned table
    /// (`partition` as [`Store::partitions`] names it), or in the whole
    /// table (`None`). The retention lock is the table's either way.
    pub async fn delete_retained_from(
        &self,
        partition: Option<&str>,
        older_than: Duration,
        limit: i64,
    ) -> Result<RetentionBatch, StoreError> {
        let sql = match partition {
            None => self.admin_sql().delete_retained,
            Some(partition) => {
                super::casts::render(&include_str!("sql/delete_retained.sql").replace("{table}", partition))
            }
        };
        let table = self.table.quoted();
        let batch = within(READ_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin(&mut client, self.pooler, READ_TIMEOUT).await?;
            let session = Session::transaction(self.pooler, &tx);
            let locked: bool = session
                .query_one(RETENTION_LOCK, &[(&table, Type::TEXT)])
                .await?
                .try_get(0)?;
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
        .await;
        self.note_write_result(&batch);
        batch
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

/// One row of `sql/list_quarantined.sql`. The statement casts each column
/// to the type read here, so every supported table shape decodes; an
/// error, not a panic, should a column still not.
fn quarantined_row(row: &tokio_postgres::Row) -> Result<QuarantinedRow, tokio_postgres::Error> {
    Ok(QuarantinedRow {
        id: row.try_get(0)?,
        event_type: row.try_get(1)?,
        attempt_count: row.try_get(2)?,
        last_error: row.try_get(3)?,
        quarantined_at: row.try_get(4)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_admin_statement_is_fully_rendered() {
        let table = TableName::parse("app.outbox_event").expect("valid name");
        let sql = AdminStatements::for_table(&table);
        let all = [
            &sql.backlog,
            &sql.gauges_read,
            &sql.gauges_store,
            &sql.published_since,
            &sql.list_quarantined,
            &sql.release_quarantined,
            &sql.release_all_quarantined,
            &sql.replay,
            &sql.delete_retained,
        ];
        for statement in all {
            assert!(!statement.contains('{'), "a placeholder is left in:\n{statement}");
        }
        // The list reads the columns as the claim does.
        assert!(sql.list_quarantined.contains(
            "SELECT id, event_type::text, attempt_count::int4, last_error::text, \
             quarantined_at::timestamptz"
        ));
        assert!(sql.replay.contains("event_type::text = $3::text"));
    }

    #[test]
    fn a_cursor_round_trips_at_microseconds() {
        let raw = "2026-11-30T00:30:01.103735Z,97ab5326-d7fc-4f02-925e-40d477063bdc";
        let cursor: QuarantineCursor = raw.parse().unwrap();
        assert_eq!(cursor.to_string(), raw);
        assert_eq!(cursor.quarantined_at.timestamp_subsec_micros(), 103_735);
        let offset: QuarantineCursor = "2026-11-30T01:30:01+01:00,97ab5326-d7fc-4f02-925e-40d477063bdc"
            .parse()
            .unwrap();
        assert_eq!(
            offset.to_string(),
            "2026-11-30T00:30:01.000000Z,97ab5326-d7fc-4f02-925e-40d477063bdc"
        );
        for bad in [
            "",
            "2026-11-30T00:30:01Z",
            "97ab5326-d7fc-4f02-925e-40d477063bdc",
            "yesterday,97ab5326-d7fc-4f02-925e-40d477063bdc",
            "2026-11-30T00:30:01Z,nope",
        ] {
            assert!(bad.parse::<QuarantineCursor>().is_err(), "{bad:?} accepted");
        }
    }
}
