//! NATS JetStream's answers, one case each (docs/nats.md#broker-answers): a
//! stream full with `discard: new`, no stream at all, a server that cannot
//! be reached, a server that stops answering (outages); a subject no
//! stream captures while others are (the row's, retried); a message over
//! the stream's `max_msg_size` and a subject over the server's control
//! line (the row's, quarantined at once).

use std::collections::HashSet;
use std::time::Duration;

use async_nats::jetstream::stream::Config;
use futures::future::BoxFuture;
use uuid::Uuid;

use super::kit::{Bench, Broker, RowFault};
use crate::common::nats::nats_addr;
use crate::common::proxy::Proxy;
use crate::common::servers::PrivateNats;
use crate::common::{nats_url, StreamLimits, TestStream};

/// A stream of the case's own (or only its name, until it is added).
struct Nats {
    stream: TestStream,
    /// The relay's subject template.
    subject: String,
    proxy: Option<Proxy>,
    /// Whether reading the stream also empties it (for a full stream).
    drain: bool,
}

impl Nats {
    async fn new(limits: StreamLimits) -> Self {
        let stream = TestStream::create_with(limits).await;
        let subject = format!("{}.{{event_type}}", stream.prefix);
        Self {
            stream,
            subject,
            proxy: None,
            drain: false,
        }
    }

    /// Named, but not created yet.
    async fn without_stream() -> Self {
        let url = nats_url();
        let stream = TestStream::unnamed(&url, TestStream::connect(&url).await);
        let subject = format!("{}.{{event_type}}", stream.prefix);
        Self {
            stream,
            subject,
            proxy: None,
            drain: false,
        }
    }

    /// A stream on `server`, the subject template `<prefix>.{aggregate_id}`.
    async fn by_aggregate_on(server: &PrivateNats) -> Self {
        let url = format!("nats://127.0.0.1:{}", server.port);
        let stream = TestStream::unnamed(&url, TestStream::connect(&url).await);
        stream.add(&StreamLimits::default()).await;
        let subject = format!("{}.{{aggregate_id}}", stream.prefix);
        Self {
            stream,
            subject,
            proxy: None,
            drain: false,
        }
    }

    async fn behind_proxy(mut self) -> Self {
        self.proxy = Some(Proxy::start(nats_addr()).await);
        self
    }

    fn proxy(&self) -> &Proxy {
        self.proxy.as_ref().expect("a proxy")
    }
}

impl Broker for Nats {
    fn env(&self) -> Vec<(&'static str, String)> {
        let url = match &self.proxy {
            Some(proxy) => format!("nats://{}", proxy.addr),
            None => self.stream.url.clone(),
        };
        let mut env = self.stream.env_via(&url);
        env.retain(|(key, _)| *key != "OUTBOX_NATS_SUBJECT");
        env.push(("OUTBOX_NATS_SUBJECT", self.subject.clone()));
        env
    }

    fn received(&self) -> BoxFuture<'_, HashSet<Uuid>> {
        Box::pin(async move {
            let Ok(stream) = self.stream.context().get_stream(&self.stream.name).await else {
                return HashSet::new();
            };
            let messages = self.stream.messages().await;
            if self.drain {
                if let Some(last) = messages.iter().map(|message| message.sequence).max() {
                    // Only what was read: a message stored meanwhile stays.
                    let _ = stream.purge().sequence(last + 1).await;
                }
            }
            messages
                .iter()
                .filter_map(|message| message.msg_id().parse().ok())
                .collect()
        })
    }
}

/// Backpressure: a stream full with `discard: new` refuses every message;
/// the stream is emptied as it is read (by the kit), and everything
/// arrives.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_stream_is_backpressure() {
    let mut nats = Nats::new(StreamLimits {
        max_messages_discard_new: 50,
        ..StreamLimits::default()
    })
    .await;
    nats.drain = true;
    let mut bench = Bench::new(nats).await;
    let ids = bench.insert(300, "conformance.full").await;
    bench.start(&[]);
    bench.assert_outage("maximum messages").await;
    bench.assert_delivered(&ids).await;
}

/// No stream captures the template's subjects: the operator has not
/// created it yet.
#[tokio::test(flavor = "multi_thread")]
async fn no_stream_is_an_outage() {
    let mut bench = Bench::new(Nats::without_stream().await).await;
    let ids = bench.insert(100, "conformance.early").await;
    bench.start(&[]);
    bench.assert_outage("no JetStream stream captures").await;
    bench.broker.stream.add(&StreamLimits::default()).await;
    bench.assert_delivered(&ids).await;
}

/// A server that cannot be reached (refused, every connection cut).
#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_cannot_be_reached_is_an_outage() {
    let mut bench = Bench::new(Nats::new(StreamLimits::default()).await.behind_proxy().await).await;
    bench.start_delivering(&[]).await;
    bench.broker.proxy().refuse(true);
    bench.broker.proxy().cut();
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage("down").await;
    bench.broker.proxy().refuse(false);
    bench.assert_delivered(&during).await;
}

