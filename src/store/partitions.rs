//! A natively partitioned outbox table (range on `created_at`): finding
//! out whether the table is one, creating partitions ahead of time and
//! dropping those whose every row is published and past retention.
//!
//! Every statement of the relay works on the parent as on a plain table;
//! only the DDL here names partitions. Partition names come from the
//! catalog quoted by PostgreSQL (`format('%I.%I')`), or are derived from
//! the validated table name and digits; bounds are rendered by the relay
//! from typed timestamps. DDL takes no parameters, so these are the only
//! values spliced into SQL text here.

use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use tracing::{debug, info};

use super::admin::{begin, millis, within, READ_TIMEOUT};
use super::pooler::Session;
use super::{Store, StoreError, TableName};

/// The width of the partitions `migrate --partitioned` creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granularity {
    /// One partition per UTC day.
    Daily,
    /// One partition per UTC hour.
    Hourly,
}

impl Granularity {
    /// The width of one partition.
    pub fn width(self) -> TimeDelta {
        match self {
            Granularity::Daily => TimeDelta::days(1),
            Granularity::Hourly => TimeDelta::hours(1),
        }
    }
}

/// How many partitions past the current one are kept created: three days
/// of daily partitions, twelve hours of hourly ones. Retention runs every
/// minute, so this is how long every relay may be down before new rows
/// start landing in the DEFAULT partition, which still takes them (and
/// from which they are moved once their partition is created). More would
/// only add partitions that every statement plans for.
pub fn ahead(width: TimeDelta) -> i32 {
    if width >= TimeDelta::days(1) {
        3
    } else {
        12
    }
}

/// The longest a partition's ATTACH or DETACH waits for its lock, which
/// is also the longest a producer can queue behind it: the DETACH takes
/// ACCESS EXCLUSIVE on the parent, and every INSERT that arrives while it
/// waits queues behind it. A lock not had in time is tried again a few
/// times, then at the next pass.
pub const LOCK_TIMEOUT: Duration = Duration::from_millis(100);

/// Tries per partition and pass when the lock is not had in time.
const LOCK_TRIES: u32 = 5;

/// One partition of the table, as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Schema-qualified name, quoted by PostgreSQL.
    pub qualified: String,
    /// The DEFAULT partition.
    pub is_default: bool,
    /// The range `[lower, upper)`; `None` for DEFAULT (or an unbounded
    /// side, left alone).
    pub range: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

/// What one pass of partition upkeep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionPass {
    /// Partitions created ahead of time.
    pub created: Vec<String>,
    /// Partitions dropped: every row published longer ago than retention.
    pub dropped: Vec<String>,
    /// Partitions whose range ended longer ago than retention, kept because
    /// a row in them is unpublished or quarantined, or was published within
    /// retention.
    pub kept: Vec<String>,
    /// Rows moved from DEFAULT into a partition created for them.
    pub moved: u64,
    /// Another replica holds the retention lock.
    pub busy: bool,
}

/// Whether `table` is natively partitioned.
pub async fn is_partitioned(client: &impl GenericClient, table: &TableName) -> Result<bool, StoreError> {
    Ok(client
        .query_typed_one(
            include_str!("sql/is_partitioned.sql"),
            &[(&table.quoted(), Type::TEXT)],
        )
        .await?
        .get(0))
}

/// The partitions of `table`, the DEFAULT one first, then by range.
pub async fn partitions(
    client: &impl GenericClient,
    table: &TableName,
) -> Result<Vec<Partition>, StoreError> {
    let rows = client
        .query_typed(
            include_str!("sql/partitions.sql"),
            &[(&table.quoted(), Type::TEXT)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let lower: Option<DateTime<Utc>> = row.get("lower_bound");
            let upper: Option<DateTime<Utc>> = row.get("upper_bound");
            Partition {
                qualified: row.get("qualified"),
                is_default: row.get("is_default"),
                range: lower.zip(upper),
            }
        })
        .collect())
}

/// The quoted name of the DEFAULT partition `migrate --partitioned` creates.
pub fn default_partition(table: &TableName) -> String {
    qualified(table, "default")
}

