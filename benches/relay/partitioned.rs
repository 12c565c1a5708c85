//! A daily-partitioned outbox table (`migrate --partitioned daily`)
//! against a plain one, each run on a fresh database:
//!
//! - a drain of `--partition-rows` rows created over the last three days
//!   and today, so that the claims take rows from several partitions;
//! - retention (OUTBOX_RETENTION=1d) of `--partition-retained-rows` rows
//!   published days ago, with `--partition-producers` connections
//!   inserting single rows all along: batched deletes on the plain table,
//!   partition drops on the partitioned one. Measured: the time from the
//!   relay's start until no old row is left, and how long the producers'
//!   INSERTs took meanwhile.
//!
//! Retention runs a pass as the relay starts and then every minute
//! (`retention::INTERVAL`, fixed, no setting); a pass loops until no old
//! row is left, so the first pass does all the work and no run waits for
//! a second one. The exception is a partition whose DETACH did not get
//! its lock within five tries: it waits for the next pass, and the run's
//! time shows that minute.
//!
//! Kinds alternate within each of `--repeat` rounds, so that both see the
//! same machine; the table shows the median of each.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_test_support::RelayProcess;

use crate::drain::{self, Drain, Setup};
use crate::fixture::{arrivals, broker, midnight_utc, relay_settings, TestDb};
use crate::meter::{Meter, Run};
use crate::report::{ms, postgres_us_per_event};
use crate::scale::percentile;
use crate::{Error, Options};

/// Days before today the drained rows were created on (and today).
const DRAIN_DAYS: u32 = 3;

/// The days (from today) the retained rows were created on: long enough
/// ago that both their partitions' ranges and their last publish are more
/// than a day past, whatever the time of day the run starts.
const RETAINED_DAYS: RangeInclusive<i32> = -5..=-3;

/// How long the producers insert beside a relay without retention before
/// the relay with retention replaces it: their INSERTs' latency without
/// retention, on the same table and machine.
const BASELINE: Duration = Duration::from_secs(3);

/// How often the run looks whether old rows are left.
const POLL: Duration = Duration::from_millis(100);

/// How long retention may take before the run fails.
const DEADLINE: Duration = Duration::from_secs(900);

/// A fresh database with a daily-partitioned outbox table: what `migrate
/// --partitioned daily` makes (DEFAULT, today and the days ahead), and a
/// partition for each of `past_days` (days from today, negative), as
/// earlier relays would have left them.
pub async fn database(options: &Options, past_days: RangeInclusive<i32>) -> Result<TestDb, Error> {
    let db = TestDb::create_at(&options.pg_url).await;
    let out = db
        .relay_command(&["migrate", "--partitioned", "daily"], &[("RUST_LOG", "warn")])
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "migrate --partitioned daily failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    for days in past_days {
        let name: String = db
            .client
            .query_one(
                "SELECT 'outbox_event_p' || to_char((now() AT TIME ZONE 'UTC')::date + $1::int, 'YYYYMMDD')",
                &[&days],
            )
            .await?
            .get(0);
        // PARTITION OF locks the parent, which costs nothing before any
        // relay or producer runs; named and sized as the relay makes them.
        db.client
            .batch_execute(&format!(
                "CREATE TABLE {name} PARTITION OF outbox_event
                     FOR VALUES FROM ({}) TO ({}) WITH (fillfactor = 50)",
                midnight_utc(days),
                midnight_utc(days + 1)
            ))
            .await?;
    }
    Ok(db)
}

/// One retention run.
pub struct Retention {
    pub partitioned: bool,
    /// From the relay's start until no row published more than a day ago
    /// was left.
    pub took: Duration,
    /// Its "events" are the rows removed.
    pub run: Run,
    /// WAL the whole server wrote meanwhile (producers and relay included).
    pub wal_bytes: i64,
    /// Producer INSERTs that ran (in part) during retention.
    pub inserts: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// The same producers' INSERTs in the [`BASELINE`] before.
    pub before_p99: Duration,
    pub before_max: Duration,
}

