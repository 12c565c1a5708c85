//! The sink contract: a batch of events in, one [`Outcome`] per event out.
//!
//! Sinks decide retryability themselves; the relay never looks at
//! broker-specific errors. A sink also reports whether its broker is
//! reachable, which backs `/readyz` and keeps the relay from burning
//! attempts during an outage.

pub mod amqp;
pub mod sqs;

use futures::future::BoxFuture;
use thiserror::Error;

use crate::event::Event;

/// Which sink publishes events, with its validated settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkConfig {
    /// RabbitMQ through an exchange, with publisher confirms.
    RabbitMq(amqp::AmqpConfig),
    /// Amazon SQS, standard or FIFO.
    Sqs(sqs::SqsConfig),
}

/// What happened to one event of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The broker confirmed the message.
    Published,
    /// Not confirmed; worth trying again later (network, nack, unroutable).
    Retry(String),
    /// Will never succeed as it is (too large, invalid for the sink):
    /// quarantine at once.
    Reject(String),
}

/// The sink cannot be reached or set up.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct SinkError(pub String);

/// A message broker the relay publishes to.
pub trait Sink: Send + Sync {
    /// Publishes a batch and returns exactly one outcome per event, in the
    /// order of `events`. Never fails as a whole: a broken connection is a
    /// `Retry` for every event it affected.
    ///
    /// A sink pairs each broker answer with its event by the event's
    /// identity (its index in `events` carried through the request, an SQS
    /// entry `Id`, a returned message's `message_id`), never by the order
    /// in which answers happen to arrive: a row is `Published` only on its
    /// own confirmation.
    fn publish<'a>(&'a self, events: &'a [Event]) -> BoxFuture<'a, Vec<Outcome>>;

    /// Connects if needed and checks the broker answers.
    fn ready(&self) -> BoxFuture<'_, Result<(), SinkError>>;

    /// A name for logs and metrics (`rabbitmq`, `sqs`).
    fn kind(&self) -> &'static str;
}

/// Builds the configured sink. Connecting happens later, in [`Sink::ready`],
/// so a broker that is down at start-up is an outage, not a crash.
pub async fn build(config: &SinkConfig) -> Result<Box<dyn Sink>, SinkError> {
    match config {
        SinkConfig::RabbitMq(amqp) => Ok(Box::new(amqp::AmqpSink::new(amqp.clone()))),
        SinkConfig::Sqs(sqs) => Ok(Box::new(sqs::SqsSink::new(sqs).await?)),
    }
}
