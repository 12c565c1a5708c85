//! The consumer's half of at-least-once delivery: apply each message's
//! effect once, whatever number of times the message arrives.
//!
//! outbox-relay publishes every outbox row at least once, under the row's
//! id (the AMQP `message_id`, the SQS `event_id` attribute). The same id
//! comes again when a relay crashes after the broker confirmed a message
//! but before it recorded that, when the broker redelivers a message the
//! consumer did not acknowledge, or when an operator runs `replay`. A
//! consumer whose effects live in PostgreSQL deduplicates by recording the
//! ids it has applied in `processed_message` (created by [`migrate`], SQL in
//! `migrations/0001_processed_message.sql`), **in the same
//! transaction as the effect**:
//!
//! 1. begin a transaction;
//! 2. [`Deduplicator::claim`] the message id: [`Claim::First`] or
//!    [`Claim::Duplicate`];
//! 3. on `First`, apply the effect through the same transaction; on
//!    `Duplicate`, apply nothing;
//! 4. commit;
//! 5. only then acknowledge (RabbitMQ `basic.ack`, SQS `DeleteMessage`).
//!
//! The mark commits together with the effect or not at all, so a consumer
//! that dies anywhere in between either applied both (and the redelivery is
//! a `Duplicate`) or neither (and the redelivery is `First` again). Two
//! deliveries of one id processed at the same time serialise on the
//! table's primary key: exactly one transaction gets `First`.
//!
//! ```no_run
//! use outbox_consumer::{Claim, Deduplicator};
//! use tokio_postgres::{Client, NoTls};
//! use uuid::Uuid;
//!
//! /// Applies one message; the caller acknowledges it once this returns Ok.
//! async fn handle(
//!     client: &mut Client,
//!     dedup: &Deduplicator,
//!     message_id: Uuid,
//!     amount: i64,
//! ) -> Result<(), tokio_postgres::Error> {
//!     let tx = client.transaction().await?;
//!     if dedup.claim(&tx, message_id).await? == Claim::First {
//!         // The effect: anything written through `tx`.
//!         tx.execute("UPDATE account SET balance = balance + $1 WHERE id = 1", &[&amount])
//!             .await?;
//!     }
//!     tx.commit().await
//! }
//!
//! # async fn start() -> Result<(), tokio_postgres::Error> {
//! let (mut client, connection) = tokio_postgres::connect("postgres://app@db/app", NoTls).await?;
//! tokio::spawn(connection);
//! outbox_consumer::migrate(&client).await?;
//! let dedup = Deduplicator::new("billing");
//! handle(&mut client, &dedup, Uuid::new_v4(), 10).await?;
//! // Now and then: forget marks older than any message can come back.
//! dedup
//!     .purge_older_than(&client, std::time::Duration::from_secs(14 * 24 * 3600), 10_000)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! `examples/consumer.rs` is a complete RabbitMQ consumer built this way,
//! and docs/consumers.md (Failure windows) describes the failure windows it closes.
//!
//! Isolation: the pattern is meant for READ COMMITTED, PostgreSQL's
//! default. Under REPEATABLE READ or SERIALIZABLE a claim racing another
//! transaction's claim of the same id fails with a serialization error
//! (SQLSTATE 40001) instead of returning `Duplicate`; roll back, and
//! leave the message unacknowledged or retry it.

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

/// The consumer migration, for projects that run migrations with their own
/// tool: idempotent (`IF NOT EXISTS`), creates `processed_message` and its
/// retention index. [`migrate`] applies the same text.
pub const MIGRATION_SQL: &str = include_str!("../migrations/0001_processed_message.sql");

const CLAIM_SQL: &str = include_str!("sql/claim.sql");
const PURGE_SQL: &str = include_str!("sql/purge.sql");

/// Creates `processed_message` and its index if they are missing.
///
/// Safe to run from every replica of a consumer at start-up: the statements
/// are sent as one simple query, which PostgreSQL runs as one implicit
/// transaction, behind a transaction-level advisory lock, so concurrent
/// runs wait for each other instead of racing on `CREATE TABLE IF NOT
/// EXISTS` (which is not safe under concurrency on its own). The table is
/// created in the first schema of the connection's `search_path`.
pub async fn migrate(client: &Client) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute(&format!(
            "SET LOCAL lock_timeout = '10s';
             SET LOCAL client_min_messages = warning;
             SELECT pg_advisory_xact_lock(hashtext('outbox-relay consumer migrate'));
             {MIGRATION_SQL}"
        ))
        .await
}

