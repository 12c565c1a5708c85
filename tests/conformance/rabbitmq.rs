//! RabbitMQ's answers, one case each (docs/rabbitmq.md#broker-answers):
//! a nack from a full `reject-publish` queue, a connection that cannot be
//! made, a broker that stops answering, a deleted exchange (outages); an
//! unroutable message (the row's, retried); a message over the relay's
//! limit and one over the broker's, which closes the channel (the row's,
//! quarantined at once).

use std::collections::HashSet;
use std::sync::Arc;

use futures::future::BoxFuture;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use uuid::Uuid;

use super::kit::{Bench, Broker, RowFault};
use crate::common::amqp_url;
use crate::common::private_rabbit::PrivateRabbit;
use crate::common::proxy::Proxy;

/// An exchange and one queue bound to it, declared for one case.
struct Rabbit {
    exchange: String,
    queue: String,
    binding_key: String,
    /// Where the relay connects: the broker, or a proxy in front of it.
    relay_url: String,
    proxy: Option<Arc<Proxy>>,
    _connection: Connection,
    channel: Channel,
}

impl Rabbit {
    /// On the shared RabbitMQ, with the queue's `arguments`.
    async fn create(binding_key: &str, arguments: FieldTable) -> Self {
        Self::create_at(&amqp_url(), binding_key, arguments).await
    }

    async fn create_at(url: &str, binding_key: &str, arguments: FieldTable) -> Self {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| {
                panic!("cannot reach RabbitMQ at {url}: {e}\nstart it with: rabbitmq-server -detached")
            });
        let channel = connection.create_channel().await.expect("channel");
        let suffix = Uuid::new_v4().simple().to_string();
        let rabbit = Self {
            exchange: format!("conformance-x-{suffix}"),
            queue: format!("conformance-q-{suffix}"),
            binding_key: binding_key.to_owned(),
            relay_url: url.to_owned(),
            proxy: None,
            _connection: connection,
            channel,
        };
        let mut arguments = arguments;
        // A queue a failed case leaves behind goes after 15 minutes.
        arguments.insert("x-expires".into(), AMQPValue::LongLongInt(900_000));
        rabbit
            .channel
            .queue_declare(
                rabbit.queue.as_str().into(),
                QueueDeclareOptions::default(),
                arguments,
            )
            .await
            .expect("declare queue");
        rabbit.declare_exchange().await;
        rabbit
    }

    /// Declares the exchange and binds the queue to it.
    async fn declare_exchange(&self) {
        self.channel
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare exchange");
        self.channel
            .queue_bind(
                self.queue.as_str().into(),
                self.exchange.as_str().into(),
                self.binding_key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind queue");
    }

    /// The relay reaches the broker through a proxy the case controls.
    async fn behind_proxy(mut self) -> Self {
        let url = url::Url::parse(&self.relay_url).expect("AMQP URL");
        let target = (url.host_str().expect("host"), url.port().unwrap_or(5672));
        let target = tokio::net::lookup_host(target)
            .await
            .expect("resolve RabbitMQ")
            .next()
            .expect("an address");
        let proxy = Proxy::start(target).await;
        let mut via = url.clone();
        via.set_port(Some(proxy.addr.port())).expect("port");
        via.set_host(Some("127.0.0.1")).expect("host");
        self.relay_url = via.to_string();
        self.proxy = Some(Arc::new(proxy));
        self
    }

    fn proxy(&self) -> &Proxy {
        self.proxy.as_deref().expect("a proxy")
    }

    async fn cleanup(&self) {
        let _ = self
            .channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(self.exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
}

impl Broker for Rabbit {
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OUTBOX_SINK", "rabbitmq".to_owned()),
            ("OUTBOX_AMQP_URL", self.relay_url.clone()),
            ("OUTBOX_AMQP_EXCHANGE", self.exchange.clone()),
        ]
    }

    fn received(&self) -> BoxFuture<'_, HashSet<Uuid>> {
        Box::pin(async move {
            let mut ids = HashSet::new();
            while let Ok(Some(message)) = self
                .channel
                .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
            {
                if let Some(id) = message
                    .delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .and_then(|id| id.as_str().parse().ok())
                {
                    ids.insert(id);
                }
            }
            ids
        })
    }
}

fn reject_publish(max_length: i64) -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(max_length));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    arguments
}

