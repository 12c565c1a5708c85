//! Kafka's answers, one case each (docs/kafka.md#broker-answers), on a
//! cluster of the case's own (librdkafka's mock cluster, which injects
//! them): every produce request refused for the topic's authorisation, an
//! idempotent producer id refused for the cluster's, not enough in-sync
//! replicas, every broker down, brokers that stop answering, no topic of
//! the template at all (outages); a topic that does not exist while others
//! of the template do (the row's, retried); a payload over the producer's
//! `message.max.bytes`, a record over it with its headers, and a topic
//! name Kafka refuses (the row's, quarantined at once); a whole produce request refused as too large
//! (split, everything delivered).

use std::collections::HashSet;
use std::time::Duration;

use futures::future::BoxFuture;
use uuid::Uuid;

use super::kit::{Bench, Broker, RowFault};
use crate::common::{unique_topic, KafkaApi, KafkaMock};

/// Far more requests than a case sends while its fault lasts: an error
/// pushed this many times is answered until the case clears it.
const EVERY_REQUEST: usize = 100_000;

/// Partitions of every topic a case creates.
const PARTITIONS: i32 = 3;

/// A cluster of the case's own, the relay's topic template
/// `<prefix>.{event_type}`, and the event types whose topics are read back.
struct Kafka {
    mock: KafkaMock,
    prefix: String,
    /// Event types the case inserts rows of; [`Broker::received`] reads
    /// each one's topic (one that does not exist reads as empty).
    event_types: Vec<String>,
    /// `OUTBOX_KAFKA_PROPERTIES`, when the case sets producer properties.
    properties: Option<String>,
}

impl Kafka {
    /// A cluster of `brokers` brokers and no topic yet; rows of
    /// `event_types` (and the kit's `conformance.before`) are read back.
    fn without_topics(brokers: i32, event_types: &[&str]) -> Self {
        let mut event_types: Vec<String> = event_types.iter().map(|t| (*t).to_owned()).collect();
        event_types.push("conformance.before".to_owned());
        Self {
            mock: KafkaMock::start(brokers),
            prefix: unique_topic("conformance"),
            event_types,
            properties: None,
        }
    }

    /// Such a cluster with a topic for each event type.
    fn new(brokers: i32, event_types: &[&str]) -> Self {
        let kafka = Self::without_topics(brokers, event_types);
        kafka.create_topics();
        kafka
    }

    fn topic(&self, event_type: &str) -> String {
        format!("{}.{event_type}", self.prefix)
    }

    /// Creates the topic of every event type, as an operator would.
    fn create_topics(&self) {
        for event_type in &self.event_types {
            self.mock.create_topic(&self.topic(event_type), PARTITIONS);
        }
    }
}

impl Broker for Kafka {
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.mock.env(&format!("{}.{{event_type}}", self.prefix));
        if let Some(properties) = &self.properties {
            env.push(("OUTBOX_KAFKA_PROPERTIES", properties.clone()));
        }
        env
    }

    fn received(&self) -> BoxFuture<'_, HashSet<Uuid>> {
        Box::pin(async move {
            let mut ids = HashSet::new();
            for event_type in &self.event_types {
                ids.extend(self.mock.event_ids(&self.topic(event_type)).await);
            }
            ids
        })
    }
}

/// Every produce request refused: the relay is not allowed to write to
/// the topic (a missing ACL), which any row would be told.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_authorization_failure_is_an_outage() {
    let mut bench = Bench::new(Kafka::new(1, &["conformance.during"])).await;
    bench.start_delivering(&[]).await;
    bench
        .broker
        .mock
        .push_errors(KafkaApi::Produce, EVERY_REQUEST, "TOPIC_AUTHORIZATION_FAILED");
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage("TopicAuthorizationFailed").await;
    bench.broker.mock.clear_errors(KafkaApi::Produce);
    bench.assert_delivered(&during).await;
}

/// The idempotent producer may not have a producer id (the relay lacks
/// the cluster's IdempotentWrite permission): nothing can be produced.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_authorization_failure_is_an_outage() {
    let mut bench = Bench::new(Kafka::new(1, &["conformance.early"])).await;
    bench.broker.mock.push_errors(
        KafkaApi::InitProducerId,
        EVERY_REQUEST,
        "CLUSTER_AUTHORIZATION_FAILED",
    );
    let ids = bench.insert(100, "conformance.early").await;
    bench.start(&[]);
    bench.assert_outage("ClusterAuthorizationFailed").await;
    bench.broker.mock.clear_errors(KafkaApi::InitProducerId);
    bench.assert_delivered(&ids).await;
}

/// Fewer in-sync replicas than the topic's `min.insync.replicas`: retried
/// inside the producer, so the relay sees its publish deadline pass.
#[tokio::test(flavor = "multi_thread")]
async fn not_enough_replicas_is_an_outage() {
    let mut bench = Bench::new(Kafka::new(1, &["conformance.during"])).await;
    bench.start_delivering(&[("OUTBOX_PUBLISH_TIMEOUT", "2s")]).await;
    bench
        .broker
        .mock
        .push_errors(KafkaApi::Produce, EVERY_REQUEST, "NOT_ENOUGH_REPLICAS");
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage("OUTBOX_PUBLISH_TIMEOUT").await;
    bench.broker.mock.clear_errors(KafkaApi::Produce);
    bench.assert_delivered(&during).await;
}

