//! RabbitMQ sink: persistent, mandatory messages on a confirm-mode channel.
//!
//! A batch is written to the channel back to back and its confirms are
//! awaited together, so a batch costs one round trip, not one per message.
//! `mandatory` makes an unroutable message come back (basic.return before
//! the ack) instead of vanishing; it is then a failed attempt.
//!
//! Each batch in flight has a channel of its own, taken from a pool that
//! grows to the number of concurrent batches: a channel error (RabbitMQ
//! closes the channel) then fails only the batch that caused it, and a
//! channel with any message of its batch unanswered is dropped with its
//! late confirms instead of leaving them (and the returns lapin would hand
//! them) to a later batch.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::future::{join_all, BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::FieldTable;
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{debug, warn};

mod config;
mod message;
mod returns;
mod tls;

pub use config::{redact_url, AmqpConfig, AmqpTls, RoutingKeyTemplate};

use returns::Returns;

use super::{Breaker, Outcome, Sink, SinkError};
use crate::cloudevents::MessageFormat;
use crate::event::Event;

struct Link {
    connection: Connection,
    /// Confirm-mode channels not in use by a batch right now.
    idle: std::sync::Mutex<Vec<Channel>>,
}

impl Link {
    fn is_open(&self) -> bool {
        self.connection.status().connected()
    }