/// Whether a message is new to this consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "apply the effect only on Claim::First"]
pub enum Claim {
    /// First time: apply the effect in the same transaction, then commit.
    First,
    /// Already applied (committed by an earlier delivery): skip the effect,
    /// commit or roll back, and acknowledge the message.
    Duplicate,
}

impl Claim {
    /// From the number of rows the claim's `INSERT … ON CONFLICT DO
    /// NOTHING` added.
    fn from_rows_added(rows: u64) -> Self {
        if rows == 0 {
            Claim::Duplicate
        } else {
            Claim::First
        }
    }

    /// `true` for [`Claim::First`].
    pub fn is_first(self) -> bool {
        self == Claim::First
    }
}

/// Deduplicates one consumer's messages on their id.
///
/// Several consumers may share the `processed_message` table; each one
/// deduplicates under its own `consumer_name`, so a message applied by one
/// is still new to another.
#[derive(Debug, Clone)]
pub struct Deduplicator {
    consumer_name: String,
}

impl Deduplicator {
    /// A deduplicator for the consumer called `consumer_name`. Keep the name
    /// stable across deployments: it is half of the key of every mark.
    pub fn new(consumer_name: impl Into<String>) -> Self {
        Self {
            consumer_name: consumer_name.into(),
        }
    }

    /// The consumer's name, as stored in `processed_message`.
    pub fn consumer_name(&self) -> &str {
        &self.consumer_name
    }

    /// Marks `message_id` processed inside `tx`, the transaction that also
    /// applies the message's effect, and tells whether this is the first
    /// time.
    ///
    /// The mark becomes visible to other deliveries only when `tx` commits,
    /// and disappears if it rolls back, so the mark and the effect are one
    /// unit. A concurrent transaction claiming the same id waits here until
    /// `tx` ends. Keep the transaction short: a redelivery of the same
    /// message blocks on it meanwhile.
    pub async fn claim(
        &self,
        tx: &Transaction<'_>,
        message_id: Uuid,
    ) -> Result<Claim, tokio_postgres::Error> {
        // Typed parameters: one round trip, no separate prepare.
        let rows = tx
            .execute_typed(
                CLAIM_SQL,
                &[(&self.consumer_name, Type::TEXT), (&message_id, Type::UUID)],
            )
            .await?;
        Ok(Claim::from_rows_added(rows))
    }

    /// Deletes this consumer's marks processed more than `age` ago, `batch`
    /// rows per statement, until a statement deletes fewer than `batch`;
    /// returns how many were deleted.
    ///
    /// Each statement commits on its own, so no lock is held for long; after
    /// a failure, the batches before it stay deleted and the next run goes
    /// on from there. A message whose
    /// mark was purged is applied again if it ever comes back, so `age` must
    /// exceed the longest time a message can take to come back: the
    /// broker's redelivery window (SQS retention, a requeued RabbitMQ
    /// message) and the furthest back an operator may `replay`. `batch` is
    /// at least 1.
    pub async fn purge_older_than(
        &self,
        client: &Client,
        age: Duration,
        batch: i64,
    ) -> Result<u64, tokio_postgres::Error> {
        let batch = batch.max(1);
        let age_ms = millis(age);
        let mut deleted = 0;
        loop {
            let rows = client
                .execute_typed(
                    PURGE_SQL,
                    &[
                        (&self.consumer_name, Type::TEXT),
                        (&age_ms, Type::INT8),
                        (&batch, Type::INT8),
                    ],
                )
                .await?;
            deleted += rows;
            if rows < batch.unsigned_abs() {
                return Ok(deleted);
            }
        }
    }
}

/// A duration in whole milliseconds, saturating (an age of centuries is
/// "everything").
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_that_added_its_row_is_the_first() {
        assert_eq!(Claim::from_rows_added(1), Claim::First);
        assert!(Claim::from_rows_added(1).is_first());
        assert_eq!(Claim::from_rows_added(0), Claim::Duplicate);
        assert!(!Claim::from_rows_added(0).is_first());
    }

    #[test]
    fn ages_are_whole_milliseconds_and_saturate() {
        assert_eq!(millis(Duration::from_micros(1_500)), 1);
        assert_eq!(millis(Duration::from_secs(7 * 24 * 3600)), 604_800_000);
        assert_eq!(millis(Duration::MAX), i64::MAX);
    }

    #[test]
    fn the_migration_creates_the_documented_table_and_retention_index() {
        let sql = MIGRATION_SQL;
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS processed_message"));
        assert!(sql.contains("PRIMARY KEY (consumer_name, message_id)"));
        assert!(sql.contains("ON processed_message (consumer_name, processed_at)"));
        // The claim relies on the primary key for its conflict.
        assert!(CLAIM_SQL.contains("ON CONFLICT DO NOTHING"));
    }
}
