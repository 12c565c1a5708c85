//! A JetStream stream of its own per test, on subjects of its own, and a
//! reader that returns every message the stream holds.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::stream::{Config, DiscardPolicy, Stream};
use async_nats::jetstream::{self, Context};

use crate::unique;

/// Where the tests find NATS (with JetStream).
pub fn nats_url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// The host and port of the tests' NATS server, for a proxy in front of it.
pub fn nats_addr() -> std::net::SocketAddr {
    let url = url::Url::parse(&nats_url()).expect("OUTBOX_TEST_NATS_URL is a URL");
    let host = url.host_str().unwrap_or("127.0.0.1");
    let port = url.port().unwrap_or(4222);
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .ok()
        .and_then(|mut addrs| addrs.next())
        .expect("NATS address resolves")
}

/// A message as the stream stored it.
#[derive(Debug, Clone)]
pub struct Stored {
    pub subject: String,
    pub sequence: u64,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Stored {
    /// The `Nats-Msg-Id` header, or "" without one.
    pub fn msg_id(&self) -> String {
        self.headers.get("Nats-Msg-Id").cloned().unwrap_or_default()
    }
}

/// How a test's stream is set up.
#[derive(Debug, Clone, Default)]
pub struct StreamLimits {
    /// The stream's `max_msg_size` (0: none).
    pub max_message_size: i32,
    /// The stream's `max_msgs` with `discard: new` (0: none).
    pub max_messages_discard_new: i64,
}

/// A stream capturing `<prefix>.>` for one test, deleted at the end.
pub struct TestStream {
    /// The stream's name.
    pub name: String,
    /// The first subject token of every subject the stream captures.
    pub prefix: String,
    /// The server's URL, which the relay is given too.
    pub url: String,
    context: Context,
}

impl TestStream {
    /// Connects to the tests' NATS server, or fails saying how to start it.
    pub async fn connect(url: &str) -> Context {
        let client = async_nats::connect(url).await.unwrap_or_else(|e| {
            panic!(
                "cannot reach NATS at {url}: {e}\nstart it with: nats-server -js \
                 (or set OUTBOX_TEST_NATS_URL)"
            )
        });
        jetstream::new(client)
    }

    /// A stream with no limits and a 10-minute duplicate window: longer
    /// than any test, so every republication is deduplicated.
    pub async fn create() -> Self {
        Self::create_with(StreamLimits::default()).await
    }

    /// A stream with `limits`.
    pub async fn create_with(limits: StreamLimits) -> Self {
        let url = nats_url();
        let context = Self::connect(&url).await;
        let stream = Self::unnamed(&url, context);
        stream.add(&limits).await;
        stream
    }

    /// Names a stream and its subjects without creating it (see
    /// [`TestStream::add`]), for a test that starts without one.
    pub fn unnamed(url: &str, context: Context) -> Self {
        let name = unique("outbox_test");
        Self {
            prefix: name.clone(),
            name,
            url: url.to_owned(),
            context,
        }
    }

    /// Creates the stream.
    pub async fn add(&self, limits: &StreamLimits) {
        let mut config = Config {
            name: self.name.clone(),
            subjects: vec![format!("{}.>", self.prefix)],
            duplicate_window: Duration::from_secs(600),
            // A test's messages are few; an hour reclaims what a failed
            // test leaves behind.
            max_age: Duration::from_secs(3600),
            ..Config::default()
        };
        if limits.max_message_size > 0 {
            config.max_message_size = limits.max_message_size;
        }
        if limits.max_messages_discard_new > 0 {
            config.max_messages = limits.max_messages_discard_new;
            config.discard = DiscardPolicy::New;
        }
        self.context.create_stream(config).await.expect("create stream");
    }

    /// The relay settings that publish to this test's stream, with
    /// `<prefix>.{event_type}` as the subject.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        self.env_via(&self.url)
    }

    /// Like [`TestStream::env`], with the relay reaching NATS at `url`.
    pub fn env_via(&self, url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("OUTBOX_SINK", "nats".to_owned()),
            ("OUTBOX_NATS_URL", url.to_owned()),
            ("OUTBOX_NATS_SUBJECT", format!("{}.{{event_type}}", self.prefix)),
        ]
    }

    /// The JetStream context the stream was created on.
    pub fn context(&self) -> &Context {
        &self.context
    }

    async fn stream(&self) -> Stream {
        self.context.get_stream(&self.name).await.expect("get stream")
    }

    /// How many messages the stream holds.
    pub async fn count(&self) -> u64 {
        let mut stream = self.stream().await;
        stream.info().await.expect("stream info").state.messages
    }

    /// Every message the stream holds, in stream order.
    pub async fn messages(&self) -> Vec<Stored> {
        let mut stream = self.stream().await;
        let state = stream.info().await.expect("stream info").state.clone();
        let mut stored = Vec::new();
        if state.messages == 0 {
            return stored;
        }
        for sequence in state.first_sequence..=state.last_sequence {
            let Ok(message) = stream.get_raw_message(sequence).await else {
                continue;
            };
            let headers = message
                .headers
                .iter()
                .filter_map(|(name, values)| {
                    values
                        .first()
                        .map(|value| (name.to_string(), value.as_str().to_owned()))
                })
                .collect();
            stored.push(Stored {
                subject: message.subject.to_string(),
                sequence,
                headers,
                body: message.payload.to_vec(),
            });
        }
        stored
    }

    /// Deletes the stream.
    pub async fn cleanup(self) {
        let _ = self.context.delete_stream(&self.name).await;
    }
}