/// Both kinds of table, drain and retention, and their tables.
pub async fn run(options: &Options) -> Result<(), Error> {
    let rounds = options.repeat.max(1);
    let mut drains: [Vec<Drain>; 2] = [Vec::new(), Vec::new()];
    let mut retentions: [Vec<Retention>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (partitioned, kept) in [false, true].into_iter().zip(drains.iter_mut()) {
            let setup = Setup {
                partitioned,
                spread_days: DRAIN_DAYS,
                ..Default::default()
            };
            let run = drain::drain_with(options, 1, options.partition_rows, setup).await?;
            eprintln!(
                "drain, {}: {:.0} events/s, PostgreSQL {:.0} µs/event",
                kind(partitioned),
                run.run.events_per_second,
                postgres_us_per_event(&run.run)
            );
            kept.push(run);
        }
    }
    for _ in 0..rounds {
        for (partitioned, kept) in [false, true].into_iter().zip(retentions.iter_mut()) {
            let run = retention(options, partitioned).await?;
            eprintln!(
                "retention, {}: {:.2} s, INSERT p99 {}, max {}",
                kind(partitioned),
                run.took.as_secs_f64(),
                ms(run.p99),
                ms(run.max)
            );
            kept.push(run);
        }
    }
    let drains = drains.map(|runs| median(runs, |d| d.run.events_per_second));
    let retentions = retentions.map(|runs| median(runs, |r| r.took.as_secs_f64()));
    table(options, &drains, &retentions);
    Ok(())
}

fn kind(partitioned: bool) -> &'static str {
    if partitioned {
        "partitioned daily"
    } else {
        "plain table"
    }
}

fn median<T>(mut runs: Vec<T>, key: impl Fn(&T) -> f64) -> T {
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let middle = runs.len() / 2;
    runs.swap_remove(middle)
}

/// Old published rows for retention, the same on either kind of table:
/// created evenly over [`RETAINED_DAYS`], each published a minute after.
async fn seed_old(db: &TestDb, rows: usize) -> Result<(), Error> {
    let start = midnight_utc(*RETAINED_DAYS.start());
    let days = RETAINED_DAYS.end() - RETAINED_DAYS.start() + 1;
    db.client
        .execute(
            &format!(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                           published_at, attempt_count)
                 SELECT gen_random_uuid(), 'order.created', 'order-' || (n % 5000), jsonb_build_object('n', n),
                        c, c + interval '1 minute', 1
                 FROM generate_series(1, $1::bigint) AS n,
                      LATERAL (SELECT {start} + (n - 1)::float8 / $1::bigint * interval '{days} days') AS t(c)"
            ),
            &[&(rows as i64)],
        )
        .await?;
    db.client.batch_execute("VACUUM ANALYZE outbox_event").await?;
    Ok(())
}

/// Whether a row published more than a day ago is left. `min` reads the
/// old end of the published index (of each partition), where a count or
/// an EXISTS could be planned as a scan over the rows retention already
/// deleted.
async fn old_rows_left(db: &TestDb) -> Result<bool, Error> {
    Ok(db
        .client
        .query_one(
            "SELECT COALESCE(min(published_at) < now() - interval '1 day', false) FROM outbox_event",
            &[],
        )
        .await?
        .get(0))
}

async fn wal_lsn(db: &TestDb) -> Result<String, Error> {
    Ok(db
        .client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0))
}

async fn wal_since(db: &TestDb, lsn: &str) -> Result<i64, Error> {
    Ok(db
        .client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::bigint",
            &[&lsn],
        )
        .await?
        .get(0))
}

/// (started, took) of each INSERT of one producer.
type Inserts = Vec<(Instant, Duration)>;

/// A producer inserting single rows, each its own transaction, until
/// `running` is cleared.
async fn producer(
    db: &TestDb,
    running: Arc<AtomicBool>,
) -> Result<tokio::task::JoinHandle<Result<Inserts, Error>>, Error> {
    let client = db.connect().await;
    let insert = client
        .prepare(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
             VALUES (gen_random_uuid(), 'order.created', 'order-producer', '{\"n\": 0}')",
        )
        .await?;
    // The first INSERT plans over the partitions and loads their catalog
    // entries: done before any is timed.
    client.execute(&insert, &[]).await?;
    Ok(tokio::spawn(async move {
        let mut inserts = Vec::new();
        while running.load(Ordering::Relaxed) {
            let started = Instant::now();
            client.execute(&insert, &[]).await?;
            inserts.push((started, started.elapsed()));
        }
        Ok(inserts)
    }))
}

