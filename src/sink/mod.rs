//! The sink contract: a batch of events in, one [`Outcome`] per event out.
//!
//! Sinks decide retryability themselves; the relay never looks at
//! broker-specific errors. Each sink classifies its broker's answers in one
//! place (`amqp::settle`, `sqs::errors`, `nats::errors`, `kafka::errors`), listed in one
//! table in its doc, and every class is proved by the conformance suite in
//! `tests/conformance/`. Above all a sink tells the row's fault (a
//! refusal of that one message: the row is charged an attempt) from the
//! broker's or the network's (an alarm, a lost connection, throttling, a
//! batch not confirmed in time: the row is not charged). A sink also
//! reports whether its broker is reachable, which backs `/readyz` and keeps
//! the relay from claiming during an outage.
//!
//! Every sink carries an event's producer headers (`Event::headers`) as
//! headers or attributes of its broker's kind, checks before sending that
//! the broker can carry them (a row it cannot is a `Reject` on its first
//! attempt, with the reason), and writes messages in the configured
//! [`MessageFormat`].

#[cfg(feature = "rabbitmq")]
pub mod amqp;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
mod settings;
#[cfg(feature = "sqs")]
pub mod sqs;
pub mod template;

#[cfg(not(any(feature = "rabbitmq", feature = "sqs", feature = "nats", feature = "kafka")))]
compile_error!("outbox-relay needs at least one sink feature: rabbitmq, sqs, nats or kafka");

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use thiserror::Error;

pub use settings::SinkSettings;

use crate::cloudevents::MessageFormat;
use crate::event::Event;

/// Which sink publishes events, with its validated settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkConfig {
    /// RabbitMQ through an exchange, with publisher confirms.
    #[cfg(feature = "rabbitmq")]
    RabbitMq(amqp::AmqpConfig),
    /// Amazon SQS, standard or FIFO.
    #[cfg(feature = "sqs")]
    Sqs(sqs::SqsConfig),
    /// NATS JetStream, deduplicated on the event id (`Nats-Msg-Id`).
    #[cfg(feature = "nats")]
    Nats(nats::NatsConfig),
    /// Kafka, through an idempotent producer, keyed by `aggregate_id`.
    #[cfg(feature = "kafka")]
    Kafka(kafka::KafkaConfig),
}

impl SinkConfig {
    /// The settings, told how long the relay waits for a batch's answers
    /// (`OUTBOX_PUBLISH_TIMEOUT`): a sink whose client retries on its own
    /// (Kafka's producer) must give up by then too.
    pub fn with_publish_timeout(self, timeout: Duration) -> Self {
        match self {
            #[cfg(feature = "kafka")]
            Self::Kafka(kafka) => Self::Kafka(kafka.with_message_timeout(timeout)),
            #[allow(unreachable_patterns)]
            other => {
                let _ = timeout;
                other
            }
        }
    }
}

/// What happened to one event of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The broker confirmed the message.
    Published,
    /// The broker refused this message for its own sake (an unroutable
    /// return, a per-entry error no other entry got): a failed attempt of
    /// the row, worth trying again later; quarantined once the row is out
    /// of attempts. Never for an answer the same request would get for any
    /// row: that is `Deferred`.
    Retry(String),
    /// Will never succeed as it is (too large, invalid for the sink):
    /// quarantine at once.
    Reject(String),
    /// Not the row's fault: the broker or the network failed the batch, or
    /// gave an answer any row would get (a nack, an alarm, a lost
    /// connection or channel, authorisation, a missing destination,
    /// throttling, a server error, no confirmation before the deadline).
    /// Published again later without costing the row an attempt; a batch
    /// deferred more than published makes the relay probe with backoff and report not
    /// ready (see `relay::DestinationHealth`).
    Deferred(String),
}

/// The sink cannot be reached or set up.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct SinkError(pub String);