/// The partition of `table` starting at `lower`: `_pYYYYMMDD` for daily
/// partitions, `_pYYYYMMDDHH` for hourly ones, down to the minute for
/// anything else.
pub fn partition_name(table: &TableName, lower: DateTime<Utc>, width: TimeDelta) -> String {
    let stamp = if width >= TimeDelta::days(1) && lower.duration_trunc(TimeDelta::days(1)).ok() == Some(lower)
    {
        lower.format("p%Y%m%d")
    } else if lower.duration_trunc(TimeDelta::hours(1)).ok() == Some(lower) {
        lower.format("p%Y%m%d%H")
    } else {
        lower.format("p%Y%m%d%H%M")
    };
    qualified(table, &stamp.to_string())
}

fn qualified(table: &TableName, suffix: &str) -> String {
    let name = table.derived(suffix);
    match table.schema() {
        Some(schema) => format!("\"{schema}\".{name}"),
        None => name,
    }
}

/// A timestamp as a SQL literal, in UTC.
fn literal(at: DateTime<Utc>) -> String {
    format!("'{}'", at.format("%Y-%m-%d %H:%M:%S%.6f+00"))
}

/// The range partitions that should exist from now on: the one holding
/// `now` and [`ahead`] more, each `width` wide, aligned to `width` from
/// the epoch (so daily partitions start at midnight UTC).
pub fn wanted_ranges(now: DateTime<Utc>, width: TimeDelta) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    let Ok(first) = now.duration_trunc(width) else {
        return Vec::new();
    };
    (0..=ahead(width))
        .map(|step| {
            let lower = first + width * step;
            (lower, lower + width)
        })
        .collect()
}

/// The width of the table's partitions, read from its newest range
/// partition: the relay keeps what `migrate` (or the operator) chose.
fn width_of(partitions: &[Partition]) -> Option<TimeDelta> {
    partitions
        .iter()
        .filter_map(|partition| partition.range)
        .max_by_key(|(lower, _)| *lower)
        .map(|(lower, upper)| upper - lower)
        .filter(|width| *width > TimeDelta::zero())
}

/// Creates and attaches one partition (sql/partition_attach.sql) in the
/// caller's transaction; returns how many rows it took over from DEFAULT.
async fn attach_partition(
    tx: &tokio_postgres::Transaction<'_>,
    table: &TableName,
    name: &str,
    default: &str,
    (lower, upper): (DateTime<Utc>, DateTime<Utc>),
) -> Result<u64, StoreError> {
    let sql = include_str!("sql/partition_attach.sql")
        .replace("{partition}", name)
        .replace("{default_partition}", default)
        .replace("{table}", &table.quoted())
        .replace("{lower}", &literal(lower))
        .replace("{upper}", &literal(upper));
    // Counted before the move, for the log: rows in DEFAULT mean that
    // partitions were not created in time.
    let moved: i64 = tx
        .query_typed_one(
            &format!("SELECT count(*) FROM {default} WHERE created_at >= $1 AND created_at < $2"),
            &[(&lower, Type::TIMESTAMPTZ), (&upper, Type::TIMESTAMPTZ)],
        )
        .await?
        .get(0);
    tx.batch_execute(&sql).await?;
    info!(partition = %name, from = %lower, to = %upper, moved_from_default = moved, "partition created");
    Ok(u64::try_from(moved).unwrap_or(0))
}

/// `migrate --partitioned`: the partitions [`wanted_ranges`] wants and the
/// table lacks, each in a transaction of its own that waits for the
/// retention lock (a relay may be creating them at the same moment);
/// returns their names.
pub async fn create_ahead(
    client: &mut tokio_postgres::Client,
    table: &TableName,
    width: TimeDelta,
) -> Result<Vec<String>, StoreError> {
    let existing = partitions(&*client, table).await?;
    let Some(default) = existing
        .iter()
        .find(|p| p.is_default)
        .map(|p| p.qualified.clone())
    else {
        return Ok(Vec::new());
    };
    let mut created = Vec::new();
    for range in wanted_ranges(Utc::now(), width) {
        if existing
            .iter()
            .filter_map(|p| p.range)
            .any(|(from, to)| from < range.1 && range.0 < to)
        {
            continue;
        }
        let name = partition_name(table, range.0, width);
        let tx = client.transaction().await?;
        tx.query_typed(
            "SELECT pg_advisory_xact_lock(hashtext('outbox-relay retention'), $1::text::regclass::oid::int4)",
            &[(&table.quoted(), Type::TEXT)],
        )
        .await?;
        attach_partition(&tx, table, &name, &default, range).await?;
        tx.commit().await?;
        created.push(name);
    }
    Ok(created)
}

/// Whether `error` is a lock wait that `lock_timeout` cut short.
fn lock_not_available(error: &StoreError) -> bool {
    matches!(error, StoreError::Query(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE))
}

