//! What every scenario starts from: a migrated database of its own, a
//! RabbitMQ exchange and queue of their own, the relay's settings, and
//! events of the same shape whether they come from the table or not.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::BasicConsumeOptions;
use lapin::types::FieldTable;
use outbox_relay::event::Event;
use outbox_test_support::{RelayBinary, TestBroker};
use uuid::Uuid;

use crate::{Error, Options};

/// The relay binary that `cargo bench` built.
pub struct OutboxRelay;

impl RelayBinary for OutboxRelay {
    const PATH: &'static str = env!("CARGO_BIN_EXE_outbox-relay");
}

/// A database of its own for one run, which the relay binary can run
/// against; dropped at the end of the run.
pub type TestDb = outbox_test_support::TestDb<OutboxRelay>;

/// A migrated database on the PostgreSQL of `--pg-url`.
pub async fn database(options: &Options) -> TestDb {
    TestDb::migrated_at(&options.pg_url).await
}

/// An exchange and a queue bound to every routing key, on the RabbitMQ of
/// `--amqp-url`.
pub async fn broker(options: &Options) -> TestBroker {
    TestBroker::create_at(&options.amqp_url, "#").await
}

/// A connection of its own for a baseline's publishers, as a relay in its
/// own process has: on the broker's connection they would share a socket
/// and lapin's I/O thread with the consumer that counts arrivals, which no
/// relay does.
pub async fn publishing_connection(options: &Options) -> Result<lapin::Connection, Error> {
    Ok(lapin::Connection::connect(&options.amqp_url, lapin::ConnectionProperties::default()).await?)
}

/// The settings of every relay the benchmark starts: the broker, no
/// retention pass during a run, and the batch size and workers under test.
pub fn relay_settings(options: &Options, exchange: &str) -> Vec<(&'static str, String)> {
    let mut settings = vec![
        ("OUTBOX_AMQP_URL", options.amqp_url.clone()),
        ("OUTBOX_AMQP_EXCHANGE", exchange.to_owned()),
        ("OUTBOX_RETENTION", "0".to_owned()),
        ("OUTBOX_HTTP_ADDR", "127.0.0.1:0".to_owned()),
        ("OUTBOX_BATCH_SIZE", options.batch_size.to_string()),
        ("OUTBOX_WORKERS", options.workers.to_string()),
        ("RUST_LOG", "warn".to_owned()),
    ];
    // `--relay-env` last, so that it overrides the defaults above.
    for (name, value) in &options.relay_env {
        settings.retain(|(existing, _)| existing != name);
        settings.push((name, value.clone()));
    }
    settings
}

pub fn payload_sql() -> &'static str {
    // ~300 bytes of JSON per event.
    "jsonb_build_object('order_id', gen_random_uuid(), 'n', n, 'customer', 'customer-' || (n % 977),
        'lines', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (n % 101), 'qty', 1 + n % 3,
        'price', 19.99)), 'note', repeat('x', 160))"
}

/// `rows` unpublished events in the table, vacuumed and analysed, created
/// one after another as producers' commits make them (10,000 a second up
/// to now), so that the table's rows lie in the order claims take them.
pub async fn prefill(db: &TestDb, rows: usize) -> Result<(), Error> {
    insert_unpublished(db, rows, &created_in_turn(rows)).await
}

/// A seeded row's created_at (SQL of `n`): 100 µs after the row before it,
/// the last one now.
fn created_in_turn(rows: usize) -> String {
    format!("now() - ({rows} - n) * interval '100 microseconds'")
}

/// Midnight UTC `days` days from today (negative: the past), as SQL.
pub fn midnight_utc(days: i32) -> String {
    format!("(((now() AT TIME ZONE 'UTC')::date + {days})::timestamp AT TIME ZONE 'UTC')")
}

/// Like [`prefill`], the rows created evenly from midnight UTC `days`
/// days ago up to now, oldest first, so that on a partitioned table they
/// fill that many daily partitions and today's.
pub async fn prefill_spread(db: &TestDb, rows: usize, days: u32) -> Result<(), Error> {
    let start = midnight_utc(-i32::try_from(days)?);
    let created_at = format!("{start} + (n - 1)::float8 / {rows} * (now() - {start})");
    insert_unpublished(db, rows, &created_at).await
}

