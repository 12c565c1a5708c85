//! The optional `headers` column on both sinks: carried verbatim as AMQP
//! headers and SQS message attributes (W3C trace context included), left
//! out without the column, and a row whose headers its sink cannot carry
//! quarantined on its first attempt with the reason, while its batch-mates
//! are published. And a trace that continues: the relay's JSON log lines
//! about a batch or a row name the trace ids of its rows.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::sqs::TestQueue;
use common::{eventually, quick_settings, with, RelayProcess, TestBroker, TestDb};
use uuid::Uuid;

/// Generous: the SQS emulator is shared by every test running at once.
const WAIT: Duration = Duration::from_secs(120);

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// Inserts a row of `event_type` with `headers` (JSON text, or NULL).
async fn insert(db: &TestDb, event_type: &str, headers: Option<&str>) -> Uuid {
    let id = Uuid::new_v4();
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at, headers)
             VALUES ($1, $2, 'order-1', '{\"a\": 1}', clock_timestamp(), $3::text::jsonb)",
            &[&id, &event_type, &headers],
        )
        .await
        .expect("insert row");
    id
}

/// Inserts a row without naming the headers column (a table without it).
async fn insert_plain(db: &TestDb, event_type: &str) -> Uuid {
    let id = Uuid::new_v4();
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
             VALUES ($1, $2, 'order-1', '{\"a\": 1}')",
            &[&id, &event_type],
        )
        .await
        .expect("insert row");
    id
}

