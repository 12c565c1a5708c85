//! `OUTBOX_MESSAGE_FORMAT=cloudevents` on both sinks, read back and
//! validated by the official CloudEvents SDK for Python (the `cloudevents`
//! package, pinned in `scripts/lib/cloudevents-sdk.sh`, which `scripts/test`
//! installs into a virtualenv and names in `OUTBOX_TEST_PYTHON`), not only
//! by our own parsing: RabbitMQ in binary content mode through the SDK's
//! RabbitMQ binding, SQS bodies in structured content mode through its JSON
//! format. With and without the headers column, extension attributes from
//! headers, and the names CloudEvents mode reserves.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::sqs::TestQueue;
use common::{eventually, quick_settings, with, RelayProcess, TestBroker, TestDb};
use serde_json::{json, Value};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(120);
const SOURCE: &str = "https://shop.example.com/orders";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A row as inserted, with what PostgreSQL made of it.
struct Row {
    id: Uuid,
    aggregate_id: String,
    payload: Value,
    created_at: chrono::DateTime<chrono::Utc>,
}

async fn database(headers_column: bool) -> TestDb {
    if headers_column {
        TestDb::migrated_with_headers().await
    } else {
        TestDb::migrated().await
    }
}

/// Inserts a row; `headers` only on a table with the column.
async fn insert(db: &TestDb, n: usize, headers: Option<&str>) -> Row {
    let id = Uuid::new_v4();
    let aggregate_id = format!("order-{n}");
    let payload = format!(r#"{{"n": {n}, "text": "héllo \"quoted\"", "nested": {{"b": [1, 2.50, null]}}}}"#);
    let sql = if headers.is_some() {
        "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, headers)
         VALUES ($1, 'order.created', $2, $3::text::jsonb, $4::text::jsonb) RETURNING created_at"
    } else {
        "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
         VALUES ($1, 'order.created', $2, $3::text::jsonb) RETURNING created_at"
    };
    let row = if let Some(headers) = headers {
        db.client
            .query_one(sql, &[&id, &aggregate_id, &payload, &headers])
            .await
    } else {
        db.client.query_one(sql, &[&id, &aggregate_id, &payload]).await
    }
    .expect("insert row");
    Row {
        id,
        aggregate_id,
        payload: serde_json::from_str(&payload).unwrap(),
        created_at: row.get(0),
    }
}

/// Hands `messages` to the official SDK (tests/cloudevents/read_events.py)
/// and returns what it made of each.
fn read_with_sdk(messages: &[Value]) -> Vec<Value> {
    let python = std::env::var("OUTBOX_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "OUTBOX_TEST_PYTHON is not set: run the tests with scripts/test, which installs the \
             CloudEvents SDK into a virtualenv and sets it, or point it at a python with \
             cloudevents==2.2.0 installed"
        )
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cloudevents/read_events.py");
    let mut child = Command::new(&python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python} (OUTBOX_TEST_PYTHON): {e}"));
    {
        let mut stdin = child.stdin.take().expect("piped stdin");
        for message in messages {
            writeln!(stdin, "{message}").expect("write to the SDK reader");
        }
    }
    let output = child.wait_with_output().expect("SDK reader ran");
    assert!(
        output.status.success(),
        "the SDK reader failed (is the cloudevents package installed for {python}?)"
    );
    let results: Vec<Value> = String::from_utf8(output.stdout)
        .expect("UTF-8 output")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(results.len(), messages.len(), "one result per message");
    results
}

/// Asserts the SDK read `result` as the event of `row`, with exactly the
/// `extensions` given beside the context attributes.
fn assert_event(result: &Value, row: &Row, extensions: &[(&str, &str)]) {
    assert_eq!(result["ok"], true, "the SDK accepted the event: {result}");
    let attributes = result["attributes"].as_object().expect("attributes");
    let mut expected: HashMap<&str, Value> = HashMap::from([
        ("specversion", json!("1.0")),
        ("id", json!(row.id.to_string())),
        ("source", json!(SOURCE)),
        ("type", json!("order.created")),
        ("subject", json!(row.aggregate_id)),
        ("datacontenttype", json!("application/json")),
    ]);
    for (name, value) in extensions {
        expected.insert(name, json!(value));
    }
    let time = chrono::DateTime::parse_from_rfc3339(attributes["time"].as_str().expect("time"))
        .expect("time is RFC 3339");
    assert_eq!(time, row.created_at, "time is created_at, to the microsecond");
    let without_time: HashMap<&str, Value> = attributes
        .iter()
        .filter(|(name, _)| *name != "time")
        .map(|(name, value)| (name.as_str(), value.clone()))
        .collect();
    assert_eq!(without_time, expected, "attributes of {}", row.id);
    assert_eq!(result["data"], row.payload, "data is the payload");
}

fn env_for_rabbit(broker: &TestBroker) -> Vec<(&'static str, String)> {
    let mut env = broker.env();
    env.extend(quick_settings());
    with(
        env,
        &[
            ("OUTBOX_MESSAGE_FORMAT", "cloudevents"),
            ("OUTBOX_CLOUDEVENTS_SOURCE", SOURCE),
        ],
    )
}

fn env_for_sqs(queue: &TestQueue) -> Vec<(&'static str, String)> {
    let mut env = queue.env();
    env.extend(with(quick_settings(), &[("OUTBOX_BACKOFF_MAX", "1s")]));
    with(
        env,
        &[
            ("OUTBOX_MESSAGE_FORMAT", "cloudevents"),
            ("OUTBOX_CLOUDEVENTS_SOURCE", SOURCE),
        ],
    )
}

/// Headers with an extension name, one that is not, and trace context.
const HEADERS: &str = r#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme", "tenant-id": "7"}"#;

async fn rabbitmq_binary_mode(headers_column: bool) {
    let db = database(headers_column).await;
    let broker = TestBroker::create("#").await;
    let mut rows = Vec::new();
    for n in 0..4 {
        let headers = headers_column.then_some(if n % 2 == 0 { HEADERS } else { "{}" });
        rows.push(insert(&db, n, headers).await);
    }
    let _relay = RelayProcess::start(&db, &env_for_rabbit(&broker));
    let received = broker.receive(rows.len(), WAIT).await;
    assert_eq!(received.len(), rows.len());
    let messages: Vec<Value> = received
        .iter()
        .map(|m| {
            json!({
                "mode": "rabbitmq",
                "headers": m.headers,
                "content_type": m.content_type,
                "body": String::from_utf8(m.body.clone()).unwrap(),
            })
        })
        .collect();
    let results = read_with_sdk(&messages);
    for (message, result) in received.iter().zip(&results) {
        let (n, row) = rows
            .iter()
            .enumerate()
            .find(|(_, row)| row.id.to_string() == message.message_id)
            .expect("a row's message");
        let with_headers = headers_column && n % 2 == 0;
        let extensions: &[(&str, &str)] = if with_headers {
            &[("traceparent", TRACEPARENT), ("tenant", "acme")]
        } else {
            &[]
        };
        assert_event(result, row, extensions);
        // The plain message is all still there: consumers of the plain
        // format keep working, and OpenTelemetry's AMQP propagators find
        // the traceparent header where they look.
        assert_eq!(message.kind.as_deref(), Some("order.created"));
        assert_eq!(message.delivery_mode, Some(2));
        assert_eq!(message.headers["aggregate_id"], row.aggregate_id);
        if with_headers {
            assert_eq!(message.headers["traceparent"], TRACEPARENT);
            assert_eq!(message.headers["tenant-id"], "7");
            assert!(!message.headers.contains_key("ce-tenant-id"));
        }
    }
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_binary_mode_reads_back_with_the_sdk_with_the_headers_column() {
    rabbitmq_binary_mode(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_binary_mode_reads_back_with_the_sdk_without_the_headers_column() {
    rabbitmq_binary_mode(false).await;
}

async fn sqs_structured_mode(headers_column: bool) {
    let db = database(headers_column).await;
    let queue = TestQueue::create(false, None).await;
    let mut rows = Vec::new();
    for n in 0..4 {
        let headers = headers_column.then_some(if n % 2 == 0 { HEADERS } else { "{}" });
        rows.push(insert(&db, n, headers).await);
    }
    let relay = RelayProcess::start(&db, &env_for_sqs(&queue));
    let received = queue.receive(rows.len(), WAIT).await;
    assert_eq!(received.len(), rows.len());
    let messages: Vec<Value> = received
        .iter()
        .map(|m| json!({"mode": "json", "body": m.body}))
        .collect();
    let results = read_with_sdk(&messages);
    for (message, result) in received.iter().zip(&results) {
        let (n, row) = rows
            .iter()
            .enumerate()
            .find(|(_, row)| row.id.to_string() == message.event_id())
            .expect("a row's message");
        let with_headers = headers_column && n % 2 == 0;
        let extensions: &[(&str, &str)] = if with_headers {
            &[("traceparent", TRACEPARENT), ("tenant", "acme")]
        } else {
            &[]
        };
        assert_event(result, row, extensions);
        // The attributes are those of the plain format.
        let mut names: HashSet<&str> = HashSet::from(["event_id", "event_type", "aggregate_id"]);
        if with_headers {
            names.extend(["traceparent", "tenant", "tenant-id"]);
        }
        assert_eq!(
            message
                .attributes
                .keys()
                .map(String::as_str)
                .collect::<HashSet<_>>(),
            names
        );
    }
    drop(relay);
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqs_structured_mode_reads_back_with_the_sdk_with_the_headers_column() {
    sqs_structured_mode(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqs_structured_mode_reads_back_with_the_sdk_without_the_headers_column() {
    sqs_structured_mode(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn names_cloudevents_sets_are_reserved_in_cloudevents_mode() {
    let db = database(true).await;
    let broker = TestBroker::create("#").await;
    let good = insert(&db, 0, Some(HEADERS)).await;
    let mut refused = Vec::new();
    for headers in [
        r#"{"ce-id": "x"}"#,
        r#"{"CE-Tenant": "x"}"#,
        r#"{"source": "x"}"#,
        r#"{"time": "x"}"#,
        r#"{"data": "x"}"#,
    ] {
        refused.push(insert(&db, 1, Some(headers)).await.id);
    }
    let _relay = RelayProcess::start(&db, &env_for_rabbit(&broker));
    for id in &refused {
        eventually(WAIT, "a reserved name quarantined", || async {
            db.count(&format!(
                "id = '{id}' AND quarantined_at IS NOT NULL AND attempt_count = 1 \
                 AND last_error LIKE '%reserved in CloudEvents mode%'"
            ))
            .await
                == 1
        })
        .await;
    }
    let received = broker.receive(1, WAIT).await;
    assert_eq!(received[0].message_id, good.id.to_string());
    broker.cleanup().await;
}

#[test]
fn cloudevents_mode_needs_a_source_that_is_a_uri_reference() {
    for (source, problem) in [
        (
            None,
            "OUTBOX_CLOUDEVENTS_SOURCE: is required when OUTBOX_MESSAGE_FORMAT=cloudevents",
        ),
        (
            Some("not a uri"),
            "OUTBOX_CLOUDEVENTS_SOURCE: is not a URI-reference",
        ),
    ] {
        let mut command = Command::new(common::relay_bin());
        command
            .args(["check"])
            .env_clear()
            .env("OUTBOX_MESSAGE_FORMAT", "cloudevents");
        if let Some(source) = source {
            command.env("OUTBOX_CLOUDEVENTS_SOURCE", source);
        }
        let output = command.output().expect("run the relay");
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(problem), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }
}
