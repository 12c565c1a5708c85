//! Bad input, generated: a few hundred rows per sink whose producer-written
//! columns (`event_type`, `aggregate_id`, `causation_id`, `headers`,
//! `payload`) come from a seeded generator, within what PostgreSQL accepts:
//! empty, very long, unicode, control characters, wildcards, reserved
//! header names, headers that are not an object of strings, payloads from
//! one byte to past the sink's limit, deep nesting, numbers PostgreSQL
//! expands.
//!
//! Whatever the input, every row ends published (and the broker holds it,
//! byte for byte) or quarantined with a reason that is the row's own; no
//! published row was charged an attempt, no worker stops (`/healthz`
//! stays 200, the process runs, rows inserted afterwards are published).
//! An oracle that knows only the obvious cases adds: a plainly valid row
//! is published, a plainly invalid one is quarantined on its first attempt.
//!
//! The seed is printed; `OUTBOX_TEST_SEED=<seed>` replays the same inputs,
//! `OUTBOX_TEST_GENERATED_ROWS=<n>` changes how many rows each test tries.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::sqs::TestQueue;
use common::system::free_port;
use common::{
    eventually, http_get, quick_settings, with, RelayProcess, StreamLimits, TestBroker, TestDb, TestStream,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use uuid::Uuid;

/// Deadline of every wait; a passing test never waits this long.
const WAIT: Duration = Duration::from_secs(120);

/// `OUTBOX_MAX_ATTEMPTS` of the relays under test.
const MAX_ATTEMPTS: i32 = 3;

/// The limits the sinks are set up with, small so that rows past them are
/// cheap to make.
const AMQP_MAX_MESSAGE_BYTES: usize = 65_536;
const SQS_MAXIMUM_MESSAGE_SIZE: usize = 4_096;
const NATS_MAX_MESSAGE_SIZE: usize = 8_192;

/// Fragments of the reasons the sinks give for a failure that is the
/// broker's or the network's: a row quarantined with one of them was
/// charged for a fault not its own.
const NOT_THE_ROWS_FAULT: [&str; 22] = [
    "deferred",
    "timed out",
    "in time",
    "not confirmed",
    "not acknowledged",
    "confirm not received",
    "unreachable",
    "connection refused",
    "connection reset",
    "connection closed",
    "connection was lost",
    "connection is down",
    "broken pipe",
    "no rabbitmq channel",
    "nacked",
    "blocks publishing",
    "did not answer",
    "jetstream publish failed",
    "jetstream api",
    "throttl",
    "the whole batch is retried",
    "returned no result",
];

// ---------------------------------------------------------------------------
// The generator
// ---------------------------------------------------------------------------

/// What a producer wrote into one row.
#[derive(Debug, Clone)]
struct Input {
    event_type: String,
    aggregate_id: String,
    causation_id: Option<Uuid>,
    /// JSON text for the `headers` column, or NULL.
    headers: Option<String>,
    /// JSON text for the `payload` column.
    payload: String,
}

const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const PUNCT: &[char] = &[
    ' ', '.', '-', '_', '*', '>', '#', '/', ':', ';', ',', '{', '}', '[', ']', '"', '\'', '\\', '=', '+',
    '!', '?', '@', '$', '%', '&', '|', '~', '^', '`', '(', ')', '<',
];
/// Non-ASCII characters, among them ones SQS refuses (U+FFFE, U+FFFF),
/// invisible ones, line and paragraph separators, a C1 control.
const UNICODE: &[char] = &[
    'é',
    'ü',
    'ß',
    'я',
    '中',
    '日',
    '🎉',
    '✓',
    '😀',
    '\u{a0}',
    '\u{85}',
    '\u{200b}',
    '\u{200d}',
    '\u{202e}',
    '\u{2028}',
    '\u{2029}',
    '\u{3000}',
    '\u{feff}',
    '\u{fffd}',
    '\u{fffe}',
    '\u{ffff}',
    '\u{d7ff}',
    '\u{e000}',
    '\u{10ffff}',
    '\u{301}',
];
/// Control characters PostgreSQL takes in text (everything but NUL).
const CONTROL: &[char] = &[
    '\t', '\n', '\r', '\u{1}', '\u{7}', '\u{8}', '\u{b}', '\u{c}', '\u{1b}', '\u{1f}', '\u{7f}', '\u{9f}',
];
/// Strings that mean something somewhere: wildcards, template
/// placeholders, path and SQL fragments, dots in the wrong places.
const SPECIAL: &[&str] = &[
    "*",
    ">",
    "#",
    "a.*",
    "a.>",
    "order.#",
    "*.created",
    "{event_type}",
    "{aggregate_id}",
    "{}",
    " order.created",
    "order.created ",
    "order..created",
    ".order",
    "order.",
    ".",
    "..",
    "é.ü",
    "🎉",
    "null",
    "../../etc/passwd",
    "%2f",
    "\\",
    "\"",
    "'; DROP TABLE outbox_event; --",
    "amq.gen-x",
    "$JS.API.STREAM.DELETE.x",
    "_INBOX.x",
];
/// Header names: ordinary ones, ones some sink reserves or cannot carry.
const HEADER_NAMES: &[&str] = &[
    "traceparent",
    "tracestate",
    "baggage",
    "tenant-id",
    "Tenant-Id",
    "X-Request-Id",
    "schema.version",
    "a..b",
    ".lead",
    "trail.",
    "AWS.trace",
    "amazon.x",
    "Nats-Msg-Id",
    "nats-expected-stream",
    "Content-Type",
    "CC",
    "bcc",
    "x-death",
    "x-first-death-queue",
    "X-Last-Death-Reason",
    "x-delivery-count",
    "x-received-from",
    "event_id",
    "Event_Type",
    "AGGREGATE_ID",
    "causation_id",
    "ce-id",
    "source",
    "has space",
    "colon:name",
    "ünï",
    "tab\there",
    "",
];
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

struct Generator {
    rng: StdRng,
}

impl Generator {
    fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// An index drawn with the given weights.
    fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut at = self.rng.random_range(0..total);
        for (index, weight) in weights.iter().enumerate() {
            if at < *weight {
                return index;
            }
            at -= weight;
        }
        weights.len() - 1
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.rng.random_range(0..items.len())]
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    fn char(&mut self) -> char {
        match self.weighted(&[55, 15, 18, 12]) {
            0 => char::from(self.pick(ALNUM)),
            1 => self.pick(PUNCT),
            2 => self.pick(UNICODE),
            _ => self.pick(CONTROL),
        }
    }

    /// Lowercase letters and digits.
    fn word(&mut self, max: usize) -> String {
        let len = self.rng.random_range(1..=max);
        (0..len)
            .map(|_| char::from(self.pick(b"abcdefghijklmnopqrstuvwxyz0123456789")))
            .collect()
    }

    /// A length, short most of the time, up to `max`.
    fn length(&mut self, max: usize) -> usize {
        if self.chance(0.8) {
            self.rng.random_range(1..=max.min(24))
        } else {
            self.rng.random_range(1..=max)
        }
    }

    /// Producer text of at most `max` characters.
    fn text(&mut self, max: usize) -> String {
        let text = match self.weighted(&[4, 30, 14, 30, 6, 6, 10]) {
            0 => String::new(),
            1 => {
                let tokens = self.rng.random_range(1..=4);
                (0..tokens).map(|_| self.word(10)).collect::<Vec<_>>().join(".")
            }
            2 => {
                let tokens = self.rng.random_range(1..=5);
                (0..tokens)
                    .map(|_| match self.weighted(&[5, 1, 1, 1, 1, 1, 2]) {
                        0 => self.word(8),
                        1 => String::new(),
                        2 => "*".to_owned(),
                        3 => ">".to_owned(),
                        4 => "#".to_owned(),
                        5 => "a b".to_owned(),
                        _ => (0..self.rng.random_range(1..=4))
                            .map(|_| self.pick(UNICODE))
                            .collect(),
                    })
                    .collect::<Vec<_>>()
                    .join(".")
            }
            3 => {
                let len = self.length(max);
                (0..len).map(|_| self.char()).collect()
            }
            4 => {
                let c = self.char();
                let len = self.rng.random_range(max / 2..=max);
                std::iter::repeat_n(c, len).collect()
            }
            5 => {
                let len = self.rng.random_range(1..=3);
                (0..len)
                    .map(|_| self.pick(&[' ', '\t', '\n', '\r', '\u{1}', '\u{a0}', '\u{3000}']))
                    .collect()
            }
            _ => self.pick(SPECIAL).to_owned(),
        };
        text.chars().take(max).collect()
    }

    /// A row: a third of them look like what a producer usually writes,
    /// the rest is anything.
    fn input(&mut self, limit: usize) -> Input {
        let ordinary = self.chance(0.3);
        let event_type = if ordinary {
            format!("{}.{}", self.word(12), self.word(12))
        } else {
            // VARCHAR(150) counts characters, not bytes.
            self.text(150)
        };
        let aggregate_id = if ordinary {
            format!("order-{}", self.rng.random_range(0..10_000))
        } else if self.chance(0.05) {
            // As long as a producer's TEXT key might get.
            let c = self.char();
            std::iter::repeat_n(c, self.rng.random_range(4_000..=10_000)).collect()
        } else {
            self.text(10_000)
        };
        let causation_id = self.chance(0.5).then(Uuid::new_v4);
        let headers = if ordinary && self.chance(0.7) {
            self.chance(0.5).then(|| {
                let pairs: serde_json::Map<String, Value> =
                    [("traceparent", TRACEPARENT), ("tenant-id", "acme")]
                        .into_iter()
                        .map(|(n, v)| (n.to_owned(), Value::from(v)))
                        .collect();
                Value::Object(pairs).to_string()
            })
        } else {
            self.headers()
        };
        Input {
            event_type,
            aggregate_id,
            causation_id,
            headers,
            payload: self.payload(limit),
        }
    }

    fn header_name(&mut self) -> String {
        match self.weighted(&[5, 3, 1]) {
            0 => self.pick(HEADER_NAMES).to_owned(),
            1 => self.text(40),
            // Past AMQP's 255-byte short string and SQS's 256 characters.
            _ => "n".repeat(self.rng.random_range(250..=300)),
        }
    }

    fn header_value(&mut self) -> Value {
        let text = match self.weighted(&[3, 12, 2, 1, 1, 1, 1]) {
            0 => TRACEPARENT.to_owned(),
            1 => self.text(200),
            2 => String::new(),
            // Around NATS's 64 KiB of headers, under AMQP's frame_max.
            3 => "v".repeat(self.rng.random_range(65_000..=66_000)),
            // Over AMQP's frame_max.
            4 => "v".repeat(200_000),
            // Around AMQP's frame_max (131,072 bytes) with the rest of the
            // properties: where the relay's count of the frame must be exact.
            5 => "v".repeat(self.rng.random_range(130_500..=131_100)),
            _ => "v".repeat(self.rng.random_range(1_000..=5_000)),
        };
        Value::from(text)
    }

    /// The `headers` column: NULL, an object of strings, or anything a
    /// producer might get wrong.
    fn headers(&mut self) -> Option<String> {
        let value = match self.weighted(&[35, 8, 7, 35, 5, 5, 1, 3]) {
            0 => return None,
            1 => Value::Object(Default::default()),
            2 => match self.weighted(&[1, 1, 1, 1, 1]) {
                0 => Value::Null,
                1 => serde_json::json!(["traceparent", TRACEPARENT]),
                2 => Value::from("tenant=acme"),
                3 => Value::from(42),
                _ => Value::from(true),
            },
            3 => {
                let count = self.rng.random_range(1..=5);
                self.header_object(count)
            }
            4 => {
                let count = self.rng.random_range(0..=3);
                let mut object = self.header_object(count);
                let bad = match self.weighted(&[1, 1, 1, 1, 1]) {
                    0 => Value::from(3),
                    1 => Value::from(false),
                    2 => Value::Null,
                    3 => serde_json::json!({"a": "b"}),
                    _ => serde_json::json!(["a"]),
                };
                if let Value::Object(map) = &mut object {
                    map.insert(self.header_name(), bad);
                }
                object
            }
            5 => {
                let count = self.rng.random_range(6..=40);
                self.header_object(count)
            }
            6 => {
                let count = self.rng.random_range(200..=2_000);
                let map: serde_json::Map<String, Value> = (0..count)
                    .map(|n| (format!("h{n}"), Value::from(self.word(20))))
                    .collect();
                Value::Object(map)
            }
            // The same name twice: jsonb keeps the last.
            _ => {
                return Some(format!(
                    r#"{{"tenant": "a", "tenant": {}, "Tenant": "c"}}"#,
                    self.header_value()
                ))
            }
        };
        Some(value.to_string())
    }

    fn header_object(&mut self, count: usize) -> Value {
        let map: serde_json::Map<String, Value> = (0..count)
            .map(|_| (self.header_name(), self.header_value()))
            .collect();
        Value::Object(map)
    }

    /// A JSON value of random shape, strings from [`Generator::text`].
    fn json(&mut self, depth: u32) -> Value {
        let kinds: &[u32] = if depth == 0 {
            &[1, 1, 2, 4, 0, 0]
        } else {
            &[1, 1, 2, 4, 2, 3]
        };
        match self.weighted(kinds) {
            0 => Value::Null,
            1 => Value::from(self.chance(0.5)),
            2 => match self.weighted(&[3, 2, 1]) {
                0 => Value::from(self.rng.random_range(-1_000_000i64..1_000_000)),
                1 => Value::from(self.rng.random::<i64>()),
                _ => serde_json::Number::from_f64(self.rng.random_range(-1e12..1e12))
                    .map_or(Value::Null, Value::Number),
            },
            3 => Value::from(self.text(60)),
            4 => {
                let len = self.rng.random_range(0..=5);
                Value::Array((0..len).map(|_| self.json(depth - 1)).collect())
            }
            _ => {
                let len = self.rng.random_range(0..=5);
                Value::Object((0..len).map(|_| (self.text(20), self.json(depth - 1))).collect())
            }
        }
    }

    /// An object whose rendering by PostgreSQL is about `bytes` long.
    fn blob(&mut self, bytes: usize) -> String {
        // The unit repeated, and how many bytes PostgreSQL renders it in.
        let (unit, rendered) = self.pick(&[
            ("x", 1),
            ("é", 2),
            ("中", 3),
            ("🎉", 4),
            ("\\n", 2),
            ("\\u0001", 6),
        ]);
        let count = bytes.saturating_sub(r#"{"blob": ""}"#.len()) / rendered;
        format!(r#"{{"blob": "{}"}}"#, unit.repeat(count))
    }

    /// The `payload` column: sizes from one byte to past `limit` (and now
    /// and then past every sink's), shapes PostgreSQL renders otherwise
    /// than written.
    fn payload(&mut self, limit: usize) -> String {
        match self.weighted(&[8, 30, 5, 6, 12, 10, 9, 4, 1, 6, 4, 5, 1]) {
            0 => self
                .pick(&[
                    "{}", "[]", "0", "1", "-0", "\"\"", "null", "true", "false", "\"x\"",
                ])
                .to_owned(),
            1 => self.json(3).to_string(),
            2 => {
                let depth = self.rng.random_range(20..=3_000);
                if self.chance(0.5) {
                    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
                } else {
                    format!("{}1{}", r#"{"a": "#.repeat(depth), "}".repeat(depth))
                }
            }
            // Numbers PostgreSQL renders in full: 1e5000 takes 5,001 bytes.
            3 => self
                .pick(&[
                    "1e400",
                    "1E+2",
                    "-1.5e-300",
                    "123456789012345678901234567890.000000000000000000001",
                    "{\"n\": 1e5000}",
                    "[1e1000, -1e1000, 0.1e-1000]",
                ])
                .to_owned(),
            4 => {
                let bytes = self.rng.random_range(16..=512);
                self.blob(bytes)
            }
            5 => {
                let bytes = self.rng.random_range(limit / 8..=limit / 2);
                self.blob(bytes)
            }
            6 => {
                let bytes = self.rng.random_range(limit - 64..=limit + 64);
                self.blob(bytes)
            }
            7 => {
                let bytes = self.rng.random_range(limit + 1..=limit * 2);
                self.blob(bytes)
            }
            8 => {
                let bytes = self.rng.random_range(1_048_577..=1_200_000);
                self.blob(bytes)
            }
            9 => {
                // JSON escapes, surrogate pairs among them; now and then one
                // PostgreSQL refuses (\u0000, a lone surrogate).
                let pieces = self.rng.random_range(1..=12);
                let text: String = (0..pieces)
                    .map(|_| {
                        self.pick(&[
                            "\\u00e9",
                            "\\ud83d\\ude00",
                            "\\u0001",
                            "\\u001f",
                            "\\ufffe",
                            "\\uffff",
                            "\\u2028",
                            "\\\\",
                            "\\\"",
                            "\\/",
                            "\\b\\f\\n\\r\\t",
                            "plain",
                            "\\u0000",
                            "\\ud800",
                        ])
                    })
                    .collect();
                format!(r#"{{"s": "{text}"}}"#)
            }
            12 => {
                // Around NATS's max_payload (1 MiB), which counts the headers
                // too: where the relay's count of the message must be exact.
                let bytes = self.rng.random_range(1_048_000..=1_048_576);
                self.blob(bytes)
            }
            10 => self
                .pick(&[
                    "  { \"a\" :\n 1 ,\t\"b\":[ ] }  ",
                    "{\"a\": 1, \"a\": 2}",
                    "{\"b\": 1, \"a\": {\"d\": 2, \"c\": 3}}",
                    "\r\n[\r\n]\r\n",
                ])
                .to_owned(),
            _ => {
                let len = self.rng.random_range(1..=200);
                let text: String = (0..len).map(|_| self.pick(UNICODE)).collect();
                serde_json::json!({ "unicode": text, "key\u{1}": "v" }).to_string()
            }
        }
    }
}

/// The seed of this run: `OUTBOX_TEST_SEED` to replay one, else random.
fn seed() -> u64 {
    match std::env::var("OUTBOX_TEST_SEED") {
        Ok(raw) => raw
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("OUTBOX_TEST_SEED={raw:?} is not a u64: {e}")),
        Err(_) => rand::random(),
    }
}

/// How many rows each test tries: `OUTBOX_TEST_GENERATED_ROWS`, else `default`.
fn row_count(default: usize) -> usize {
    std::env::var("OUTBOX_TEST_GENERATED_ROWS")
        .ok()
        .and_then(|raw| raw.trim().parse().ok())
        .unwrap_or(default)
}

/// A short, one-line description of a long string, for failure messages.
fn shown(text: &str) -> String {
    let head: String = text.chars().take(60).collect();
    let escaped = head.escape_debug().to_string();
    if head.len() == text.len() {
        format!("\"{escaped}\"")
    } else {
        format!(
            "\"{escaped}…\" ({} bytes, {} chars)",
            text.len(),
            text.chars().count()
        )
    }
}

// ---------------------------------------------------------------------------
// The sinks under test
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// RabbitMQ; routing key `{event_type}`, or `evt.{aggregate_id}`.
    Rabbit {
        by_aggregate: bool,
    },
    Sqs {
        fifo: bool,
    },
    /// NATS, subject `<prefix>.{event_type}.{aggregate_id}`, or
    /// `<prefix>.{event_type}`.
    Nats {
        by_aggregate: bool,
    },
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Rabbit { by_aggregate: false } => "rabbitmq, routing key {event_type}",
            Kind::Rabbit { by_aggregate: true } => "rabbitmq, routing key evt.{aggregate_id}",
            Kind::Sqs { fifo: false } => "sqs, standard queue",
            Kind::Sqs { fifo: true } => "sqs, FIFO queue",
            Kind::Nats { by_aggregate: true } => "nats, subject <prefix>.{event_type}.{aggregate_id}",
            Kind::Nats { by_aggregate: false } => "nats, subject <prefix>.{event_type}",
        }
    }

    /// The size the payload generator aims around.
    fn limit(self) -> usize {
        match self {
            Kind::Rabbit { .. } => AMQP_MAX_MESSAGE_BYTES,
            Kind::Sqs { .. } => SQS_MAXIMUM_MESSAGE_SIZE,
            Kind::Nats { .. } => NATS_MAX_MESSAGE_SIZE,
        }
    }

    /// Distinguishes the tests' inputs under one seed.
    fn salt(self) -> u64 {
        match self {
            Kind::Rabbit { by_aggregate: false } => 1,
            Kind::Rabbit { by_aggregate: true } => 2,
            Kind::Sqs { fifo: false } => 3,
            Kind::Sqs { fifo: true } => 4,
            Kind::Nats { by_aggregate: true } => 5,
            Kind::Nats { by_aggregate: false } => 6,
        }
    }
}

