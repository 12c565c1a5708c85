//! Deletes published rows once their `published_at` is older than
//! `OUTBOX_RETENTION`, in bounded batches.
//!
//! On a natively partitioned table (found at every pass, no setting) a
//! pass first keeps partitions created ahead of time and drops whole
//! partitions whose every row was published longer ago than retention
//! (`Store::maintain_partitions`): no row-by-row DELETE, no vacuum, no
//! WAL per row. A partition that still holds an unpublished or a
//! quarantined row is kept, whole, until that row is published, released
//! and published, or deleted by an operator; its published rows are not
//! deleted one by one meanwhile (that would be the cost partitioning
//! avoids, for a partition that is usually dropped soon after). Row-by-row
//! batches then run on the DEFAULT partition only, which holds the rows
//! no partition covered when they were written.
//!
//! Each tick runs a pass: batches of at most [`BATCH_SIZE`] rows, each one
//! short transaction, until a batch comes back short; then the task sleeps
//! until the next tick. No batch holds row locks for longer than deleting
//! a thousand rows takes, and no statement locks the table beyond the
//! ordinary row-exclusive lock any DELETE takes, so producers and relays
//! are never blocked behind it.
//!
//! Only one replica cleans a table at a time. Each batch tries a
//! transaction-level advisory lock (`store/sql/retention_lock.sql`) in its
//! own transaction rather than holding a session lock on a dedicated
//! connection: nothing has to keep a connection out of the pool for the
//! process lifetime, a replica that dies mid-pass releases the lock with
//! its transaction, and it works behind a transaction-pooling PgBouncer,
//! where session locks would be held by whichever client shares the server
//! connection. The cost is that replicas may take turns between batches,
//! which is harmless: the batches are disjoint by construction
//! (`FOR UPDATE SKIP LOCKED`), the lock only avoids wasted work.
//!
//! While the relay is catching up with a backlog (a claim came back full in
//! the last seconds: [`CatchUp`]), a pass gives way: after each batch it
//! pauses [`YIELD_FACTOR`] times as long as the batch took, so it takes at
//! most a quarter of one connection's time from the drain. Deleting old
//! rows can wait; publishing new ones cannot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::Outage;
use crate::metrics::SourceMetrics;
use crate::relay::CatchUp;
use crate::settings::{parse_duration, var, ConfigError};
use crate::store::{PartitionPass, RetentionBatch, Store, StoreError};

/// Settings of retention.
#[derive(Debug, Clone, Args)]
pub struct RetentionSettings {
    /// Published rows older than this are deleted; `0` keeps them.
    #[arg(long, env = var::RETENTION, default_value = "7d")]
    pub retention: String,
}

impl RetentionSettings {
    /// Validated retention: `None` keeps published rows.
    pub fn validate(&self) -> Result<Option<Duration>, ConfigError> {
        let retention = parse_duration(&self.retention).map_err(|e| ConfigError::new(var::RETENTION, e))?;
        Ok((!retention.is_zero()).then_some(retention))
    }
}

/// Rows deleted per statement: small enough that a batch takes
/// milliseconds and its WAL is modest, large enough that a day of traffic
/// goes in a few hundred batches.
pub const BATCH_SIZE: i64 = 1_000;

/// Time between passes. Retention is measured in days, so a minute of
/// delay is invisible, while a pass on a table with nothing to delete is a
/// single index probe.
pub const INTERVAL: Duration = Duration::from_secs(60);

/// While the relay catches up, a pass pauses this many times as long as
/// each batch took.
pub const YIELD_FACTOR: u32 = 3;

