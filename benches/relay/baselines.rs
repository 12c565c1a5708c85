//! What the relay is measured against: the broker's own limit (a bare
//! publisher), the simplest correct relay, and the row-lock design the
//! relay's committed lease replaced.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::Confirmation;
use outbox_relay::event::Event;
use outbox_relay::sink::amqp::AmqpSink;
use uuid::Uuid;

use crate::fixture::{
    arrivals, broker, checkpoint, database, prefill, prefill_for_drain, publishing_connection, sample_event,
};
use crate::meter::{proc_usage, Meter, Run};
use crate::{Error, Options};

/// A bare publisher: the relay's messages (same properties, same size),
/// the same confirm window the relay keeps in flight (batch size ×
/// workers, over as many channels), no database at all. Each channel keeps
/// its window full: a new message goes out as soon as one is confirmed.
pub async fn bare_publisher(options: &Options) -> Result<Run, Error> {
    let broker = broker(options).await;
    let _arrivals = arrivals(&broker).await?;
    let events: Arc<Vec<Event>> = Arc::new((0..options.rows).map(sample_event).collect());
    let publisher = publishing_connection(options).await?;
    let meter = Meter::start();
    let mut loops = Vec::new();
    for lane in 0..options.workers {
        let channel = publisher.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        let (events, exchange, window) = (events.clone(), broker.exchange.clone(), options.batch_size);
        let workers = options.workers;
        loops.push(tokio::spawn(async move {
            let mut in_flight = futures::stream::FuturesUnordered::new();
            for event in events.iter().skip(lane).step_by(workers) {
                if in_flight.len() >= window {
                    let confirmation: Result<Confirmation, lapin::Error> =
                        in_flight.next().await.expect("a confirm");
                    assert!(confirmation?.is_ack());
                }
                let (channel, exchange) = (&channel, exchange.as_str());
                in_flight.push(async move { publish(channel, exchange, event).await?.await });
            }
            while let Some(confirmation) = in_flight.next().await {
                assert!(confirmation?.is_ack());
            }
            Ok::<(), Error>(())
        }));
    }
    for handle in loops {
        handle.await??;
    }
    let run = meter.finish(options.rows);
    close(publisher).await;
    broker.cleanup().await;
    Ok(run)
}

/// Claims rows of the prefilled table inside `tx`, locking them.
const LOCKING_CLAIM: &str =
    "SELECT id, causation_id, event_type::text, aggregate_id::text, payload::text, created_at
     FROM outbox_event
     WHERE published_at IS NULL AND quarantined_at IS NULL AND next_attempt_at <= now()
     ORDER BY created_at, id LIMIT $1 FOR UPDATE SKIP LOCKED";

const MARK_BATCH: &str = "UPDATE outbox_event SET published_at = now() WHERE id = ANY($1)";

fn event_of(row: &tokio_postgres::Row) -> Event {
    Event {
        id: row.get(0),
        causation_id: row.get(1),
        event_type: row.get(2),
        aggregate_id: row.get(3),
        payload: row.get(4),
        created_at: row.get(5),
        attempt_count: 1,
        headers: Default::default(),
    }
}

async fn publish(
    channel: &lapin::Channel,
    exchange: &str,
    event: &Event,
) -> Result<lapin::PublisherConfirm, lapin::Error> {
    channel
        .basic_publish(
            exchange.into(),
            event.event_type.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            event.payload.as_bytes(),
            AmqpSink::properties(event),
        )
        .await
}

/// The simplest correct relay: per batch one transaction; each row
/// published and its confirm awaited before the next; one UPDATE per row.
pub async fn naive_relay(options: &Options) -> Result<Run, Error> {
    let db = database(options).await;
    let broker = broker(options).await;
    prefill(&db, options.naive_rows).await?;
    let _arrivals = arrivals(&broker).await?;
    let publisher = publishing_connection(options).await?;
    let channel = publisher.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut client = db.connect().await;
    let meter = Meter::start();
    loop {
        let tx = client.transaction().await?;
        let rows = tx.query(LOCKING_CLAIM, &[&100i64]).await?;
        if rows.is_empty() {
            break;
        }
        for row in &rows {
            let event = event_of(row);
            let confirmation = publish(&channel, &broker.exchange, &event).await?.await?;
            assert!(confirmation.is_ack());
            tx.execute(
                "UPDATE outbox_event SET published_at = now() WHERE id = $1",
                &[&event.id],
            )
            .await?;
        }
        tx.commit().await?;
    }
    let run = meter.finish(options.naive_rows);
    close(publisher).await;
    broker.cleanup().await;
    Ok(run)
}

