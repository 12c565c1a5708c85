//! The NATS JetStream sink against the real NATS server (`nats-server -js`):
//! every message field, a batch acknowledged together, a `duplicate: true`
//! acknowledgement counted as published, a missing stream waited out
//! without burning attempts, oversized rows and subjects too long for the
//! server's control line quarantined at once, the connection cut mid-run,
//! and a relay killed between the acknowledgement and the mark, whose
//! republication the stream stores once.
//!
//! Each test has its own database and its own stream (on subjects of its
//! own), so they run in parallel.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::proxy::Proxy;
use common::servers::{Certs, PrivateNats};
use common::system::free_port;
use common::{
    eventually, nats_url, produce, produce_varied, quick_settings, with, ProducedRow, RelayProcess, Stored,
    StreamLimits, TestDb, TestStream,
};
use futures::StreamExt;
use uuid::Uuid;

/// Deadline of every wait; a passing test never waits this long.
const WAIT: Duration = Duration::from_secs(120);

/// Settings that make a test relay react quickly, publishing to `stream`
/// through `url`.
fn fast(stream: &TestStream, url: &str) -> Vec<(&'static str, String)> {
    let mut env = stream.env_via(url);
    env.extend(with(quick_settings(), &[("OUTBOX_BACKOFF_MAX", "1s")]));
    env
}

/// Asserts a stored message carries exactly the row's fields.
fn assert_fields(message: &Stored, row: &ProducedRow, stream: &TestStream) {
    assert_eq!(
        message.body,
        row.payload.as_bytes(),
        "body is the payload, byte for byte"
    );
    assert_eq!(message.subject, format!("{}.{}", stream.prefix, row.event_type));
    let mut expected: HashMap<&str, String> = HashMap::from([
        ("Nats-Msg-Id", row.id.to_string()),
        ("Content-Type", "application/json".to_owned()),
        ("event_type", row.event_type.clone()),
        ("aggregate_id", row.aggregate_id.clone()),
    ]);
    if let Some(cause) = row.causation_id {
        expected.insert("causation_id", cause.to_string());
    }
    let got: HashMap<&str, String> = message
        .headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.clone()))
        .collect();
    assert_eq!(got, expected, "headers of {}", row.id);
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