/// `rows` unpublished events created at `created_at` (SQL of `n`, the
/// row's number from 1), vacuumed and analysed.
async fn insert_unpublished(db: &TestDb, rows: usize, created_at: &str) -> Result<(), Error> {
    db.client
        .execute(
            &format!(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
                 SELECT gen_random_uuid(), 'order.created', 'order-' || (n % 5000), {}, {created_at}
                 FROM generate_series(1, $1::bigint) AS n",
                payload_sql()
            ),
            &[&(rows as i64)],
        )
        .await?;
    db.client.batch_execute("VACUUM ANALYZE outbox_event").await?;
    Ok(())
}

/// A checkpoint once the table is seeded, before a drain is timed: the
/// seed's WAL (about 1 GB for a million rows, the default `max_wal_size`)
/// would otherwise set off checkpoints inside whichever drain follows it,
/// so a large drain paid for its seed and a small one did not. A backlog
/// in production builds up over checkpoints as usual; after this one, as
/// there, the first change to each page writes the whole page to WAL.
pub async fn checkpoint(db: &TestDb) -> Result<(), Error> {
    db.client.batch_execute("CHECKPOINT").await?;
    Ok(())
}

/// The drain runs' table: `rows` rows, at `--fillfactor` if given, and all
/// created at one instant with `--one-created-at`.
pub async fn prefill_for_drain(db: &TestDb, options: &Options, rows: usize) -> Result<(), Error> {
    set_fillfactor(db, options).await?;
    if options.one_created_at {
        insert_unpublished(db, rows, "now()").await
    } else {
        prefill(db, rows).await
    }
}

/// `--fillfactor`, if given, for the pages written from now on.
pub async fn set_fillfactor(db: &TestDb, options: &Options) -> Result<(), Error> {
    if let Some(fillfactor) = options.fillfactor {
        db.client
            .batch_execute(&format!(
                "ALTER TABLE outbox_event SET (fillfactor = {fillfactor})"
            ))
            .await?;
    }
    Ok(())
}

pub async fn unpublished(db: &TestDb) -> Result<i64, Error> {
    Ok(db
        .client
        .query_one(
            "SELECT count(*) FROM outbox_event WHERE published_at IS NULL AND quarantined_at IS NULL",
            &[],
        )
        .await?
        .get(0))
}

/// Waits until no row is left to publish, polling every `poll`; an error
/// after 15 minutes, or when the table cannot be read.
pub async fn until_published(db: &TestDb, poll: Duration) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        match unpublished(db).await? {
            0 => return Ok(()),
            left if Instant::now() > deadline => {
                return Err(format!("{left} rows left after 15 minutes").into())
            }
            _ => tokio::time::sleep(poll).await,
        }
    }
}

/// Consumes (auto-ack) in the background, recording when each message id
/// arrived.
pub async fn arrivals(broker: &TestBroker) -> Result<Arc<Mutex<HashMap<String, Instant>>>, Error> {
    let arrivals = Arc::new(Mutex::new(HashMap::new()));
    let channel = broker.connection().create_channel().await?;
    let mut consumer = channel
        .basic_consume(
            broker.queue.as_str().into(),
            "bench".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    let sink = arrivals.clone();
    tokio::spawn(async move {
        let _channel = channel;
        while let Some(Ok(delivery)) = consumer.next().await {
            let now = Instant::now();
            if let Some(id) = delivery.properties.message_id() {
                sink.lock().unwrap().entry(id.to_string()).or_insert(now);
            }
        }
    });
    Ok(arrivals)
}

/// An event like the prefilled rows, for publishers without a database.
pub fn sample_event(n: usize) -> Event {
    let payload = format!(
        r#"{{"n": {n}, "note": "{}", "lines": [{{"qty": 1, "sku": "SKU-{}", "price": 19.99}}], "customer": "customer-{}", "order_id": "{}"}}"#,
        "x".repeat(160),
        n % 101,
        n % 977,
        Uuid::new_v4()
    );
    Event {
        id: Uuid::new_v4(),
        causation_id: None,
        event_type: "order.created".to_owned(),
        aggregate_id: format!("order-{}", n % 5000),
        payload,
        created_at: chrono::Utc::now(),
        attempt_count: 1,
        headers: Default::default(),
    }
}