/// Backpressure: a queue full with `x-overflow=reject-publish` nacks every
/// message; no consumer for a while. Nothing is charged; everything arrives
/// once a consumer drains the queue (the kit's reading does).
#[tokio::test(flavor = "multi_thread")]
async fn a_full_reject_publish_queue_is_backpressure() {
    let mut bench = Bench::new(Rabbit::create("#", reject_publish(50)).await).await;
    let ids = bench.insert(300, "conformance.full").await;
    bench.start(&[]);
    bench.assert_outage("nacked").await;
    bench.assert_delivered(&ids).await;
    bench.broker.cleanup().await;
}

/// A connection that cannot be made (refused, then every open one cut).
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_that_cannot_be_reached_is_an_outage() {
    let mut bench = Bench::new(
        Rabbit::create("#", FieldTable::default())
            .await
            .behind_proxy()
            .await,
    )
    .await;
    bench.start_delivering(&[]).await;
    bench.broker.proxy().refuse(true);
    bench.broker.proxy().cut();
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage("unreachable").await;
    bench.broker.proxy().refuse(false);
    bench.assert_delivered(&during).await;
    bench.broker.cleanup().await;
}

/// A broker that stops answering with its connection open: nothing is
/// confirmed by the publish timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_that_stops_answering_is_an_outage() {
    let mut bench = Bench::new(
        Rabbit::create("#", FieldTable::default())
            .await
            .behind_proxy()
            .await,
    )
    .await;
    bench.start_delivering(&[("OUTBOX_PUBLISH_TIMEOUT", "2s")]).await;
    bench.broker.proxy().stall(true);
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage("OUTBOX_PUBLISH_TIMEOUT").await;
    bench.broker.proxy().stall(false);
    bench.assert_delivered(&during).await;
    bench.broker.cleanup().await;
}

/// The exchange is deleted while the relay publishes to it: RabbitMQ
/// closes the channel (404), which any message would get.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_exchange_is_an_outage() {
    let mut bench = Bench::new(Rabbit::create("#", FieldTable::default()).await).await;
    bench.start_delivering(&[]).await;
    bench
        .broker
        .channel
        .exchange_delete(
            bench.broker.exchange.as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await
        .expect("delete exchange");
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage(&bench.broker.exchange.clone()).await;
    bench.broker.declare_exchange().await;
    bench.assert_delivered(&during).await;
    bench.broker.cleanup().await;
}

/// An unroutable message (`mandatory`, no binding for its key) comes back:
/// a failed attempt of that row, quarantined once out of attempts.
#[tokio::test(flavor = "multi_thread")]
async fn an_unroutable_message_is_the_rows_retry() {
    let mut bench = Bench::new(Rabbit::create("conformance.routed.#", FieldTable::default()).await).await;
    let (bad, good) = bench
        .among_good_rows("conformance.routed.a", async {
            bench.insert(1, "conformance.nowhere").await[0]
        })
        .await;
    bench.start(&[]);
    bench
        .assert_row_fault(bad, RowFault::Retry, "unroutable", &good)
        .await;
    bench.broker.cleanup().await;
}

/// A payload over `OUTBOX_AMQP_MAX_MESSAGE_BYTES` is never loaded or sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_over_the_configured_limit_is_rejected_before_sending() {
    let mut bench = Bench::new(Rabbit::create("#", FieldTable::default()).await).await;
    let (bad, good) = bench
        .among_good_rows(
            "conformance.small",
            bench.insert_row(
                "conformance.big",
                "a",
                &format!("{{\"blob\": \"{}\"}}", "x".repeat(4000)),
            ),
        )
        .await;
    bench.start(&[("OUTBOX_AMQP_MAX_MESSAGE_BYTES", "2048")]);
    bench
        .assert_row_fault(bad, RowFault::Reject, "exceeds", &good)
        .await;
    bench.broker.cleanup().await;
}

/// A message over the broker's own `max_message_size`, which the relay was
/// not told: RabbitMQ closes the channel; halving finds the row among its
/// batch-mates and quarantines it alone with the broker's reason.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_that_makes_the_broker_close_the_channel_is_isolated() {
    let rabbit = PrivateRabbit::start("max_message_size = 4096").await;
    let mut bench = Bench::new(Rabbit::create_at(&rabbit.amqp_url(), "#", FieldTable::default()).await).await;
    let mut good = bench.insert(40, "conformance.small").await;
    let bad = bench
        .insert_row(
            "conformance.big",
            "a",
            &format!("{{\"blob\": \"{}\"}}", "x".repeat(8000)),
        )
        .await;
    good.extend(bench.insert(40, "conformance.small").await);
    bench.start(&[]);
    bench
        .assert_row_fault(bad, RowFault::Reject, "closed the channel", &good)
        .await;
    bench.broker.cleanup().await;
}
