//! NATS JetStream sink: every message of a batch published at once, the
//! acknowledgements awaited together.
//!
//! Each message carries the event id as `Nats-Msg-Id`, so a stream stores
//! it once within its duplicate window: a republication (after a crash
//! between the acknowledgement and the mark, a lease that ran out, a
//! replay) is acknowledged with `duplicate: true` and counts as published
//! without a second copy in the stream.
//!
//! A batch is checked row by row first ([`message::prepare`]): a message
//! larger than the server's `max_payload` (from its INFO), or whose subject
//! makes the publish's control line longer than the server's
//! `max_control_line`, would make the server close the connection and fail
//! its batch-mates, so it is rejected without being sent. The rest are all
//! sent before any acknowledgement is awaited, then the answers are matched
//! to their rows by position (each publish is a request with an inbox of
//! its own), up to the deadline. [`errors`] says whose fault each refusal
//! is. Should the server still close the connection on a message (a limit
//! the relay could not know), [`closes`] tells so, and the unanswered
//! messages are published again alone, in halves, until the culprit stands
//! alone and is rejected.
//!
//! "No responders" means no stream captures the subject, or JetStream does
//! not answer for it. The JetStream API tells the two apart: when some
//! stream captures the template's subjects but none this row's subject,
//! the row is at fault (as an unroutable RabbitMQ message is); when no
//! stream captures any, the operator has not created it yet, and the
//! relay waits, not ready, without charging attempts.
//!
//! The relay never creates streams: operators own them (retention,
//! replicas, the duplicate window).

mod closes;
mod config;
mod errors;
mod message;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::context::{GetStreamByNameErrorKind, PublishAckFuture};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, Context};
use async_nats::{Client, ConnectOptions};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tracing::{debug, info};

pub use config::{NatsAuth, NatsConfig, NatsTls};
pub use message::{headers, MAX_CONTROL_LINE};

use super::{Breaker, Outcome, Sink, SinkError};
use crate::event::Event;
use closes::ProtocolErrors;
use errors::{classify, describe, Verdict};

/// How long a successful look at the streams stands for [`Sink::ready`],
/// which the relay asks before every claim.
const RECHECK_AFTER: Duration = Duration::from_secs(5);

/// Bound of a JetStream API request (the stream lookup) and of connecting.
const API_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a batch waiting for acknowledgements looks whether the
/// server closed the connection on something sent.
const CLOSE_CHECK: Duration = Duration::from_millis(100);

/// The largest `max_payload` a NATS server accepts (64 MiB): the claim's
/// bound before the server's own value is known.
const LARGEST_MAX_PAYLOAD: usize = 64 * 1024 * 1024;

/// Publishes to NATS JetStream, connecting on first use; the client
/// reconnects by itself afterwards.
pub struct NatsSink {
    config: NatsConfig,
    /// The subjects the template can produce, as a filter (placeholders
    /// become wildcards) for the stream lookup.
    filter: String,
    link: tokio::sync::Mutex<Option<Context>>,
    /// When a stream capturing `filter` was last seen.
    stream_seen: Mutex<Option<Instant>>,
    /// The server's `max_payload`, as of its last INFO.
    max_payload: AtomicUsize,
    breaker: Breaker,
    /// `-ERR`s the server closed the connection with (see `closes.rs`).
    protocol_errors: Arc<ProtocolErrors>,
    /// Batches publish side by side (shared); isolating the message a
    /// server closed the connection on publishes alone (exclusive), so
    /// that a close can only be the group's being isolated.
    isolation: tokio::sync::RwLock<()>,
}

impl NatsSink {
    /// A sink that connects on first use.
    pub fn new(config: NatsConfig) -> Self {
        let filter = subject_filter(&config.subject.render("\u{1}", "\u{1}"));
        Self {
            config,
            filter,
            link: tokio::sync::Mutex::new(None),
            stream_seen: Mutex::new(None),
            max_payload: AtomicUsize::new(LARGEST_MAX_PAYLOAD),
            breaker: Breaker::default(),
            protocol_errors: Arc::default(),
            isolation: tokio::sync::RwLock::new(()),
        }
    }

