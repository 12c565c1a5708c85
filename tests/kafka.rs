//! The Kafka sink against a Kafka cluster of each test's own (librdkafka's
//! mock cluster, in a child process), read back with kafka-python, a client
//! that shares no code with the relay's: every record field (key, value
//! byte for byte, every header, the producer's headers), each aggregate's
//! events on one partition in order, and on the partition a Java client's
//! default partitioner picks; each delivered row marked published;
//! binary-mode CloudEvents that the official SDK reads; `check`; and a
//! relay killed mid-drain, whose republications carry the same event id.
//!
//! Each test has its own database and its own cluster, so they run in
//! parallel.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::{
    eventually, produce, produce_varied, quick_settings, unique_topic, with, KafkaMock, KafkaRecord,
    ProducedRow, RelayProcess, TestDb,
};
use uuid::Uuid;

/// Deadline of every wait; a passing test never waits this long.
const WAIT: Duration = Duration::from_secs(120);

/// A migrated database whose table has the producer's `headers` column.
async fn setup() -> TestDb {
    TestDb::migrated_with_headers().await
}

/// Settings that make a test relay react quickly, publishing to `mock`
/// with the topic template `topic`.
fn fast(mock: &KafkaMock, topic: &str) -> Vec<(&'static str, String)> {
    let mut env = mock.env(topic);
    env.extend(with(quick_settings(), &[("OUTBOX_BACKOFF_MAX", "1s")]));
    env
}

async fn published(db: &TestDb, ids: &[Uuid]) -> i64 {
    db.client
        .query_one(
            "SELECT count(*) FROM outbox_event WHERE id = ANY($1) AND published_at IS NOT NULL",
            &[&ids],
        )
        .await
        .expect("count published")
        .get(0)
}

async fn all_published(db: &TestDb, rows: &[ProducedRow]) {
    let ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
    eventually(WAIT, "every row published", || async {
        published(db, &ids).await == ids.len() as i64
    })
    .await;
}

/// Every header a record of `row` carries in plain mode, sorted.
fn expected_headers(row: &ProducedRow) -> Vec<(String, Vec<u8>)> {
    let mut expected: Vec<(String, Vec<u8>)> = vec![
        ("event_id".to_owned(), row.id.to_string().into_bytes()),
        ("event_type".to_owned(), row.event_type.clone().into_bytes()),
        ("aggregate_id".to_owned(), row.aggregate_id.clone().into_bytes()),
        ("content-type".to_owned(), b"application/json".to_vec()),
    ];
    if let Some(cause) = row.causation_id {
        expected.push(("causation_id".to_owned(), cause.to_string().into_bytes()));
    }
    for (name, value) in &row.headers {
        expected.push((name.clone(), value.clone().into_bytes()));
    }
    expected.sort();
    expected
}

/// Asserts a record carries exactly the row's fields.
fn assert_fields(record: &KafkaRecord, row: &ProducedRow) {
    assert_eq!(
        record.key.as_deref(),
        Some(row.aggregate_id.as_bytes()),
        "the key is the aggregate id"
    );
    assert_eq!(
        record.value,
        row.payload.as_bytes(),
        "the value is the payload, byte for byte"
    );
    let mut headers = record.headers.clone();
    headers.sort();
    assert_eq!(headers, expected_headers(row), "headers of {}", row.id);
}

/// Kafka's default partitioner (the Java client's, and librdkafka's
/// `murmur2`): a consumer co-partitioning with other producers relies on
/// the same key landing on the same partition whoever produced it.
fn murmur2_partition(key: &[u8], partitions: i32) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ key.len() as u32;
    let mut chunks = key.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        for (i, byte) in rest.iter().enumerate().rev() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    ((h & 0x7fff_ffff) % partitions as u32) as i32
}

