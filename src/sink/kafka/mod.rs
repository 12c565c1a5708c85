//! Kafka sink: every record of a batch handed to the producer at once, the
//! delivery reports awaited together.
//!
//! The producer is librdkafka's idempotent producer (`acks=all`): within
//! one producer session it neither duplicates nor reorders a partition's
//! records across its own retries. Each record's key is the event's
//! `aggregate_id`, partitioned by `murmur2_random` as Java producers do, so
//! an aggregate's events share a partition and keep their order there;
//! the `event_id` header carries the id consumers deduplicate on, since a
//! record the relay republishes (after a crash, a lease that ran out, a
//! replay) is a new record to Kafka.
//!
//! A batch is checked row by row first ([`message::prepare`]: a topic
//! name Kafka refuses, a producer header in the place of the relay's);
//! librdkafka itself refuses a record over its `message.max.bytes` when it
//! is handed over. [`errors`] says whose fault each delivery report is. Two
//! answers need a second look: a request the broker refused as too large
//! holds many records, so its records are sent again one at a time, alone
//! on the producer, and only one refused alone is the row's; and a topic
//! that does not exist is the row's only when other topics of the template
//! do (the operator has created the others), and an outage otherwise.
//!
//! The relay never creates topics (`allow.auto.create.topics=false`).

mod config;
mod errors;
mod message;

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::metadata::Metadata;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tracing::{debug, info, warn};

pub use config::{KafkaConfig, KafkaSettings, Sasl, SecurityProtocol, DEFAULT_MAX_MESSAGE_BYTES};
pub use message::{check_topic, headers};

use super::{Breaker, Outcome, Sink, SinkError};
use crate::cloudevents::MessageFormat;
use crate::event::Event;
use errors::{classify, Stage, Verdict};
use message::TopicPattern;

/// How long a successful look at the cluster stands for [`Sink::ready`],
/// which the relay asks before every claim.
const RECHECK_AFTER: Duration = Duration::from_secs(5);

/// How long a producer that failed fatally is kept before the next is
/// made: a cause that lasts (the cluster refusing the producer an id, as
/// without `IdempotentWrite` permission) would otherwise have a producer
/// made and failed on every claim.
const REMAKE_AFTER: Duration = Duration::from_secs(5);

/// How long a producer made anew after a fatal error is not ready yet: it
/// asks the cluster for its idempotence id as it starts, and a refusal (the
/// cause that lasts, above) comes back as a fatal error moments later
/// (55 ms seen), after its first metadata answer. Ready before that, it
/// would take the relay's rows into a producer about to fail, and tell
/// `/readyz` the outage was over when it was not.
const REMADE_SETTLE: Duration = Duration::from_secs(1);

/// Bound of a metadata request: within the 3 s `/readyz` gives a sink, so
/// that an unreachable cluster is reported with the client's reason.
const METADATA_TIMEOUT: Duration = Duration::from_millis(2500);

/// The producer's context: remembers the last error librdkafka raised for
/// the client as a whole (all brokers down, authentication), so that
/// readiness can say why.
#[derive(Clone, Default)]
struct RelayContext {
    /// Shared by every producer the sink makes, and by the sink.
    last_error: Arc<Mutex<Option<(Instant, String)>>>,
}