impl Store {
    /// Whether the outbox table is natively partitioned.
    pub async fn is_partitioned(&self) -> Result<bool, StoreError> {
        let client = self.client().await?;
        within(READ_TIMEOUT, is_partitioned(&**client, self.table())).await
    }

    /// The partitions of the outbox table.
    pub async fn partitions(&self) -> Result<Vec<Partition>, StoreError> {
        let client = self.client().await?;
        within(READ_TIMEOUT, partitions(&**client, self.table())).await
    }

    /// One pass of partition upkeep on a partitioned table: creates the
    /// partitions [`wanted_ranges`] lacks (of `width`, or of the width the
    /// table's partitions have), then, with a `retention`, drops the
    /// partitions whose every row was published longer ago than that.
    /// Each partition is one short transaction under the retention lock
    /// (one replica at a time) and a [`LOCK_TIMEOUT`].
    pub async fn maintain_partitions(
        &self,
        width: Option<TimeDelta>,
        retention: Option<Duration>,
    ) -> Result<PartitionPass, StoreError> {
        let mut pass = PartitionPass::default();
        let existing = self.partitions().await?;
        let Some(default) = existing
            .iter()
            .find(|p| p.is_default)
            .map(|p| p.qualified.clone())
        else {
            // Without a DEFAULT partition the attach has nowhere to move
            // early rows from, and a missing partition fails INSERTs:
            // the operator manages such a table (docs/operations.md).
            debug!("partitioned table without a DEFAULT partition: partitions are left to the operator");
            return Ok(pass);
        };
        if let Some(width) = width.or_else(|| width_of(&existing)) {
            let now = Utc::now();
            for (lower, upper) in wanted_ranges(now, width) {
                let covered = existing
                    .iter()
                    .filter_map(|p| p.range)
                    .any(|(from, to)| from < upper && lower < to);
                if covered {
                    continue;
                }
                let name = partition_name(self.table(), lower, width);
                match self
                    .with_lock_retries(|| self.attach(&name, &default, lower, upper))
                    .await?
                {
                    Some(moved) => {
                        pass.moved += moved;
                        pass.created.push(name);
                    }
                    None => {
                        pass.busy = true;
                        return Ok(pass);
                    }
                }
            }
        }
        let Some(retention) = retention else {
            return Ok(pass);
        };
        let horizon = Utc::now() - TimeDelta::from_std(retention).unwrap_or(TimeDelta::MAX);
        for partition in &existing {
            // A partition whose range ends within retention cannot have
            // every row published longer ago than that (a row is
            // published after it is created): not even looked at.
            let Some((_, upper)) = partition.range else {
                continue;
            };
            if upper > horizon {
                continue;
            }
            if !self.settled(&partition.qualified, retention).await? {
                pass.kept.push(partition.qualified.clone());
                continue;
            }
            match self
                .with_lock_retries(|| self.detach_and_drop(&partition.qualified, retention))
                .await?
            {
                Some(true) => pass.dropped.push(partition.qualified.clone()),
                Some(false) => pass.kept.push(partition.qualified.clone()),
                None => {
                    pass.busy = true;
                    return Ok(pass);
                }
            }
        }
        Ok(pass)
    }

