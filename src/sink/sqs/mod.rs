//! Amazon SQS sink: `SendMessageBatch`, several requests in flight, one
//! outcome per entry.
//!
//! A claimed batch is checked row by row first: a row SQS can never accept
//! (larger than the queue's `MaximumMessageSize`, characters SQS refuses, a
//! FIFO group id SQS would refuse) is rejected here, so it cannot make SQS
//! refuse a whole request and take its batch-mates down with it. The rest
//! is packed, in claim order, into requests of at most 10 entries and at
//! most the request byte limit, and up to [`IN_FLIGHT`] requests run at
//! once. Each entry's result decides its own row ([`errors`] classifies
//! every answer; docs/sqs.md has the table): success is `Published`; a code
//! about the moment or the setup (throttling, KMS, permissions, the queue)
//! is `Deferred`, as every entry would get it; another sender fault on the
//! entry is `Reject`; anything else is `Retry`.
//!
//! On a FIFO queue, requests that share a message group (an aggregate) are
//! sent one after the other in claim order, never side by side, so SQS
//! sees each group's events in the order the relay claimed them; once an
//! event of a group is to be retried, the group's later events in the same
//! batch are held back instead of overtaking it.
//!
//! [`Sink::ready`] reads the queue's attributes with `GetQueueAttributes`
//! (which also gives `MaximumMessageSize`). The relay asks before every
//! claim, so an answer from SQS (a probe or an accepted request) stands for
//! a few seconds; a transport failure during a publish drops it at once, so
//! an outage stops the relay before it burns more attempts. The attributes
//! are read again at least once a minute even while sends succeed.

mod batching;
mod client;
mod config;
mod errors;
mod message;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::QueueAttributeName;
use aws_sdk_sqs::Client;
use futures::future::BoxFuture;
use futures::StreamExt;
use tracing::{debug, info, warn};

use super::{Breaker, Outcome, Sink, SinkError};
use crate::cloudevents::MessageFormat;
use crate::event::Event;
use batching::{chain_by_group, group_requests, request_byte_limit, run_chain, Sent};
use batching::{CLASSIC_REQUEST_BYTES, MAX_ENTRIES};
pub use config::SqsConfig;
use errors::{classify_request_error, describe_sdk_error, entry_outcomes, suggests_outage};
use message::{entry, precheck};

/// Requests in flight at once for one claimed batch. SQS scales with
/// concurrent requests; eight covers a 100-row batch (ten requests) in
/// about one round trip without opening a connection per request.
pub const IN_FLIGHT: usize = 8;

/// The largest `MaximumMessageSize` a queue can have (1 MiB): a larger
/// payload can never be sent, so a claim does not load it.
const MAX_QUEUE_MESSAGE_BYTES: usize = 1024 * 1024;

/// How long an answer from SQS (a probe, or a request it processed)
/// stands for [`Sink::ready`]. The relay asks before every claim; probing
/// each time would add a round trip per batch. A transport failure
/// invalidates it early.
const RECHECK_AFTER: Duration = Duration::from_secs(5);

/// How often `MaximumMessageSize` is read again, so a changed queue setting
/// is noticed while the relay is busy.
const REREAD_ATTRIBUTES_AFTER: Duration = Duration::from_secs(60);

/// Publishes to one SQS queue (standard or FIFO).
pub struct SqsSink {
    client: Client,
    queue_url: String,
    fifo: bool,
    format: MessageFormat,
    state: Mutex<QueueState>,
    breaker: Breaker,
}

/// What the last look at the queue found.
#[derive(Debug, Default)]
struct QueueState {
    /// The queue's `MaximumMessageSize` in bytes, and when it was read.
    max_message_size: Option<(usize, Instant)>,
    /// When SQS last answered; `None` after a transport failure, so the
    /// next [`Sink::ready`] asks again.
    answered_at: Option<Instant>,
}