impl RelayContext {
    fn state(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The last client error, if it came within `within`.
    fn recent_error(&self, within: Duration) -> Option<String> {
        self.state()
            .as_ref()
            .filter(|(at, _)| at.elapsed() < within)
            .map(|(_, reason)| reason.clone())
    }
}

impl ClientContext for RelayContext {
    /// librdkafka's own lines, under the target `librdkafka`. It logs a
    /// refused or lost broker connection as an error although it
    /// reconnects by itself, and the relay reports the outage it makes
    /// (readiness, `Kafka client error`): warnings at most, so that only
    /// the relay's own errors are errors.
    fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => warn!(target: "librdkafka", facility, "{line}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                info!(target: "librdkafka", facility, "{line}")
            }
            RDKafkaLogLevel::Debug => debug!(target: "librdkafka", facility, "{line}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let mut last = self.state();
        // librdkafka repeats these while they last: logged when they change.
        if last.as_ref().is_none_or(|(_, previous)| previous != reason) {
            warn!(error = %error, reason, "Kafka client error");
        }
        *last = Some((Instant::now(), reason.to_owned()));
    }
}

type Client = FutureProducer<RelayContext>;

/// Publishes to Kafka through one idempotent producer, made anew after a
/// fatal error.
pub struct KafkaSink {
    config: KafkaConfig,
    format: MessageFormat,
    pattern: TopicPattern,
    /// The producer, and when it was made.
    producer: RwLock<(Arc<Client>, Instant)>,
    /// When the producer was last made anew after a fatal error, and that
    /// error.
    remade: Mutex<Option<(Instant, String)>>,
    context: RelayContext,
    /// When the cluster was last seen to hold a topic of the template.
    topics_seen: Mutex<Option<Instant>>,
    breaker: Breaker,
    /// Batches publish side by side (shared); records a broker refused as
    /// too large are sent again alone on the producer (exclusive), so that
    /// a request refused then holds nothing else.
    isolation: tokio::sync::RwLock<()>,
}

impl KafkaSink {
    /// A sink whose producer connects in the background, on first use.
    pub fn new(config: KafkaConfig, format: MessageFormat) -> Result<Self, SinkError> {
        let context = RelayContext::default();
        let producer = create(&config, context.clone())?;
        let pattern = TopicPattern::of(&config.topic);
        Ok(Self {
            config,
            format,
            pattern,
            producer: RwLock::new((Arc::new(producer), Instant::now())),
            remade: Mutex::new(None),
            context,
            topics_seen: Mutex::new(None),
            breaker: Breaker::default(),
            isolation: tokio::sync::RwLock::new(()),
        })
    }

    fn producer(&self) -> Arc<Client> {
        self.producer
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0
            .clone()
    }

    /// The producer, made anew first if the current one raised a fatal
    /// error (after which librdkafka sends nothing more on it) and has had
    /// its [`REMAKE_AFTER`]; until then, the fatal error.
    fn healthy_producer(&self) -> Result<Arc<Client>, SinkError> {
        let mut slot = self
            .producer
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(why) = fatal_reason(&slot.0) else {
            return Ok(slot.0.clone());
        };
        if slot.1.elapsed() < REMAKE_AFTER {
            return Err(SinkError(format!("{why}; a new producer is made in a moment")));
        }
        warn!(reason = %why, "making a new Kafka producer");
        let fresh = Arc::new(create(&self.config, self.context.clone())?);
        *slot = (fresh.clone(), Instant::now());
        *self
            .remade
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((Instant::now(), why));
        Ok(fresh)
    }

    fn seen_state(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        // A plain timestamp stays consistent whatever panicked elsewhere.
        self.topics_seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Asks the cluster for its topics (the template's one topic, if it has
    /// no placeholder), off the async threads: librdkafka's call blocks.
    async fn metadata(&self, producer: Arc<Client>) -> Result<Metadata, SinkError> {
        let topic = self.pattern.literal().map(str::to_owned);
        let brokers = self.config.describe_brokers().to_owned();
        let context_error = self.context.recent_error(Duration::from_secs(30));
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(topic.as_deref(), METADATA_TIMEOUT)
        })
        .await
        .map_err(|e| SinkError(format!("Kafka metadata request did not finish: {e}")))?
        .map_err(|e| {
            let code = e
                .rdkafka_error_code()
                .map(|code| format!(" ({code:?})"))
                .unwrap_or_default();
            let why = context_error
                .map(|reason| format!("; last client error: {reason}"))
                .unwrap_or_default();
            SinkError(format!("Kafka brokers unreachable ({brokers}): {e}{code}{why}"))
        })
    }