/// The model above agrees with the Java client's own test vectors
/// (`UtilsTest.testMurmur2`), as partitions of `2^31`.
#[test]
fn the_partitioner_model_is_kafkas() {
    for (key, hash) in [
        ("21", -973932308i32),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ("abc", 479470107),
    ] {
        assert_eq!(
            murmur2_partition(key.as_bytes(), i32::MAX),
            (hash & 0x7fff_ffff) % i32::MAX,
            "{key}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_field_arrives_as_a_consumer_reads_it() {
    let db = setup().await;
    let mock = KafkaMock::start(1);
    let prefix = unique_topic("kafka");
    for event_type in ["order.created", "order.paid"] {
        mock.create_topic(&format!("{prefix}.{event_type}"), 3);
    }
    let rows = produce_varied(&db, 60, 7, true).await;
    let relay = RelayProcess::start(
        &db,
        &with(
            fast(&mock, &format!("{prefix}.{{event_type}}")),
            &[("OUTBOX_BATCH_SIZE", "25")],
        ),
    );
    all_published(&db, &rows).await;
    let mut records = mock.read(&format!("{prefix}.order.created")).await;
    let paid = mock.read(&format!("{prefix}.order.paid")).await;
    let by_id: HashMap<String, &ProducedRow> = rows.iter().map(|row| (row.id.to_string(), row)).collect();
    for record in &paid {
        assert_eq!(by_id[&record.event_id()].event_type, "order.paid", "{record:?}");
    }
    records.extend(paid);
    assert_eq!(records.len(), rows.len(), "one record per row");
    let ids: HashSet<String> = records.iter().map(KafkaRecord::event_id).collect();
    assert_eq!(ids.len(), rows.len(), "each row once");
    for record in &records {
        let row = by_id
            .get(&record.event_id())
            .unwrap_or_else(|| panic!("unknown record {record:?}"));
        assert_fields(record, row);
    }
    assert!(
        records
            .iter()
            .any(|record| record.header("causation_id").is_none()),
        "rows without a causation id have no causation_id header"
    );
    assert_eq!(
        db.count("quarantined_at IS NOT NULL OR attempt_count <> 1").await,
        0
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_aggregates_events_land_on_one_partition_in_order() {
    const PARTITIONS: i32 = 6;
    const AGGREGATES: usize = 20;
    const EVENTS: usize = 10;
    let db = setup().await;
    let mock = KafkaMock::start(1);
    let topic = unique_topic("kafka-order");
    mock.create_topic(&topic, PARTITIONS);
    // Interleaved, so that every batch holds several aggregates and every
    // aggregate's events span several batches.
    let mut rows = Vec::new();
    for seq in 0..EVENTS {
        for aggregate in 0..AGGREGATES {
            rows.push(
                produce(
                    &db,
                    None,
                    "order.updated",
                    &format!("order-{aggregate}"),
                    &format!(r#"{{"seq": {seq}}}"#),
                )
                .await,
            );
        }
    }
    // Order per aggregate is what OUTBOX_ORDERING=aggregate promises
    // (without it, workers publish batches side by side); the partition is
    // the key's whatever the setting.
    let relay = RelayProcess::start(
        &db,
        &with(
            fast(&mock, &topic),
            &[("OUTBOX_BATCH_SIZE", "30"), ("OUTBOX_ORDERING", "aggregate")],
        ),
    );
    all_published(&db, &rows).await;
    let records = mock.read(&topic).await;
    assert_eq!(records.len(), rows.len(), "one record per row");
    let seq = |record: &KafkaRecord| -> u64 {
        serde_json::from_slice::<serde_json::Value>(&record.value).expect("JSON value")["seq"]
            .as_u64()
            .expect("seq")
    };
    let mut by_aggregate: HashMap<String, Vec<&KafkaRecord>> = HashMap::new();
    for record in &records {
        by_aggregate.entry(record.key_str()).or_default().push(record);
    }
    assert_eq!(by_aggregate.len(), AGGREGATES);
    let mut partitions_used = HashSet::new();
    for (aggregate, mut events) in by_aggregate {
        let partition = events[0].partition;
        assert!(
            events.iter().all(|record| record.partition == partition),
            "{aggregate}'s events are on one partition: {:?}",
            events.iter().map(|r| r.partition).collect::<Vec<_>>()
        );
        assert_eq!(
            partition,
            murmur2_partition(aggregate.as_bytes(), PARTITIONS),
            "{aggregate} is on the partition Kafka's default partitioner picks"
        );
        partitions_used.insert(partition);
        events.sort_by_key(|record| record.offset);
        let order: Vec<u64> = events.iter().map(|record| seq(record)).collect();
        assert_eq!(
            order,
            (0..EVENTS as u64).collect::<Vec<_>>(),
            "{aggregate}'s events in created_at order"
        );
    }
    assert!(
        partitions_used.len() > 1,
        "aggregates spread over the partitions: {partitions_used:?}"
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread")]
async fn each_delivered_row_is_marked_published_and_only_those() {
    let db = setup().await;
    let mock = KafkaMock::start(1);
    let topic = unique_topic("kafka-mark");
    mock.create_topic(&topic, 3);
    let rows = produce_varied(&db, 80, 7, true).await;
    let relay = RelayProcess::start(&db, &with(fast(&mock, &topic), &[("OUTBOX_BATCH_SIZE", "20")]));
    let want: HashSet<Uuid> = rows.iter().map(|row| row.id).collect();
    eventually(WAIT, "every row's record is in the topic", || async {
        mock.event_ids(&topic).await.into_iter().collect::<HashSet<_>>() == want
    })
    .await;
    all_published(&db, &rows).await;
    drop(relay);
    let stored: HashSet<Uuid> = mock.event_ids(&topic).await.into_iter().collect();
    let marked = db.ids_where("published_at IS NOT NULL").await;
    assert_eq!(marked, stored, "the rows marked published are those in the topic");
    assert_eq!(
        db.count("published_at < created_at OR attempt_count <> 1").await,
        0,
        "marked after creation, on the first attempt"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cloudevents_binary_mode_is_read_by_the_official_sdk() {
    const SOURCE: &str = "urn:x";
    let db = setup().await;
    let mock = KafkaMock::start(1);
    let topic = unique_topic("kafka-ce");
    mock.create_topic(&topic, 3);
    let rows = produce_varied(&db, 20, 7, true).await;
    let relay = RelayProcess::start(
        &db,
        &with(
            fast(&mock, &topic),
            &[
                ("OUTBOX_MESSAGE_FORMAT", "cloudevents"),
                ("OUTBOX_CLOUDEVENTS_SOURCE", SOURCE),
            ],
        ),
    );
    all_published(&db, &rows).await;
    drop(relay);
    let created: HashMap<Uuid, chrono::DateTime<chrono::Utc>> = db
        .client
        .query("SELECT id, created_at FROM outbox_event", &[])
        .await
        .expect("read created_at")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let by_id: HashMap<String, &ProducedRow> = rows.iter().map(|row| (row.id.to_string(), row)).collect();
    let events = mock.read_cloudevents(&topic).await;
    assert_eq!(events.len(), rows.len(), "one record per row");
    for event in &events {
        assert_eq!(event["ok"], true, "the SDK reads the record: {event}");
        let attributes = &event["attributes"];
        let text = |name: &str| attributes[name].as_str().unwrap_or_default().to_owned();
        let row = by_id
            .get(&text("id"))
            .unwrap_or_else(|| panic!("ce_id is a row's id: {event}"));
        assert_eq!(text("specversion"), "1.0");
        assert_eq!(text("source"), SOURCE);
        assert_eq!(text("type"), row.event_type);
        assert_eq!(text("subject"), row.aggregate_id);
        assert_eq!(text("datacontenttype"), "application/json");
        // The SDK makes the record key an extension attribute.
        assert_eq!(text("partitionkey"), row.aggregate_id);
        let time = chrono::DateTime::parse_from_rfc3339(&text("time"))
            .unwrap_or_else(|e| panic!("ce_time is RFC 3339 ({e}): {event}"));
        let lag = time.with_timezone(&chrono::Utc) - created[&row.id];
        assert!(
            lag.num_milliseconds().abs() < 1000,
            "ce_time is the row's created_at: {time} vs {}",
            created[&row.id]
        );
        let payload: serde_json::Value = serde_json::from_str(&row.payload).expect("payload JSON");
        assert_eq!(event["data"], payload, "data is the payload");
    }
    // The plain headers stay beside the ce_ ones.
    for record in mock.read(&topic).await {
        let row = by_id[&record.event_id()];
        assert_eq!(record.header_str("ce_id"), Some(row.id.to_string()));
        assert_eq!(record.header_str("ce_subject"), Some(row.aggregate_id.clone()));
        assert_eq!(record.value, row.payload.as_bytes());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn check_passes_with_the_topic_and_fails_naming_the_reason_otherwise() {
    let db = setup().await;
    let mock = KafkaMock::start(1);
    let prefix = unique_topic("kafka-check");
    let template = format!("{prefix}.{{event_type}}");
    let env = mock.env(&template);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let check = || {
        let output = db.relay_command(&["check"], &env).output().expect("run check");
        let said =
            String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
        (output.status.code(), said)
    };

    let (status, said) = check();
    assert_eq!(status, Some(1), "check fails without a topic: {said}");
    assert!(
        said.contains("no Kafka topic matches"),
        "check names the reason: {said}"
    );

    mock.create_topic(&format!("{prefix}.order.created"), 1);
    let (status, said) = check();
    assert_eq!(status, Some(0), "check passes once a topic exists: {said}");

    mock.all_down();
    let (status, said) = check();
    assert_eq!(status, Some(1), "check fails with every broker down: {said}");
    assert!(
        said.contains("Kafka brokers unreachable"),
        "check names the reason: {said}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_killed_mid_drain_loses_nothing_and_republishes_under_the_same_event_id() {
    let db = setup().await;
    let mock = KafkaMock::start(1);
    let topic = unique_topic("kafka-kill");
    mock.create_topic(&topic, 3);
    let rows = produce_varied(&db, 400, 7, true).await;
    let ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
    // A short publish timeout gives a short lease (2 × timeout + 5 s).
    let env = with(
        fast(&mock, &topic),
        &[("OUTBOX_BATCH_SIZE", "20"), ("OUTBOX_PUBLISH_TIMEOUT", "1s")],
    );
    // Once 60 rows are marked, marks hang: what Kafka stores next is
    // stored but never marked, as when a relay dies between the delivery
    // report and the mark; the kill then lands mid-drain with such rows in
    // flight. In place before the relay starts, so that a relay that
    // drains all 400 rows before the test looks is still caught.
    common::hang_marks_after(&db, 60).await;
    let mut relay = RelayProcess::start(&db, &env);
    eventually(WAIT, "a first part of the rows published", || async {
        published(&db, &ids).await >= 60
    })
    .await;
    eventually(WAIT, "records stored that are not marked", || async {
        let marked = published(&db, &ids).await;
        mock.read(&topic).await.len() as i64 > marked
    })
    .await;
    relay.signal("KILL");
    assert!(relay.wait(WAIT).await.is_some(), "relay exits on SIGKILL");
    db.terminate_relay_backends().await;
    common::release_marks(&db).await;
    let unmarked_but_stored = {
        let stored: HashSet<Uuid> = mock.event_ids(&topic).await.into_iter().collect();
        let marked = db.ids_where("published_at IS NOT NULL").await;
        stored.difference(&marked).count()
    };
    assert!(unmarked_but_stored > 0, "the kill left stored rows unmarked");

    let relay = RelayProcess::start(&db, &env);
    all_published(&db, &rows).await;
    drop(relay);
    assert_eq!(db.count("quarantined_at IS NOT NULL").await, 0);
    let records = mock.read(&topic).await;
    let by_id: HashMap<String, &ProducedRow> = rows.iter().map(|row| (row.id.to_string(), row)).collect();
    let mut copies: HashMap<String, usize> = HashMap::new();
    for record in &records {
        let row = by_id
            .get(&record.event_id())
            .unwrap_or_else(|| panic!("a record of no row: {record:?}"));
        // Every copy, the first and the republished, is the same record.
        assert_fields(record, row);
        *copies.entry(record.event_id()).or_default() += 1;
    }
    assert_eq!(copies.len(), rows.len(), "every row is in the topic");
    let republished = copies.values().filter(|&&n| n > 1).count();
    assert!(
        republished >= unmarked_but_stored,
        "the rows stored but not marked were published again ({republished} of {unmarked_but_stored})"
    );
}