/// `GET /readyz`: the status and body, or `None` while nothing listens.
async fn readyz(port: u16) -> Option<(u16, String)> {
    let response = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_field_arrives_and_the_stream_holds_each_event_once() {
    let db = TestDb::migrated().await;
    let stream = TestStream::create().await;
    let rows = produce_varied(&db, 60, 7, false).await;
    let relay = RelayProcess::start(
        &db,
        &with(fast(&stream, &stream.url), &[("OUTBOX_BATCH_SIZE", "25")]),
    );
    all_published(&db, &rows).await;
    let stored = stream.messages().await;
    assert_eq!(stored.len(), rows.len(), "one message per row");
    let by_id: HashMap<String, &ProducedRow> = rows.iter().map(|row| (row.id.to_string(), row)).collect();
    for message in &stored {
        let row = by_id
            .get(&message.msg_id())
            .unwrap_or_else(|| panic!("unknown message {message:?}"));
        assert_fields(message, row, &stream);
    }
    assert_eq!(
        db.count("quarantined_at IS NOT NULL OR attempt_count <> 1").await,
        0
    );
    drop(relay);
    stream.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_is_acknowledged_together_not_one_round_trip_per_message() {
    let db = TestDb::migrated().await;
    let stream = TestStream::create().await;
    // Every round trip through this proxy takes at least 400 ms: one per
    // message, a batch of 100 would need 40 s, far past the 5 s publish
    // timeout, and its rows would be deferred and published again later.
    let proxy = Proxy::start_with_latency(common::nats::nats_addr(), Duration::from_millis(200)).await;
    let rows = produce_varied(&db, 100, 7, false).await;
    let relay = RelayProcess::start(
        &db,
        &with(
            fast(&stream, &format!("nats://{}", proxy.addr)),
            &[
                ("OUTBOX_BATCH_SIZE", "100"),
                ("OUTBOX_WORKERS", "1"),
                ("OUTBOX_PUBLISH_TIMEOUT", "5s"),
            ],
        ),
    );
    all_published(&db, &rows).await;
    // One mark statement (one `now()`) for all 100: the batch was
    // acknowledged within its one publish, none of it deferred to a later
    // claim.
    let marks = db
        .column::<i64>("SELECT count(DISTINCT published_at) FROM outbox_event", &[])
        .await;
    assert_eq!(marks, [1], "every row marked by the first batch's one mark");
    assert_eq!(db.count("attempt_count <> 1").await, 0);
    assert_eq!(stream.count().await, 100);
    drop(relay);
    stream.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_acknowledgement_counts_as_published() {
    let db = TestDb::migrated().await;
    let stream = TestStream::create().await;
    let row = produce(&db, None, "order.created", "order-1", r#"{"n": 1}"#).await;
    // The message is already in the stream, under the row's id (as after
    // a relay died between the acknowledgement and the mark).
    let event = outbox_relay::event::Event {
        id: row.id,
        causation_id: None,
        event_type: row.event_type.clone(),
        aggregate_id: row.aggregate_id.clone(),
        payload: row.payload.clone(),
        created_at: chrono::Utc::now(),
        attempt_count: 1,
        headers: Default::default(),
    };
    let ack = stream
        .context()
        .publish_with_headers(
            format!("{}.{}", stream.prefix, row.event_type),
            outbox_relay::sink::nats::headers(&event),
            row.payload.clone().into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored");
    assert!(!ack.duplicate);
    let relay = RelayProcess::start(&db, &fast(&stream, &stream.url));
    all_published(&db, std::slice::from_ref(&row)).await;
    assert_eq!(
        db.count("quarantined_at IS NOT NULL OR attempt_count <> 1").await,
        0
    );
    let stored = stream.messages().await;
    assert_eq!(stored.len(), 1, "the stream kept the first copy only");
    assert_eq!(stored[0].sequence, ack.sequence);
    drop(relay);
    stream.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_stream_makes_the_relay_not_ready_and_burns_no_attempts() {
    let db = TestDb::migrated().await;
    let url = nats_url();
    let stream = TestStream::unnamed(&url, TestStream::connect(&url).await);
    let rows = produce_varied(&db, 30, 7, false).await;
    let port = free_port();
    let relay = RelayProcess::start(
        &db,
        &with(
            fast(&stream, &url),
            &[("OUTBOX_HTTP_ADDR", &format!("127.0.0.1:{port}"))],
        ),
    );
    eventually(WAIT, "/readyz names the missing stream", || async {
        matches!(readyz(port).await, Some((503, body)) if body.contains("no JetStream stream captures"))
    })
    .await;
    let check = db
        .relay_command(
            &["check"],
            &stream
                .env()
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        )
        .output()
        .expect("run check");
    assert_eq!(check.status.code(), Some(1), "check fails without a stream");
    let said = String::from_utf8_lossy(&check.stderr);
    assert!(
        said.contains(&format!("{}.>", stream.prefix)),
        "check names the subjects: {said}"
    );
    assert_eq!(
        db.count("attempt_count <> 0 OR published_at IS NOT NULL OR quarantined_at IS NOT NULL")
            .await,
        0,
        "nothing claimed while there is no stream"
    );
    stream.add(&StreamLimits::default()).await;
    all_published(&db, &rows).await;
    assert_eq!(db.count("attempt_count <> 1").await, 0);
    assert_eq!(stream.count().await, rows.len() as u64);
    eventually(WAIT, "/readyz is ready", || async {
        matches!(readyz(port).await, Some((200, _)))
    })
    .await;
    drop(relay);
    stream.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_nats_cannot_take_are_quarantined_at_once_and_their_batch_mates_published() {
    let db = TestDb::migrated().await;
    let stream = TestStream::create_with(StreamLimits {
        max_message_size: 4096,
        ..StreamLimits::default()
    })
    .await;
    let max_payload = stream.context().client().server_info().max_payload;
    let blob = |bytes: usize| format!(r#"{{"blob": "{}"}}"#, "x".repeat(bytes - 12));
    let mut good = Vec::new();
    for n in 0..4 {
        good.push(produce(&db, None, "order.created", "order-1", &format!(r#"{{"n": {n}}}"#)).await);
    }
    // Over the stream's max_msg_size: the stream refuses it.
    let over_stream = produce(&db, None, "order.created", "order-1", &blob(8192)).await;
    // Under the server's max_payload, over it with the headers: the sink
    // refuses to send it (the server would close the connection).
    let over_with_headers = produce(&db, None, "order.created", "order-2", &blob(max_payload - 20)).await;
    // Over max_payload by itself: the claim does not even load it.
    let over_payload = produce(&db, None, "order.created", "order-2", &blob(max_payload + 1)).await;
    // A subject with white space in it cannot be published to.
    let bad_subject = produce(&db, None, "order created", "order-3", r#"{"n": 9}"#).await;
    for n in 4..8 {
        good.push(produce(&db, None, "order.created", "order-3", &format!(r#"{{"n": {n}}}"#)).await);
    }
    let relay = RelayProcess::start(&db, &fast(&stream, &stream.url));
    all_published(&db, &good).await;
    for (row, mentions) in [
        (&over_stream, "exceeds maximum"),
        (&over_with_headers, "max_payload"),
        (&over_payload, "largest message the sink accepts"),
        (&bad_subject, "white space"),
    ] {
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
        assert_eq!(state.get::<_, i32>(0), 1, "quarantined on the first attempt");
        let last_error: String = state.get(1);
        assert!(
            last_error.contains(mentions),
            "last_error names the reason: {last_error}"
        );
        assert!(state.get::<_, bool>(2));
    }
    let stored: HashSet<String> = stream.messages().await.iter().map(Stored::msg_id).collect();
    let want: HashSet<String> = good.iter().map(|row| row.id.to_string()).collect();
    assert_eq!(stored, want, "the good rows, and only they, are in the stream");
    drop(relay);
    stream.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subject_over_the_control_line_limit_is_quarantined_and_the_others_published() {
    let db = TestDb::migrated().await;
    let stream = TestStream::create().await;
    let mut good = Vec::new();
    for n in 0..200 {
        good.push(produce(&db, None, "order.created", &format!("order-{n}"), r#"{"n": 1}"#).await);
    }
    // Its subject alone is longer than the server's max_control_line
    // (4096 bytes): the server would close the connection on its publish,
    // failing its batch-mates with it, on every claim.
    let long = produce(&db, None, "order.created", &"a".repeat(5000), r#"{"n": 2}"#).await;
    for n in 200..399 {
        good.push(produce(&db, None, "order.created", &format!("order-{n}"), r#"{"n": 3}"#).await);
    }
    // A long subject that fits the line is sent, and the server takes it.
    good.push(produce(&db, None, "order.created", &"b".repeat(3800), r#"{"n": 4}"#).await);
    let subject = format!("{}.{{aggregate_id}}", stream.prefix);
    let relay = RelayProcess::start(
        &db,
        &with(fast(&stream, &stream.url), &[("OUTBOX_NATS_SUBJECT", &subject)]),
    );
    all_published(&db, &good).await;
    eventually(WAIT, "the long row quarantined", || async {
        db.count(&format!("id = '{}' AND quarantined_at IS NOT NULL", long.id))
            .await
            == 1
    })
    .await;
    let state = db
        .client
        .query_one(
            "SELECT attempt_count, last_error, published_at IS NULL FROM outbox_event WHERE id = $1",
            &[&long.id],
        )
        .await
        .unwrap();
    assert_eq!(state.get::<_, i32>(0), 1, "quarantined on the first attempt");
    let last_error: String = state.get(1);
    assert!(
        last_error.contains("max_control_line of 4096"),
        "last_error names the limit: {last_error}"
    );
    assert!(state.get::<_, bool>(2), "never marked published");
    let stored = stream.messages().await;
    let ids: HashSet<String> = stored.iter().map(Stored::msg_id).collect();
    let want: HashSet<String> = good.iter().map(|row| row.id.to_string()).collect();
    assert_eq!(ids, want, "the 400 others, and only they, are in the stream");
    assert_eq!(stored.len(), good.len(), "each once");
    drop(relay);
    stream.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_connection_mid_run_loses_nothing_and_duplicates_nothing_in_the_stream() {
    let db = TestDb::migrated().await;
    let stream = TestStream::create().await;
    let proxy = Proxy::start(common::nats::nats_addr()).await;
    let relay = RelayProcess::start(
        &db,
        &with(
            fast(&stream, &format!("nats://{}", proxy.addr)),
            &[("OUTBOX_BATCH_SIZE", "20"), ("OUTBOX_PUBLISH_TIMEOUT", "2s")],
        ),
    );
    let mut rows = Vec::new();
    for round in 0..5 {
        rows.extend(produce_varied(&db, 80, 7, false).await);
        // Cut while the relay is publishing this round.
        let ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
        eventually(WAIT, "some of the round published", || async {
            published(&db, &ids).await > (round * 80) as i64
        })
        .await;
        proxy.cut();
    }
    all_published(&db, &rows).await;
    assert_eq!(db.count("quarantined_at IS NOT NULL").await, 0);
    let stored = stream.messages().await;
    let ids: HashSet<String> = stored.iter().map(Stored::msg_id).collect();
    assert_eq!(ids.len(), rows.len(), "every row is in the stream");
    assert_eq!(stored.len(), rows.len(), "and only once, republications included");
    drop(relay);
    stream.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_killed_between_ack_and_mark_republishes_under_the_same_id_and_the_stream_holds_it_once() {
    let db = TestDb::migrated().await;
    let stream = TestStream::create().await;
    // A plain subscriber sees every publish, duplicates included, while the
    // stream stores the first only.
    let watcher = async_nats::connect(&stream.url).await.expect("watcher connects");
    let mut published_messages = watcher
        .subscribe(format!("{}.>", stream.prefix))
        .await
        .expect("subscribe");
    watcher.flush().await.expect("subscription registered");
    common::hang_marks(&db).await;
    let row = produce(
        &db,
        Some(Uuid::new_v4()),
        "order.created",
        "order-42",
        r#"{"total": 42}"#,
    )
    .await;
    // A short publish timeout gives a short lease (2 × timeout + 5 s).
    let env = with(fast(&stream, &stream.url), &[("OUTBOX_PUBLISH_TIMEOUT", "1s")]);
    let mut relay = RelayProcess::start(&db, &env);
    let first = tokio::time::timeout(WAIT, published_messages.next())
        .await
        .expect("the first publish")
        .expect("subscription open");
    eventually(WAIT, "the stream acknowledged it", || async {
        stream.count().await == 1
    })
    .await;
    relay.signal("KILL");
    assert!(relay.wait(WAIT).await.is_some(), "relay exits on SIGKILL");
    db.terminate_relay_backends().await;
    common::release_marks(&db).await;
    assert_eq!(
        db.count(&format!(
            "id = '{}' AND published_at IS NULL AND attempt_count = 1",
            row.id
        ))
        .await,
        1,
        "the stream took it, but the row was never marked"
    );
    let relay = RelayProcess::start(&db, &env);
    let again = tokio::time::timeout(WAIT, published_messages.next())
        .await
        .expect("the republication")
        .expect("subscription open");
    let msg_id = |message: &async_nats::Message| {
        message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|value| value.as_str().to_owned())
    };
    assert_eq!(msg_id(&first), Some(row.id.to_string()));
    assert_eq!(
        msg_id(&again),
        Some(row.id.to_string()),
        "republished under the same Nats-Msg-Id"
    );
    assert_eq!(again.payload, first.payload);
    all_published(&db, std::slice::from_ref(&row)).await;
    assert_eq!(
        db.count(&format!("id = '{}' AND attempt_count = 2", row.id))
            .await,
        1
    );
    let stored = stream.messages().await;
    assert_eq!(stored.len(), 1, "the stream holds the event once");
    assert_fields(&stored[0], &row, &stream);
    drop(relay);
    stream.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_and_a_password_in_the_url_work_and_the_password_is_never_shown() {
    const PASSWORD: &str = "s3cr3t-Pa55";
    let certs = Certs::generate("relay");
    let server = PrivateNats::start_tls(&certs, "relay", PASSWORD);
    let url = format!("tls://localhost:{}", server.port);
    let client = async_nats::ConnectOptions::new()
        .user_and_password("relay".into(), PASSWORD.into())
        .add_root_certificates(certs.path("ca.pem").into())
        .require_tls(true)
        .connect(&url)
        .await
        .expect("the test reaches its NATS server");
    let stream = TestStream::unnamed(&url, async_nats::jetstream::new(client));
    stream.add(&StreamLimits::default()).await;
    let db = TestDb::migrated().await;
    let rows = produce_varied(&db, 20, 7, false).await;
    let with_password = format!("tls://relay:{PASSWORD}@localhost:{}", server.port);
    let ca = certs.path("ca.pem");
    let env = with(fast(&stream, &with_password), &[("OUTBOX_NATS_CA_FILE", &ca)]);

    // Without the CA file, the server's certificate is not trusted:
    // `check` says so, without the password.
    let plain = fast(&stream, &with_password);
    let untrusted: Vec<(&str, &str)> = plain.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let check = db
        .relay_command(&["check"], &untrusted)
        .output()
        .expect("run check");
    let said = String::from_utf8_lossy(&check.stderr).into_owned() + &String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "check fails: {said}");
    assert!(said.contains("NATS"), "check names NATS: {said}");
    assert!(!said.contains(PASSWORD), "check shows the password: {said}");

    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = lines.clone();
    let (relay, reader) =
        RelayProcess::start_reading_log(&db, &with(env, &[("RUST_LOG", "debug")]), move |line| {
            seen.lock().unwrap().push(line.to_owned())
        });
    all_published(&db, &rows).await;
    assert_eq!(stream.count().await, rows.len() as u64);
    drop(relay);
    reader.join().expect("log reader");
    let lines = std::mem::take(&mut *lines.lock().unwrap());
    assert!(!lines.is_empty());
    for line in &lines {
        assert!(!line.contains(PASSWORD), "a log line shows the password: {line}");
    }
    stream.cleanup().await;
}