    /// RabbitMQ blocks a connection's publishing during a memory or disk
    /// alarm (`connection.blocked`): nothing sent is confirmed until the
    /// alarm clears.
    fn is_blocked(&self) -> bool {
        self.connection.status().blocked()
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Channel>> {
        // A list of handles stays consistent whatever panicked elsewhere.
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An idle channel, or a new one in confirm mode.
    async fn channel(&self) -> Result<Channel, lapin::Error> {
        let reused = self.idle().pop();
        if let Some(channel) = reused.filter(|c| c.status().connected()) {
            return Ok(channel);
        }
        let channel = self.connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok(channel)
    }

    /// Returns a channel after a batch; a failed one is dropped.
    fn release(&self, channel: Channel) {
        if channel.status().connected() {
            self.idle().push(channel);
        }
    }
}

/// Publishes to one exchange of one RabbitMQ server, reconnecting lazily.
pub struct AmqpSink {
    config: AmqpConfig,
    format: MessageFormat,
    link: Mutex<Option<Arc<Link>>>,
    breaker: Breaker,
}

impl AmqpSink {
    /// A sink that connects on first use, sending messages in `format`.
    pub fn new(config: AmqpConfig, format: MessageFormat) -> Self {
        Self {
            config,
            format,
            link: Mutex::new(None),
            breaker: Breaker::default(),
        }
    }

    async fn link(&self) -> Result<Arc<Link>, SinkError> {
        let mut guard = self.link.lock().await;
        if let Some(link) = guard.as_ref().filter(|link| link.is_open()) {
            return Ok(link.clone());
        }
        if let Some(stale) = guard.take() {
            // Best effort: the old connection is usually dead already.
            let _ = stale.connection.close(200, "reconnecting".into()).await;
        }
        let link = Arc::new(self.connect().await?);
        *guard = Some(link.clone());
        Ok(link)
    }

    async fn connect(&self) -> Result<Link, SinkError> {
        let properties = ConnectionProperties::default().with_connection_name("outbox-relay".into());
        // lapin's errors carry no credentials, but name the server with the
        // redacted URL ourselves so the log says where we tried; a TLS
        // failure is put in words (unknown CA, expired, name mismatch).
        let unreachable = |e: lapin::Error| {
            let reason = crate::tls::describe_chain(&e).unwrap_or_else(|| e.to_string());
            SinkError(format!(
                "RabbitMQ at {} unreachable: {reason}",
                self.config.redacted_url()
            ))
        };
        let connection = match &self.config.tls {
            None => Connection::connect(&self.config.url, properties).await,
            Some(tls) => tls::connect(&self.config.url, tls, properties).await,
        }
        .map_err(unreachable)?;
        if !self.config.exchange.is_empty() {
            // A passive declare fails on a missing exchange; it closes the
            // channel it runs on, so it gets a throwaway one.
            let probe = connection.create_channel().await.map_err(unreachable)?;
            probe
                .exchange_declare(
                    self.config.exchange.as_str().into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        passive: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| SinkError(format!("exchange '{}' is not usable: {e}", self.config.exchange)))?;
            let _ = probe.close(200, "probe done".into()).await;
        }
        let link = Link {
            connection,
            idle: std::sync::Mutex::new(Vec::new()),
        };
        // One channel up front, so readiness means publishing can start.
        let channel = link.channel().await.map_err(unreachable)?;
        link.release(channel);
        debug!(server = %self.config.redacted_url(), "connected to RabbitMQ");
        Ok(link)
    }

    async fn forget(&self, broken: &Arc<Link>) {
        let mut guard = self.link.lock().await;
        if guard.as_ref().is_some_and(|current| Arc::ptr_eq(current, broken)) {
            *guard = None;
        }
    }

    /// The properties of an event's message in the plain format. Public so
    /// that other publishers (the benchmark's bare publisher) send exactly
    /// the relay's messages.
    pub fn properties(event: &Event) -> BasicProperties {
        message::properties(event, &MessageFormat::Plain)
    }

    /// The negotiated `frame_max` of the current connection, or RabbitMQ's
    /// default before there is one.
    async fn frame_max(&self) -> usize {
        match self.link.lock().await.as_ref() {
            Some(link) => link.connection.configuration().frame_max() as usize,
            None => message::DEFAULT_FRAME_MAX,
        }
    }

    async fn publish_batch(&self, events: &[Event], deadline: Instant) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; events.len()];
        let mut sendable = Vec::with_capacity(events.len());
        let frame_max = self.frame_max().await;
        for (index, event) in events.iter().enumerate() {
            match message::precheck(event, &self.config, &self.format, frame_max) {
                Ok(routing_key) => sendable.push(Message { index, routing_key }),
                Err(reason) => outcomes[index] = Some(Outcome::Reject(reason)),
            }
        }
        // A group is published on one channel. A group whose channel the
        // broker closes for a message's sake is split in halves, each on a
        // fresh channel, until the message stands alone and is rejected:
        // its batch-mates are published, and only it is quarantined.
        let mut groups: VecDeque<Vec<Message>> = VecDeque::from([sendable]);
        while let Some(group) = groups.pop_front() {
            if group.is_empty() {
                continue;
            }
            let settled = if Instant::now() >= deadline {
                Settled::unanswered(&group, not_confirmed_in_time())
            } else {
                self.publish_group(events, &group, deadline).await
            };
            for (index, outcome) in settled.outcomes {
                outcomes[index] = Some(outcome);
            }
            match settled.closed_by {
                None => {}
                Some(reason) if settled.unsettled.len() == 1 => {
                    let index = settled.unsettled[0].index;
                    outcomes[index] = Some(Outcome::Reject(format!("RabbitMQ closed the channel: {reason}")));
                }
                Some(reason) => {
                    debug!(messages = settled.unsettled.len(), %reason, "RabbitMQ closed the channel for a message; publishing the rest in halves");
                    let mut first = settled.unsettled;
                    let second = first.split_off(first.len() / 2);
                    groups.push_front(second);
                    groups.push_front(first);
                }
            }
        }
        let outcomes: Vec<Outcome> = outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| Outcome::Deferred("not attempted".to_owned())))
            .collect();
        // Every deferral here is the broker's or the network's doing.
        match outcomes.iter().find_map(|outcome| match outcome {
            Outcome::Deferred(reason) => Some(reason),
            _ => None,
        }) {
            Some(reason) => self.breaker.trip(reason),
            None => self.breaker.reset(),
        }
        outcomes
    }

    /// Publishes `group` on one channel and waits for its confirms until
    /// `deadline`.
    async fn publish_group(&self, events: &[Event], group: &[Message], deadline: Instant) -> Settled {
        let link = match self.link().await {
            Ok(link) => link,
            Err(e) => return Settled::unanswered(group, e.0),
        };
        if link.is_blocked() {
            return Settled::unanswered(group, blocked_reason());
        }
        let channel = match link.channel().await {
            Ok(channel) => channel,
            Err(e) => {
                let reason = format!("no RabbitMQ channel: {e}");
                warn!(%reason, "RabbitMQ connection failed; reconnecting before the next batch");
                self.forget(&link).await;
                return Settled::unanswered(group, reason);
            }
        };
        // Every publish of the group is started before any is awaited: the
        // first poll of each queues its frames in order, so lapin's I/O loop
        // writes the batch in a few large writes. Awaiting them one at a
        // time would cost a thread hand-off and a write per message. A
        // blocked broker stops reading, so even the writes are bounded by
        // the deadline.
        let sends = join_all(group.iter().map(|message| {
            let event = &events[message.index];
            channel.basic_publish(
                self.config.exchange.as_str().into(),
                message.routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                event.payload.as_bytes(),
                message::properties(event, &self.format),
            )
        }));
        let sends = match tokio::time::timeout_at(deadline, sends).await {
            Ok(sends) => sends,
            Err(_) => return Settled::unanswered(group, not_confirmed_in_time()),
        };
        let mut answers: Vec<Option<Result<Confirmation, lapin::Error>>> = Vec::new();
        answers.resize_with(group.len(), || None);
        let mut confirms = Vec::with_capacity(group.len());
        for (position, sent) in sends.into_iter().enumerate() {
            match sent {
                Ok(confirm) => confirms.push((position, confirm)),
                Err(e) => answers[position] = Some(Err(e)),
            }
        }
        // Awaiting every message's confirm would have lapin's I/O thread
        // wake this task for each answer as it arrives: a thread hand-off
        // per message when answers trickle in. lapin also resolves one
        // promise when the channel's newest message is answered (what
        // `wait_for_confirms` awaits), so the group is usually woken once
        // and the answers that are in by then are read without waiting.
        // RabbitMQ may answer out of order, and a failed channel fails
        // every confirm: what is still open is then awaited together, as
        // before. After a failed send the newest message may never be
        // answered, so that wait is skipped.
        let mut handed_back = Vec::new();
        if !confirms.is_empty() && confirms.len() == group.len() {
            if let Ok(Ok(returns)) = tokio::time::timeout_at(deadline, channel.wait_for_confirms()).await {
                // lapin hands back the returns that confirms dropped
                // unanswered carried. A channel is pooled only when every
                // message on it was answered, so there should be none; if
                // one came, it is attributed like any other.
                handed_back = returns;
            }
        }
        let mut waiting = FuturesUnordered::new();
        for (position, mut confirm) in confirms {
            // Polled through a reference: a PublisherConfirm dropped
            // unanswered would be handed to the channel's own bookkeeping.
            match (&mut confirm).now_or_never() {
                Some(answer) => answers[position] = Some(answer),
                None => waiting.push(async move { (position, confirm.await) }),
            }
        }
        // Answers that came before the deadline stand; the rest are left
        // unanswered, so a confirmed row is not sent again. One timer for
        // the whole group: a timeout around each answer would register and
        // cancel a timer per message.
        let collect = async {
            while let Some((position, answer)) = waiting.next().await {
                answers[position] = Some(answer);
            }
        };
        let _ = tokio::time::timeout_at(deadline, collect).await;
        drop(waiting);
        // A confirm dropped unanswered stays with its channel, and lapin
        // gives the next return it receives to whichever confirm it
        // resolves next: on a pooled channel that could be the dropped one,
        // and a later batch's unroutable message would read as delivered.
        let every_message_answered = answers.iter().all(Option::is_some);
        let settled = self.settle(events, group, answers, &handed_back);
        if every_message_answered
            && settled
                .outcomes
                .iter()
                .all(|(_, outcome)| !matches!(outcome, Outcome::Deferred(_)))
            && settled.closed_by.is_none()
        {
            link.release(channel);
        } else if !link.is_open() {
            warn!("RabbitMQ connection failed; reconnecting before the next batch");
            self.forget(&link).await;
        }
        // Otherwise the channel is dropped, with any confirm still to come,
        // so that no later batch receives it.
        settled
    }

    /// Each message's answer decides its row; see [`Returns`] for how a
    /// return finds its row.
    fn settle(
        &self,
        events: &[Event],
        group: &[Message],
        answers: Vec<Option<Result<Confirmation, lapin::Error>>>,
        handed_back: &[BasicReturnMessage],
    ) -> Settled {
        let returns = Returns::collect(
            answers.iter().flatten(),
            handed_back,
            events,
            &self.config.exchange,
        );
        if let Some(stray) = &returns.stray {
            // Some message of this group may have gone nowhere and we cannot
            // tell which: marking any row could lose it, so all are retried.
            let reason = format!(
                "RabbitMQ returned a message that names no row of this batch ({stray}); the whole batch is retried"
            );
            warn!(%reason, "unattributable basic.return");
            return Settled {
                outcomes: group
                    .iter()
                    .map(|m| (m.index, Outcome::Retry(reason.clone())))
                    .collect(),
                ..Settled::default()
            };
        }
        let mut settled = Settled::default();
        for (message, answer) in group.iter().zip(answers) {
            let returned = returns.reason_for(&events[message.index].id);
            let outcome = match (answer, returned) {
                (None, Some(unroutable)) => Outcome::Retry(unroutable.clone()),
                (None, None) => Outcome::Deferred(not_confirmed_in_time()),
                (Some(Ok(Confirmation::Ack(_))), None) => Outcome::Published,
                (Some(Ok(Confirmation::Ack(_) | Confirmation::Nack(_))), Some(unroutable)) => {
                    Outcome::Retry(unroutable.clone())
                }
                // RabbitMQ nacks what a queue cannot take now (full with
                // `x-overflow=reject-publish`) or what it failed to store:
                // the broker's state, which any message to that queue gets.
                (Some(Ok(Confirmation::Nack(_))), None) => Outcome::Deferred(nacked_reason()),
                (Some(Ok(Confirmation::NotRequested)), _) => {
                    Outcome::Deferred("channel is not in confirm mode".to_owned())
                }
                (Some(Err(e)), _) => match closed_for_a_message(&e) {
                    Some(reason) => {
                        settled.closed_by.get_or_insert(reason);
                        settled.unsettled.push(message.clone());
                        continue;
                    }
                    None => Outcome::Deferred(format!("confirm not received: {e}")),
                },
            };
            settled.outcomes.push((message.index, outcome));
        }
        settled
    }
}