impl SqsSink {
    /// Builds the client from the standard AWS configuration chain, in the
    /// region the queue URL names if it names one. Nothing is sent here:
    /// credentials are resolved and the queue is reached on first use, in
    /// [`Sink::ready`].
    pub async fn new(config: &SqsConfig, format: MessageFormat) -> Result<Self, SinkError> {
        Ok(Self {
            client: client::build(config).await,
            queue_url: config.queue_url.clone(),
            fifo: config.is_fifo(),
            format,
            state: Mutex::new(QueueState::default()),
            breaker: Breaker::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // The lock is only held for plain field updates, which cannot
        // panic, so a poisoned lock still holds consistent data.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets that SQS answered: the next `ready()` asks it.
    fn suspect(&self) {
        self.state().answered_at = None;
    }

    /// Records that SQS processed a request.
    fn answered(&self) {
        self.state().answered_at = Some(Instant::now());
    }

    /// `GetQueueAttributes`, refreshing the cached `MaximumMessageSize`.
    async fn probe(&self) -> Result<usize, SinkError> {
        let answer = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::MaximumMessageSize)
            .customize()
            .config_override(client::probe_override())
            .send()
            .await
            .map_err(|e| {
                SinkError(format!(
                    "GetQueueAttributes on {} failed: {}",
                    self.queue_url,
                    describe_sdk_error(&e)
                ))
            })?;
        let reported = answer
            .attributes()
            .and_then(|attributes| attributes.get(&QueueAttributeName::MaximumMessageSize))
            .and_then(|value| value.trim().parse::<usize>().ok());
        let max_message_size = match reported {
            Some(size) => size,
            None => {
                // Some emulators leave it out; the classic limit is the
                // smallest any SQS has had, so nothing it lets through is
                // refused for size.
                warn!(
                    assumed = CLASSIC_REQUEST_BYTES,
                    "the queue did not report MaximumMessageSize; assuming the classic limit"
                );
                CLASSIC_REQUEST_BYTES
            }
        };
        let first = {
            let mut state = self.state();
            let now = Instant::now();
            let first = state.max_message_size.is_none();
            state.max_message_size = Some((max_message_size, now));
            state.answered_at = Some(now);
            first
        };
        if first {
            info!(queue = %self.queue_url, fifo = self.fifo, max_message_size, "SQS queue reachable");
        } else {
            debug!(queue = %self.queue_url, max_message_size, "SQS queue checked");
        }
        Ok(max_message_size)
    }

    async fn check(&self) -> Result<(), SinkError> {
        let fresh = {
            let state = self.state();
            state.answered_at.is_some_and(|at| at.elapsed() < RECHECK_AFTER)
                && state
                    .max_message_size
                    .is_some_and(|(_, read_at)| read_at.elapsed() < REREAD_ATTRIBUTES_AFTER)
        };
        if fresh {
            return Ok(());
        }
        self.probe().await.map(|_| ())
    }

    /// The queue's `MaximumMessageSize`, probing if it was never read.
    async fn max_message_size(&self) -> Result<usize, SinkError> {
        let known = self.state().max_message_size;
        match known {
            Some((size, _)) => Ok(size),
            None => self.probe().await,
        }
    }

    async fn publish_batch(&self, events: &[Event], deadline: tokio::time::Instant) -> Vec<Outcome> {
        let max_message_size = match self.max_message_size().await {
            Ok(size) => size,
            Err(e) => return vec![Outcome::Deferred(e.0); events.len()],
        };
        let mut outcomes: Vec<Option<Outcome>> = vec![None; events.len()];
        let mut sendable = Vec::with_capacity(events.len());
        for (index, event) in events.iter().enumerate() {
            match precheck(event, self.fifo, &self.format, max_message_size) {
                Ok(size) => sendable.push((index, size)),
                Err(reason) => outcomes[index] = Some(Outcome::Reject(reason)),
            }
        }
        let requests = group_requests(&sendable, MAX_ENTRIES, request_byte_limit(max_message_size));
        let chains = if self.fifo {
            chain_by_group(requests, |index| events[index].aggregate_id.as_str())
        } else {
            requests.into_iter().map(|request| vec![request]).collect()
        };
        let group_of = |index: usize| self.fifo.then(|| events[index].aggregate_id.as_str());
        let results: Vec<Vec<(usize, Outcome)>> = futures::stream::iter(chains)
            .map(|chain| {
                run_chain(chain, group_of, |request| {
                    self.send_before(events, request, deadline)
                })
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        for (index, outcome) in results.into_iter().flatten() {
            outcomes[index] = Some(outcome);
        }
        let outcomes: Vec<Outcome> = outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| Outcome::Deferred("not attempted".to_owned())))
            .collect();
        outcomes
    }

    /// [`Self::send_request`], unless `deadline` has passed or passes
    /// first: then the entries are deferred. A request that completed
    /// before the deadline keeps its outcomes, so entries SQS accepted are
    /// not sent again.
    async fn send_before(
        &self,
        events: &[Event],
        request: Vec<usize>,
        deadline: tokio::time::Instant,
    ) -> Sent {
        let entries = request.len();
        let deferred = || {
            Sent::Outcomes(vec![
                Outcome::Deferred(
                    "not sent within OUTBOX_PUBLISH_TIMEOUT".to_owned()
                );
                entries
            ])
        };
        if tokio::time::Instant::now() >= deadline {
            return deferred();
        }
        tokio::time::timeout_at(deadline, self.send_request(events, request))
            .await
            .unwrap_or_else(|_| {
                self.breaker
                    .trip("SendMessageBatch not answered within OUTBOX_PUBLISH_TIMEOUT");
                deferred()
            })
    }

    /// Sends one `SendMessageBatch` for `request` (indexes into `events`).
    /// Entry ids are positions in the request, which SQS allows (1–80
    /// characters of `[A-Za-z0-9_-]`) and which map straight back.
    async fn send_request(&self, events: &[Event], request: Vec<usize>) -> Sent {
        let mut entries = Vec::with_capacity(request.len());
        for (position, &index) in request.iter().enumerate() {
            match entry(position, &events[index], self.fifo, &self.format) {
                Ok(built) => entries.push(built),
                // Only a missing required field fails a build, and `entry`
                // sets both; should that ever change, it is our bug, not
                // the rows': retry rather than quarantine.
                Err(e) => {
                    return Sent::Outcomes(vec![
                        Outcome::Retry(format!("cannot build entry: {e}"));
                        request.len()
                    ])
                }
            }
        }
        let response = self
            .client
            .send_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await;
        match response {
            Ok(output) => {
                self.answered();
                self.breaker.reset();
                let successful: Vec<&str> = output.successful().iter().map(|ok| ok.id()).collect();
                Sent::Outcomes(entry_outcomes(request.len(), &successful, output.failed()))
            }
            Err(e) => {
                let status = e.raw_response().map(|raw| raw.status().as_u16());
                let reason = format!("SendMessageBatch failed: {}", describe_sdk_error(&e));
                if suggests_outage(e.code(), status) {
                    self.suspect();
                    self.breaker.trip(&reason);
                } else if matches!(classify_request_error(e.code(), String::new(), 0), Sent::Split(_)) {
                    // Refused for what one entry holds: the queue is fine.
                    self.answered();
                } else {
                    // Refused as a whole for the queue's or the caller's
                    // sake (a deleted queue, a permission): the next
                    // readiness check asks SQS again instead of trusting
                    // its last answer for up to a minute.
                    self.suspect();
                }
                let sent = classify_request_error(e.code(), reason, request.len());
                if let Sent::Split(reason) = &sent {
                    debug!(entries = request.len(), %reason, "request refused as a whole; sending it in halves");
                }
                sent
            }
        }
    }
}

/// A queue's name: its URL's last path segment.
fn queue_name(queue_url: &str) -> &str {
    queue_url
        .rsplit('/')
        .find(|segment| !segment.is_empty())
        .unwrap_or(queue_url)
}

impl Sink for SqsSink {
    fn publish<'a>(
        &'a self,
        events: &'a [Event],
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(self.publish_batch(events, deadline))
    }

    fn max_payload_bytes(&self) -> usize {
        MAX_QUEUE_MESSAGE_BYTES
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            self.check().await?;
            self.breaker.check()
        })
    }

    fn kind(&self) -> &'static str {
        "sqs"
    }

    fn destination_of(&self, event: &Event) -> String {
        let _ = event;
        queue_name(&self.queue_url).to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::queue_name;

    #[test]
    fn a_queue_is_named_by_its_urls_last_segment() {
        assert_eq!(
            queue_name("https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo"),
            "orders.fifo"
        );
        assert_eq!(queue_name("http://127.0.0.1:4566/000000000000/orders/"), "orders");
    }
}
