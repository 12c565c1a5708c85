//! What `migrate` costs producers on a big live table: a seed-shaped
//! table (the producer's columns only, as 0001 creates them, without the
//! relay's, so migrate adds columns and builds every index) of
//! `--migrate-rows` rows, and a producer inserting single rows from its own
//! connection all along. The number is the longest any INSERT took while
//! migrate ran: how long migrate held producers up.
//!
//! Run twice: as `migrate` runs on a direct connection (catalog changes in
//! a short transaction, indexes built concurrently), and as it runs
//! through a transaction pooler (everything in one transaction, indexes
//! included, which was every run before concurrent builds).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::fixture::TestDb;

/// How long the producer runs alone before migrate starts.
const BASELINE: Duration = Duration::from_secs(5);
use crate::{Error, Options};

pub struct MigrateLock {
    /// Through a transaction pooler (one transaction), not concurrently.
    pub in_transaction: bool,
    /// `outbox-relay migrate` from start to exit.
    pub total: Duration,
    /// The longest single-row INSERT while migrate ran.
    pub longest_insert: Duration,
    /// When that INSERT started, from migrate's start.
    pub longest_at: Duration,
    /// The longest INSERT in the same time before migrate started: what
    /// the machine's noise alone costs.
    pub longest_before: Duration,
    /// INSERTs committed while migrate ran.
    pub inserts: u64,
}

/// Seeds a table of `--migrate-rows` rows (set-based), then runs migrate
/// on it while a producer inserts.
pub async fn run(options: &Options, in_transaction: bool) -> Result<MigrateLock, Error> {
    let db = TestDb::create_at(&options.pg_url).await;
    db.client
        .batch_execute(
            "CREATE TABLE outbox_event (
                 id            UUID PRIMARY KEY,
                 causation_id  UUID NOT NULL,
                 event_type    VARCHAR(150) NOT NULL,
                 aggregate_id  UUID NOT NULL,
                 payload       JSONB NOT NULL,
                 created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
                 published_at  TIMESTAMPTZ
             )",
        )
        .await?;
    // Mostly published, as a live outbox is; the rest waits.
    db.client
        .execute(
            "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload, created_at, published_at)
             SELECT gen_random_uuid(), gen_random_uuid(), 'order.created', gen_random_uuid(),
                    jsonb_build_object('n', n, 'customer', 'customer-' || (n % 977)),
                    now() - interval '1 second' * ($1::bigint - n),
                    CASE WHEN n % 10 <> 0 THEN now() END
             FROM generate_series(1, $1::bigint) AS n",
            &[&(options.migrate_rows as i64)],
        )
        .await?;
    db.client.batch_execute("VACUUM ANALYZE outbox_event").await?;

    let producer = db.connect().await;
    let insert = producer
        .prepare(
            "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload)
             VALUES (gen_random_uuid(), gen_random_uuid(), 'order.created', gen_random_uuid(), '{\"n\": 0}')",
        )
        .await?;
    // One insert first, so the loop below starts on a warm connection.
    producer.execute(&insert, &[]).await?;
    let running = Arc::new(AtomicBool::new(true));
    let producing = running.clone();
    let producer = tokio::spawn(async move {
        // (started, took) of every INSERT.
        let mut inserts = Vec::new();
        while producing.load(Ordering::Relaxed) {
            let started = Instant::now();
            producer.execute(&insert, &[]).await?;
            inserts.push((started, started.elapsed()));
        }
        Ok::<_, Error>(inserts)
    });
    // The producer alone first, for a fixed window: how long its INSERTs
    // take on this machine without migrate.
    let quiet = Instant::now();
    tokio::time::sleep(BASELINE).await;

    let mut migrate = db.relay_command(&["migrate"], &[("RUST_LOG", "warn")]);
    if in_transaction {
        // The database URL is direct; the setting only makes migrate do
        // what it does behind a pooler.
        migrate.env("OUTBOX_DATABASE_POOLER", "transaction");
    }
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || migrate.output()).await??;
    let total = started.elapsed();
    running.store(false, Ordering::Relaxed);
    let inserts = producer.await??;
    let longest_before = inserts
        .iter()
        .filter(|(at, _)| *at >= quiet && *at < started)
        .map(|(_, took)| *took)
        .max()
        .unwrap_or_default();
    // An INSERT that started before migrate and ended during it counts.
    let during: Vec<&(Instant, Duration)> = inserts
        .iter()
        .filter(|(at, took)| *at + *took >= started)
        .collect();
    let (longest_at, longest_insert) = during
        .iter()
        .max_by_key(|(_, took)| *took)
        .map(|(at, took)| (at.saturating_duration_since(started), *took))
        .unwrap_or_default();
    let inserts = during.len() as u64;
    if !out.status.success() {
        return Err(format!("migrate failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(MigrateLock {
        in_transaction,
        total,
        longest_insert,
        longest_at,
        longest_before,
        inserts,
    })
}

/// The table docs/performance.md quotes.
pub fn table(options: &Options, runs: &[MigrateLock]) {
    println!(
        "\n| migrate on a seed-shaped table of {} rows, a producer inserting | migrate total | longest producer INSERT (at) | INSERTs during migrate | longest INSERT in {} s before |",
        options.migrate_rows,
        BASELINE.as_secs()
    );
    println!("|---|---:|---:|---:|---:|");
    for run in runs {
        let how = if run.in_transaction {
            "one transaction, indexes built inside (through a transaction pooler)"
        } else {
            "catalog transaction, then indexes CONCURRENTLY (direct connection)"
        };
        println!(
            "| {how} | {:.2} s | {:.1} ms ({:.2} s in) | {} | {:.1} ms |",
            run.total.as_secs_f64(),
            run.longest_insert.as_secs_f64() * 1000.0,
            run.longest_at.as_secs_f64(),
            run.inserts,
            run.longest_before.as_secs_f64() * 1000.0
        );
    }
}
