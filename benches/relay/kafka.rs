//! The Kafka half of the benchmark: the relay draining prefilled rows into
//! a topic, next to a bare rdkafka producer that sends the same records
//! (the relay's key, headers and timestamp) with the same producer
//! settings (the relay's own configuration: idempotence, `acks=all`,
//! `murmur2_random`) and the same number of records in flight as the
//! relay keeps (batch size × workers).
//!
//! The broker is librdkafka's mock cluster in a process of its own (the
//! one the tests use), on a fresh topic of 6 partitions per run: it
//! speaks the protocol but stores in memory and replicates nothing, so the
//! numbers compare the relay with the bare producer, not with a real
//! cluster.

use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use outbox_relay::cloudevents::MessageFormat;
use outbox_relay::sink::kafka::{headers, KafkaConfig, KafkaSettings};
use outbox_test_support::kafka::{unique_topic, KafkaMock};
use outbox_test_support::RelayProcess;
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::fixture::{database, prefill, relay_settings, sample_event, until_published};
use crate::meter::proc_usage;
use crate::{Error, Options};

/// Partitions of each run's topic.
const PARTITIONS: i32 = 6;

/// One Kafka run's result.
pub struct KafkaRun {
    pub bare: f64,
    pub relay: f64,
    pub relay_peak_rss_mib: f64,
    pub in_flight: usize,
}

/// Events/s of a bare producer: the relay's records, at most `in_flight`
/// delivery reports outstanding, each awaited.
async fn bare(cluster: &KafkaMock, rows: usize, in_flight: usize) -> Result<f64, Error> {
    let prefix = unique_topic("bench");
    cluster.create_topic(&format!("{prefix}.order.created"), PARTITIONS);
    let template = format!("{prefix}.{{event_type}}");
    let config = KafkaConfig::parse(&KafkaSettings {
        brokers: Some(&cluster.bootstrap),
        topic: &template,
        security_protocol: "plaintext",
        ..KafkaSettings::default()
    })?;
    let producer: FutureProducer = config.client_config().create()?;
    let topic = format!("{prefix}.order.created");
    let events: Vec<_> = (0..rows).map(sample_event).collect();
    let started = Instant::now();
    let mut waiting: FuturesUnordered<rdkafka::producer::DeliveryFuture> = FuturesUnordered::new();
    let mut stored = 0;
    for event in &events {
        if waiting.len() >= in_flight {
            if let Some(report) = waiting.next().await {
                report?.map_err(|(e, _)| e)?;
                stored += 1;
            }
        }
        let record = FutureRecord::to(&topic)
            .key(event.aggregate_id.as_bytes())
            .payload(event.payload.as_bytes())
            .headers(headers(event, &MessageFormat::Plain))
            .timestamp(event.created_at.timestamp_millis());
        let delivery = producer.send_result(record).map_err(|(e, _)| e)?;
        waiting.push(delivery);
    }
    while let Some(report) = waiting.next().await {
        report?.map_err(|(e, _)| e)?;
        stored += 1;
    }
    let rate = rows as f64 / started.elapsed().as_secs_f64();
    if stored != rows {
        return Err(format!("bare producer: {stored} delivered of {rows}").into());
    }
    Ok(rate)
}

/// Events/s of the relay process, from its start to the last row marked
/// published (marked only after its delivery report), and its peak RSS.
async fn relay(cluster: &KafkaMock, options: &Options) -> Result<(f64, f64), Error> {
    let prefix = unique_topic("bench");
    cluster.create_topic(&format!("{prefix}.order.created"), PARTITIONS);
    let db = database(options).await;
    prefill(&db, options.kafka_rows).await?;
    let started = Instant::now();
    let mut settings = relay_settings(options, "unused");
    settings.extend(cluster.env(&format!("{prefix}.{{event_type}}")));
    let relay = RelayProcess::start(&db, &settings);
    let outcome = until_published(&db, Duration::from_millis(20)).await;
    let rate = options.kafka_rows as f64 / started.elapsed().as_secs_f64();
    let (peak_kib, _) = proc_usage(relay.child.id());
    drop(relay);
    outcome?;
    Ok((rate, peak_kib as f64 / 1024.0))
}

/// The bare producer, then the relay, on the same number of rows and the
/// same cluster.
pub async fn run(options: &Options) -> Result<KafkaRun, Error> {
    let in_flight = options.batch_size * options.workers;
    let cluster = KafkaMock::start(1);
    let bare = bare(&cluster, options.kafka_rows, in_flight).await?;
    eprintln!("Kafka bare producer: {bare:.0} msg/s");
    let (relay, relay_peak_rss_mib) = relay(&cluster, options).await?;
    eprintln!("Kafka relay: {relay:.0} events/s");
    Ok(KafkaRun {
        bare,
        relay,
        relay_peak_rss_mib,
        in_flight,
    })
}
