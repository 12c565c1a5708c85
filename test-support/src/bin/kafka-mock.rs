//! A Kafka cluster for the tests: librdkafka's mock cluster, in a process
//! of its own.
//!
//! The mock cluster lives inside a librdkafka client handle, so a test
//! could create it in its own process; but the relay under test is another
//! process, and a cluster owned by the test would die with a panicking
//! test's runtime at awkward moments and share its threads. Here it is a
//! child the test drives over a pipe, and it ends when the pipe closes,
//! that is with the test.
//!
//! Usage: `kafka-mock [BROKERS]` (default 1). It prints `bootstrap
//! <servers>`, then reads one command a line from standard input and
//! answers each with `ok` or `error <text>`:
//!
//! - `topic <name> <partitions>`: creates a topic (replication factor 1);
//!   the relay never creates topics.
//! - `errors <api> <count> <ERROR_NAME>`: the next `count` requests of
//!   `api` (`produce`, `metadata`, `init_producer_id`, `api_versions`) are
//!   answered with that error.
//! - `clear <api>`: drops the errors still queued for `api`.
//! - `topic-error <name> <ERROR_NAME>`: metadata answers that error for the
//!   topic (`NO_ERROR` clears it).
//! - `down <broker_id>`, `up <broker_id>`: closes a broker's listener and
//!   connections, or opens it again.
//! - `rtt <broker_id> <millis>`: delays each of a broker's answers.

use std::io::{BufRead, Write};
use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

type Cluster = MockCluster<'static, DefaultProducerContext>;

fn main() {
    let brokers: i32 = match std::env::args().nth(1) {
        None => 1,
        Some(arg) => arg.parse().unwrap_or_else(|_| {
            eprintln!("kafka-mock: the broker count must be a number, not {arg:?}");
            std::process::exit(2)
        }),
    };
    let cluster = MockCluster::new(brokers).unwrap_or_else(|e| {
        eprintln!("kafka-mock: cannot start a mock cluster of {brokers} brokers: {e}");
        std::process::exit(1)
    });
    let mut out = std::io::stdout().lock();
    // Standard output is a pipe: each answer is flushed, or the test waits
    // for it forever.
    writeln!(out, "bootstrap {}", cluster.bootstrap_servers())
        .and_then(|()| out.flush())
        .ok();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let answer = match run(&cluster, line) {
            Ok(()) => "ok".to_owned(),
            Err(text) => format!("error {text}"),
        };
        if writeln!(out, "{answer}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    // Standard input closed: the test is over.
}

/// Carries out one command line.
fn run(cluster: &Cluster, line: &str) -> Result<(), String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["topic", name, partitions] => cluster
            .create_topic(name, number(partitions)?, 1)
            .map_err(|e| format!("create topic {name}: {e}")),
        ["errors", api, count, error] => {
            let count: usize = number(count)?;
            cluster.request_errors(api_key(api)?, &vec![error_code(error)?; count]);
            Ok(())
        }
        ["clear", api] => {
            cluster.clear_request_errors(api_key(api)?);
            Ok(())
        }
        ["topic-error", name, error] => cluster
            .topic_error(name, error_code(error)?)
            .map_err(|e| format!("topic error on {name}: {e}")),
        ["down", broker] => cluster
            .broker_down(number(broker)?)
            .map_err(|e| format!("broker {broker} down: {e}")),
        ["up", broker] => cluster
            .broker_up(number(broker)?)
            .map_err(|e| format!("broker {broker} up: {e}")),
        ["rtt", broker, millis] => cluster
            .broker_round_trip_time(number(broker)?, Duration::from_millis(number(millis)?))
            .map_err(|e| format!("broker {broker} round trip time: {e}")),
        _ => Err(format!("unknown command: {line}")),
    }
}

fn number<T: std::str::FromStr>(word: &str) -> Result<T, String> {
    word.parse().map_err(|_| format!("not a number: {word}"))
}

/// The request kinds a test injects errors into.
fn api_key(name: &str) -> Result<RDKafkaApiKey, String> {
    Ok(match name {
        "produce" => RDKafkaApiKey::Produce,
        "metadata" => RDKafkaApiKey::Metadata,
        "init_producer_id" => RDKafkaApiKey::InitProducerId,
        "api_versions" => RDKafkaApiKey::ApiVersion,
        _ => {
            return Err(format!(
                "unknown api {name} (produce, metadata, init_producer_id, api_versions)"
            ))
        }
    })
}

/// The broker errors the tests inject, by their Kafka protocol names.
fn error_code(name: &str) -> Result<RDKafkaRespErr, String> {
    use RDKafkaRespErr::*;
    Ok(match name {
        "NO_ERROR" => RD_KAFKA_RESP_ERR_NO_ERROR,
        // Not a broker answer: the mock broker closes the connection.
        "_TRANSPORT" => RD_KAFKA_RESP_ERR__TRANSPORT,
        "TOPIC_AUTHORIZATION_FAILED" => RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        "CLUSTER_AUTHORIZATION_FAILED" => RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED,
        "NOT_ENOUGH_REPLICAS" => RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND" => RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        "REQUEST_TIMED_OUT" => RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        "LEADER_NOT_AVAILABLE" => RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        "NOT_LEADER_FOR_PARTITION" => RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        "MSG_SIZE_TOO_LARGE" => RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
        "UNKNOWN_TOPIC_OR_PART" => RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
        "INVALID_RECORD" => RD_KAFKA_RESP_ERR_INVALID_RECORD,
        "POLICY_VIOLATION" => RD_KAFKA_RESP_ERR_POLICY_VIOLATION,
        "THROTTLING_QUOTA_EXCEEDED" => RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED,
        "INVALID_REQUIRED_ACKS" => RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS,
        "RECORD_LIST_TOO_LARGE" => RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE,
        "CORRUPT_MESSAGE" => RD_KAFKA_RESP_ERR_INVALID_MSG,
        "KAFKA_STORAGE_ERROR" => RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR,
        "OUT_OF_ORDER_SEQUENCE_NUMBER" => RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
        "UNKNOWN_PRODUCER_ID" => RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID,
        "UNSUPPORTED_FOR_MESSAGE_FORMAT" => RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT,
        _ => return Err(format!("unknown error name {name}")),
    })
}