    /// Whether the cluster holds a topic the template can render; `Err`
    /// says why not, in words for `/readyz`.
    async fn find_topics(&self, producer: Arc<Client>) -> Result<(), SinkError> {
        let fresh = self.seen_state().is_some_and(|at| at.elapsed() < RECHECK_AFTER);
        if fresh {
            return Ok(());
        }
        let metadata = self.metadata(producer).await?;
        let found = metadata
            .topics()
            .iter()
            .any(|topic| topic.error().is_none() && self.pattern.matches(topic.name()));
        if found {
            *self.seen_state() = Some(Instant::now());
            return Ok(());
        }
        *self.seen_state() = None;
        // A topic named in the request (the template's literal one) comes
        // back with an error of its own; a missing one is said in words.
        let refused = metadata
            .topics()
            .iter()
            .filter(|topic| self.pattern.matches(topic.name()))
            .filter_map(|topic| {
                topic
                    .error()
                    .map(|code| (topic.name().to_owned(), RDKafkaErrorCode::from(code)))
            })
            .find(|(_, code)| *code != RDKafkaErrorCode::UnknownTopicOrPartition);
        Err(SinkError(match (refused, self.pattern.literal()) {
            (Some((topic, code)), _) => format!("Kafka answered for topic {topic}: {code} ({code:?})"),
            (None, Some(topic)) => {
                format!(
                    "Kafka topic {topic} does not exist (OUTBOX_KAFKA_TOPIC); the relay never creates topics"
                )
            }
            (None, None) => format!(
                "no Kafka topic matches OUTBOX_KAFKA_TOPIC ({}); the relay never creates topics",
                self.pattern.describe()
            ),
        }))
    }