/// Retention of `--partition-retained-rows` old rows on one kind of table,
/// producers inserting.
pub async fn retention(options: &Options, partitioned: bool) -> Result<Retention, Error> {
    let rows = options.partition_retained_rows;
    let db = if partitioned {
        database(options, RETAINED_DAYS).await?
    } else {
        crate::fixture::database(options).await
    };
    seed_old(&db, rows).await?;
    if partitioned {
        // A row that missed its partition would be deleted row by row,
        // which is not what this run is to measure.
        let in_default: i64 = db
            .client
            .query_one("SELECT count(*) FROM outbox_event_default", &[])
            .await?
            .get(0);
        if in_default > 0 {
            return Err(format!("{in_default} retained rows went to the DEFAULT partition").into());
        }
    }
    let broker = broker(options).await;
    // Consumed, so that the queue does not grow with the producers' rows.
    let _arrivals = arrivals(&broker).await?;
    let mut settings = relay_settings(options, &broker.exchange);
    // Publishing the producers' rows meanwhile, as a live relay would.
    let quiet_relay = RelayProcess::start(&db, &settings);
    let running = Arc::new(AtomicBool::new(true));
    let mut producers = Vec::new();
    for _ in 0..options.partition_producers.max(1) {
        producers.push(producer(&db, running.clone()).await?);
    }
    let quiet = Instant::now();
    tokio::time::sleep(BASELINE).await;

    settings.retain(|(name, _)| *name != "OUTBOX_RETENTION");
    settings.push(("OUTBOX_RETENTION", "1d".to_owned()));
    let wal_before = wal_lsn(&db).await?;
    // Dropping a RelayProcess kills it and waits for it.
    drop(quiet_relay);
    let meter = Meter::start();
    let started = Instant::now();
    let relay = RelayProcess::start(&db, &settings);
    let waited = async {
        while old_rows_left(&db).await? {
            if started.elapsed() > DEADLINE {
                return Err::<(), Error>(format!("old rows left after {} s", DEADLINE.as_secs()).into());
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }
    .await;
    let took = started.elapsed();
    let run = meter.finish(rows);
    // The producers stop whether retention finished or not.
    running.store(false, Ordering::Relaxed);
    let mut inserts = Vec::new();
    for producer in producers {
        inserts.extend(producer.await??);
    }
    waited?;
    let wal_bytes = wal_since(&db, &wal_before).await?;
    drop(relay);
    broker.cleanup().await;

    let ended = started + took;
    let sorted = |keep: &dyn Fn(&(Instant, Duration)) -> bool| {
        let mut took: Vec<Duration> = inserts.iter().filter(|i| keep(i)).map(|(_, t)| *t).collect();
        took.sort();
        took
    };
    // An INSERT that started before retention and ended during it counts.
    let during = sorted(&|(at, took)| *at + *took >= started && *at < ended);
    let before = sorted(&|(at, took)| *at >= quiet && *at + *took < started);
    Ok(Retention {
        partitioned,
        took,
        run,
        wal_bytes,
        inserts: during.len(),
        p50: percentile(&during, 0.5),
        p99: percentile(&during, 0.99),
        max: during.last().copied().unwrap_or_default(),
        before_p99: percentile(&before, 0.99),
        before_max: before.last().copied().unwrap_or_default(),
    })
}

/// The tables docs/performance.md quotes.
pub fn table(options: &Options, drains: &[Drain; 2], retentions: &[Retention; 2]) {
    let rounds = options.repeat.max(1);
    println!(
        "\n| drain of {} rows created over the last {DRAIN_DAYS} days and today (1 relay, batch {} × {} workers; median of {rounds}) | events/s | vs plain | PostgreSQL CPU | PostgreSQL CPU per event | relay CPU | machine busy |",
        options.partition_rows, options.batch_size, options.workers
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let plain = drains[0].run.events_per_second;
    for (d, name) in drains.iter().zip([
        "plain table".to_owned(),
        format!(
            "partitioned daily ({} days' partitions, today's, 3 ahead, DEFAULT)",
            DRAIN_DAYS
        ),
    ]) {
        println!(
            "| {name} | {:.0} | {:.2}× | {:.0}% | {:.0} µs | {:.0}% | {:.0}% |",
            d.run.events_per_second,
            d.run.events_per_second / plain,
            d.run.postgres_percent,
            postgres_us_per_event(&d.run),
            d.relay_percent,
            d.run.machine_busy_percent
        );
    }
    let days = RETAINED_DAYS.end() - RETAINED_DAYS.start() + 1;
    println!(
        "\n| retention of {} rows published days ago (OUTBOX_RETENTION=1d, 1 relay), {} producers inserting single rows; median of {rounds} | until gone | rows removed/s | PostgreSQL CPU | WAL written (server) | INSERTs during | INSERT p50 | p99 | max | p99 / max in {} s before |",
        options.partition_retained_rows,
        options.partition_producers.max(1),
        BASELINE.as_secs()
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in retentions {
        let name = if r.partitioned {
            format!("partitioned daily: {days} partitions dropped")
        } else {
            "plain table: batched deletes of 1,000".to_owned()
        };
        println!(
            "| {name} | {:.2} s | {:.0} | {:.0}% | {:.1} MiB | {} | {} | {} | {} | {} / {} |",
            r.took.as_secs_f64(),
            r.run.events_per_second,
            r.run.postgres_percent,
            r.wal_bytes as f64 / (1024.0 * 1024.0),
            r.inserts,
            ms(r.p50),
            ms(r.p99),
            ms(r.max),
            ms(r.before_p99),
            ms(r.before_max)
        );
    }
}