/// A run of the row-lock loop, and the CPU its process used.
pub struct RowLock {
    pub run: Run,
    pub client_cpu_seconds: f64,
}

/// The row-lock alternative to the committed lease, at its best: per batch
/// one transaction holding the rows' locks across the publish, the batch's
/// publishes started together and their confirms awaited together, one
/// UPDATE for the batch; `--workers` loops at once, a channel each, like
/// the relay. One row version per publish instead of the lease's two, but
/// a transaction stays open for every broker round trip.
///
/// The loops run in a process of their own, this benchmark started again
/// with `--row-lock-database`, as the relay runs in its own: their CPU is
/// then read the way the relay's is, and neither shares a runtime or a
/// core's caches with the consumer that counts arrivals here. Like the
/// relay, the process connects inside the measured time.
pub async fn lock_relay(options: &Options) -> Result<RowLock, Error> {
    let db = database(options).await;
    let broker = broker(options).await;
    prefill_for_drain(&db, options, options.rows).await?;
    checkpoint(&db).await?;
    let arrivals = arrivals(&broker).await?;
    let meter = Meter::start();
    let mut loops = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--row-lock-database",
            &db.url,
            "--row-lock-exchange",
            &broker.exchange,
        ])
        .args(["--amqp-url", &options.amqp_url])
        .args(["--batch-size", &options.batch_size.to_string()])
        .args(["--workers", &options.workers.to_string()])
        .args(
            options
                .row_lock_synchronous_commit
                .iter()
                .flat_map(|level| ["--row-lock-synchronous-commit", level]),
        )
        .spawn()?;
    // Until it is reaped, an exited process's /proc entry still holds its
    // CPU times, so the last reading before the reap is the whole run's.
    let client_cpu_seconds = loop {
        let used = proc_usage(loops.id()).1;
        if let Some(status) = loops.try_wait()? {
            if !status.success() {
                return Err(format!("the row-lock loops failed: {status}").into());
            }
            break used;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    while arrivals.lock().unwrap().len() < options.rows {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = meter.finish(options.rows);
    broker.cleanup().await;
    Ok(RowLock {
        run,
        client_cpu_seconds,
    })
}

/// The row-lock loop process: `--workers` loops on `database` until no row
/// is left, each with its connection and channel.
pub async fn row_lock_loops(options: &Options, database: &str, exchange: &str) -> Result<(), Error> {
    let publisher = publishing_connection(options).await?;
    let database = match &options.row_lock_synchronous_commit {
        Some(level) => {
            let separator = if database.contains('?') { '&' } else { '?' };
            format!("{database}{separator}options=-c%20synchronous_commit%3D{level}")
        }
        None => database.to_owned(),
    };
    let mut loops = Vec::new();
    for _ in 0..options.workers {
        let mut client = outbox_test_support::db::connect(&database).await;
        if let Some(level) = &options.row_lock_synchronous_commit {
            let set: String = client.query_one("SHOW synchronous_commit", &[]).await?.get(0);
            assert_eq!(&set, level, "the loop's synchronous_commit");
        }
        let channel = publisher.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        let exchange = exchange.to_owned();
        let batch_size = options.batch_size as i64;
        // Prepared once per loop, as a hand-written loop would: each batch
        // is then two round trips of statements PostgreSQL has planned.
        let claim = client.prepare(LOCKING_CLAIM).await?;
        let mark = client.prepare(MARK_BATCH).await?;
        loops.push(tokio::spawn(async move {
            loop {
                let tx = client.transaction().await?;
                let rows = tx.query(&claim, &[&batch_size]).await?;
                if rows.is_empty() {
                    return Ok::<(), Error>(());
                }
                let events: Vec<Event> = rows.iter().map(event_of).collect();
                let sent =
                    futures::future::join_all(events.iter().map(|e| publish(&channel, &exchange, e))).await;
                let mut confirms = Vec::with_capacity(sent.len());
                for confirm in sent {
                    confirms.push(confirm?);
                }
                for confirmation in futures::future::join_all(confirms).await {
                    assert!(confirmation?.is_ack());
                }
                let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
                tx.execute(&mark, &[&ids]).await?;
                tx.commit().await?;
            }
        }));
    }
    for handle in loops {
        handle.await??;
    }
    close(publisher).await;
    Ok(())
}

/// Closes a baseline's publishing connection: 200 is AMQP's normal close.
/// Bounded, so that a close-ok that never comes cannot hang the benchmark
/// after its run was measured.
async fn close(publisher: lapin::Connection) {
    let _ = tokio::time::timeout(Duration::from_secs(5), publisher.close(200, "done".into())).await;
}
