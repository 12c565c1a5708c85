//! A Kafka cluster of its own per test — librdkafka's mock cluster, run by
//! the `kafka-mock` binary of this crate in a child process — the faults a
//! test injects into it, and a reader that returns every record of a topic
//! through a client of its own (kafka-python, not the librdkafka the relay
//! uses).
//!
//! The mock cluster starts in milliseconds and speaks the Kafka protocol
//! on loopback ports of its own, so every test (and every conformance
//! case) has a cluster nobody else touches, and no Kafka server has to be
//! installed. What it cannot do is be a second opinion on the protocol:
//! the relay and the mock are the same library, so records are read back
//! with kafka-python, which shares no code with either.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;

/// The request kinds [`KafkaMock::push_errors`] answers with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaApi {
    Produce,
    Metadata,
    InitProducerId,
    ApiVersions,
}

impl KafkaApi {
    fn name(self) -> &'static str {
        match self {
            Self::Produce => "produce",
            Self::Metadata => "metadata",
            Self::InitProducerId => "init_producer_id",
            Self::ApiVersions => "api_versions",
        }
    }
}

/// A record as a Kafka consumer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    /// In the record's order; Kafka allows a name twice.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl KafkaRecord {
    /// The first header called `name`, as bytes.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_slice())
    }

    /// The first header called `name`, as text.
    pub fn header_str(&self, name: &str) -> Option<String> {
        self.header(name)
            .map(|value| String::from_utf8_lossy(value).into_owned())
    }

    /// The `event_id` header, or "" without one.
    pub fn event_id(&self) -> String {
        self.header_str("event_id").unwrap_or_default()
    }

    /// The key as text, or "" without one.
    pub fn key_str(&self) -> String {
        self.key
            .as_deref()
            .map(|key| String::from_utf8_lossy(key).into_owned())
            .unwrap_or_default()
    }
}

/// A topic name no other test uses: `<prefix>.<32 hex digits>`. Kafka
/// topic names are `[A-Za-z0-9._-]`, at most 249 characters.
pub fn unique_topic(prefix: &str) -> String {
    let topic = format!("{prefix}.{}", uuid::Uuid::new_v4().simple());
    assert!(
        topic.len() <= 249
            && topic
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
        "not a valid Kafka topic name: {topic}"
    );
    topic
}

/// A mock Kafka cluster in a child process, killed when dropped.
///
/// Brokers are numbered from 1. Every command waits for the mock's answer
/// and panics with its error, so a test never goes on against a cluster
/// that did not do what it was told.
pub struct KafkaMock {
    /// The cluster's `bootstrap.servers`, for the relay and the reader.
    pub bootstrap: String,
    /// How many brokers the cluster has.
    pub brokers: i32,
    child: Child,
    control: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
}

impl KafkaMock {
    /// Starts a cluster of `brokers` brokers.
    pub fn start(brokers: i32) -> Self {
        let binary = mock_binary();
        let mut child = Command::new(&binary)
            .arg(brokers.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        // The mock prints this line before anything else, or exits (with
        // its reason on stderr, which the test's output shows).
        stdout.read_line(&mut line).expect("read kafka-mock's output");
        let bootstrap = line
            .trim()
            .strip_prefix("bootstrap ")
            .unwrap_or_else(|| panic!("kafka-mock did not start: {line:?}"))
            .to_owned();
        Self {
            bootstrap,
            brokers,
            child,
            control: Mutex::new((stdin, stdout)),
        }
    }

    /// The relay settings that publish to this cluster with the topic
    /// template `topic`.
    pub fn env(&self, topic: &str) -> Vec<(&'static str, String)> {
        vec![
            ("OUTBOX_SINK", "kafka".to_owned()),
            ("OUTBOX_KAFKA_BROKERS", self.bootstrap.clone()),
            ("OUTBOX_KAFKA_TOPIC", topic.to_owned()),
        ]
    }

    /// Sends one command line and waits for its answer.
    fn command(&self, line: &str) {
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        let (stdin, stdout) = &mut *control;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("kafka-mock is gone ({e}); it was told: {line}"));
        let mut answer = String::new();
        stdout
            .read_line(&mut answer)
            .unwrap_or_else(|e| panic!("kafka-mock did not answer {line}: {e}"));
        match answer.trim() {
            "ok" => {}
            "" => panic!("kafka-mock exited on: {line}"),
            other => panic!(
                "kafka-mock refused `{line}`: {}",
                other.strip_prefix("error ").unwrap_or(other)
            ),
        }
    }

