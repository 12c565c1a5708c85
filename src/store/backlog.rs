//! The backlog gauges and `status`: the oldest age, exact on every
//! refresh, and the counts, bounded, computed by one replica at a time and
//! read by the others.

use std::time::Duration;

use tokio_postgres::types::Type;

use super::admin::{begin, millis, within, GAUGES_LOCK, READ_TIMEOUT, SET_LOCAL_INDEX_SCANS};
use super::pooler::{Pooler, Session};
use super::{Store, StoreError};

/// Counting stops after this many index entries: an index-only scan of
/// this length takes tens of milliseconds, where a full count of a
/// 10-million-row backlog takes seconds and would soon exceed
/// [`READ_TIMEOUT`]. Past it the planner's estimate is reported.
pub const COUNT_CAP: i64 = 100_000;

/// The stuck-aggregate count looks at this many of the oldest pending rows
/// and as many of the oldest quarantined rows (a heap read and an index
/// probe for each candidate).
pub const STUCK_SCAN: i64 = 10_000;

/// The backlog as the gauges and `status` report it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    /// Now minus the oldest unpublished, unquarantined row's `created_at`,
    /// in seconds; 0 when none. Always exact.
    pub oldest_unpublished_age_seconds: f64,
    /// The counts, each exact or bounded.
    pub counts: BacklogCounts,
}

/// The backlog's counts. Each is exact when its flag says so; otherwise
/// it is bounded (see `sql/backlog.sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BacklogCounts {
    /// Rows not yet published and not quarantined, due or backing off.
    pub unpublished: i64,
    /// False past [`COUNT_CAP`]: then PostgreSQL's estimate, at least the cap.
    pub unpublished_exact: bool,
    /// Quarantined rows waiting for an operator.
    pub quarantined: i64,
    /// False past [`COUNT_CAP`]: then PostgreSQL's estimate, at least the cap.
    pub quarantined_exact: bool,
    /// Aggregates whose oldest unpublished row has failed or is quarantined:
    /// held back under `OUTBOX_ORDERING=aggregate`.
    pub stuck_aggregates: i64,
    /// False when the scan stopped at [`STUCK_SCAN`] rows: then a lower bound.
    pub stuck_aggregates_exact: bool,
}

/// One gauge refresh, as [`Store::refresh_gauges`] read or computed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GaugeReading {
    /// Exact, computed by this refresh whoever computed the counts.
    pub oldest_unpublished_age_seconds: f64,
    /// The counts and the Unix time (database clock) they were computed at;
    /// `None` while no replica has stored any yet.
    pub counts: Option<(BacklogCounts, f64)>,
    /// Whether this refresh computed the counts (held the gauges lock and
    /// found them older than asked), rather than reading stored ones.
    pub computed: bool,
}

/// A count that stopped at `cap`: exact below it, else the estimate, and
/// never less than what was counted.
fn bounded(counted: i64, cap: i64, estimate: Option<f64>) -> (i64, bool) {
    if counted < cap {
        return (counted, true);
    }
    // reltuples is -1 (or 0 on old servers) before the first VACUUM or
    // ANALYZE; the saturating float-to-int conversion keeps any value sane.
    let estimate = estimate.map_or(0, |value| value.round() as i64);
    (counted.max(estimate), false)
}

/// Like [`begin`], for the backlog statements: index scans only (see
/// `sql/set_local_index_scans.sql`).
async fn begin_backlog(
    client: &mut deadpool_postgres::Object,
    pooler: Pooler,
) -> Result<deadpool_postgres::Transaction<'_>, StoreError> {
    let tx = begin(client, pooler, READ_TIMEOUT).await?;
    Session::transaction(pooler, &tx)
        .query_one(SET_LOCAL_INDEX_SCANS, &[])
        .await?;
    Ok(tx)
}