enum Target {
    Rabbit(TestBroker),
    Sqs(TestQueue),
    Nats(TestStream),
}

impl Target {
    async fn create(kind: Kind) -> Self {
        match kind {
            // Bound on `#`: every routing key is routable.
            Kind::Rabbit { .. } => Target::Rabbit(TestBroker::create("#").await),
            Kind::Sqs { fifo } => {
                Target::Sqs(TestQueue::create(fifo, Some(SQS_MAXIMUM_MESSAGE_SIZE as u32)).await)
            }
            Kind::Nats { .. } => Target::Nats(
                TestStream::create_with(StreamLimits {
                    max_message_size: NATS_MAX_MESSAGE_SIZE as i32,
                    ..StreamLimits::default()
                })
                .await,
            ),
        }
    }

    fn env(&self, kind: Kind) -> Vec<(&'static str, String)> {
        match (self, kind) {
            (Target::Rabbit(broker), Kind::Rabbit { by_aggregate }) => {
                let mut env = broker.env();
                env.push((
                    "OUTBOX_AMQP_MAX_MESSAGE_BYTES",
                    AMQP_MAX_MESSAGE_BYTES.to_string(),
                ));
                if by_aggregate {
                    env.push(("OUTBOX_AMQP_ROUTING_KEY", "evt.{aggregate_id}".to_owned()));
                }
                env
            }
            (Target::Sqs(queue), _) => queue.env(),
            (Target::Nats(stream), Kind::Nats { by_aggregate: true }) => with(
                stream.env(),
                &[(
                    "OUTBOX_NATS_SUBJECT",
                    &format!("{}.{{event_type}}.{{aggregate_id}}", stream.prefix),
                )],
            ),
            (Target::Nats(stream), _) => stream.env(),
            _ => unreachable!("a target of another kind"),
        }
    }