    /// Creates `topic` with `partitions` partitions (replication factor 1).
    /// The relay never creates topics; the test does, as an operator
    /// would.
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        self.command(&format!("topic {topic} {partitions}"));
    }

    /// Answers the next `count` requests of `api` with `error`, a Kafka
    /// protocol error name such as `TOPIC_AUTHORIZATION_FAILED`
    /// (`_TRANSPORT`: the broker closes the connection instead). A count
    /// far above what a test sends lasts until [`KafkaMock::clear_errors`].
    pub fn push_errors(&self, api: KafkaApi, count: usize, error: &str) {
        self.command(&format!("errors {} {count} {error}", api.name()));
    }

    /// Drops the errors still queued for `api`.
    pub fn clear_errors(&self, api: KafkaApi) {
        self.command(&format!("clear {}", api.name()));
    }

    /// Metadata answers `error` for `topic`; `NO_ERROR` ends it.
    pub fn topic_error(&self, topic: &str, error: &str) {
        self.command(&format!("topic-error {topic} {error}"));
    }

    /// Closes a broker's listener and its connections.
    pub fn broker_down(&self, broker: i32) {
        self.command(&format!("down {broker}"));
    }

    /// Opens a broker's listener again.
    pub fn broker_up(&self, broker: i32) {
        self.command(&format!("up {broker}"));
    }

    /// Every broker down ([`KafkaMock::broker_down`]).
    pub fn all_down(&self) {
        (1..=self.brokers).for_each(|broker| self.broker_down(broker));
    }

    /// Every broker up ([`KafkaMock::broker_up`]).
    pub fn all_up(&self) {
        (1..=self.brokers).for_each(|broker| self.broker_up(broker));
    }

    /// Delays each answer of `broker` by `delay` (zero: no delay).
    pub fn round_trip_time(&self, broker: i32, delay: Duration) {
        self.command(&format!("rtt {broker} {}", delay.as_millis()));
    }

    /// Every record of every partition of `topic`, from the beginning to
    /// the end offsets when the read starts, read with kafka-python; by
    /// partition, then offset. A topic that does not exist reads as empty
    /// (and reading it does not create it).
    pub async fn read(&self, topic: &str) -> Vec<KafkaRecord> {
        read_lines(&self.bootstrap, topic, false)
            .await
            .iter()
            .map(record)
            .collect()
    }

    /// The ids of every record of `topic` ([`KafkaMock::read`]), in the
    /// order read; a record without an `event_id` header is a test failure.
    pub async fn event_ids(&self, topic: &str) -> Vec<uuid::Uuid> {
        self.read(topic)
            .await
            .iter()
            .map(|record| {
                record
                    .event_id()
                    .parse()
                    .unwrap_or_else(|_| panic!("a record without an event_id header: {record:?}"))
            })
            .collect()
    }

    /// Every record of `topic` as the official CloudEvents SDK parses it
    /// (`cloudevents.core.bindings.kafka.from_binary`, binary content
    /// mode): per record, `{"partition", "offset", "ok": true,
    /// "attributes": {...}, "data": ...}`, or `"ok": false` and the SDK's
    /// `"error"` when it refused the record.
    pub async fn read_cloudevents(&self, topic: &str) -> Vec<serde_json::Value> {
        read_lines(&self.bootstrap, topic, true).await
    }
}

impl Drop for KafkaMock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `kafka-mock` binary beside the running test's: a test binary is
/// `target/<profile>/deps/<test>-<hash>`, the crate's binaries are in
/// `target/<profile>/`. Cargo tells a binary's path only to its own
/// package's tests, and the relay's tests are another package's.
fn mock_binary() -> PathBuf {
    let test = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary is in target/<profile>/deps");
    let binary = profile_dir.join("kafka-mock");
    assert!(
        binary.exists(),
        "{} is missing: `cargo build -p outbox-test-support --bin kafka-mock` builds it \
         (scripts/test does before running the tests)",
        binary.display()
    );
    binary
}

/// Runs `python/read_kafka.py` and returns its JSON lines.
async fn read_lines(bootstrap: &str, topic: &str, cloudevents: bool) -> Vec<serde_json::Value> {
    let python = std::env::var("OUTBOX_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "OUTBOX_TEST_PYTHON is not set: run the tests with scripts/test, which installs \
             kafka-python and the CloudEvents SDK into a virtualenv and sets it"
        )
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/read_kafka.py");
    let mut command = tokio::process::Command::new(&python);
    command.arg(script);
    if cloudevents {
        command.arg("--cloudevents");
    }
    let output = command
        .args([bootstrap, topic])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {python} (OUTBOX_TEST_PYTHON): {e}"));
    assert!(
        output.status.success(),
        "read_kafka.py {topic} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("read_kafka.py printed {line:?}: {e}"))
        })
        .collect()
}

fn record(line: &serde_json::Value) -> KafkaRecord {
    let bytes = |value: &serde_json::Value| -> Option<Vec<u8>> {
        value.as_str().map(|text| {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .unwrap_or_else(|e| panic!("read_kafka.py printed bad base64 {text:?}: {e}"))
        })
    };
    KafkaRecord {
        partition: line["partition"].as_i64().expect("partition") as i32,
        offset: line["offset"].as_i64().expect("offset"),
        key: bytes(&line["key"]),
        value: bytes(&line["value"]).unwrap_or_default(),
        headers: line["headers"]
            .as_array()
            .expect("headers")
            .iter()
            .map(|header| {
                (
                    header[0].as_str().expect("header name").to_owned(),
                    bytes(&header[1]).unwrap_or_default(),
                )
            })
            .collect(),
    }
}