    async fn publish_batch(&self, events: &[Event], deadline: tokio::time::Instant) -> Vec<Outcome> {
        let mut outcomes = match self.healthy_producer() {
            Ok(producer) => {
                let _shared = self.isolation.read().await;
                let mut outcomes = self.publish_on(&producer, events, deadline).await;
                // Records failed by a fatal error say only "Fatal": the
                // producer knows the cause. Nothing more is tried on it.
                if let Some(why) = fatal_reason(&producer) {
                    for (verdict, outcome) in &mut outcomes {
                        if verdict.is_some() || matches!(outcome, Outcome::Deferred(_)) {
                            *verdict = None;
                            *outcome = Outcome::Deferred(why.clone());
                        }
                    }
                }
                outcomes
            }
            Err(e) => vec![(None, Outcome::Deferred(e.0)); events.len()],
        };
        self.settle(events, &mut outcomes, deadline).await;
        let outcomes: Vec<Outcome> = outcomes.into_iter().map(|(_, outcome)| outcome).collect();
        let published = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Published))
            .count();
        let deferred: Vec<&String> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                Outcome::Deferred(reason) => Some(reason),
                _ => None,
            })
            .collect();
        if published > 0 {
            // The cluster took records of the template: as good as a look
            // at its metadata, which need not be asked for meanwhile.
            *self.seen_state() = Some(Instant::now());
        }
        // As the relay's outage rule does: a batch the cluster deferred
        // more of than it took holds the other workers back for a moment;
        // a row deferred among published batch-mates slows nobody.
        match deferred.first() {
            Some(reason) if deferred.len() > published => self.breaker.trip(reason),
            _ => self.breaker.reset(),
        }
        outcomes
    }

    /// Hands every record of `events` to the producer, then collects the
    /// delivery reports until `deadline`. Each outcome comes with the
    /// verdict that needs a second look (too large, unknown topic), if any.
    async fn publish_on(
        &self,
        producer: &Client,
        events: &[Event],
        deadline: tokio::time::Instant,
    ) -> Vec<(Option<Verdict>, Outcome)> {
        let mut outcomes: Vec<Option<(Option<Verdict>, Outcome)>> = vec![None; events.len()];
        let mut waiting = FuturesUnordered::new();
        for (index, event) in events.iter().enumerate() {
            let topic = match message::prepare(event, &self.config.topic, &self.format) {
                Ok(topic) => topic,
                Err(reason) => {
                    outcomes[index] = Some((None, Outcome::Reject(reason)));
                    continue;
                }
            };
            let record = FutureRecord::to(&topic)
                .key(event.aggregate_id.as_bytes())
                .payload(event.payload.as_bytes())
                .headers(message::headers(event, &self.format))
                .timestamp(event.created_at.timestamp_millis());
            match producer.send_result(record) {
                Ok(delivery) => waiting.push(async move { (index, delivery.await) }),
                Err((error, _)) => outcomes[index] = Some(outcome_of(classify(&error, Stage::Enqueue))),
            }
        }
        // Reports that came before the deadline stand; the rest stay
        // unanswered (deferred), so a stored record is not charged.
        while let Ok(Some((index, report))) = tokio::time::timeout_at(deadline, waiting.next()).await {
            outcomes[index] = Some(match report {
                Ok(Ok(_delivery)) => (None, Outcome::Published),
                Ok(Err((error, _message))) => outcome_of(classify(&error, Stage::Report)),
                Err(_canceled) => (
                    None,
                    Outcome::Deferred("the Kafka producer went away before the delivery report".to_owned()),
                ),
            });
        }
        outcomes
            .into_iter()
            .map(|outcome| {
                outcome.unwrap_or_else(|| {
                    (
                        None,
                        Outcome::Deferred(
                            "not acknowledged by Kafka within OUTBOX_PUBLISH_TIMEOUT".to_owned(),
                        ),
                    )
                })
            })
            .collect()
    }

    /// Decides what needed a second look: records a broker refused as too
    /// large are sent again alone; records whose topic does not exist are
    /// the row's if the template's other topics exist.
    async fn settle(
        &self,
        events: &[Event],
        outcomes: &mut [(Option<Verdict>, Outcome)],
        deadline: tokio::time::Instant,
    ) {
        let too_large: Vec<usize> = (0..events.len())
            .filter(|&index| matches!(outcomes[index].0, Some(Verdict::TooLarge(_))))
            .collect();
        if !too_large.is_empty() {
            self.isolate(events, &too_large, outcomes, deadline).await;
        }
        let unknown: Vec<usize> = (0..events.len())
            .filter(|&index| matches!(outcomes[index].0, Some(Verdict::UnknownTopic)))
            .collect();
        if !unknown.is_empty() {
            self.settle_unknown_topics(events, &unknown, outcomes).await;
        }
        if outcomes
            .iter()
            .any(|(verdict, _)| matches!(verdict, Some(Verdict::Fatal(_))))
        {
            // Made anew before the next batch; this one is deferred.
            let _ = self.healthy_producer();
        }
    }

    /// Sends each record of `indexes` alone on the producer, awaiting its
    /// report before the next: refused as too large alone, it is the
    /// row's and is rejected; what the deadline leaves stays deferred.
    async fn isolate(
        &self,
        events: &[Event],
        indexes: &[usize],
        outcomes: &mut [(Option<Verdict>, Outcome)],
        deadline: tokio::time::Instant,
    ) {
        debug!(
            records = indexes.len(),
            "Kafka refused a request as too large; sending its records one at a time"
        );
        let Ok(_alone) = tokio::time::timeout_at(deadline, self.isolation.write()).await else {
            return;
        };
        let Ok(producer) = self.healthy_producer() else {
            return;
        };
        for &index in indexes {
            let mut answer = self
                .publish_on(&producer, std::slice::from_ref(&events[index]), deadline)
                .await;
            let (verdict, outcome) = answer.remove(0);
            outcomes[index] = match verdict {
                Some(Verdict::TooLarge(reason)) => (
                    None,
                    Outcome::Reject(format!(
                        "Kafka refused the record, sent alone, as too large for the broker or the topic \
                         (message.max.bytes, max.message.bytes): {reason}"
                    )),
                ),
                verdict => (verdict, outcome),
            };
        }
    }

    async fn settle_unknown_topics(
        &self,
        events: &[Event],
        indexes: &[usize],
        outcomes: &mut [(Option<Verdict>, Outcome)],
    ) {
        *self.seen_state() = None;
        let producer = self.producer();
        let metadata = match self.metadata(producer).await {
            Ok(metadata) => metadata,
            Err(e) => {
                for &index in indexes {
                    outcomes[index] = (None, Outcome::Deferred(e.0.clone()));
                }
                return;
            }
        };
        let existing: Vec<&str> = metadata
            .topics()
            .iter()
            .filter(|topic| topic.error().is_none())
            .map(|topic| topic.name())
            .collect();
        let others_exist = existing.iter().any(|topic| self.pattern.matches(topic));
        for &index in indexes {
            let event = &events[index];
            let topic = self.config.topic.render(&event.event_type, &event.aggregate_id);
            outcomes[index] = if existing.contains(&topic.as_str()) {
                // Created since the producer looked: tried again soon.
                (
                    None,
                    Outcome::Deferred(format!("Kafka topic {topic} was not known to the producer yet")),
                )
            } else if others_exist && self.pattern.literal().is_none() {
                (
                    None,
                    Outcome::Retry(format!(
                        "Kafka topic {topic} does not exist (UnknownTopicOrPartition); the relay never creates topics"
                    )),
                )
            } else {
                (
                    None,
                    Outcome::Deferred(format!(
                        "no Kafka topic matches OUTBOX_KAFKA_TOPIC ({}): {topic} does not exist; the relay never creates topics",
                        self.pattern.describe()
                    )),
                )
            };
        }
    }
}