/// Every broker of a three-broker cluster down: connections refused.
#[tokio::test(flavor = "multi_thread")]
async fn brokers_that_cannot_be_reached_are_an_outage() {
    let mut bench = Bench::new(Kafka::new(3, &["conformance.during"])).await;
    bench.start_delivering(&[]).await;
    bench.broker.mock.all_down();
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage("Kafka brokers unreachable").await;
    bench.broker.mock.all_up();
    bench.assert_delivered(&during).await;
}

/// A broker that keeps its connections open and answers nothing (an
/// hour's round trip) until the case restores it.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_that_stops_answering_is_an_outage() {
    let mut bench = Bench::new(Kafka::new(1, &["conformance.during"])).await;
    bench.start_delivering(&[("OUTBOX_PUBLISH_TIMEOUT", "2s")]).await;
    // The mock applies a broker's round-trip time when it writes each
    // answer, so answers held back go out as soon as it is zero again.
    bench.broker.mock.round_trip_time(1, Duration::from_secs(3600));
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage("OUTBOX_PUBLISH_TIMEOUT").await;
    bench.broker.mock.round_trip_time(1, Duration::ZERO);
    bench.assert_delivered(&during).await;
}

/// No topic of the template exists yet: the operator has not created
/// them (the relay never does).
#[tokio::test(flavor = "multi_thread")]
async fn no_topic_is_an_outage() {
    let mut bench = Bench::new(Kafka::without_topics(1, &["conformance.early"])).await;
    let ids = bench.insert(100, "conformance.early").await;
    bench.start(&[]);
    bench.assert_outage("no Kafka topic matches").await;
    bench.broker.create_topics();
    bench.assert_delivered(&ids).await;
}

/// Topics of the template exist but not this row's: the row's failed
/// attempt, as an unroutable RabbitMQ message is.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_that_does_not_exist_among_others_is_the_rows_retry() {
    // `nowhere` is read back too, so a record that reached it would count.
    let kafka = Kafka::without_topics(1, &["routed.a", "nowhere"]);
    kafka.mock.create_topic(&kafka.topic("routed.a"), PARTITIONS);
    let mut bench = Bench::new(kafka).await;
    let (bad, good) = bench
        .among_good_rows("routed.a", async { bench.insert(1, "nowhere").await[0] })
        .await;
    bench.start(&[]);
    bench
        .assert_row_fault(bad, RowFault::Retry, "does not exist", &good)
        .await;
}

/// With `message.max.bytes=2000`, a row whose payload is `blob` bytes of
/// JSON string among good rows: refused for its own sake, at once, with a
/// reason that contains `reason`.
async fn over_message_max_bytes(blob: usize, reason: &str) {
    let mut kafka = Kafka::new(1, &["conformance.small", "conformance.big"]);
    kafka.properties = Some("message.max.bytes=2000".to_owned());
    let mut bench = Bench::new(kafka).await;
    let payload = format!("{{\"blob\": \"{}\"}}", "x".repeat(blob));
    let (bad, good) = bench
        .among_good_rows(
            "conformance.small",
            bench.insert_row("conformance.big", "a", &payload),
        )
        .await;
    bench.start(&[]);
    bench.assert_row_fault(bad, RowFault::Reject, reason, &good).await;
}

/// A payload over the producer's `message.max.bytes`: the claim does not
/// even load it (as on every sink, the sink's largest message bounds what
/// a claim reads), and it can never fit.
#[tokio::test(flavor = "multi_thread")]
async fn a_payload_over_message_max_bytes_is_rejected() {
    over_message_max_bytes(3000, "exceeds the largest message").await;
}

/// A payload under the producer's `message.max.bytes` that goes over it
/// with its key and headers: librdkafka refuses the record when it is
/// handed over, before sending, and it can never fit.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_over_message_max_bytes_with_its_headers_is_rejected() {
    over_message_max_bytes(1950, "message.max.bytes").await;
}

/// An event type the template turns into a topic name Kafka refuses (a
/// space): refused before sending.
#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_topic_name_is_rejected() {
    let mut bench = Bench::new(Kafka::new(1, &["conformance.good"])).await;
    let (bad, good) = bench
        .among_good_rows(
            "conformance.good",
            bench.insert_row("bad type", "a", r#"{"n": 1}"#),
        )
        .await;
    bench.start(&[]);
    bench
        .assert_row_fault(bad, RowFault::Reject, "not a valid Kafka topic name", &good)
        .await;
}

/// A whole produce request refused as too large (the broker's limit on a
/// request, which the relay cannot know): its records are sent again one
/// by one, so none is charged for its batch-mates and all arrive.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_refused_as_too_large_is_split() {
    let mut bench = Bench::new(Kafka::new(1, &["conformance.split"])).await;
    let ids = bench.insert(100, "conformance.split").await;
    bench
        .broker
        .mock
        .push_errors(KafkaApi::Produce, 1, "MSG_SIZE_TOO_LARGE");
    bench.start(&[]);
    bench.assert_delivered(&ids).await;
}
