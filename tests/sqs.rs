//! The SQS sink against a real SQS emulator (moto, started by
//! `scripts/test`): every message field on standard and FIFO queues,
//! oversized and invalid rows quarantined without hurting their
//! batch-mates, an unreachable queue mid-run, and a relay killed between
//! the send and the commit.
//!
//! Each test has its own database and its own queues, so they run in
//! parallel. Queues stay at a few hundred messages at most: moto rescans a
//! whole queue on every send.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::proxy::Proxy;
use common::sqs::{SqsReceived, TestQueue};
use common::system::free_port;
use common::{eventually, produce, produce_varied, quick_settings, with, ProducedRow, RelayProcess, TestDb};
use uuid::Uuid;

/// Deadline of every wait. Generous: the emulator is one process shared by
/// every test running in parallel and slows down under their load; a
/// passing test never waits this long.
const WAIT: Duration = Duration::from_secs(120);

/// Settings that make a test relay react quickly, publishing to `queue`
/// through `endpoint_url`.
fn fast(queue: &TestQueue, endpoint_url: &str) -> Vec<(&'static str, String)> {
    let mut env = queue.env_via(endpoint_url);
    env.extend(with(quick_settings(), &[("OUTBOX_BACKOFF_MAX", "1s")]));
    env
}

/// Asserts a received message carries exactly the row's fields.
fn assert_fields(message: &SqsReceived, row: &ProducedRow, fifo: bool) {
    assert_eq!(
        message.body, row.payload,
        "body is the payload text, byte for byte"
    );
    let mut expected: HashMap<&str, String> = HashMap::from([
        ("event_id", row.id.to_string()),
        ("event_type", row.event_type.clone()),
        ("aggregate_id", row.aggregate_id.clone()),
    ]);
    if let Some(cause) = row.causation_id {
        expected.insert("causation_id", cause.to_string());
    }
    let names: HashSet<&str> = message.attributes.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        expected.keys().copied().collect(),
        "attribute names of {}",
        row.id
    );
    for (name, value) in &expected {
        let (data_type, received) = &message.attributes[*name];
        assert_eq!(data_type, "String", "{name} is a String attribute");
        assert_eq!(received.as_deref(), Some(value.as_str()), "{name} of {}", row.id);
    }
    if fifo {
        assert_eq!(
            message.group_id.as_deref(),
            Some(row.aggregate_id.as_str()),
            "MessageGroupId"
        );
        assert_eq!(
            message.deduplication_id.as_deref(),
            Some(row.id.to_string().as_str()),
            "MessageDeduplicationId"
        );
    } else {
        assert_eq!(message.group_id, None, "no MessageGroupId on a standard queue");
        assert_eq!(
            message.deduplication_id, None,
            "no MessageDeduplicationId on a standard queue"
        );
    }
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