/// One message of a batch: its row's index, and its routing key.
#[derive(Debug, Clone)]
struct Message {
    index: usize,
    routing_key: String,
}

/// What came of publishing a group on one channel.
#[derive(Debug, Default)]
struct Settled {
    /// Rows (by index) with their outcome.
    outcomes: Vec<(usize, Outcome)>,
    /// Set when RabbitMQ closed the channel for a message's sake: the
    /// broker's reason.
    closed_by: Option<String>,
    /// The messages without an answer because of that close: the culprit
    /// is among them.
    unsettled: Vec<Message>,
}

impl Settled {
    /// Every message deferred for `reason`.
    fn unanswered(group: &[Message], reason: String) -> Self {
        Self {
            outcomes: group
                .iter()
                .map(|m| (m.index, Outcome::Deferred(reason.clone())))
                .collect(),
            ..Self::default()
        }
    }
}

fn not_confirmed_in_time() -> String {
    "not confirmed within OUTBOX_PUBLISH_TIMEOUT".to_owned()
}

fn nacked_reason() -> String {
    "nacked by RabbitMQ (a queue full with x-overflow=reject-publish, or a broker fault): backpressure, not the message's fault".to_owned()
}

fn blocked_reason() -> String {
    "RabbitMQ blocks publishing (connection.blocked: a memory or disk alarm)".to_owned()
}

/// The broker's reason when it closed the channel because of a message
/// (406 PRECONDITION_FAILED: larger than its `max_message_size`, or another
/// property it refuses). Any other close (a deleted exchange, a lost
/// connection) is not a message's fault.
fn closed_for_a_message(error: &lapin::Error) -> Option<String> {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(
                amqp.kind(),
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)
            ) =>
        {
            Some(amqp.get_message().to_string())
        }
        _ => None,
    }
}

impl Sink for AmqpSink {
    fn publish<'a>(&'a self, events: &'a [Event], deadline: Instant) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(self.publish_batch(events, deadline))
    }

    fn max_payload_bytes(&self) -> usize {
        self.config.max_message_bytes
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let link = self.link().await?;
            if link.is_blocked() {
                return Err(SinkError(blocked_reason()));
            }
            self.breaker.check()
        })
    }

    fn kind(&self) -> &'static str {
        "rabbitmq"
    }

    fn destination_of(&self, event: &Event) -> String {
        let _ = event;
        // The conventions' name of the default exchange.
        if self.config.exchange.is_empty() {
            "amq.default".to_owned()
        } else {
            self.config.exchange.clone()
        }
    }
}