/// A message broker the relay publishes to.
pub trait Sink: Send + Sync {
    /// Publishes a batch and returns exactly one outcome per event, in the
    /// order of `events`. Never fails as a whole: a broken connection is
    /// `Deferred` for every event it affected.
    ///
    /// A sink pairs each broker answer with its event by the event's
    /// identity (its index in `events` carried through the request, an SQS
    /// entry `Id`, a returned message's `message_id`), never by the order
    /// in which answers happen to arrive: a row is `Published` only on its
    /// own confirmation.
    ///
    /// Answers that have not come by `deadline` are `Deferred`, while
    /// those that came are kept: confirmed rows are published, not sent
    /// again.
    fn publish<'a>(
        &'a self,
        events: &'a [Event],
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, Vec<Outcome>>;

    /// The largest payload the sink can ever publish, in bytes: a claim
    /// does not even load a larger one, and quarantines it.
    fn max_payload_bytes(&self) -> usize;

    /// Connects if needed and checks the broker answers.
    fn ready(&self) -> BoxFuture<'_, Result<(), SinkError>>;

    /// A name for logs and metrics (`rabbitmq`, `sqs`, `nats`, `kafka`).
    fn kind(&self) -> &'static str;

    /// The broker's name of where `event` goes (exchange, queue, subject,
    /// topic): its publish span's `messaging.destination.name`.
    fn destination_of(&self, event: &Event) -> String;
}

/// Builds the configured sink, sending messages in `format`. Connecting
/// happens later, in [`Sink::ready`], so a broker that is down at start-up
/// is an outage, not a crash.
pub async fn build(config: &SinkConfig, format: &MessageFormat) -> Result<Box<dyn Sink>, SinkError> {
    // NATS writes plain messages only: a build with NATS alone reads no format.
    let _ = format;
    match config {
        #[cfg(feature = "rabbitmq")]
        SinkConfig::RabbitMq(amqp) => Ok(Box::new(amqp::AmqpSink::new(amqp.clone(), format.clone()))),
        #[cfg(feature = "sqs")]
        SinkConfig::Sqs(sqs) => Ok(Box::new(sqs::SqsSink::new(sqs, format.clone()).await?)),
        #[cfg(feature = "nats")]
        SinkConfig::Nats(nats) => Ok(Box::new(nats::NatsSink::new(nats.clone()))),
        #[cfg(feature = "kafka")]
        SinkConfig::Kafka(kafka) => Ok(Box::new(kafka::KafkaSink::new(kafka.clone(), format.clone())?)),
    }
}

/// Keeps a sink "not ready" for a moment after it failed a batch for the
/// broker's or the network's sake, so that every worker of the replica
/// backs off and `/readyz` says why, instead of each worker finding out by
/// failing a batch of its own.
#[derive(Debug, Default)]
pub(crate) struct Breaker {
    tripped: Mutex<Option<(Instant, String)>>,
}

impl Breaker {
    /// How long a trip holds: long enough for the other workers to see it,
    /// short enough that the next try comes soon after the broker is back
    /// (the workers' own backoff spaces the tries further).
    const HOLD: Duration = Duration::from_secs(2);

    fn state(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.tripped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The broker or network failed a batch for `reason`.
    pub(crate) fn trip(&self, reason: &str) {
        *self.state() = Some((Instant::now(), reason.to_owned()));
    }

    /// A batch went through.
    pub(crate) fn reset(&self) {
        *self.state() = None;
    }

    /// `Err` while a recent trip holds.
    pub(crate) fn check(&self) -> Result<(), SinkError> {
        match &*self.state() {
            Some((at, reason)) if at.elapsed() < Self::HOLD => Err(SinkError(format!(
                "the last batch failed for the broker's sake ({reason}); backing off"
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trip_holds_readiness_until_a_batch_gets_through() {
        let breaker = Breaker::default();
        assert!(breaker.check().is_ok());
        breaker.trip("blocked");
        assert!(breaker.check().unwrap_err().0.contains("blocked"));
        breaker.reset();
        assert!(breaker.check().is_ok());
    }
}
