//! A RabbitMQ topic exchange and queue of their own per test, and a
//! consumer that reads every property back.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};

use crate::unique;

/// Where the tests find RabbitMQ.
pub fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A message as a consumer received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub message_id: String,
    pub kind: Option<String>,
    pub content_type: Option<String>,
    pub delivery_mode: Option<u8>,
    pub timestamp: Option<u64>,
    pub headers: HashMap<String, String>,
    pub routing_key: String,
    pub body: Vec<u8>,
}

/// A topic exchange and a queue of their own for one test, deleted at the end.
pub struct TestBroker {
    pub exchange: String,
    pub queue: String,
    /// The broker's URL, which the relay is given too.
    pub url: String,
    connection: Connection,
    channel: lapin::Channel,
}

impl TestBroker {
    /// Declares an exchange and a queue bound with `binding_key` on the
    /// tests' RabbitMQ.
    pub async fn create(binding_key: &str) -> Self {
        Self::create_at(&amqp_url(), binding_key).await
    }

    /// Declares an exchange and a queue bound with `binding_key` on the
    /// RabbitMQ at `amqp_url`.
    pub async fn create_at(amqp_url: &str, binding_key: &str) -> Self {
        Self::create_with_queue_arguments(amqp_url, binding_key, FieldTable::default()).await
    }