    /// The JetStream context, connecting first if there is none yet.
    async fn context(&self) -> Result<Context, SinkError> {
        let mut guard = self.link.lock().await;
        if let Some(context) = guard.as_ref() {
            return Ok(context.clone());
        }
        let client = self.connect().await?;
        info!(servers = %self.config.describe_servers(), "connected to NATS");
        // Acknowledgements are bounded by the relay's own deadline; this
        // only bounds the context's own waits past it.
        let context = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(600))
            .build(client);
        *guard = Some(context.clone());
        Ok(context)
    }

    async fn connect(&self) -> Result<Client, SinkError> {
        let servers = self.config.describe_servers();
        let protocol_errors = self.protocol_errors.clone();
        let mut options = ConnectOptions::new()
            .name("outbox-relay")
            .connection_timeout(API_TIMEOUT)
            .event_callback(move |event| {
                let protocol_errors = protocol_errors.clone();
                async move {
                    if let async_nats::Event::ServerError(async_nats::ServerError::Other(text)) = event {
                        protocol_errors.record(&text);
                    }
                }
            });
        options = match &self.config.auth {
            NatsAuth::None => options,
            NatsAuth::UserPassword(user, password) => {
                options.user_and_password(user.clone(), password.clone())
            }
            NatsAuth::Token(token) => options.token(token.clone()),
            NatsAuth::CredsFile(path) => options
                .credentials_file(path)
                .await
                .map_err(|e| SinkError(format!("NATS credentials file {}: {e}", path.display())))?,
        };
        if let Some(tls) = &self.config.tls {
            options = options.tls_client_config((*tls.config).clone()).require_tls(true);
        }
        let addresses: Vec<async_nats::ServerAddr> = self
            .config
            .servers
            .iter()
            .map(|server| server.parse())
            .collect::<Result<_, _>>()
            .map_err(|e| SinkError(format!("NATS server address: {e}")))?;
        // Credentials are not in these addresses (see config), so the
        // client's errors cannot show them.
        options
            .connect(addresses)
            .await
            .map_err(|e| SinkError(format!("NATS at {servers} unreachable: {}", describe(&e))))
    }

    /// Whether the connection is up, and the server's current `max_payload`.
    fn check_connection(&self, context: &Context) -> Result<usize, SinkError> {
        let client = context.client();
        if client.connection_state() != async_nats::connection::State::Connected {
            return Err(SinkError(format!(
                "NATS connection to {} is down; reconnecting",
                self.config.describe_servers()
            )));
        }
        let max_payload = client.server_info().max_payload;
        if max_payload > 0 {
            self.max_payload.store(max_payload, Ordering::Relaxed);
        }
        Ok(self.max_payload.load(Ordering::Relaxed))
    }

    /// Asks JetStream for a stream capturing the template's subjects.
    async fn find_stream(&self, context: &Context) -> Result<(), SinkError> {
        let fresh = self.seen().is_some_and(|at| at.elapsed() < RECHECK_AFTER);
        if fresh {
            return Ok(());
        }
        match lookup(context, &self.filter).await {
            Lookup::Found(stream) => {
                debug!(%stream, filter = %self.filter, "JetStream stream found");
                *self.seen_state() = Some(Instant::now());
                Ok(())
            }
            Lookup::NotFound => {
                *self.seen_state() = None;
                Err(SinkError(format!(
                    "no JetStream stream captures the subjects {} (OUTBOX_NATS_SUBJECT); the relay never creates one",
                    self.filter
                )))
            }
            Lookup::Failed(reason) => {
                *self.seen_state() = None;
                Err(SinkError(reason))
            }
        }
    }

    fn seen_state(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        // A plain timestamp stays consistent whatever panicked elsewhere.
        self.stream_seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn seen(&self) -> Option<Instant> {
        *self.seen_state()
    }

    async fn publish_batch(&self, events: &[Event], deadline: tokio::time::Instant) -> Vec<Outcome> {
        let started = Instant::now();
        let mut outcomes = match self.context().await {
            Ok(context) => match self.check_connection(&context) {
                Ok(max_payload) => {
                    let _shared = self.isolation.read().await;
                    self.publish_on(&context, events, max_payload, deadline, started)
                        .await
                }
                Err(e) => vec![Outcome::Deferred(e.0); events.len()],
            },
            Err(e) => vec![Outcome::Deferred(e.0); events.len()],
        };
        if let Some(error) = self.protocol_errors.since(started) {
            if outcomes
                .iter()
                .any(|outcome| matches!(outcome, Outcome::Deferred(_)))
            {
                debug!(%error, "the NATS server closed the connection on something this batch sent; publishing the unanswered messages in halves");
                self.isolate(events, &mut outcomes, deadline).await;
            }
        }
        // Every deferral is the server's or the network's doing.
        match outcomes.iter().find_map(|outcome| match outcome {
            Outcome::Deferred(reason) => Some(reason),
            _ => None,
        }) {
            Some(reason) => self.breaker.trip(reason),
            None => self.breaker.reset(),
        }
        outcomes
    }

    /// Publishes the deferred rows of a batch whose connection the server
    /// closed with a protocol error, alone on the connection, in halves:
    /// a group the server closes the connection on again is split until
    /// the message stands alone, and is rejected with the server's error;
    /// the others get their own answers. What the deadline leaves
    /// unsettled stays deferred.
    async fn isolate(&self, events: &[Event], outcomes: &mut [Outcome], deadline: tokio::time::Instant) {
        let _alone = self.isolation.write().await;
        let suspects: Vec<usize> = (0..events.len())
            .filter(|&index| matches!(outcomes[index], Outcome::Deferred(_)))
            .collect();
        let mut groups = VecDeque::from([suspects]);
        while let Some(group) = groups.pop_front() {
            if group.is_empty() {
                continue;
            }
            let Some((context, max_payload)) = self.reconnected(deadline).await else {
                return;
            };
            let started = Instant::now();
            let batch: Vec<Event> = group.iter().map(|&index| events[index].clone()).collect();
            let answers = self
                .publish_on(&context, &batch, max_payload, deadline, started)
                .await;
            let closed_by = self.protocol_errors.since(started);
            let mut unsettled = Vec::new();
            for (&index, answer) in group.iter().zip(answers) {
                match (&closed_by, answer) {
                    (Some(_), Outcome::Deferred(_)) => unsettled.push(index),
                    (_, answer) => outcomes[index] = answer,
                }
            }
            match (closed_by, unsettled.len()) {
                (_, 0) | (None, _) => {}
                (Some(error), 1) => {
                    outcomes[unsettled[0]] = Outcome::Reject(format!(
                        "the NATS server closed the connection on this message: {error}"
                    ));
                }
                (Some(_), _) => {
                    let second = unsettled.split_off(unsettled.len() / 2);
                    groups.push_front(second);
                    groups.push_front(unsettled);
                }
            }
        }
    }

    /// The context once the client has reconnected, with the server's
    /// `max_payload`; `None` if that does not happen by `deadline`.
    async fn reconnected(&self, deadline: tokio::time::Instant) -> Option<(Context, usize)> {
        let context = self.context().await.ok()?;
        loop {
            if let Ok(max_payload) = self.check_connection(&context) {
                return Some((context, max_payload));
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Publishes `events` on `context` and collects their answers until
    /// `deadline`, or until the server closes the connection with a
    /// protocol error after `started` (the answers still missing then will
    /// not come).
    async fn publish_on(
        &self,
        context: &Context,
        events: &[Event],
        max_payload: usize,
        deadline: tokio::time::Instant,
        started: Instant,
    ) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; events.len()];
        let mut subjects: Vec<Option<String>> = vec![None; events.len()];
        // Every message is sent before any acknowledgement is awaited: one
        // round trip for the batch, not one per message.
        let mut waiting = FuturesUnordered::new();
        let mut no_responders = Vec::new();
        for (index, event) in events.iter().enumerate() {
            let prepared = match message::prepare(
                event,
                &self.config.subject,
                max_payload,
                self.config.max_control_line,
            ) {
                Ok(prepared) => prepared,
                Err(reason) => {
                    outcomes[index] = Some(Outcome::Reject(reason));
                    continue;
                }
            };
            let publish = PublishMessage::build()
                .payload(event.payload.clone().into())
                .headers(prepared.headers);
            let sent =
                tokio::time::timeout_at(deadline, context.send_publish(prepared.subject.clone(), publish))
                    .await;
            subjects[index] = Some(prepared.subject);
            match sent {
                Ok(Ok(ack)) => waiting.push(acknowledged(index, ack)),
                Ok(Err(e)) => {
                    outcomes[index] = Some(verdict_outcome(classify(&e), index, &mut no_responders))
                }
                Err(_) => break,
            }
        }
        // Answers that came before the deadline stand; the rest stay
        // unanswered (deferred), so a stored message is not charged.
        loop {
            let wait_until = deadline.min(tokio::time::Instant::now() + CLOSE_CHECK);
            let (index, answer) = match tokio::time::timeout_at(wait_until, waiting.next()).await {
                Ok(Some(answered)) => answered,
                Ok(None) => break,
                Err(_) if wait_until >= deadline || self.protocol_errors.since(started).is_some() => break,
                Err(_) => continue,
            };
            outcomes[index] = Some(match answer {
                Ok(ack) => {
                    if ack.duplicate {
                        debug!(event_id = %events[index].id, stream = %ack.stream, "already in the stream (duplicate); published");
                    }
                    Outcome::Published
                }
                Err(e) => verdict_outcome(classify(&e), index, &mut no_responders),
            });
        }
        drop(waiting);
        if !no_responders.is_empty() {
            self.settle_no_responders(context, &no_responders, &subjects, &mut outcomes)
                .await;
        }
        outcomes
            .into_iter()
            .map(|outcome| {
                outcome.unwrap_or_else(|| {
                    Outcome::Deferred(
                        "not acknowledged by JetStream within OUTBOX_PUBLISH_TIMEOUT".to_owned(),
                    )
                })
            })
            .collect()
    }

    /// Decides the rows whose publish met no responders: the row's fault
    /// if streams exist for the template but none for its subject; the
    /// server's if there is no stream at all, a stream that did not answer,
    /// or the lookup failed.
    async fn settle_no_responders(
        &self,
        context: &Context,
        indexes: &[usize],
        subjects: &[Option<String>],
        outcomes: &mut [Option<Outcome>],
    ) {
        *self.seen_state() = None;
        if let Err(e) = self.find_stream(context).await {
            for &index in indexes {
                outcomes[index] = Some(Outcome::Deferred(e.0.clone()));
            }
            return;
        }
        let mut looked_up: Vec<(String, Outcome)> = Vec::new();
        for &index in indexes {
            let subject = subjects[index].clone().unwrap_or_default();
            let known = looked_up
                .iter()
                .find(|(s, _)| *s == subject)
                .map(|(_, o)| o.clone());
            let outcome = match known {
                Some(outcome) => outcome,
                None => {
                    let outcome = match lookup(context, &subject).await {
                        Lookup::NotFound => {
                            Outcome::Retry(format!("no JetStream stream captures the subject {subject}"))
                        }
                        Lookup::Found(stream) => Outcome::Deferred(format!(
                            "stream {stream} captures {subject} but did not answer (no responders)"
                        )),
                        Lookup::Failed(reason) => Outcome::Deferred(reason),
                    };
                    looked_up.push((subject, outcome.clone()));
                    outcome
                }
            };
            outcomes[index] = Some(outcome);
        }
    }
}

/// An acknowledgement, with the index of its row.
async fn acknowledged(
    index: usize,
    ack: PublishAckFuture,
) -> (
    usize,
    Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
) {
    (index, ack.await)
}

/// The outcome of a verdict; a "no responders" is noted for the stream
/// lookup and left undecided for now.
fn verdict_outcome(verdict: Verdict, index: usize, no_responders: &mut Vec<usize>) -> Outcome {
    match verdict {
        Verdict::Row(outcome) => outcome,
        Verdict::Server(reason) => Outcome::Deferred(reason),
        Verdict::NoResponders => {
            no_responders.push(index);
            Outcome::Deferred("no responders for the subject".to_owned())
        }
    }
}

/// What a stream lookup by subject found.
enum Lookup {
    Found(String),
    NotFound,
    Failed(String),
}

async fn lookup(context: &Context, subject: &str) -> Lookup {
    match tokio::time::timeout(API_TIMEOUT, context.stream_by_subject(subject)).await {
        Ok(Ok(stream)) => Lookup::Found(stream),
        Ok(Err(e)) if e.kind() == GetStreamByNameErrorKind::NotFound => Lookup::NotFound,
        Ok(Err(e)) => Lookup::Failed(format!("JetStream API (stream lookup) failed: {}", describe(&e))),
        Err(_) => Lookup::Failed("JetStream API (stream lookup) did not answer in time".to_owned()),
    }
}

/// The subjects a rendered template can produce, as a NATS filter: from
/// the first token holding a placeholder (marked by `\u{1}`) on, anything
/// (`>`), since an event type may itself hold dots.
fn subject_filter(marked: &str) -> String {
    let mut tokens = Vec::new();
    for token in marked.split('.') {
        if token.contains('\u{1}') {
            tokens.push(">");
            break;
        }
        tokens.push(token);
    }
    tokens.join(".")
}

impl Sink for NatsSink {
    fn publish<'a>(
        &'a self,
        events: &'a [Event],
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(self.publish_batch(events, deadline))
    }

    fn max_payload_bytes(&self) -> usize {
        self.max_payload.load(Ordering::Relaxed)
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let context = self.context().await?;
            self.check_connection(&context)?;
            self.find_stream(&context).await?;
            self.breaker.check()
        })
    }

    fn kind(&self) -> &'static str {
        "nats"
    }

    fn destination_of(&self, event: &Event) -> String {
        self.config.subject.render(&event.event_type, &event.aggregate_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_covers_every_subject_the_template_makes() {
        assert_eq!(subject_filter("outbox.\u{1}"), "outbox.>");
        assert_eq!(subject_filter("events.\u{1}.x"), "events.>");
        assert_eq!(subject_filter("events.t-\u{1}"), "events.>");
        assert_eq!(subject_filter("fixed.subject"), "fixed.subject");
        assert_eq!(subject_filter("\u{1}"), ">");
    }
}