    /// Runs `work` again while its lock wait times out, up to
    /// [`LOCK_TRIES`] times with a growing pause; `None` when another
    /// replica holds the retention lock.
    async fn with_lock_retries<T, F, Fut>(&self, work: F) -> Result<Option<T>, StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, StoreError>>,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            match work().await {
                Err(e) if lock_not_available(&e) && tries < LOCK_TRIES => {
                    debug!(tries, "partition DDL did not get its lock in time; trying again");
                    tokio::time::sleep(LOCK_TIMEOUT * tries).await;
                }
                other => return other,
            }
        }
    }

    /// Whether `partition` may be dropped (sql/partition_settled.sql).
    async fn settled(&self, partition: &str, retention: Duration) -> Result<bool, StoreError> {
        let sql = include_str!("sql/partition_settled.sql").replace("{partition}", partition);
        let client = self.client().await?;
        within(READ_TIMEOUT, async {
            Ok(client
                .query_typed_one(&sql, &[(&millis(retention), Type::INT8)])
                .await?
                .get(0))
        })
        .await
    }

    /// Starts a DDL transaction: short lock waits, and the retention lock,
    /// `None` when another replica holds it.
    async fn partition_transaction<'a>(
        &self,
        client: &'a mut deadpool_postgres::Object,
    ) -> Result<Option<deadpool_postgres::Transaction<'a>>, StoreError> {
        let tx = begin(client, self.pooler, READ_TIMEOUT).await?;
        let session = Session::transaction(self.pooler, &tx);
        session
            .query_one(
                "SELECT set_config('lock_timeout', $1, true)",
                &[(&millis(LOCK_TIMEOUT).to_string(), Type::TEXT)],
            )
            .await?;
        let locked: bool = session
            .query_one(
                include_str!("sql/retention_lock.sql"),
                &[(&self.table().quoted(), Type::TEXT)],
            )
            .await?
            .try_get(0)?;
        Ok(locked.then_some(tx))
    }

    /// Creates and attaches the partition `[lower, upper)` under the
    /// retention lock; returns how many rows it took over from DEFAULT,
    /// `None` when another replica holds the lock.
    async fn attach(
        &self,
        name: &str,
        default: &str,
        lower: DateTime<Utc>,
        upper: DateTime<Utc>,
    ) -> Result<Option<u64>, StoreError> {
        let mut client = self.client().await?;
        within(READ_TIMEOUT, async {
            let Some(tx) = self.partition_transaction(&mut client).await? else {
                return Ok(None);
            };
            let moved = attach_partition(&tx, self.table(), name, default, (lower, upper)).await?;
            tx.commit().await?;
            Ok(Some(moved))
        })
        .await
    }

    /// Detaches `partition`, checks again that it is settled (a `replay`
    /// may have re-queued rows in it since the first check), and drops it;
    /// rolls back, keeping it, if it is not. `Some(dropped)`, or `None`
    /// when another replica holds the retention lock.
    async fn detach_and_drop(
        &self,
        partition: &str,
        retention: Duration,
    ) -> Result<Option<bool>, StoreError> {
        let detach = include_str!("sql/partition_detach.sql")
            .replace("{table}", &self.table().quoted())
            .replace("{partition}", partition);
        let check = include_str!("sql/partition_settled.sql").replace("{partition}", partition);
        let drop = include_str!("sql/partition_drop.sql").replace("{partition}", partition);
        let mut client = self.client().await?;
        within(READ_TIMEOUT, async {
            let Some(tx) = self.partition_transaction(&mut client).await? else {
                return Ok(None);
            };
            tx.batch_execute(&detach).await?;
            let settled: bool = tx
                .query_typed_one(&check, &[(&millis(retention), Type::INT8)])
                .await?
                .get(0);
            if !settled {
                tx.rollback().await?;
                return Ok(Some(false));
            }
            tx.batch_execute(&drop).await?;
            tx.commit().await?;
            info!(partition = %partition, "partition dropped: every row published longer ago than retention");
            Ok(Some(true))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn partitions_are_named_by_their_start() {
        let table = TableName::parse("app.outbox_event").unwrap();
        let midnight = Utc.with_ymd_and_hms(2026, 3, 9, 0, 0, 0).unwrap();
        assert_eq!(
            partition_name(&table, midnight, Granularity::Daily.width()),
            "\"app\".\"outbox_event_p20260309\""
        );
        assert_eq!(
            partition_name(
                &table,
                midnight + TimeDelta::hours(13),
                Granularity::Hourly.width()
            ),
            "\"app\".\"outbox_event_p2026030913\""
        );
        assert_eq!(default_partition(&table), "\"app\".\"outbox_event_default\"");
    }

    #[test]
    fn the_wanted_ranges_start_at_the_current_one_and_reach_ahead() {
        let now = Utc.with_ymd_and_hms(2026, 3, 9, 13, 45, 0).unwrap();
        let daily = wanted_ranges(now, Granularity::Daily.width());
        assert_eq!(daily.len(), 4);
        assert_eq!(daily[0].0, Utc.with_ymd_and_hms(2026, 3, 9, 0, 0, 0).unwrap());
        assert_eq!(daily[3].1, Utc.with_ymd_and_hms(2026, 3, 13, 0, 0, 0).unwrap());
        let hourly = wanted_ranges(now, Granularity::Hourly.width());
        assert_eq!(hourly.len(), 13);
        assert_eq!(hourly[0].0, Utc.with_ymd_and_hms(2026, 3, 9, 13, 0, 0).unwrap());
        assert_eq!(literal(hourly[0].0), "'2026-03-09 13:00:00.000000+00'");
    }
}
