//! OUTBOX_ORDERING=aggregate: per aggregate, rows are published in
//! (created_at, id) order and never before their predecessor's publish has
//! committed; a stuck aggregate holds back only itself.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{eventually, Received, RelayProcess, TestBroker, TestDb};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

fn ordered(broker: &TestBroker, extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut env = broker.env();
    env.extend([
        ("OUTBOX_ORDERING", "aggregate".to_owned()),
        ("OUTBOX_POLL_INTERVAL", "50ms".to_owned()),
        ("OUTBOX_BACKOFF_BASE", "100ms".to_owned()),
        ("OUTBOX_BACKOFF_MAX", "500ms".to_owned()),
    ]);
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    env
}

/// Inserts `per_aggregate` rows for each of `aggregates`, interleaved, with
/// strictly increasing created_at; returns each aggregate's ids in order.
async fn insert_interleaved(
    db: &TestDb,
    aggregates: usize,
    per_aggregate: usize,
) -> HashMap<String, Vec<String>> {
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(), 'ordered.event', 'agg-' || (n % $1), jsonb_build_object('n', n),
                    timestamptz '2026-01-01' + n * interval '1 millisecond'
             FROM generate_series(0, $2 - 1) AS n",
            &[&(aggregates as i32), &((aggregates * per_aggregate) as i32)],
        )
        .await
        .unwrap();
    let mut order: HashMap<String, Vec<String>> = HashMap::new();
    for row in db
        .client
        .query(
            "SELECT aggregate_id, id FROM outbox_event ORDER BY created_at, id",
            &[],
        )
        .await
        .unwrap()
    {
        let id: Uuid = row.get(1);
        order.entry(row.get(0)).or_default().push(id.to_string());
    }
    order
}

/// The ids of `received`, per aggregate, in the order of their first
/// delivery (a redelivery is at-least-once, not disorder).
fn first_deliveries_per_aggregate(received: Vec<Received>) -> HashMap<String, Vec<String>> {
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    for message in received {
        let aggregate = message.headers.get("aggregate_id").cloned().unwrap();
        let ids = seen.entry(aggregate).or_default();
        if !ids.contains(&message.message_id) {
            ids.push(message.message_id);
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_publish_each_aggregate_in_order() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let expected = insert_interleaved(&db, 20, 60).await;
    let env = ordered(&broker, &[("OUTBOX_BATCH_SIZE", "25")]);
    let _first = RelayProcess::start(&db, &env);
    let _second = RelayProcess::start(&db, &env);

    let received = broker.receive(1_200, WAIT).await;
    assert_eq!(received.len(), 1_200);
    let seen = first_deliveries_per_aggregate(received);
    assert_eq!(
        seen, expected,
        "first deliveries per aggregate follow (created_at, id)"
    );
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stuck_aggregate_holds_back_only_itself() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("good.#").await;
    // agg-stuck's head is unroutable, so it backs off and then is quarantined.
    db.client
        .batch_execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(),
                    CASE WHEN n = 0 THEN 'bad.head' ELSE 'good.event' END,
                    CASE WHEN n % 5 = 0 THEN 'agg-stuck' ELSE 'agg-' || (n % 5) END,
                    '{}', timestamptz '2026-01-01' + n * interval '1 millisecond'
             FROM generate_series(0, 499) AS n",
        )
        .await
        .unwrap();
    let _relay = RelayProcess::start(&db, &ordered(&broker, &[("OUTBOX_MAX_ATTEMPTS", "3")]));

    // The 400 rows of the other aggregates flow at once.
    let received = broker.receive(400, WAIT).await;
    assert_eq!(received.len(), 400);
    assert!(received
        .iter()
        .all(|m| m.headers.get("aggregate_id").map(String::as_str) != Some("agg-stuck")));
    eventually(WAIT, "the stuck head is quarantined", || async {
        db.count("event_type = 'bad.head' AND quarantined_at IS NOT NULL")
            .await
            == 1
    })
    .await;
    // Its successors never went out, and still wait.
    assert!(broker.receive(1, Duration::from_millis(500)).await.is_empty());
    assert_eq!(
        db.count("aggregate_id = 'agg-stuck' AND published_at IS NULL")
            .await,
        100
    );
    assert_eq!(
        db.count("aggregate_id = 'agg-stuck' AND attempt_count > 0 AND event_type <> 'bad.head'")
            .await,
        0
    );

    // The stuck aggregate shows in status.
    let out = db.relay_command(&["status", "--json"], &[]).output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["stuck_aggregates"], 1, "{status}");

    // Once the operator fixes the head (here: deletes it), the aggregate flows.
    db.client
        .batch_execute("DELETE FROM outbox_event WHERE event_type = 'bad.head'")
        .await
        .unwrap();
    let rest = broker.receive(99, WAIT).await;
    assert_eq!(rest.len(), 99);
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sequence_number_column_orders_an_aggregate_when_present() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    db.client
        .batch_execute("ALTER TABLE outbox_event ADD COLUMN sequence_number BIGINT")
        .await
        .unwrap();
    // created_at runs backwards (transactions that started in the other
    // order); the producer's sequence numbers give the real order.
    db.client
        .batch_execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at, sequence_number)
             SELECT gen_random_uuid(), 'seq.event', 'agg-' || (n % 3), jsonb_build_object('n', n),
                    timestamptz '2026-01-01' - n * interval '1 millisecond', n
             FROM generate_series(0, 89) AS n",
        )
        .await
        .unwrap();
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for row in db
        .client
        .query(
            "SELECT aggregate_id, id FROM outbox_event ORDER BY sequence_number",
            &[],
        )
        .await
        .unwrap()
    {
        let id: Uuid = row.get(1);
        expected.entry(row.get(0)).or_default().push(id.to_string());
    }
    let _relay = RelayProcess::start(&db, &ordered(&broker, &[("OUTBOX_BATCH_SIZE", "10")]));

    let received = broker.receive(90, WAIT).await;
    assert_eq!(received.len(), 90);
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    for message in received {
        let aggregate = message.headers.get("aggregate_id").cloned().unwrap();
        seen.entry(aggregate).or_default().push(message.message_id);
    }
    assert_eq!(
        seen, expected,
        "per aggregate in sequence_number order, not created_at"
    );
    broker.cleanup().await;
}