    /// Reads back what the broker received until every id in `wanted` is
    /// there or the deadline passes.
    async fn receive(&self, wanted: &HashSet<Uuid>) -> Vec<Message> {
        let deadline = Instant::now() + WAIT;
        let mut messages: Vec<Message> = Vec::new();
        let missing = |messages: &[Message]| {
            let seen: HashSet<Uuid> = messages.iter().filter_map(|m| m.id).collect();
            wanted.difference(&seen).count()
        };
        while missing(&messages) > 0 && Instant::now() < deadline {
            let want = missing(&messages);
            match self {
                Target::Rabbit(broker) => {
                    for m in broker.receive(want, Duration::from_secs(10)).await {
                        messages.push(Message {
                            id: m.message_id.parse().ok(),
                            body: m.body,
                            route: m.routing_key,
                            fields: m.headers.into_iter().collect(),
                            kind: m.kind,
                        });
                    }
                }
                Target::Sqs(queue) => {
                    for m in queue.receive(want, Duration::from_secs(10)).await {
                        messages.push(Message {
                            id: m.event_id().parse().ok(),
                            route: m.group_id.clone().unwrap_or_default(),
                            fields: m
                                .attributes
                                .iter()
                                .map(|(name, (kind, value))| {
                                    let value = value.clone().unwrap_or_default();
                                    (name.clone(), format!("{kind}:{value}"))
                                })
                                .collect(),
                            body: m.body.into_bytes(),
                            kind: None,
                        });
                    }
                }
                Target::Nats(stream) => {
                    // The stream keeps every message: each read returns all.
                    messages = stream
                        .messages()
                        .await
                        .into_iter()
                        .map(|m| Message {
                            id: m.msg_id().parse().ok(),
                            route: m.subject,
                            fields: m.headers.into_iter().collect(),
                            body: m.body,
                            kind: None,
                        })
                        .collect();
                    if missing(&messages) > 0 {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        }
        messages
    }

    async fn cleanup(self) {
        match self {
            Target::Rabbit(broker) => broker.cleanup().await,
            Target::Sqs(queue) => queue.cleanup().await,
            Target::Nats(stream) => stream.cleanup().await,
        }
    }
}

/// A message as the broker delivered or stored it, in one shape for every
/// sink: `fields` are its headers (RabbitMQ, NATS) or its message
/// attributes as `type:value` (SQS); `route` its routing key, subject or
/// FIFO group id.
#[derive(Debug)]
struct Message {
    id: Option<Uuid>,
    body: Vec<u8>,
    route: String,
    fields: BTreeMap<String, String>,
    kind: Option<String>,
}

// ---------------------------------------------------------------------------
// What the test knows about a row
// ---------------------------------------------------------------------------

/// A row as inserted, with the texts PostgreSQL renders.
#[derive(Debug)]
struct Row {
    id: Uuid,
    input: Input,
    /// `payload::text`, the message body.
    payload: String,
    /// `headers::text`.
    headers: Option<String>,
}

/// What the test can tell from the input alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Plainly valid on this sink: published.
    Published,
    /// Plainly invalid on this sink: quarantined on its first attempt.
    Quarantined,
    /// Either, as long as it ends one way or the other.
    Either,
}

impl Row {
    /// The headers column as name → value when it is an object.
    fn header_object(&self) -> Option<serde_json::Map<String, Value>> {
        match serde_json::from_str::<Value>(self.headers.as_deref()?) {
            Ok(Value::Object(map)) => Some(map),
            _ => None,
        }
    }

    /// The producer headers the relay carries: the column, when it is an
    /// object of strings.
    fn carried_headers(&self) -> Vec<(String, String)> {
        self.header_object()
            .map(|map| {
                map.into_iter()
                    .filter_map(|(name, value)| value.as_str().map(|v| (name.clone(), v.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the headers column is one no sink can carry: not an object
    /// of strings, an empty name, a name the relay sets.
    fn headers_invalid_everywhere(&self) -> bool {
        let Some(text) = self.headers.as_deref() else {
            return false;
        };
        let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) else {
            return true;
        };
        map.iter().any(|(name, value)| {
            !value.is_string()
                || name.is_empty()
                || ["event_id", "event_type", "aggregate_id", "causation_id"]
                    .iter()
                    .any(|reserved| reserved.eq_ignore_ascii_case(name))
        })
    }

    fn expect(&self, kind: Kind) -> Expect {
        if self.headers_invalid_everywhere() || self.invalid_on(kind) {
            Expect::Quarantined
        } else if self.plainly_valid(kind) {
            Expect::Published
        } else {
            Expect::Either
        }
    }

    /// Rows the sink must refuse, each for a reason its docs give.
    fn invalid_on(&self, kind: Kind) -> bool {
        let (event_type, aggregate_id) = (&self.input.event_type, &self.input.aggregate_id);
        let headers = self.carried_headers();
        match kind {
            Kind::Rabbit { by_aggregate } => {
                let key_bytes = if by_aggregate {
                    "evt.".len() + aggregate_id.len()
                } else {
                    event_type.len()
                };
                self.payload.len() > AMQP_MAX_MESSAGE_BYTES
                    || event_type.len() > 255
                    || key_bytes > 255
                    || headers.iter().any(|(name, _)| {
                        let lower = name.to_ascii_lowercase();
                        name.len() > 255
                            || ["cc", "bcc", "x-death", "x-delivery-count", "x-received-from"]
                                .contains(&lower.as_str())
                            || lower.starts_with("x-first-death-")
                            || lower.starts_with("x-last-death-")
                    })
                    || headers.iter().map(|(_, value)| value.len()).sum::<usize>() > 131_072
            }
            Kind::Sqs { fifo } => {
                let sqs_char = |c: char| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..);
                let attribute_count = 3 + usize::from(self.input.causation_id.is_some()) + headers.len();
                self.payload.len() > SQS_MAXIMUM_MESSAGE_SIZE
                    || !self.payload.chars().all(sqs_char)
                    || event_type.is_empty()
                    || aggregate_id.is_empty()
                    || !event_type.chars().all(sqs_char)
                    || !aggregate_id.chars().all(sqs_char)
                    || attribute_count > 10
                    || headers.iter().any(|(name, value)| {
                        value.is_empty()
                            || !value.chars().all(sqs_char)
                            || name.len() > 256
                            || !name
                                .bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
                    })
                    || (fifo
                        && !((1..=128).contains(&aggregate_id.len())
                            && aggregate_id.bytes().all(|b| b.is_ascii_graphic())))
            }
            Kind::Nats { by_aggregate } => {
                let subject_part_invalid = |part: &str| {
                    part.is_empty()
                        || part.chars().any(|c| c.is_whitespace() || c.is_control())
                        || part
                            .split('.')
                            .any(|token| token.is_empty() || token == "*" || token == ">")
                };
                self.payload.len() > NATS_MAX_MESSAGE_SIZE
                    || subject_part_invalid(event_type)
                    || (by_aggregate && subject_part_invalid(aggregate_id))
                    || aggregate_id.contains(['\r', '\n'])
                    || headers.iter().any(|(name, value)| {
                        let lower = name.to_ascii_lowercase();
                        !name.bytes().all(|b| (33..=126).contains(&b) && b != b':')
                            || lower.starts_with("nats-")
                            || lower == "content-type"
                            || value.contains(['\r', '\n'])
                    })
            }
        }
    }

    /// Rows any producer would call ordinary, well within the sink's
    /// limits.
    fn plainly_valid(&self, kind: Kind) -> bool {
        let (event_type, aggregate_id) = (&self.input.event_type, &self.input.aggregate_id);
        let token = |t: &str| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        };
        let ordinary_type = event_type.len() <= 100 && event_type.split('.').all(token);
        let ordinary_aggregate = (1..=64).contains(&aggregate_id.len())
            && aggregate_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        let headers = self.carried_headers();
        let ordinary_headers = self.header_object().is_some() || self.headers.is_none();
        let ordinary_headers = ordinary_headers
            && headers.len() <= 5
            && headers.len() == self.header_object().map_or(0, |map| map.len())
            && headers.iter().all(|(name, value)| {
                let first = name.bytes().next();
                first.is_some_and(|b| b.is_ascii_lowercase())
                    && name.len() <= 30
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !["cc", "bcc", "content-type"].contains(&name.as_str())
                    && !name.starts_with("x-")
                    && !name.starts_with("nats-")
                    && (1..=200).contains(&value.len())
                    && value.bytes().all(|b| (0x20..=0x7e).contains(&b))
            });
        let header_bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 8).sum();
        let fits = match kind {
            Kind::Rabbit { .. } => self.payload.len() <= AMQP_MAX_MESSAGE_BYTES,
            Kind::Sqs { .. } => {
                let attributes = 50 + 16 + event_type.len() + 18 + aggregate_id.len() + 54 + header_bytes;
                self.payload.len() + attributes <= SQS_MAXIMUM_MESSAGE_SIZE
                    && self
                        .payload
                        .chars()
                        .all(|c| !matches!(c, '\u{FFFE}' | '\u{FFFF}'))
            }
            Kind::Nats { .. } => self.payload.len() + 512 + header_bytes <= NATS_MAX_MESSAGE_SIZE,
        };
        ordinary_type && ordinary_aggregate && ordinary_headers && fits
    }

    /// What a mismatch between this row and its message is, if any.
    fn mismatch(&self, kind: Kind, message: &Message, prefix: &str) -> Option<String> {
        let mut wrong = Vec::new();
        if message.body != self.payload.as_bytes() {
            wrong.push(format!(
                "body {} is not the payload {}",
                shown(&String::from_utf8_lossy(&message.body)),
                shown(&self.payload)
            ));
        }
        let (event_type, aggregate_id) = (&self.input.event_type, &self.input.aggregate_id);
        let mut expected: BTreeMap<String, String> = BTreeMap::new();
        let cause = self.input.causation_id.map(|id| id.to_string());
        let route = match kind {
            Kind::Rabbit { by_aggregate } => {
                expected.insert("aggregate_id".into(), aggregate_id.clone());
                if let Some(cause) = &cause {
                    expected.insert("causation_id".into(), cause.clone());
                }
                expected.extend(self.carried_headers());
                if message.kind.as_deref() != Some(event_type.as_str()) {
                    wrong.push(format!("type {:?}", message.kind));
                }
                if by_aggregate {
                    format!("evt.{aggregate_id}")
                } else {
                    event_type.clone()
                }
            }
            Kind::Sqs { fifo } => {
                let string = |v: &str| format!("String:{v}");
                expected.insert("event_id".into(), string(&self.id.to_string()));
                expected.insert("event_type".into(), string(event_type));
                expected.insert("aggregate_id".into(), string(aggregate_id));
                if let Some(cause) = &cause {
                    expected.insert("causation_id".into(), string(cause));
                }
                for (name, value) in self.carried_headers() {
                    expected.insert(name, string(&value));
                }
                if fifo {
                    aggregate_id.clone()
                } else {
                    String::new()
                }
            }
            Kind::Nats { by_aggregate } => {
                expected.insert("Nats-Msg-Id".into(), self.id.to_string());
                expected.insert("Content-Type".into(), "application/json".into());
                expected.insert("event_type".into(), event_type.clone());
                expected.insert("aggregate_id".into(), aggregate_id.clone());
                if let Some(cause) = &cause {
                    expected.insert("causation_id".into(), cause.clone());
                }
                expected.extend(self.carried_headers());
                // The server stores header values byte for byte, but NATS
                // clients (this one included) trim white space around a
                // value when they read it: what a consumer reads is the
                // trimmed value (docs/nats.md says so).
                for value in expected.values_mut() {
                    *value = value.trim().to_owned();
                }
                if by_aggregate {
                    format!("{prefix}.{event_type}.{aggregate_id}")
                } else {
                    format!("{prefix}.{event_type}")
                }
            }
        };
        if message.route != route {
            wrong.push(format!(
                "route {} instead of {}",
                shown(&message.route),
                shown(&route)
            ));
        }
        if message.fields != expected {
            let differing: Vec<String> = expected
                .keys()
                .chain(message.fields.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .filter(|name| expected.get(*name) != message.fields.get(*name))
                .map(|name| {
                    format!(
                        "{}: got {} want {}",
                        shown(name),
                        message.fields.get(name).map_or("none".into(), |v| shown(v)),
                        expected.get(name).map_or("none".into(), |v| shown(v))
                    )
                })
                .collect();
            wrong.push(format!("fields differ: {}", differing.join("; ")));
        }
        (!wrong.is_empty()).then(|| wrong.join(", "))
    }

    fn describe(&self) -> String {
        format!(
            "id {} event_type {} aggregate_id {} causation_id {:?} headers {} payload {}",
            self.id,
            shown(&self.input.event_type),
            shown(&self.input.aggregate_id),
            self.input.causation_id,
            self.headers.as_deref().map_or("NULL".to_owned(), shown),
            shown(&self.payload)
        )
    }
}

/// A row's state in the table.
#[derive(Debug)]
struct State {
    published: bool,
    quarantined: bool,
    attempts: i32,
    last_error: Option<String>,
}

async fn states(db: &TestDb) -> HashMap<Uuid, State> {
    db.client
        .query(
            "SELECT id, published_at IS NOT NULL, quarantined_at IS NOT NULL, attempt_count, last_error
             FROM outbox_event",
            &[],
        )
        .await
        .expect("read the rows")
        .iter()
        .map(|row| {
            (
                row.get(0),
                State {
                    published: row.get(1),
                    quarantined: row.get(2),
                    attempts: row.get(3),
                    last_error: row.get(4),
                },
            )
        })
        .collect()
}

/// A reason with its particulars (quoted names, subjects, numbers)
/// blanked, so that reasons of one kind are counted together.
fn reason_kind(reason: &str) -> String {
    let chars: Vec<char> = reason.chars().collect();
    let mut kind = String::new();
    let mut at = 0;
    while at < chars.len() {
        let c = chars[at];
        // A quotation: `"` anywhere (escaped within), `'` only after a
        // space, so that "queue's" stays a word; it ends at the matching
        // quote that ends a word.
        let opens = c == '"' || (c == '\'' && (at == 0 || chars[at - 1] == ' '));
        if opens {
            kind.push(c);
            kind.push('…');
            at += 1;
            while at < chars.len() {
                if chars[at] == '\\' {
                    at += 2;
                    continue;
                }
                let ends_word = chars.get(at + 1).is_none_or(|next| !next.is_alphanumeric());
                if chars[at] == c && (c == '"' || ends_word) {
                    break;
                }
                at += 1;
            }
            kind.push(c);
            at += 1;
            continue;
        }
        if !c.is_ascii_digit() {
            kind.push(c);
        } else if !chars[at.saturating_sub(1)].is_ascii_digit() || at == 0 {
            kind.push('N');
        }
        at += 1;
    }
    kind.chars()
        .take(140)
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

async fn generated_rows_end_published_or_quarantined(kind: Kind, default_rows: usize) {
    let base_seed = seed();
    let count = row_count(default_rows);
    eprintln!(
        "generated rows [{}]: seed {base_seed} (replay with OUTBOX_TEST_SEED={base_seed}), {count} inputs",
        kind.name()
    );
    let mut generator = Generator::new(base_seed ^ kind.salt().wrapping_mul(0x9E37_79B9_7F4A_7C15));

    let db = TestDb::migrated_with_headers().await;
    let target = Target::create(kind).await;

    // Every row is in before the relay starts, so batches mix the good and
    // the bad.
    let mut rows: Vec<Row> = Vec::with_capacity(count);
    // Reason → how many, and the first input refused so.
    let mut refused_by_postgres: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for _ in 0..count {
        let input = generator.input(kind.limit());
        let id = Uuid::new_v4();
        let inserted = db
            .client
            .query_one(
                "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload, headers, created_at)
                 VALUES ($1, $2, $3, $4, $5::text::jsonb, $6::text::jsonb, clock_timestamp())
                 RETURNING payload::text, headers::text",
                &[
                    &id,
                    &input.causation_id,
                    &input.event_type,
                    &input.aggregate_id,
                    &input.payload,
                    &input.headers,
                ],
            )
            .await;
        match inserted {
            Ok(row) => rows.push(Row {
                id,
                input,
                payload: row.get(0),
                headers: row.get(1),
            }),
            Err(e) => {
                let reason = e
                    .as_db_error()
                    .map_or_else(|| e.to_string(), |db| db.message().to_owned());
                let entry = refused_by_postgres
                    .entry(reason_kind(&reason))
                    .or_insert_with(|| (0, format!("{input:?}").chars().take(300).collect()));
                entry.0 += 1;
            }
        }
    }
    let expect: HashMap<Uuid, Expect> = rows.iter().map(|row| (row.id, row.expect(kind))).collect();
    let by_id: HashMap<Uuid, &Row> = rows.iter().map(|row| (row.id, row)).collect();

    let port = free_port();
    let env = with(
        {
            let mut env = target.env(kind);
            env.extend(quick_settings());
            env
        },
        &[
            ("OUTBOX_MAX_ATTEMPTS", &MAX_ATTEMPTS.to_string()),
            ("OUTBOX_BATCH_SIZE", "25"),
            ("OUTBOX_HTTP_ADDR", &format!("127.0.0.1:{port}")),
        ],
    );
    let mut relay = RelayProcess::start(&db, &env);

    // Wait for every row to end one way or the other, probing the health
    // endpoints meanwhile.
    let deadline = Instant::now() + WAIT;
    let mut health_failures: Vec<(u16, String)> = Vec::new();
    let mut not_ready: BTreeMap<String, usize> = BTreeMap::new();
    let mut ready_once = false;
    loop {
        let unsettled = db.count("published_at IS NULL AND quarantined_at IS NULL").await;
        if unsettled == 0 {
            break;
        }
        if let Some(status) = relay.child.try_wait().expect("try_wait") {
            panic!("the relay exited ({status}) with {unsettled} rows unsettled");
        }
        match http_get(port, "/healthz").await {
            Some((200, _)) | None => {}
            Some(other) => health_failures.push(other),
        }
        match http_get(port, "/readyz").await {
            Some((200, _)) => ready_once = true,
            Some((_, body)) if ready_once => *not_ready.entry(reason_kind(&body)).or_default() += 1,
            _ => {}
        }
        if Instant::now() > deadline {
            let states = states(&db).await;
            let stuck: Vec<String> = rows
                .iter()
                .filter(|row| {
                    let state = &states[&row.id];
                    !state.published && !state.quarantined
                })
                .take(30)
                .map(|row| {
                    let state = &states[&row.id];
                    format!(
                        "{}\n    attempts {} quarantined {} last_error {:?}",
                        row.describe(),
                        state.attempts,
                        state.quarantined,
                        state.last_error
                    )
                })
                .collect();
            panic!(
                "[{}] seed {base_seed}: {unsettled} rows neither published nor quarantined after {WAIT:?} \
                 (/readyz said, after being ready: {not_ready:?}); the first of them:\n{}",
                kind.name(),
                stuck.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let states = states(&db).await;
    let mut problems: Vec<String> = Vec::new();
    let mut reasons: BTreeMap<(String, i32), usize> = BTreeMap::new();
    let (mut published, mut quarantined) = (HashSet::new(), 0usize);
    for row in &rows {
        let state = &states[&row.id];
        let expected = expect[&row.id];
        if state.published {
            published.insert(row.id);
            if state.attempts != 1 {
                problems.push(format!(
                    "published after {} attempts (charged for a fault not its own): {}",
                    state.attempts,
                    row.describe()
                ));
            }
            if expected == Expect::Quarantined {
                problems.push(format!(
                    "published, though the sink cannot take it: {}",
                    row.describe()
                ));
            }
            continue;
        }
        quarantined += 1;
        let reason = state.last_error.clone().unwrap_or_default();
        if reason.trim().is_empty() {
            problems.push(format!("quarantined without a reason: {}", row.describe()));
        }
        *reasons.entry((reason_kind(&reason), state.attempts)).or_default() += 1;
        let lower = reason.to_lowercase();
        if let Some(fragment) = NOT_THE_ROWS_FAULT.iter().find(|f| lower.contains(*f)) {
            problems.push(format!(
                "quarantined for a fault that is not its own ({fragment:?} in {reason:?}): {}",
                row.describe()
            ));
        }
        match expected {
            Expect::Published => problems.push(format!(
                "quarantined after {} attempts, though plainly valid ({reason:?}): {}",
                state.attempts,
                row.describe()
            )),
            Expect::Quarantined if state.attempts != 1 => problems.push(format!(
                "quarantined only after {} attempts, though invalid from the start ({reason:?}): {}",
                state.attempts,
                row.describe()
            )),
            _ => {}
        }
    }

    // No worker stopped: rows inserted now are published too.
    let canaries: Vec<Uuid> = (0..10).map(|_| Uuid::new_v4()).collect();
    for (n, id) in canaries.iter().enumerate() {
        db.client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload) VALUES ($1, 'canary.created', $2, $3::text::jsonb)",
                &[id, &format!("canary-{n}"), &format!("{{\"n\": {n}}}")],
            )
            .await
            .expect("insert a canary");
    }
    eventually(WAIT, "the rows inserted afterwards are published", || async {
        db.client
            .query_one(
                "SELECT count(*) FROM outbox_event WHERE id = ANY($1) AND published_at IS NOT NULL",
                &[&canaries],
            )
            .await
            .expect("count canaries")
            .get::<_, i64>(0)
            == canaries.len() as i64
    })
    .await;

    // Every published row reached the broker, as it was written.
    let mut wanted = published.clone();
    wanted.extend(canaries.iter().copied());
    let messages = target.receive(&wanted).await;
    let prefix = match &target {
        Target::Nats(stream) => stream.prefix.clone(),
        _ => String::new(),
    };
    let mut received: HashSet<Uuid> = HashSet::new();
    let mut of_quarantined = 0usize;
    for message in &messages {
        let Some(id) = message.id else {
            problems.push(format!("a message without a row id: {message:?}"));
            continue;
        };
        received.insert(id);
        if canaries.contains(&id) {
            continue;
        }
        let Some(row) = by_id.get(&id) else {
            problems.push(format!("a message for no row: {id}"));
            continue;
        };
        if !published.contains(&id) {
            of_quarantined += 1;
        }
        if let Some(wrong) = row.mismatch(kind, message, &prefix) {
            problems.push(format!(
                "message differs from its row ({wrong}): {}",
                row.describe()
            ));
        }
    }
    for id in wanted.difference(&received) {
        let what = by_id
            .get(id)
            .map_or_else(|| format!("canary {id}"), |row| row.describe());
        problems.push(format!("published but not received: {what}"));
    }

    match http_get(port, "/healthz").await {
        Some((200, _)) => {}
        other => problems.push(format!("/healthz at the end: {other:?}")),
    }
    if !health_failures.is_empty() {
        problems.push(format!("/healthz failed during the run: {health_failures:?}"));
    }
    if let Some(status) = relay.child.try_wait().expect("try_wait") {
        problems.push(format!("the relay exited: {status}"));
    }

    let tried = count;
    let inserted = rows.len();
    let plainly = |e: Expect| expect.values().filter(|x| **x == e).count();
    eprintln!(
        "generated rows [{}]: seed {base_seed}: tried {tried} inputs; PostgreSQL refused {}, {inserted} inserted: \
         {} published, {quarantined} quarantined ({} of them received by the broker all the same); \
         the oracle expected {} published, {} quarantined, {} either way",
        kind.name(),
        tried - inserted,
        published.len(),
        of_quarantined,
        plainly(Expect::Published),
        plainly(Expect::Quarantined),
        plainly(Expect::Either),
    );
    for (reason, (n, example)) in &refused_by_postgres {
        eprintln!("  refused by PostgreSQL ×{n}: {reason}; e.g. {example}");
    }
    for ((reason, attempts), n) in &reasons {
        eprintln!("  quarantined ×{n} after {attempts} attempt(s): {reason}");
    }
    if !not_ready.is_empty() {
        eprintln!("  /readyz not ready after being ready: {not_ready:?}");
    }
    assert!(
        problems.is_empty(),
        "[{}] seed {base_seed}: {} problems:\n{}",
        kind.name(),
        problems.len(),
        problems.join("\n")
    );
    drop(relay);
    target.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_routed_by_event_type() {
    generated_rows_end_published_or_quarantined(Kind::Rabbit { by_aggregate: false }, 300).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_routed_by_aggregate_id() {
    generated_rows_end_published_or_quarantined(Kind::Rabbit { by_aggregate: true }, 200).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqs_standard_queue() {
    generated_rows_end_published_or_quarantined(Kind::Sqs { fifo: false }, 300).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqs_fifo_queue() {
    generated_rows_end_published_or_quarantined(Kind::Sqs { fifo: true }, 200).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_subject_of_event_type() {
    generated_rows_end_published_or_quarantined(Kind::Nats { by_aggregate: false }, 300).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_subject_of_event_type_and_aggregate_id() {
    generated_rows_end_published_or_quarantined(Kind::Nats { by_aggregate: true }, 300).await;
}