/// The cause of the producer's fatal error, if it raised one.
fn fatal_reason(producer: &Client) -> Option<String> {
    producer
        .client()
        .fatal_error()
        .map(|(code, reason)| format!("the Kafka producer failed: {reason} ({code:?})"))
}

/// The outcome of a verdict; those that need a second look are kept with it.
fn outcome_of(verdict: Verdict) -> (Option<Verdict>, Outcome) {
    match verdict {
        Verdict::Row(outcome) => (None, outcome),
        Verdict::Cluster(reason) => (None, Outcome::Deferred(reason)),
        Verdict::Fatal(ref reason) | Verdict::TooLarge(ref reason) => {
            let outcome = Outcome::Deferred(reason.clone());
            (Some(verdict), outcome)
        }
        Verdict::UnknownTopic => (
            Some(Verdict::UnknownTopic),
            Outcome::Deferred("Kafka topic unknown to the producer".to_owned()),
        ),
    }
}

fn create(config: &KafkaConfig, context: RelayContext) -> Result<Client, SinkError> {
    let producer: Client = config
        .client_config()
        .create_with_context(context)
        .map_err(|e| SinkError(format!("Kafka producer could not be created: {e}")))?;
    info!(brokers = %config.describe_brokers(), "Kafka producer created");
    Ok(producer)
}

impl Sink for KafkaSink {
    fn publish<'a>(
        &'a self,
        events: &'a [Event],
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(self.publish_batch(events, deadline))
    }

    fn max_payload_bytes(&self) -> usize {
        self.config.max_message_bytes
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let producer = self.healthy_producer()?;
            self.find_topics(producer).await?;
            let settling = self
                .remade
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .as_ref()
                .filter(|(at, _)| at.elapsed() < REMADE_SETTLE)
                .map(|(_, why)| why.clone());
            if let Some(why) = settling {
                return Err(SinkError(format!(
                    "a new Kafka producer is getting its idempotence id; the last one failed: {why}"
                )));
            }
            self.breaker.check()
        })
    }

    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn destination_of(&self, event: &Event) -> String {
        self.config.topic.render(&event.event_type, &event.aggregate_id)
    }
}