    /// Declares an exchange and a queue bound with `binding_key` on the
    /// tests' RabbitMQ, the queue holding at most `max_length` messages and
    /// refusing more (`x-overflow: reject-publish`): once full, the broker
    /// nacks every message published to it, which a relay must take as
    /// backpressure. [`TestBroker::fill`] fills it, [`TestBroker::purge`]
    /// makes room again.
    pub async fn create_rejecting_beyond(binding_key: &str, max_length: i64) -> Self {
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(max_length));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        Self::create_with_queue_arguments(&amqp_url(), binding_key, arguments).await
    }

    /// Declares an exchange and a queue bound with `binding_key` on the
    /// RabbitMQ at `amqp_url`, the queue declared with `queue_arguments`
    /// (beside the expiry every test queue has).
    pub async fn create_with_queue_arguments(
        amqp_url: &str,
        binding_key: &str,
        queue_arguments: FieldTable,
    ) -> Self {
        let connection = Connection::connect(amqp_url, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach RabbitMQ at {amqp_url}: {e}\nstart it with: rabbitmq-server -detached \
                     (or set OUTBOX_TEST_AMQP_URL)"
                )
            });
        let channel = connection.create_channel().await.expect("channel");
        let exchange = unique("outbox-test-x");
        let queue = unique("outbox-test-q");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                // Goes with its queue's binding, so a test that panics
                // before cleanup() leaves nothing behind for long.
                ExchangeDeclareOptions {
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare exchange");
        // Unused for 15 minutes (no consumer, no declare), the broker deletes
        // the queue: far longer than any test, short enough to reclaim what
        // a failed test left.
        let mut queue_arguments = queue_arguments;
        queue_arguments.insert("x-expires".into(), AMQPValue::LongLongInt(900_000));
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                queue_arguments,
            )
            .await
            .expect("declare queue");
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                binding_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind queue");
        Self {
            exchange,
            queue,
            url: amqp_url.to_owned(),
            connection,
            channel,
        }
    }

    /// Receives messages until `count` arrived or `within` passed; returns
    /// what arrived (acknowledged).
    pub async fn receive(&self, count: usize, within: Duration) -> Vec<Received> {
        self.receive_as(count, within, |delivery| {
            let properties = &delivery.properties;
            let headers = properties
                .headers()
                .as_ref()
                .map(|table| {
                    table
                        .inner()
                        .iter()
                        .map(|(key, value)| {
                            let text = match value {
                                lapin::types::AMQPValue::LongString(s) => s.to_string(),
                                other => format!("{other:?}"),
                            };
                            (key.to_string(), text)
                        })
                        .collect()
                })
                .unwrap_or_default();
            Received {
                message_id: message_id(delivery),
                kind: properties.kind().as_ref().map(|s| s.to_string()),
                content_type: properties.content_type().as_ref().map(|s| s.to_string()),
                delivery_mode: *properties.delivery_mode(),
                timestamp: *properties.timestamp(),
                headers,
                routing_key: delivery.routing_key.to_string(),
                body: delivery.data.clone(),
            }
        })
        .await
    }

    /// The connection the exchange and queue were declared on, for channels
    /// of the caller's own.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Receives like [`TestBroker::receive`], keeping only the message ids,
    /// for tests whose messages are large.
    pub async fn receive_ids(&self, count: usize, within: Duration) -> Vec<String> {
        self.receive_as(count, within, message_id).await
    }

    /// Receives and acknowledges messages until `count` arrived or `within`
    /// passed, keeping what `keep` takes from each.
    async fn receive_as<T>(&self, count: usize, within: Duration, keep: impl Fn(&Delivery) -> T) -> Vec<T> {
        // A channel per call: closing it hands any message delivered past
        // `count` (prefetched, never acked) back to the queue.
        let channel = self.connection.create_channel().await.expect("consumer channel");
        let mut consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                unique("consumer").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let deadline = tokio::time::Instant::now() + within;
        let mut received = Vec::new();
        while received.len() < count {
            let next = tokio::time::timeout_at(deadline, consumer.next()).await;
            let Ok(Some(Ok(delivery))) = next else { break };
            delivery.ack(BasicAckOptions::default()).await.expect("ack");
            received.push(keep(&delivery));
        }
        let _ = channel.close(200, "done".into()).await;
        received
    }

    /// The relay settings that publish to this test's exchange on this
    /// test's broker.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OUTBOX_AMQP_EXCHANGE", self.exchange.clone()),
            ("OUTBOX_AMQP_URL", self.url.clone()),
        ]
    }

    /// Publishes `count` messages of the test's own (message id
    /// [`FILLER_ID`]) straight to the queue, each confirmed: a queue made by
    /// [`TestBroker::create_rejecting_beyond`] with `max_length` = `count`
    /// is then full, and nacks whatever comes next.
    pub async fn fill(&self, count: usize) {
        let channel = self.connection.create_channel().await.expect("filler channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("publisher confirms");
        for _ in 0..count {
            let confirmation = channel
                .basic_publish(
                    "".into(),
                    self.queue.as_str().into(),
                    BasicPublishOptions::default(),
                    b"{}",
                    BasicProperties::default().with_message_id(FILLER_ID.into()),
                )
                .await
                .expect("publish filler")
                .await
                .expect("filler confirmed");
            assert!(
                confirmation.is_ack(),
                "the queue {} refused a filler message: it was full already",
                self.queue
            );
        }
        let _ = channel.close(200, "done".into()).await;
    }

    /// Messages ready in the queue.
    pub async fn message_count(&self) -> u32 {
        self.channel
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive queue declare")
            .message_count()
    }

    /// Removes every ready message from the queue; returns how many.
    pub async fn purge(&self) -> u32 {
        self.channel
            .queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default())
            .await
            .expect("purge queue")
    }

    /// The settings of a configuration file's `[[destination]]` (sink
    /// `rabbitmq`) that publishes to this test's exchange through
    /// `amqp_url` (this broker, or a proxy in front of it).
    pub fn destination_settings_via(&self, amqp_url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("amqp_url", amqp_url.to_owned()),
            ("amqp_exchange", self.exchange.clone()),
        ]
    }

    /// [`TestBroker::destination_settings_via`] this test's broker.
    pub fn destination_settings(&self) -> Vec<(&'static str, String)> {
        self.destination_settings_via(&self.url)
    }

    /// Deletes the queue and exchange.
    pub async fn cleanup(self) {
        let _ = self
            .channel
            .queue_delete(self.queue.as_str().into(), Default::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(self.exchange.as_str().into(), Default::default())
            .await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// The message id of what [`TestBroker::fill`] publishes: no row's id.
pub const FILLER_ID: &str = "filler";

/// The message id a delivery carries, or "" without one.
fn message_id(delivery: &Delivery) -> String {
    delivery
        .properties
        .message_id()
        .as_ref()
        .map(|s| s.to_string())
        .unwrap_or_default()
}