/// Behind an aggregate's head in flight, every other row of it is one no
/// claim can take. A claim from the oldest row stepped over all of them
/// each time, so a long queue of few aggregates drained in time quadratic
/// in its length, and past `statement_timeout` not at all. Claims read in
/// windows and take each aggregate's next row by its aggregate instead.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_queue_of_few_aggregates_drains_in_order_without_each_claim_reading_all_of_it() {
    const AGGREGATES: usize = 20;
    const PER_AGGREGATE: usize = 1_000;
    const ROWS: usize = AGGREGATES * PER_AGGREGATE;
    // Time for the relay's connections to report their reads once idle.
    const STATISTICS_DELAY: Duration = Duration::from_secs(11);
    const MOST_READS_PER_ROW: usize = 100;
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let expected = insert_interleaved(&db, AGGREGATES, PER_AGGREGATE).await;
    let reads_before = db.fresh_index_reads().await;
    let _relay = RelayProcess::start(&db, &ordered(&broker, &[]));

    let received = broker.receive(ROWS, WAIT).await;
    assert_eq!(received.len(), ROWS);
    let seen = first_deliveries_per_aggregate(received);
    assert_eq!(
        seen, expected,
        "first deliveries per aggregate follow (created_at, id)"
    );
    eventually(WAIT, "every row is marked published", || async {
        db.count("published_at IS NULL").await == 0
    })
    .await;
    tokio::time::sleep(STATISTICS_DELAY).await;
    let reads = db.fresh_index_reads().await - reads_before;
    eprintln!(
        "{ROWS} rows of {AGGREGATES} aggregates drained in order: {reads} fresh-index entries read ({:.1} per row)",
        reads as f64 / ROWS as f64
    );
    // Windows of 2,000 entries and sweeps read about 20 a row here; claims
    // from the oldest row read the rest of the queue each time, thousands
    // a row (they did not drain it within WAIT).
    assert!(
        reads <= (MOST_READS_PER_ROW * ROWS) as i64,
        "the claims read {reads} entries of the fresh index to drain {ROWS} rows (at most \
         {MOST_READS_PER_ROW} a row expected)"
    );
    broker.cleanup().await;
}