async fn fields_arrive(fifo: bool) {
    let db = TestDb::migrated().await;
    let queue = TestQueue::create(fifo, None).await;
    let rows = produce_varied(&db, 60, 5, false).await;
    // Batches of 25 cross request boundaries (10 entries) and batches.
    // One batch at a time: with several in flight and OUTBOX_ORDERING=none
    // batches may overtake each other, and what this test checks is that
    // the sink keeps each group's order across the requests of a batch.
    let relay = RelayProcess::start(
        &db,
        &with(
            fast(&queue, &common::sqs::endpoint()),
            &[("OUTBOX_BATCH_SIZE", "25"), ("OUTBOX_WORKERS", "1")],
        ),
    );
    let received = queue.receive(rows.len(), WAIT).await;
    let by_id: HashMap<String, &ProducedRow> = rows.iter().map(|row| (row.id.to_string(), row)).collect();
    let ids: HashSet<String> = received.iter().map(SqsReceived::event_id).collect();
    assert_eq!(ids.len(), rows.len(), "every row arrived once");
    for message in &received {
        let row = by_id
            .get(&message.event_id())
            .unwrap_or_else(|| panic!("unknown message {message:?}"));
        assert_fields(message, row, fifo);
    }
    if fifo {
        // FIFO keeps each message group (aggregate) in claim order.
        let mut expected: HashMap<&str, Vec<String>> = HashMap::new();
        for row in &rows {
            expected
                .entry(&row.aggregate_id)
                .or_default()
                .push(row.id.to_string());
        }
        let mut got: HashMap<&str, Vec<String>> = HashMap::new();
        for message in &received {
            got.entry(by_id[&message.event_id()].aggregate_id.as_str())
                .or_default()
                .push(message.event_id());
        }
        assert_eq!(got, expected, "per-aggregate order");
    }
    let all: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
    eventually(WAIT, "every row marked published", || async {
        published(&db, &all).await == all.len() as i64
    })
    .await;
    assert_eq!(
        db.count("quarantined_at IS NOT NULL OR attempt_count <> 1").await,
        0
    );
    drop(relay);
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_field_arrives_on_a_standard_queue() {
    fields_arrive(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_field_arrives_on_a_fifo_queue_in_aggregate_order() {
    fields_arrive(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_sqs_cannot_take_are_quarantined_at_once_and_their_batch_mates_published() {
    let db = TestDb::migrated().await;
    // 1024 is the smallest MaximumMessageSize SQS allows.
    let queue = TestQueue::create(false, Some(1024)).await;
    let mut good = Vec::new();
    for n in 0..4 {
        good.push(produce(&db, None, "order.created", "order-1", &format!(r#"{{"n": {n}}}"#)).await);
    }
    let oversized = produce(
        &db,
        None,
        "order.created",
        "order-1",
        &format!(r#"{{"blob": "{}"}}"#, "x".repeat(2000)),
    )
    .await;
    for n in 4..8 {
        good.push(produce(&db, None, "order.created", "order-2", &format!(r#"{{"n": {n}}}"#)).await);
    }
    // U+FFFF is valid in JSON and in PostgreSQL, but not in an SQS body.
    let invalid = produce(&db, None, "order.created", "order-2", "{\"s\": \"a\u{FFFF}b\"}").await;
    good.push(produce(&db, None, "order.created", "order-3", r#"{"n": 8}"#).await);

    // One batch holds them all, so the rejected rows share requests'
    // worth of batch-mates.
    let relay = RelayProcess::start(&db, &fast(&queue, &common::sqs::endpoint()));
    let received = queue.receive(good.len(), WAIT).await;
    let got: HashSet<String> = received.iter().map(SqsReceived::event_id).collect();
    let want: HashSet<String> = good.iter().map(|row| row.id.to_string()).collect();
    assert_eq!(got, want, "every good row arrived, no rejected one");
    let good_ids: Vec<Uuid> = good.iter().map(|row| row.id).collect();
    eventually(WAIT, "good rows published", || async {
        published(&db, &good_ids).await == good_ids.len() as i64
    })
    .await;
    for (row, mentions) in [(&oversized, "MaximumMessageSize"), (&invalid, "U+FFFF")] {
        eventually(WAIT, "rejected row quarantined", || async {
            db.count(&format!("id = '{}' AND quarantined_at IS NOT NULL", row.id))
                .await
                == 1
        })
        .await;
        let state = db
            .client
            .query_one(
                "SELECT attempt_count, last_error, published_at IS NULL FROM outbox_event WHERE id = $1",
                &[&row.id],
            )
            .await
            .unwrap();
        let attempts: i32 = state.get(0);
        let last_error: String = state.get(1);
        let unpublished: bool = state.get(2);
        assert_eq!(attempts, 1, "quarantined on the first attempt");
        assert!(
            last_error.contains(mentions),
            "last_error names the reason: {last_error}"
        );
        assert!(unpublished);
    }
    drop(relay);
    queue.cleanup().await;
}

/// `GET /readyz`: the status and body, or `None` while nothing listens.
async fn readyz(port: u16) -> Option<(u16, String)> {
    let response = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.unwrap_or_default()))
}

/// Waits until `/readyz` reports the SQS outage, then checks that none of
/// `rows` was published or quarantined meanwhile.
async fn outage_holds(db: &TestDb, port: u16, rows: &[Uuid]) {
    eventually(WAIT, "/readyz reports the SQS outage", || async {
        matches!(readyz(port).await, Some((503, body)) if body.contains("sqs"))
    })
    .await;
    assert_eq!(
        published(db, rows).await,
        0,
        "nothing is published while SQS is away"
    );
    assert_eq!(
        db.count("quarantined_at IS NOT NULL").await,
        0,
        "an outage quarantines nothing"
    );
}

/// Waits until every row of `rows` is published and received.
async fn all_delivered(db: &TestDb, queue: &TestQueue, rows: &[Uuid]) {
    eventually(WAIT, "every row published once SQS is back", || async {
        published(db, rows).await == rows.len() as i64
    })
    .await;
    let received = queue.receive(rows.len(), WAIT).await;
    let got: HashSet<String> = received.iter().map(SqsReceived::event_id).collect();
    let want: HashSet<String> = rows.iter().map(Uuid::to_string).collect();
    assert!(got.is_superset(&want), "every row delivered");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_queue_is_waited_out_and_everything_delivered_after() {
    let db = TestDb::migrated().await;
    let queue = TestQueue::create(false, None).await;
    // The relay reaches the shared emulator only through this proxy, so
    // refusing there takes SQS away from this relay alone.
    let proxy = Proxy::start(common::sqs::endpoint_addr()).await;
    let port = free_port();
    let env = with(
        fast(&queue, &format!("http://{}", proxy.addr)),
        &[("OUTBOX_HTTP_ADDR", &format!("127.0.0.1:{port}"))],
    );

    // Unreachable at start-up: an outage to wait out, not a crash.
    proxy.refuse(true);
    let early: Vec<Uuid> = produce_varied(&db, 40, 7, false)
        .await
        .iter()
        .map(|row| row.id)
        .collect();
    let mut relay = RelayProcess::start(&db, &env);
    outage_holds(&db, port, &early).await;
    assert!(
        relay.child.try_wait().expect("try_wait").is_none(),
        "the relay keeps running"
    );
    proxy.refuse(false);
    all_delivered(&db, &queue, &early).await;

    // Unreachable mid-run: open connections cut, new ones refused.
    proxy.refuse(true);
    proxy.cut();
    let during: Vec<Uuid> = produce_varied(&db, 60, 7, false)
        .await
        .iter()
        .map(|row| row.id)
        .collect();
    outage_holds(&db, port, &during).await;
    proxy.refuse(false);
    all_delivered(&db, &queue, &during).await;
    eventually(WAIT, "/readyz is ready again", || async {
        matches!(readyz(port).await, Some((200, _)))
    })
    .await;

    // The relay waited on readiness instead of spending attempts: at most
    // the batch in flight when the link went down failed once or twice.
    assert_eq!(db.count("quarantined_at IS NOT NULL").await, 0);
    assert_eq!(
        db.count("attempt_count > 3").await,
        0,
        "the outage did not burn attempts"
    );
    drop(relay);
    queue.cleanup().await;
}

/// Kills a relay after SQS accepted a row's message and before the row was
/// marked, restarts it, and returns the row (unpublished until the
/// restarted relay sends it again) and the restarted relay.
async fn kill_between_send_and_commit(
    db: &TestDb,
    queue: &TestQueue,
    keep_first_delivery: bool,
) -> (ProducedRow, SqsReceived, RelayProcess) {
    common::hang_marks(db).await;
    let row = produce(
        db,
        Some(Uuid::new_v4()),
        "order.created",
        "order-42",
        r#"{"total": 42}"#,
    )
    .await;
    // A short publish timeout gives a short lease (2 × timeout + 5 s), so
    // the restarted relay takes the row over soon.
    let env = with(
        fast(queue, &common::sqs::endpoint()),
        &[("OUTBOX_PUBLISH_TIMEOUT", "1s")],
    );
    let relay = RelayProcess::start(db, &env);

    let deadline = tokio::time::Instant::now() + WAIT;
    let first = loop {
        // A FIFO test leaves the message in the queue (visible again after
        // a second) so the resend meets SQS's deduplication.
        let mut batch = queue.receive_once(1).await;
        if let Some(message) = batch.pop() {
            if !keep_first_delivery {
                queue.delete(&message).await;
            }
            break message;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first send never arrived"
        );
    };
    assert_eq!(first.event_id(), row.id.to_string());

    relay.signal("KILL");
    let mut relay = relay;
    assert!(relay.wait(WAIT).await.is_some(), "relay exits on SIGKILL");
    // The killed relay's statement still sleeps in the trigger; end it, and
    // its transaction with it, before dropping the trigger.
    db.terminate_relay_backends().await;
    common::release_marks(db).await;
    let state = db
        .client
        .query_one(
            "SELECT published_at IS NULL, attempt_count FROM outbox_event WHERE id = $1",
            &[&row.id],
        )
        .await
        .unwrap();
    assert!(
        state.get::<_, bool>(0),
        "SQS accepted it, but the row was never marked"
    );
    assert_eq!(state.get::<_, i32>(1), 1);

    let restarted = RelayProcess::start(db, &env);
    (row, first, restarted)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_killed_between_send_and_commit_sends_the_row_again_under_its_id() {
    let db = TestDb::migrated().await;
    let queue = TestQueue::create(false, None).await;
    let (row, first, relay) = kill_between_send_and_commit(&db, &queue, false).await;
    let again = queue.receive(1, WAIT).await;
    assert_eq!(again.len(), 1, "the row was sent again");
    assert_eq!(again[0].event_id(), row.id.to_string(), "under the same event_id");
    assert_eq!(again[0].body, first.body);
    assert_fields(&again[0], &row, false);
    eventually(WAIT, "row published after the restart", || async {
        published(&db, &[row.id]).await == 1
    })
    .await;
    assert_eq!(
        db.count(&format!("id = '{}' AND attempt_count = 2", row.id))
            .await,
        1
    );
    drop(relay);
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fifo_resend_after_a_crash_carries_the_same_deduplication_id() {
    let db = TestDb::migrated().await;
    let queue = TestQueue::create(true, None).await;
    let (row, first, relay) = kill_between_send_and_commit(&db, &queue, true).await;
    assert_fields(&first, &row, true);
    // The resend succeeds (the row gets marked) ...
    eventually(WAIT, "row published after the restart", || async {
        published(&db, &[row.id]).await == 1
    })
    .await;
    // ... and, carrying the same MessageDeduplicationId within SQS's
    // five-minute window, adds no second copy: the queue still holds just
    // the first delivery.
    let remaining = queue.receive(2, Duration::from_secs(5)).await;
    assert_eq!(
        remaining.len(),
        1,
        "deduplicated by MessageDeduplicationId: {remaining:?}"
    );
    assert_fields(&remaining[0], &row, true);
    drop(relay);
    queue.cleanup().await;
}