/// The producer headers every carrying test writes: trace context,
/// characters that need escaping in JSON, a name with a dash.
fn carried() -> Vec<(&'static str, &'static str)> {
    vec![
        ("traceparent", TRACEPARENT),
        ("tracestate", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
        ("baggage", "userId=alice,serverNode=DF%2028"),
        ("tenant-id", "acme \"quoted\" ünïcode"),
    ]
}

fn as_json(headers: &[(&str, &str)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(name, value)| ((*name).to_owned(), serde_json::Value::from(*value)))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// Waits until `id` is quarantined and returns its attempts and last error.
async fn quarantined(db: &TestDb, id: Uuid) -> (i32, String) {
    eventually(WAIT, &format!("row {id} quarantined"), || async {
        db.count(&format!("id = '{id}' AND quarantined_at IS NOT NULL"))
            .await
            == 1
    })
    .await;
    let row = db
        .client
        .query_one(
            "SELECT attempt_count, last_error FROM outbox_event WHERE id = $1",
            &[&id],
        )
        .await
        .expect("read row");
    (row.get(0), row.get::<_, Option<String>>(1).unwrap_or_default())
}

/// Asserts every case was quarantined on its first attempt with a reason
/// holding its fragment, and every good row was published.
async fn assert_rejected(db: &TestDb, cases: &[(Uuid, &str)], good: &[Uuid]) {
    for (id, fragment) in cases {
        let (attempts, error) = quarantined(db, *id).await;
        assert_eq!(attempts, 1, "quarantined on its first attempt: {error}");
        assert!(
            error.contains(fragment),
            "reason of {id} should say {fragment:?}: {error}"
        );
    }
    eventually(WAIT, "every good row published", || async {
        db.count("published_at IS NOT NULL").await == good.len() as i64
    })
    .await;
    let published = db.ids_where("published_at IS NOT NULL").await;
    assert_eq!(published, good.iter().copied().collect::<HashSet<_>>());
}

fn rabbit_env(broker: &TestBroker) -> Vec<(&'static str, String)> {
    let mut env = broker.env();
    env.extend(quick_settings());
    env
}

fn sqs_env(queue: &TestQueue) -> Vec<(&'static str, String)> {
    let mut env = queue.env();
    env.extend(with(quick_settings(), &[("OUTBOX_BACKOFF_MAX", "1s")]));
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_carries_the_headers_column_verbatim() {
    let db = TestDb::migrated_with_headers().await;
    let broker = TestBroker::create("#").await;
    let with_all = insert(&db, "order.created", Some(&as_json(&carried()))).await;
    let null = insert(&db, "order.created", None).await;
    let empty = insert(&db, "order.created", Some("{}")).await;
    let _relay = RelayProcess::start(&db, &rabbit_env(&broker));
    let received = broker.receive(3, WAIT).await;
    assert_eq!(received.len(), 3);
    let by_id: HashMap<&str, _> = received.iter().map(|m| (m.message_id.as_str(), m)).collect();
    let full = by_id[with_all.to_string().as_str()];
    let mut expected: HashMap<String, String> = carried()
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    expected.insert("aggregate_id".into(), "order-1".into());
    assert_eq!(
        full.headers, expected,
        "the relay's headers and the producer's, verbatim"
    );
    // Properties as without the column.
    assert_eq!(full.content_type.as_deref(), Some("application/json"));
    assert_eq!(full.kind.as_deref(), Some("order.created"));
    for id in [null, empty] {
        let message = by_id[id.to_string().as_str()];
        let names: HashSet<&str> = message.headers.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            HashSet::from(["aggregate_id"]),
            "no producer header for {id}"
        );
    }
    eventually(WAIT, "all published", || async {
        db.count("published_at IS NOT NULL AND attempt_count = 1").await == 3
    })
    .await;
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_messages_are_unchanged_without_the_column() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let id = insert_plain(&db, "order.created").await;
    let _relay = RelayProcess::start(&db, &rabbit_env(&broker));
    let received = broker.receive(1, WAIT).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].message_id, id.to_string());
    let names: HashSet<&str> = received[0].headers.keys().map(String::as_str).collect();
    assert_eq!(names, HashSet::from(["aggregate_id"]));
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_quarantines_headers_it_cannot_carry_at_once() {
    let db = TestDb::migrated_with_headers().await;
    let broker = TestBroker::create("#").await;
    let mut good = vec![insert(&db, "order.created", Some(&as_json(&carried()))).await];
    let big = "v".repeat(200_000);
    let long_name = "n".repeat(256);
    let cases = vec![
        (
            insert(&db, "order.created", Some(r#"["traceparent"]"#)).await,
            "not a JSON object",
        ),
        (
            insert(&db, "order.created", Some(r#"{"retries": 3}"#)).await,
            "non-string value for \"retries\"",
        ),
        (
            insert(&db, "order.created", Some(r#"{"event_id": "x"}"#)).await,
            "which the relay sets itself",
        ),
        (
            insert(&db, "order.created", Some(r#"{"Aggregate_Id": "x"}"#)).await,
            "which the relay sets itself",
        ),
        (
            insert(&db, "order.created", Some(r#"{"CC": "elsewhere"}"#)).await,
            "RabbitMQ acts on it",
        ),
        (
            insert(&db, "order.created", Some(r#"{"x-death": "x"}"#)).await,
            "RabbitMQ acts on it",
        ),
        (
            insert(&db, "order.created", Some(&as_json(&[("big", big.as_str())]))).await,
            "frame_max",
        ),
        (
            insert(&db, "order.created", Some(&as_json(&[(long_name.as_str(), "v")]))).await,
            "255",
        ),
    ];
    good.push(insert(&db, "order.created", Some(r#"{"x-tenant": "acme"}"#)).await);
    let _relay = RelayProcess::start(&db, &rabbit_env(&broker));
    assert_rejected(&db, &cases, &good).await;
    let received = broker.receive(good.len(), WAIT).await;
    let ids: HashSet<String> = received.iter().map(|m| m.message_id.clone()).collect();
    assert_eq!(ids, good.iter().map(Uuid::to_string).collect());
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqs_carries_the_headers_column_as_string_attributes() {
    let db = TestDb::migrated_with_headers().await;
    let queue = TestQueue::create(false, None).await;
    let with_all = insert(&db, "order.created", Some(&as_json(&carried()))).await;
    let null = insert(&db, "order.created", None).await;
    let relay = RelayProcess::start(&db, &sqs_env(&queue));
    let received = queue.receive(2, WAIT).await;
    assert_eq!(received.len(), 2);
    for message in &received {
        let mut expected: HashMap<String, (String, Option<String>)> = [
            ("event_id", message.event_id()),
            ("event_type", "order.created".to_owned()),
            ("aggregate_id", "order-1".to_owned()),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_owned(), ("String".to_owned(), Some(v))))
        .collect();
        if message.event_id() == with_all.to_string() {
            for (name, value) in carried() {
                expected.insert(name.to_owned(), ("String".to_owned(), Some(value.to_owned())));
            }
        } else {
            assert_eq!(message.event_id(), null.to_string());
        }
        assert_eq!(message.attributes, expected);
        assert_eq!(message.body, r#"{"a": 1}"#, "the body stays the payload");
    }
    drop(relay);
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqs_messages_are_unchanged_without_the_column() {
    let db = TestDb::migrated().await;
    let queue = TestQueue::create(false, None).await;
    insert_plain(&db, "order.created").await;
    let relay = RelayProcess::start(&db, &sqs_env(&queue));
    let received = queue.receive(1, WAIT).await;
    assert_eq!(received.len(), 1);
    let names: HashSet<&str> = received[0].attributes.keys().map(String::as_str).collect();
    assert_eq!(names, HashSet::from(["event_id", "event_type", "aggregate_id"]));
    drop(relay);
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqs_quarantines_headers_it_cannot_carry_at_once() {
    let db = TestDb::migrated_with_headers().await;
    // The smallest MaximumMessageSize SQS allows, for the size case.
    let queue = TestQueue::create(false, Some(1024)).await;
    // Seven headers and the relay's three attributes: the most SQS takes.
    let seven: Vec<(String, String)> = (0..7).map(|n| (format!("h{n}"), format!("v{n}"))).collect();
    let eight: Vec<(String, String)> = (0..8).map(|n| (format!("h{n}"), format!("v{n}"))).collect();
    let pairs = |list: &[(String, String)]| -> String {
        as_json(
            &list
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
        )
    };
    let good = vec![
        insert(&db, "order.created", Some(&pairs(&seven))).await,
        insert(&db, "order.created", Some(r#"{"tenant-id.v2_x": "acme"}"#)).await,
    ];
    let big = "v".repeat(1000);
    let cases = vec![
        (
            insert(&db, "order.created", Some(&pairs(&eight))).await,
            "make 11 message attributes; SQS allows 10",
        ),
        (
            insert(&db, "order.created", Some(r#"{"has space": "x"}"#)).await,
            "cannot be an SQS attribute name",
        ),
        (
            insert(&db, "order.created", Some(r#"{"AWS.trace": "x"}"#)).await,
            "AWS. or Amazon.",
        ),
        (
            insert(&db, "order.created", Some(r#"{"a..b": "x"}"#)).await,
            "'..'",
        ),
        (
            insert(&db, "order.created", Some(r#"{"empty": ""}"#)).await,
            "empty attribute values",
        ),
        (
            insert(&db, "order.created", Some(r#"{"causation_id": "x"}"#)).await,
            "which the relay sets itself",
        ),
        (
            insert(&db, "order.created", Some(r#"{"n": null}"#)).await,
            "non-string value",
        ),
        (
            insert(&db, "order.created", Some(&as_json(&[("big", big.as_str())]))).await,
            "MaximumMessageSize of 1024",
        ),
    ];
    let relay = RelayProcess::start(&db, &sqs_env(&queue));
    assert_rejected(&db, &cases, &good).await;
    let received = queue.receive(good.len(), WAIT).await;
    let ids: HashSet<String> = received.iter().map(|m| m.event_id()).collect();
    assert_eq!(ids, good.iter().map(Uuid::to_string).collect());
    let full = received
        .iter()
        .find(|m| m.event_id() == good[0].to_string())
        .expect("the row with seven headers");
    assert_eq!(full.attributes.len(), 10, "ten attributes in all");
    drop(relay);
    queue.cleanup().await;
}

/// JSON log lines of a relay, as parsed objects.
type Log = Arc<Mutex<Vec<serde_json::Value>>>;

fn lines_with(log: &Log, report: &str) -> Vec<serde_json::Value> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|line| line["report"] == report)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trace_continues_through_the_relay() {
    let db = TestDb::migrated_with_headers().await;
    let broker = TestBroker::create("#").await;
    let traced = insert(
        &db,
        "order.created",
        Some(&as_json(&[("traceparent", TRACEPARENT)])),
    )
    .await;
    // Carried verbatim, but not a valid traceparent: named in no log line.
    let invalid = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
    let untraced = insert(&db, "order.created", Some(&as_json(&[("traceparent", invalid)]))).await;
    // Another trace, on a row RabbitMQ cannot take: its quarantine line names it.
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let refused = insert(
        &db,
        "order.created",
        Some(&as_json(&[("traceparent", other), ("CC", "x")])),
    )
    .await;
    let log: Log = Arc::default();
    let sink = log.clone();
    let env = with(rabbit_env(&broker), &[("RUST_LOG", "info,outbox_relay=debug")]);
    let (relay, reader) = RelayProcess::start_reading_log(&db, &env, move |line| {
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(line) {
            sink.lock().unwrap().push(value);
        }
    });
    let received = broker.receive(2, WAIT).await;
    let by_id: HashMap<&str, _> = received.iter().map(|m| (m.message_id.as_str(), m)).collect();
    assert_eq!(
        by_id[traced.to_string().as_str()]
            .headers
            .get("traceparent")
            .map(String::as_str),
        Some(TRACEPARENT),
        "the producer's traceparent arrives unchanged"
    );
    assert_eq!(
        by_id[untraced.to_string().as_str()]
            .headers
            .get("traceparent")
            .map(String::as_str),
        Some(invalid),
        "an invalid traceparent is carried as it is"
    );
    quarantined(&db, refused).await;
    eventually(WAIT, "a batch line naming the trace", || async {
        lines_with(&log, "batch_recorded").iter().any(|line| {
            line["trace_id"]
                .as_str()
                .is_some_and(|ids| ids.contains(TRACE_ID))
        })
    })
    .await;
    eventually(WAIT, "the quarantine line naming its row's trace", || async {
        log.lock().unwrap().iter().any(|line| {
            line["event_id"] == refused.to_string() && line["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
        })
    })
    .await;
    drop(relay);
    reader.join().expect("log reader");
    // No line names the invalid traceparent's would-be trace id in any case.
    let invalid_id = "4bf92f3577b34da6a3ce929d0e0e4736".to_uppercase();
    assert!(!log
        .lock()
        .unwrap()
        .iter()
        .any(|line| line.to_string().contains(&invalid_id)));
    broker.cleanup().await;
}