/// A server that stops answering with the connection open.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_stops_answering_is_an_outage() {
    let mut bench = Bench::new(Nats::new(StreamLimits::default()).await.behind_proxy().await).await;
    bench.start_delivering(&[("OUTBOX_PUBLISH_TIMEOUT", "2s")]).await;
    bench.broker.proxy().stall(true);
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage("OUTBOX_PUBLISH_TIMEOUT").await;
    bench.broker.proxy().stall(false);
    bench.assert_delivered(&during).await;
}

/// Streams capture some of the template's subjects but not this row's: the
/// row's failed attempt, as an unroutable RabbitMQ message is.
#[tokio::test(flavor = "multi_thread")]
async fn a_subject_no_stream_captures_is_the_rows_retry() {
    let nats = Nats::without_stream().await;
    nats.stream
        .context()
        .create_stream(Config {
            name: nats.stream.name.clone(),
            subjects: vec![format!("{}.routed.>", nats.stream.prefix)],
            max_age: Duration::from_secs(3600),
            duplicate_window: Duration::from_secs(600),
            ..Config::default()
        })
        .await
        .expect("create stream");
    let mut bench = Bench::new(nats).await;
    let (bad, good) = bench
        .among_good_rows("routed.a", async { bench.insert(1, "nowhere").await[0] })
        .await;
    bench.start(&[]);
    bench
        .assert_row_fault(
            bad,
            RowFault::Retry,
            "no JetStream stream captures the subject",
            &good,
        )
        .await;
}

/// A message over the stream's `max_msg_size`.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_over_the_stream_limit_is_rejected() {
    let mut bench = Bench::new(
        Nats::new(StreamLimits {
            max_message_size: 1024,
            ..StreamLimits::default()
        })
        .await,
    )
    .await;
    let (bad, good) = bench
        .among_good_rows(
            "conformance.small",
            bench.insert_row(
                "conformance.big",
                "a",
                &format!("{{\"blob\": \"{}\"}}", "x".repeat(2000)),
            ),
        )
        .await;
    bench.start(&[]);
    bench
        .assert_row_fault(bad, RowFault::Reject, "exceeds maximum", &good)
        .await;
}

/// A subject longer than the server's control line would have the server
/// close the connection, failing the batch-mates: refused before sending.
#[tokio::test(flavor = "multi_thread")]
async fn a_subject_over_the_control_line_is_rejected_before_sending() {
    let mut nats = Nats::new(StreamLimits::default()).await;
    nats.subject = format!("{}.{{aggregate_id}}", nats.stream.prefix);
    let mut bench = Bench::new(nats).await;
    let mut good = bench.insert(200, "conformance.short").await;
    let bad = bench
        .insert_row("conformance.long", &"a".repeat(5000), r#"{"n": 1}"#)
        .await;
    good.extend(bench.insert(200, "conformance.short").await);
    bench.start(&[]);
    bench
        .assert_row_fault(bad, RowFault::Reject, "subject", &good)
        .await;
}

/// A server whose `max_control_line` is set below the default, which the
/// relay is told (`OUTBOX_NATS_MAX_CONTROL_LINE`): a subject that fits the
/// default but not this server is refused before sending.
#[tokio::test(flavor = "multi_thread")]
async fn a_subject_over_a_lowered_control_line_is_rejected_before_sending() {
    let server = PrivateNats::start_with("max_control_line: 1024");
    let mut bench = Bench::new(Nats::by_aggregate_on(&server).await).await;
    let (bad, good) = bench
        .among_good_rows(
            "conformance.short",
            bench.insert_row("conformance.long", &"a".repeat(2000), r#"{"n": 1}"#),
        )
        .await;
    bench.start(&[("OUTBOX_NATS_MAX_CONTROL_LINE", "1024")]);
    bench
        .assert_row_fault(bad, RowFault::Reject, "max_control_line of 1024", &good)
        .await;
}

/// The same server, the relay not told: the server closes the connection
/// on the long subject, failing the acknowledgements of everything in
/// flight. The relay publishes the unanswered messages again alone on the
/// connection, in halves, until the one the server closes it on stands
/// alone: it is quarantined with the server's error, the others published.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_the_server_closes_the_connection_on_is_isolated() {
    let server = PrivateNats::start_with("max_control_line: 1024");
    let mut bench = Bench::new(Nats::by_aggregate_on(&server).await).await;
    let (bad, good) = bench
        .among_good_rows(
            "conformance.short",
            bench.insert_row("conformance.long", &"a".repeat(2000), r#"{"n": 1}"#),
        )
        .await;
    bench.start(&[]);
    bench
        .assert_row_fault(
            bad,
            RowFault::Reject,
            "closed the connection on this message",
            &good,
        )
        .await;
}

impl Drop for Nats {
    fn drop(&mut self) {
        // The stream goes with the case; TestStream::cleanup is async, so
        // a thread with its own runtime deletes it.
        let (url, name) = (self.stream.url.clone(), self.stream.name.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                runtime.block_on(async {
                    let context = TestStream::connect(&url).await;
                    let _ = context.delete_stream(&name).await;
                });
            }
        })
        .join();
    }
}
