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
//! timed-out batch's channel is dropped with its late confirms instead of
//! leaving them to a later batch.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::future::{join_all, BoxFuture};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::Mutex;
use tracing::{debug, warn};
use uuid::Uuid;

mod config;
mod tls;

pub use config::{redact_url, AmqpConfig, AmqpTls, RoutingKeyTemplate};

use super::{Outcome, Sink, SinkError};
use crate::event::Event;

/// RabbitMQ's default `max_message_size`; a larger body is refused by the
/// broker (it closes the channel), so it can never be published.
const MAX_BODY_BYTES: usize = 128 * 1024 * 1024;

/// AMQP short strings (routing keys) are limited to 255 bytes.
const MAX_SHORT_STRING: usize = 255;

struct Link {
    connection: Connection,
    /// Confirm-mode channels not in use by a batch right now.
    idle: std::sync::Mutex<Vec<Channel>>,
}

impl Link {
    fn is_open(&self) -> bool {
        self.connection.status().connected()
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
    link: Mutex<Option<Arc<Link>>>,
}

impl AmqpSink {
    /// A sink that connects on first use.
    pub fn new(config: AmqpConfig) -> Self {
        Self {
            config,
            link: Mutex::new(None),
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

    /// The message properties of an event: `message_id` = id, `type`,
    /// `content_type`, persistent delivery, `timestamp` = created_at, and
    /// the `aggregate_id` / `causation_id` headers. Public so that other
    /// publishers (the benchmark's bare publisher) send exactly the relay's
    /// messages.
    pub fn properties(event: &Event) -> BasicProperties {
        let mut headers = FieldTable::default();
        headers.insert(
            "aggregate_id".into(),
            AMQPValue::LongString(LongString::from(event.aggregate_id.as_str())),
        );
        if let Some(causation_id) = event.causation_id {
            headers.insert(
                "causation_id".into(),
                AMQPValue::LongString(LongString::from(causation_id.to_string())),
            );
        }
        let timestamp = u64::try_from(event.created_at.timestamp()).unwrap_or(0);
        BasicProperties::default()
            .with_message_id(ShortString::from(event.id.to_string()))
            .with_type(ShortString::from(event.event_type.as_str()))
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_timestamp(timestamp)
            .with_headers(headers)
    }

    /// Checks that can fail before anything is sent, and never succeed later.
    fn precheck(&self, event: &Event) -> Result<String, String> {
        if event.payload.len() > MAX_BODY_BYTES {
            return Err(format!(
                "payload of {} bytes exceeds RabbitMQ's maximum message size of {MAX_BODY_BYTES} bytes",
                event.payload.len()
            ));
        }
        if event.event_type.len() > MAX_SHORT_STRING {
            return Err("event_type is longer than the 255 bytes an AMQP type property holds".to_owned());
        }
        let routing_key = self
            .config
            .routing_key
            .render(&event.event_type, &event.aggregate_id);
        if routing_key.len() > MAX_SHORT_STRING {
            return Err(format!(
                "routing key of {} bytes exceeds AMQP's 255-byte limit",
                routing_key.len()
            ));
        }
        Ok(routing_key)
    }

    async fn publish_batch(&self, events: &[Event]) -> Vec<Outcome> {
        let link = match self.link().await {
            Ok(link) => link,
            Err(e) => return vec![Outcome::Retry(e.0); events.len()],
        };
        let channel = match link.channel().await {
            Ok(channel) => channel,
            Err(e) => {
                let reason = format!("no RabbitMQ channel: {e}");
                warn!(%reason, "RabbitMQ connection failed; reconnecting before the next batch");
                self.forget(&link).await;
                return vec![Outcome::Retry(reason); events.len()];
            }
        };
        let mut outcomes: Vec<Option<Outcome>> = vec![None; events.len()];
        let mut sendable = Vec::with_capacity(events.len());
        for (index, event) in events.iter().enumerate() {
            match self.precheck(event) {
                Ok(routing_key) => sendable.push((index, event, routing_key)),
                Err(reason) => outcomes[index] = Some(Outcome::Reject(reason)),
            }
        }
        // Every publish of the batch is started before any is awaited: the
        // first poll of each queues its frames in batch order, so lapin's
        // I/O loop writes the batch in a few large writes. Awaiting them one
        // at a time would cost a thread hand-off and a write per message.
        let sends = join_all(sendable.iter().map(|(_, event, routing_key)| {
            channel.basic_publish(
                self.config.exchange.as_str().into(),
                routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                event.payload.as_bytes(),
                Self::properties(event),
            )
        }))
        .await;
        let mut pending = Vec::with_capacity(sends.len());
        let mut broken: Option<String> = None;
        for ((index, _, _), sent) in sendable.iter().zip(sends) {
            match sent {
                Ok(confirm) => pending.push((*index, confirm)),
                Err(e) => {
                    let reason = format!("publish failed: {e}");
                    outcomes[*index] = Some(Outcome::Retry(reason.clone()));
                    broken.get_or_insert(reason);
                }
            }
        }
        let (indexes, confirms): (Vec<usize>, Vec<_>) = pending.into_iter().unzip();
        let confirmations = join_all(confirms).await;
        let returns = Returns::collect(&confirmations, events, &self.config.exchange);
        if let Some(stray) = &returns.stray {
            // Some message of this batch may have gone nowhere and we cannot
            // tell which: marking any row could lose it, so all are retried.
            let reason = format!(
                "RabbitMQ returned a message that names no row of this batch ({stray}); the whole batch is retried"
            );
            warn!(%reason, "unattributable basic.return");
            return vec![Outcome::Retry(reason); events.len()];
        }
        for (index, confirmation) in indexes.into_iter().zip(confirmations) {
            let returned = returns.reason_for(&events[index].id);
            outcomes[index] = Some(match (confirmation, returned) {
                (Ok(Confirmation::Ack(_)), None) => Outcome::Published,
                (Ok(Confirmation::Ack(_) | Confirmation::Nack(_)), Some(unroutable)) => {
                    Outcome::Retry(unroutable.clone())
                }
                (Ok(Confirmation::Nack(_)), None) => Outcome::Retry("nacked by RabbitMQ".to_owned()),
                (Ok(Confirmation::NotRequested), _) => {
                    Outcome::Retry("channel is not in confirm mode".to_owned())
                }
                (Err(e), _) => {
                    broken.get_or_insert_with(|| e.to_string());
                    Outcome::Retry(format!("confirm not received: {e}"))
                }
            });
        }
        if let Some(reason) = broken {
            if link.is_open() {
                warn!(%reason, "RabbitMQ channel failed; the next batch opens another");
            } else {
                warn!(%reason, "RabbitMQ connection failed; reconnecting before the next batch");
                self.forget(&link).await;
            }
        } else {
            link.release(channel);
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| Outcome::Retry("not attempted".to_owned())))
            .collect()
    }
}

/// The `basic.return`s of one batch, attributed to rows by message id.
///
/// lapin hands each return to whichever confirmation it resolves next; with
/// many publishes outstanding and acks that confirm several delivery tags at
/// once, that is often another message's confirmation. So a return is never
/// read as news about the confirmation that carries it: every confirmation
/// of the batch is searched, and the returned message's own `message_id`
/// (the event id) names the row it belongs to. RabbitMQ sends a mandatory
/// message's return before its ack, so once every ack of the batch has
/// arrived, every return of the batch is among them.
struct Returns {
    /// Event id → why it came back.
    unroutable: HashMap<Uuid, String>,
    /// A return that names no row of this batch, described.
    stray: Option<String>,
}

impl Returns {
    fn collect(
        confirmations: &[Result<Confirmation, lapin::Error>],
        events: &[Event],
        exchange: &str,
    ) -> Self {
        let batch: HashSet<Uuid> = events.iter().map(|event| event.id).collect();
        let mut returns = Self {
            unroutable: HashMap::new(),
            stray: None,
        };
        let carried = confirmations
            .iter()
            .filter_map(|confirmation| match confirmation {
                Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => Some(returned),
                _ => None,
            });
        for returned in carried {
            let reason = format!(
                "returned by RabbitMQ as unroutable: {} {} (exchange '{exchange}', routing key '{}')",
                returned.reply_code, returned.reply_text, returned.delivery.routing_key
            );
            let message_id = returned
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str());
            let row = message_id
                .and_then(|id| Uuid::parse_str(id).ok())
                .filter(|id| batch.contains(id));
            match row {
                Some(id) => {
                    returns.unroutable.insert(id, reason);
                }
                None => {
                    returns.stray.get_or_insert_with(|| match message_id {
                        Some(id) => format!("message_id {id}"),
                        None => "no message_id".to_owned(),
                    });
                }
            }
        }
        returns
    }

    fn reason_for(&self, event_id: &Uuid) -> Option<&String> {
        self.unroutable.get(event_id)
    }
}

impl Sink for AmqpSink {
    fn publish<'a>(&'a self, events: &'a [Event]) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(self.publish_batch(events))
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move { self.link().await.map(|_| ()) })
    }

    fn kind(&self) -> &'static str {
        "rabbitmq"
    }
}
