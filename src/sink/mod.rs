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

use crate::config::SinkConfig;
use crate::store::Event;

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

/// Keeps error texts stored in `last_error` short and on one line.
pub fn truncate_reason(reason: &str) -> String {
    const MAX: usize = 1000;
    let one_line = reason.replace(['\n', '\r'], " ");
    if one_line.len() <= MAX {
        return one_line;
    }
    let mut end = MAX;
    while !one_line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &one_line[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_single_line_and_bounded() {
        assert_eq!(truncate_reason("a\nb"), "a b");
        let long = "é".repeat(2000);
        let cut = truncate_reason(&long);
        assert!(cut.len() <= 1000 + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }
}
