//! A RabbitMQ consumer of outbox-relay's messages that applies each event
//! once, with `outbox_consumer`.
//!
//! For every delivery: begin a transaction → claim the message id → apply
//! the effect only if the claim is the first → commit → acknowledge. A
//! crash before the commit leaves neither the effect nor the mark (the
//! redelivery applies it); a crash after the commit and before the ack
//! leaves both (the redelivery is a duplicate and is only acknowledged).
//!
//! Run it beside the relay (`docker compose up`, or a local PostgreSQL and
//! RabbitMQ):
//!
//! ```text
//! CONSUMER_DATABASE_URL=postgres://postgres@localhost:5432/postgres \
//! CONSUMER_QUEUE=orders-projection CONSUMER_BINDING_KEY='order.#' \
//!     cargo run --example consumer
//! ```
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `CONSUMER_DATABASE_URL` | `postgres://postgres@localhost:5432/postgres` | the consumer's own database (effects and marks) |
//! | `CONSUMER_AMQP_URL` | `amqp://guest:guest@localhost:5672/%2f` | RabbitMQ |
//! | `CONSUMER_QUEUE` | `outbox-consumer-example` | queue to consume (declared durable if missing) |
//! | `CONSUMER_EXCHANGE` | `amq.topic` | exchange the queue is bound to (the relay's `OUTBOX_AMQP_EXCHANGE`); empty: no binding |
//! | `CONSUMER_BINDING_KEY` | `#` | binding key |
//! | `CONSUMER_NAME` | `example-consumer` | the deduplication namespace in `processed_message` |
//! | `CONSUMER_RETENTION` | `14` (days) | marks older than this are purged, hourly |
//!
//! The effect here is a row in `example_event_log`; a real consumer
//! updates its own tables the same way, through the same transaction.

use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use outbox_consumer::{Claim, Deduplicator};
use tokio_postgres::{Client, NoTls};
use tracing::{error, info, warn};
use uuid::Uuid;

/// Deliveries RabbitMQ may hand over before the first is acknowledged.
const PREFETCH: u16 = 32;

struct Settings {
    database_url: String,
    amqp_url: String,
    queue: String,
    exchange: String,
    binding_key: String,
    consumer_name: String,
    retention: Duration,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
        let days: u64 = var("CONSUMER_RETENTION", "14")
            .parse()
            .context("CONSUMER_RETENTION: a whole number of days")?;
        Ok(Self {
            database_url: var(
                "CONSUMER_DATABASE_URL",
                "postgres://postgres@localhost:5432/postgres",
            ),
            amqp_url: var("CONSUMER_AMQP_URL", "amqp://guest:guest@localhost:5672/%2f"),
            queue: var("CONSUMER_QUEUE", "outbox-consumer-example"),
            exchange: var("CONSUMER_EXCHANGE", "amq.topic"),
            binding_key: var("CONSUMER_BINDING_KEY", "#"),
            consumer_name: var("CONSUMER_NAME", "example-consumer"),
            retention: Duration::from_secs(days * 24 * 3600),
        })
    }
}

async fn connect_db(url: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .context("connecting to the consumer database")?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            warn!(error = %e, "database connection ended");
        }
    });
    Ok(client)
}

/// What became of one delivery.
enum Handled {
    /// Effect applied and committed (or already applied before): ack.
    Done(Claim),
    /// Can never be applied (no usable id, not JSON): reject without
    /// requeueing (a dead-letter exchange, if configured, keeps it).
    Poison(String),
}