/// The pause after a batch that took `took`.
fn pause_after(took: Duration, catching_up: bool) -> Duration {
    if catching_up {
        took * YIELD_FACTOR
    } else {
        Duration::ZERO
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pass {
    /// Rows deleted by this replica.
    pub deleted: u64,
    /// Batches run (including the last, short one).
    pub batches: u64,
    /// Whether the pass stopped because another replica holds the lock.
    pub busy: bool,
    /// Time spent giving way to the relay.
    pub paused: Duration,
}

/// Deletes rows published more than `retention` ago, `batch_size` at a
/// time, until a batch comes back short, another replica turns out to be
/// cleaning the table, or `shutdown` is cancelled. Counts every committed
/// batch in `outbox_retention_deleted_total` as it goes, so a pass cut short
/// by an error still reports what it did. Gives way to the relay while
/// `catch_up` says it is catching up.
pub async fn run_pass(
    store: &Store,
    retention: Duration,
    batch_size: i64,
    metrics: &SourceMetrics,
    catch_up: &CatchUp,
    shutdown: &CancellationToken,
) -> Result<Pass, StoreError> {
    run_pass_in(store, None, retention, batch_size, metrics, catch_up, shutdown).await
}

/// [`run_pass`] in one partition (`Some`, as [`Store::partitions`] names
/// it) or the whole table.
pub async fn run_pass_in(
    store: &Store,
    partition: Option<&str>,
    retention: Duration,
    batch_size: i64,
    metrics: &SourceMetrics,
    catch_up: &CatchUp,
    shutdown: &CancellationToken,
) -> Result<Pass, StoreError> {
    let mut pass = Pass::default();
    let mut pause = Duration::ZERO;
    while !shutdown.is_cancelled() {
        if !pause.is_zero() {
            pass.paused += pause;
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        pass.batches += 1;
        let started = Instant::now();
        let batch = store
            .delete_retained_from(partition, retention, batch_size)
            .await?;
        pause = pause_after(started.elapsed(), catch_up.catching_up());
        match batch {
            RetentionBatch::Busy => {
                pass.busy = true;
                break;
            }
            RetentionBatch::Deleted(deleted) => {
                pass.deleted += deleted;
                metrics.retention_deleted_total.inc_by(deleted);
                if i64::try_from(deleted).unwrap_or(i64::MAX) < batch_size {
                    break;
                }
            }
        }
    }
    Ok(pass)
}

/// What one tick does on a partitioned table: partition upkeep, then
/// row-by-row retention in the DEFAULT partition; `None` on a plain table.
pub async fn run_partitioned_pass(
    store: &Store,
    retention: Option<Duration>,
    metrics: &SourceMetrics,
    catch_up: &CatchUp,
    shutdown: &CancellationToken,
) -> Result<Option<(PartitionPass, Pass)>, StoreError> {
    if !store.is_partitioned().await? {
        return Ok(None);
    }
    let partitions = store.maintain_partitions(None, retention).await?;
    metrics
        .retention_partitions_dropped_total
        .inc_by(partitions.dropped.len() as u64);
    if !partitions.created.is_empty() || !partitions.dropped.is_empty() {
        info!(
            created = ?partitions.created,
            dropped = ?partitions.dropped,
            kept_with_unpublished_rows = ?partitions.kept,
            moved_from_default = partitions.moved,
            "partitions maintained"
        );
    }
    let mut rows = Pass::default();
    if let Some(retention) = retention {
        let default = store.partitions().await?.into_iter().find(|p| p.is_default);
        if let Some(default) = default {
            rows = run_pass_in(
                store,
                Some(&default.qualified),
                retention,
                BATCH_SIZE,
                metrics,
                catch_up,
                shutdown,
            )
            .await?;
        }
    }
    Ok(Some((partitions, rows)))
}

/// Runs a pass at once and then every [`INTERVAL`] until `shutdown`.
/// With retention disabled (`None`) it returns at once on a plain table,
/// and on a partitioned one only keeps partitions created ahead.
pub async fn run(
    store: Arc<Store>,
    retention: Option<Duration>,
    metrics: SourceMetrics,
    catch_up: Arc<CatchUp>,
    shutdown: CancellationToken,
) {
    match retention {
        Some(retention) => info!(retention_secs = retention.as_secs(), "retention enabled"),
        None => info!("retention disabled (OUTBOX_RETENTION=0): published rows are kept"),
    }
    let mut outage = Outage::new("retention");
    let mut ticker = tokio::time::interval(INTERVAL);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let started = Instant::now();
        let partitioned = run_partitioned_pass(&store, retention, &metrics, &catch_up, &shutdown).await;
        let pass = match (partitioned, retention) {
            (Ok(Some((_, rows))), _) => Ok(rows),
            (Ok(None), None) => {
                // A plain table and nothing to delete: nothing to do, ever.
                outage.succeeded();
                return;
            }
            // A batch is one short transaction, so letting the one in
            // flight finish on shutdown costs at most a few milliseconds.
            (Ok(None), Some(retention)) => {
                run_pass(&store, retention, BATCH_SIZE, &metrics, &catch_up, &shutdown).await
            }
            (Err(error), _) => Err(error),
        };
        match pass {
            Ok(pass) => {
                outage.succeeded();
                if pass.deleted > 0 {
                    info!(
                        deleted = pass.deleted,
                        batches = pass.batches,
                        paused_for_backlog_ms = pass.paused.as_millis() as u64,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "retention deleted published rows"
                    );
                } else if pass.busy {
                    debug!("retention skipped: another replica is cleaning the table");
                }
            }
            Err(error) => outage.failed(&error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_pauses_only_while_the_relay_catches_up() {
        let took = Duration::from_millis(20);
        assert_eq!(pause_after(took, false), Duration::ZERO);
        assert_eq!(pause_after(took, true), Duration::from_millis(60));
    }

    #[test]
    fn retention_is_a_duration_and_zero_keeps_rows() {
        let retention = |raw: &str| {
            RetentionSettings {
                retention: raw.into(),
            }
            .validate()
        };
        assert_eq!(retention("7d"), Ok(Some(Duration::from_secs(7 * 86_400))));
        assert_eq!(retention("0"), Ok(None));
        assert_eq!(retention("a week").unwrap_err().variable, "OUTBOX_RETENTION");
    }
}