impl Store {
    /// The backlog, computed now at a bounded cost: one statement, each part
    /// served by a partial index (see `sql/backlog.sql`).
    pub async fn backlog(&self) -> Result<Backlog, StoreError> {
        let sql = self.admin_sql().backlog;
        within(READ_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin_backlog(&mut client, self.pooler).await?;
            let backlog = self
                .compute_backlog(&Session::transaction(self.pooler, &tx), &sql)
                .await?;
            tx.commit().await?;
            Ok(backlog)
        })
        .await
    }

    async fn compute_backlog(&self, session: &Session<'_, '_>, sql: &str) -> Result<Backlog, StoreError> {
        let pending_index = self.table.qualified_derived("pending_idx");
        let quarantined_index = self.table.qualified_derived("quarantined_idx");
        let row = session
            .query_one(
                sql,
                &[
                    (&COUNT_CAP, Type::INT8),
                    (&STUCK_SCAN, Type::INT8),
                    (&pending_index, Type::TEXT),
                    (&quarantined_index, Type::TEXT),
                ],
            )
            .await?;
        let (unpublished, unpublished_exact) = bounded(row.try_get(1)?, COUNT_CAP, row.try_get(2)?);
        let (quarantined, quarantined_exact) = bounded(row.try_get(3)?, COUNT_CAP, row.try_get(4)?);
        let (pending_scanned, quarantined_scanned): (i64, i64) = (row.try_get(5)?, row.try_get(7)?);
        Ok(Backlog {
            oldest_unpublished_age_seconds: row.try_get(0)?,
            counts: BacklogCounts {
                unpublished,
                unpublished_exact,
                quarantined,
                quarantined_exact,
                stuck_aggregates: row.try_get(6)?,
                stuck_aggregates_exact: pending_scanned < STUCK_SCAN && quarantined_scanned < STUCK_SCAN,
            },
        })
    }

    /// One gauge refresh: the oldest age, computed here, and the counts,
    /// computed here only if this replica holds the table's gauges lock and
    /// the stored counts are older than `max_age` (or missing); otherwise
    /// the stored ones. So however many replicas refresh, the counting runs
    /// once per `max_age` at most, and never twice at the same time.
    pub async fn refresh_gauges(&self, max_age: Duration) -> Result<GaugeReading, StoreError> {
        let sql = self.admin_sql();
        let table = self.table.quoted();
        let key = self.table.name().to_owned();
        let reading = within(READ_TIMEOUT, async {
            let mut client = self.pool.get().await?;
            let tx = begin_backlog(&mut client, self.pooler).await?;
            let session = Session::transaction(self.pooler, &tx);
            // The lock before the read: the read's snapshot then includes
            // whatever the previous holder stored and committed.
            let locked: bool = session
                .query_one(GAUGES_LOCK, &[(&table, Type::TEXT)])
                .await?
                .try_get(0)?;
            let row = session
                .query_one(
                    &sql.gauges_read,
                    &[(&key, Type::TEXT), (&millis(max_age), Type::INT8)],
                )
                .await?;
            let oldest_unpublished_age_seconds: f64 = row.try_get(0)?;
            let stored = match row.try_get::<_, Option<i64>>(1)? {
                None => None,
                Some(unpublished) => {
                    let counts = BacklogCounts {
                        unpublished,
                        unpublished_exact: row.try_get(2)?,
                        quarantined: row.try_get(3)?,
                        quarantined_exact: row.try_get(4)?,
                        stuck_aggregates: row.try_get(5)?,
                        stuck_aggregates_exact: row.try_get(6)?,
                    };
                    Some((counts, row.try_get::<_, f64>(7)?))
                }
            };
            let fresh = row.try_get::<_, Option<bool>>(8)?.unwrap_or(false);
            if !locked || fresh {
                tx.commit().await?;
                return Ok(GaugeReading {
                    oldest_unpublished_age_seconds,
                    counts: stored,
                    computed: false,
                });
            }
            let backlog = self.compute_backlog(&session, &sql.backlog).await?;
            let c = backlog.counts;
            let refreshed_at: f64 = session
                .query_one(
                    &sql.gauges_store,
                    &[
                        (&key, Type::TEXT),
                        (&c.unpublished, Type::INT8),
                        (&c.unpublished_exact, Type::BOOL),
                        (&c.quarantined, Type::INT8),
                        (&c.quarantined_exact, Type::BOOL),
                        (&c.stuck_aggregates, Type::INT8),
                        (&c.stuck_aggregates_exact, Type::BOOL),
                    ],
                )
                .await?
                .try_get(0)?;
            tx.commit().await?;
            Ok(GaugeReading {
                oldest_unpublished_age_seconds: backlog.oldest_unpublished_age_seconds,
                counts: Some((c, refreshed_at)),
                computed: true,
            })
        })
        .await;
        self.note_write_result(&reading);
        reading
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_exact_below_the_cap_and_estimated_at_it() {
        assert_eq!(bounded(0, 100, Some(-1.0)), (0, true));
        assert_eq!(
            bounded(99, 100, Some(5_000.0)),
            (99, true),
            "the estimate is ignored below the cap"
        );
        assert_eq!(bounded(100, 100, Some(5_000.4)), (5_000, false));
        assert_eq!(
            bounded(100, 100, Some(-1.0)),
            (100, false),
            "never analyzed: at least the cap"
        );
        assert_eq!(
            bounded(100, 100, Some(40.0)),
            (100, false),
            "a stale estimate never lowers the count"
        );
        assert_eq!(bounded(100, 100, None), (100, false), "no such index");
    }
}