/// The pattern: one transaction holds the mark and the effect.
async fn handle(client: &mut Client, dedup: &Deduplicator, delivery: &Delivery) -> Result<Handled> {
    let properties = &delivery.properties;
    let Some(Ok(message_id)) = properties
        .message_id()
        .as_ref()
        .map(|id| Uuid::parse_str(id.as_str()))
    else {
        return Ok(Handled::Poison("no message_id, or not a UUID".to_owned()));
    };
    let Ok(payload) = serde_json::from_slice::<serde_json::Value>(&delivery.data) else {
        return Ok(Handled::Poison(format!("message {message_id}: body is not JSON")));
    };
    let event_type = properties.kind().as_ref().map(|kind| kind.to_string());
    let aggregate_id =
        properties
            .headers()
            .as_ref()
            .and_then(|headers| match headers.inner().get("aggregate_id") {
                Some(AMQPValue::LongString(value)) => Some(value.to_string()),
                _ => None,
            });

    let tx = client.transaction().await?;
    let claim = dedup.claim(&tx, message_id).await?;
    if claim == Claim::First {
        tx.execute(
            "INSERT INTO example_event_log (message_id, event_type, aggregate_id, payload)
             VALUES ($1, $2, $3, $4)",
            &[&message_id, &event_type, &aggregate_id, &payload],
        )
        .await?;
    }
    // Dropping `tx` on an error above rolls the mark back with the effect.
    tx.commit().await?;
    Ok(Handled::Done(claim))
}

/// Forgets marks older than the retention, hourly, on a connection of its
/// own (the consumer's connection is busy with transactions).
async fn purge_hourly(settings_url: String, dedup: Deduplicator, retention: Duration) {
    let mut ticker = tokio::time::interval(Duration::from_secs(3600));
    loop {
        ticker.tick().await;
        let purged = match connect_db(&settings_url).await {
            Ok(client) => dedup
                .purge_older_than(&client, retention, 10_000)
                .await
                .map_err(Into::into),
            Err(e) => Err(e),
        };
        match purged {
            Ok(rows) => info!(rows, "purged old processed_message marks"),
            Err(e) => warn!(error = %e, "purging processed_message failed; will try next hour"),
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let settings = Settings::from_env()?;
    let dedup = Deduplicator::new(settings.consumer_name.clone());

    let mut client = connect_db(&settings.database_url).await?;
    outbox_consumer::migrate(&client)
        .await
        .context("creating processed_message")?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS example_event_log (
                 message_id   UUID NOT NULL,
                 event_type   TEXT,
                 aggregate_id TEXT,
                 payload      JSONB NOT NULL,
                 applied_at   TIMESTAMPTZ NOT NULL DEFAULT now()
             )",
        )
        .await
        .context("creating example_event_log")?;
    tokio::spawn(purge_hourly(
        settings.database_url.clone(),
        dedup.clone(),
        settings.retention,
    ));

    let connection = Connection::connect(&settings.amqp_url, ConnectionProperties::default())
        .await
        .context("connecting to RabbitMQ")?;
    let channel = connection.create_channel().await?;
    channel
        .queue_declare(
            settings.queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    if !settings.exchange.is_empty() {
        channel
            .queue_bind(
                settings.queue.as_str().into(),
                settings.exchange.as_str().into(),
                settings.binding_key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    channel.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    // Manual acknowledgements: `no_ack` stays false.
    let mut deliveries = channel
        .basic_consume(
            settings.queue.as_str().into(),
            settings.consumer_name.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    info!(queue = %settings.queue, consumer = %settings.consumer_name, "consuming");

    loop {
        let delivery = tokio::select! {
            next = deliveries.next() => match next {
                Some(delivery) => delivery?,
                None => break,
            },
            _ = tokio::signal::ctrl_c() => break,
        };
        match handle(&mut client, &dedup, &delivery).await {
            Ok(Handled::Done(claim)) => {
                // Acknowledged only after the commit: a crash in between
                // brings the message back, and the mark makes it a no-op.
                delivery.ack(BasicAckOptions::default()).await?;
                if claim == Claim::Duplicate {
                    info!(redelivered = delivery.redelivered, "duplicate skipped");
                }
            }
            Ok(Handled::Poison(reason)) => {
                error!(%reason, "rejecting a message that can never be applied");
                delivery.reject(BasicRejectOptions { requeue: false }).await?;
            }
            Err(e) => {
                // Nothing was committed: hand the message back and slow down.
                warn!(error = %e, "could not apply a message; it goes back to the queue");
                delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    })
                    .await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
                if client.is_closed() {
                    client = connect_db(&settings.database_url).await?;
                }
            }
        }
    }
    // Unacknowledged deliveries go back to the queue when the channel closes.
    let _ = channel.close(200, "shutting down".into()).await;
    let _ = connection.close(200, "shutting down".into()).await;
    info!("stopped");
    Ok(())
}
