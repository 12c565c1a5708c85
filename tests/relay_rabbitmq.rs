//! The relay core against the real PostgreSQL and RabbitMQ: delivery,
//! message mapping, competing replicas, failures, crashes and shutdown.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::proxy::Proxy;
use common::{eventually, hang_marks, quick_settings, release_marks, with, RelayProcess, TestBroker, TestDb};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// Settings that make a test relay react quickly.
fn fast(broker: &TestBroker) -> Vec<(&'static str, String)> {
    let mut env = broker.env();
    env.extend(quick_settings());
    env
}

/// Nothing more arrives (a short wait for strays: a row published
/// twice), every row ends marked, and the broker's queue goes.
async fn nothing_more_and_every_row_marked(db: &TestDb, broker: TestBroker) {
    assert!(
        broker.receive(1, Duration::from_millis(500)).await.is_empty(),
        "a row was published twice"
    );
    eventually(WAIT, "all rows marked", || async {
        db.count("published_at IS NULL").await == 0
    })
    .await;
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_become_messages_with_the_spec_properties() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("orders.#").await;
    let causation = Uuid::new_v4();
    let mut expected = HashMap::new();
    for n in 0..20 {
        let id = Uuid::new_v4();
        // Key order and spacing are PostgreSQL's JSONB rendering; the body
        // must be exactly that text.
        let payload = format!(r#"{{"n": {n}, "text": "héllo \"quoted\"", "nested": {{"a": [1, 2]}}}}"#);
        let causation_id = (n % 2 == 0).then_some(causation);
        db.client
            .execute(
                "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload, created_at)
                 VALUES ($1, $2, 'created', $3, $4::text::jsonb, '2026-01-02T03:04:05Z')",
                &[&id, &causation_id, &format!("order-{n}"), &payload],
            )
            .await
            .unwrap();
        let body: String = db
            .client
            .query_one("SELECT payload::text FROM outbox_event WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        expected.insert(id.to_string(), (n, body, causation_id));
    }
    let _relay = RelayProcess::start(
        &db,
        &with(
            fast(&broker),
            &[("OUTBOX_AMQP_ROUTING_KEY", "orders.{event_type}.{aggregate_id}")],
        ),
    );

    let received = broker.receive(20, WAIT).await;
    assert_eq!(received.len(), 20, "every row becomes one message");
    for message in &received {
        let (n, body, causation_id) = expected.get(&message.message_id).expect("message_id is a row id");
        assert_eq!(
            String::from_utf8(message.body.clone()).unwrap(),
            *body,
            "body is the payload text"
        );
        assert_eq!(message.kind.as_deref(), Some("created"));
        assert_eq!(message.content_type.as_deref(), Some("application/json"));
        assert_eq!(message.delivery_mode, Some(2), "persistent");
        assert_eq!(message.timestamp, Some(1_767_323_045), "created_at in seconds");
        assert_eq!(message.routing_key, format!("orders.created.order-{n}"));
        assert_eq!(
            message.headers.get("aggregate_id").map(String::as_str),
            Some(format!("order-{n}").as_str())
        );
        assert_eq!(
            message.headers.get("causation_id").cloned(),
            causation_id.map(|c| c.to_string())
        );
    }
    eventually(WAIT, "all rows marked published", || async {
        db.count("published_at IS NOT NULL").await == 20
    })
    .await;
    assert_eq!(db.count("attempt_count = 1 AND last_error IS NULL").await, 20);
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_relays_deliver_every_row_exactly_once_in_normal_operation() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let ids = db.insert_events(3_000, "load.test").await;
    let env = with(fast(&broker), &[("OUTBOX_BATCH_SIZE", "50")]);
    let _first = RelayProcess::start(&db, &env);
    let _second = RelayProcess::start(&db, &env);

    let received = broker.receive(ids.len(), WAIT).await;
    let unique: HashSet<&str> = received.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(received.len(), ids.len(), "no row missing and none twice");
    assert_eq!(unique.len(), ids.len());
    let expected: HashSet<String> = ids.iter().map(Uuid::to_string).collect();
    assert!(unique.iter().all(|id| expected.contains(*id)));
    nothing_more_and_every_row_marked(&db, broker).await;
}

/// While a backlog drains, the workers' claims start past the last row
/// the relay took (see src/relay/claim_start.rs). Rows that become due
/// behind that point all the same, here dated before the whole backlog as
/// rows of a producer transaction that began before it and committed late
/// would be, are published too, each once.
#[tokio::test(flavor = "multi_thread")]
async fn rows_committed_behind_a_draining_relay_are_published_once() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let backlog = db.insert_events(10_000, "load.test").await;
    let env = with(
        fast(&broker),
        &[("OUTBOX_BATCH_SIZE", "50"), ("OUTBOX_WORKERS", "4")],
    );
    let _relay = RelayProcess::start(&db, &env);
    eventually(WAIT, "the drain under way", || async {
        db.count("published_at IS NOT NULL").await >= 500
    })
    .await;
    let late: Vec<Uuid> = db
        .column(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(), 'late.test', 'late', jsonb_build_object('n', n),
                    timestamptz '2000-01-01' + n * interval '1 second'
             FROM generate_series(1, 20) AS n
             RETURNING id",
            &[],
        )
        .await;
    let still_draining = db
        .count("published_at IS NULL AND event_type = 'load.test'")
        .await;
    eprintln!("{still_draining} rows of the backlog were unpublished when the late rows committed");

    let received = broker.receive(backlog.len() + late.len(), WAIT).await;
    let unique: HashSet<&str> = received.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(unique.len(), received.len(), "a row was published twice");
    for id in &late {
        assert!(
            unique.contains(id.to_string().as_str()),
            "late row {id} was not published"
        );
    }
    assert_eq!(received.len(), backlog.len() + late.len(), "every row, once");
    nothing_more_and_every_row_marked(&db, broker).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unroutable_rows_back_off_then_quarantine_while_others_flow() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("good.#").await;
    // Three unroutable rows among 200 routable ones, with the default
    // workers: they may fail in different batches of different workers.
    let mut good = db.insert_events(50, "good.event").await;
    let mut bad = Vec::new();
    for _ in 0..3 {
        bad.extend(db.insert_events(1, "bad.event").await);
        good.extend(db.insert_events(50, "good.event").await);
    }
    let env = with(
        fast(&broker),
        &[
            ("OUTBOX_MAX_ATTEMPTS", "3"),
            ("OUTBOX_BACKOFF_BASE", "2s"),
            ("OUTBOX_BACKOFF_MAX", "2s"),
        ],
    );
    let _relay = RelayProcess::start(&db, &env);

    // After its first failed attempt, each unroutable row is counted,
    // explained, and due later. Rows that fail in different batches reach
    // that state at different moments, so each is observed on its own.
    let seen_backing_off = std::cell::RefCell::new(HashSet::new());
    eventually(WAIT, "first failed attempt recorded", || async {
        let backing_off = db
            .ids_where(
                "event_type = 'bad.event' AND attempt_count = 1 AND next_attempt_at > now()
                   AND last_error LIKE '%NO_ROUTE%' AND quarantined_at IS NULL",
            )
            .await;
        seen_backing_off.borrow_mut().extend(backing_off);
        seen_backing_off.borrow().len() == 3
    })
    .await;
    assert_eq!(
        seen_backing_off.into_inner(),
        bad.iter().copied().collect::<HashSet<_>>(),
        "failed rows are backed off into the future"
    );

    let received = broker.receive(good.len(), WAIT).await;
    assert_eq!(received.len(), good.len(), "routable rows keep flowing");

    eventually(WAIT, "unroutable rows quarantined at the maximum", || async {
        db.count("event_type = 'bad.event' AND quarantined_at IS NOT NULL AND attempt_count = 3")
            .await
            == 3
    })
    .await;
    assert_eq!(
        db.count("event_type = 'bad.event' AND published_at IS NOT NULL")
            .await,
        0
    );
    let reason: String = db
        .client
        .query_one("SELECT last_error FROM outbox_event WHERE id = $1", &[&bad[0]])
        .await
        .unwrap()
        .get(0);
    assert!(
        reason.contains("gave up after 3 attempts") && reason.contains("NO_ROUTE"),
        "{reason}"
    );
    assert_eq!(
        db.count("event_type = 'good.event' AND published_at IS NOT NULL")
            .await,
        200
    );
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_killed_between_confirm_and_commit_republishes_with_the_same_id() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let ids = db.insert_events(5, "crash.test").await;
    hang_marks(&db).await;
    let env = with(fast(&broker), &[("OUTBOX_PUBLISH_TIMEOUT", "1s")]);
    let mut relay = RelayProcess::start(&db, &env);

    let first = broker.receive(ids.len(), WAIT).await;
    assert_eq!(first.len(), ids.len(), "the broker confirmed the batch");
    relay.signal("KILL");
    relay.wait(WAIT).await.expect("relay killed");
    // The killed relay's statement is still sleeping on the server.
    db.terminate_relay_backends().await;
    release_marks(&db).await;
    assert_eq!(
        db.count("published_at IS NULL").await,
        5,
        "no row marked without a committed outcome"
    );

    let _restarted = RelayProcess::start(&db, &env);
    let second = broker.receive(ids.len(), WAIT).await;
    let first_ids: HashSet<String> = first.into_iter().map(|m| m.message_id).collect();
    let second_ids: HashSet<String> = second.into_iter().map(|m| m.message_id).collect();
    assert_eq!(first_ids, second_ids, "republished under the same ids");
    eventually(WAIT, "rows marked after the restart", || async {
        db.count("published_at IS NOT NULL").await == 5
    })
    .await;
    assert_eq!(
        db.count("attempt_count = 2").await,
        5,
        "the crashed attempt counts"
    );
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_that_keeps_killing_the_relay_ends_in_quarantine() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    db.insert_events(1, "crash.loop").await;
    hang_marks(&db).await;
    let env = with(
        fast(&broker),
        &[("OUTBOX_PUBLISH_TIMEOUT", "1s"), ("OUTBOX_MAX_ATTEMPTS", "2")],
    );
    for attempt in 1..=2 {
        let mut relay = RelayProcess::start(&db, &env);
        assert_eq!(
            broker.receive(1, WAIT).await.len(),
            1,
            "attempt {attempt} published"
        );
        relay.signal("KILL");
        relay.wait(WAIT).await.expect("relay killed");
        db.terminate_relay_backends().await;
    }
    release_marks(&db).await;
    let _relay = RelayProcess::start(&db, &env);
    eventually(WAIT, "crash-looping row quarantined", || async {
        db.count("quarantined_at IS NOT NULL AND published_at IS NULL")
            .await
            == 1
    })
    .await;
    let reason: String = db
        .client
        .query_one("SELECT last_error FROM outbox_event", &[])
        .await
        .unwrap()
        .get(0);
    assert!(reason.contains("without an outcome"), "{reason}");
    assert!(
        broker.receive(1, Duration::from_millis(500)).await.is_empty(),
        "not published a third time"
    );
    broker.cleanup().await;
}

/// Starts a relay and returns it once the broker has the row `id`.
async fn start_until_published(
    db: &TestDb,
    env: &[(&'static str, String)],
    broker: &TestBroker,
    id: Uuid,
    round: u32,
) -> RelayProcess {
    let relay = RelayProcess::start(db, env);
    let id = id.to_string();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !broker
        .receive(1, Duration::from_millis(500))
        .await
        .iter()
        .any(|message| message.message_id == id)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "round {round}: {id} not published"
        );
    }
    relay
}

/// A row that kills the relay while its batch-mates are in flight with
/// it: every one of them is charged the attempt, and retried together
/// they would share each of its attempts until all were quarantined. Here
/// the relay dies (killed by the test) whenever the poison row's mark is
/// under way, which a trigger holds up for that row only: after the first
/// crash the poison row is published alone, its batch-mates are published
/// and marked while it hangs, and only the poison row reaches quarantine.
#[tokio::test(flavor = "multi_thread")]
async fn a_row_that_keeps_killing_the_relay_does_not_take_its_batch_mates_to_quarantine() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let poison = db.insert_events(1, "crash.poison").await[0];
    let mates = db.insert_events(19, "crash.mate").await;
    db.client
        .batch_execute(
            "CREATE FUNCTION hang_poison_mark() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.published_at IS NOT NULL AND OLD.published_at IS NULL
                    AND OLD.event_type = 'crash.poison' THEN
                     PERFORM pg_sleep(600);
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER hang_poison_mark BEFORE UPDATE ON outbox_event
                 FOR EACH ROW EXECUTE FUNCTION hang_poison_mark();",
        )
        .await
        .unwrap();
    let env = with(
        fast(&broker),
        &[("OUTBOX_PUBLISH_TIMEOUT", "1s"), ("OUTBOX_MAX_ATTEMPTS", "2")],
    );
    // Round 1: the whole first batch is in flight when the relay dies.
    let mut relay = start_until_published(&db, &env, &broker, poison, 1).await;
    relay.signal("KILL");
    relay.wait(WAIT).await.expect("relay killed");
    db.terminate_relay_backends().await;

    // Round 2: the poison row goes alone; its batch-mates are published
    // and marked while its mark hangs.
    let mut relay = start_until_published(&db, &env, &broker, poison, 2).await;
    eventually(WAIT, "the batch-mates published and marked", || async {
        db.count(&format!(
            "published_at IS NOT NULL AND id IN ({})",
            mates
                .iter()
                .map(|id| format!("'{id}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .await
            == mates.len() as i64
    })
    .await;
    relay.signal("KILL");
    relay.wait(WAIT).await.expect("relay killed");
    db.terminate_relay_backends().await;

    // Round 3: the poison row is past its attempts.
    let _relay = RelayProcess::start(&db, &env);
    eventually(WAIT, "the poison row quarantined", || async {
        db.count("quarantined_at IS NOT NULL").await == 1
    })
    .await;
    let quarantined: Uuid = db
        .client
        .query_one(
            "SELECT id FROM outbox_event WHERE quarantined_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(quarantined, poison, "only the poison row is quarantined");
    assert_eq!(db.count("published_at IS NOT NULL").await, 19);
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_relay_recovers_from_cut_database_and_broker_connections_under_load() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let proxy = Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let ids = db.insert_events(4_000, "chaos.test").await;
    let mut env = with(
        fast(&broker),
        &[("OUTBOX_BATCH_SIZE", "50"), ("OUTBOX_PUBLISH_TIMEOUT", "2s")],
    );
    env.push((
        "OUTBOX_AMQP_URL",
        format!("amqp://guest:guest@{}/%2f", proxy.addr),
    ));
    let _relay = RelayProcess::start(&db, &env);

    let mut seen = HashSet::new();
    for round in 0..3 {
        let batch = broker.receive(500, WAIT).await;
        assert!(
            !batch.is_empty(),
            "round {round}: the relay delivers again after a cut"
        );
        seen.extend(batch.into_iter().map(|m| m.message_id));
        let terminated = db.terminate_relay_backends().await;
        proxy.cut();
        eprintln!("round {round}: terminated {terminated} database connections, cut the broker connection");
    }
    eventually(
        Duration::from_secs(120),
        "every row published after the cuts",
        || async { db.count("published_at IS NULL").await == 0 },
    )
    .await;
    let rest = broker.receive(ids.len(), Duration::from_secs(5)).await;
    seen.extend(rest.into_iter().map(|m| m.message_id));
    let expected: HashSet<String> = ids.iter().map(Uuid::to_string).collect();
    assert!(
        expected.is_subset(&seen),
        "{} rows never arrived",
        expected.difference(&seen).count()
    );
    assert_eq!(
        db.count("quarantined_at IS NOT NULL").await,
        0,
        "an outage quarantines nothing"
    );
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_under_load_settles_the_batch_in_flight_and_exits_zero() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    db.insert_events(20_000, "shutdown.test").await;
    let mut relay = RelayProcess::start(&db, &with(fast(&broker), &[("OUTBOX_BATCH_SIZE", "200")]));
    eventually(WAIT, "relay under way", || async {
        db.count("published_at IS NOT NULL").await > 500
    })
    .await;
    relay.signal("TERM");
    let status = relay
        .wait(Duration::from_secs(30))
        .await
        .expect("exits within 30 s");
    assert!(status.success(), "exit status {status:?}");

    // Every claimed row was published and recorded: none carries an attempt
    // without an outcome, and the broker has exactly the published rows.
    assert_eq!(
        db.count("published_at IS NULL AND attempt_count > 0").await,
        0,
        "a row was left claimed"
    );
    let published = db.count("published_at IS NOT NULL").await;
    let received = broker
        .receive(published as usize + 1, Duration::from_secs(20))
        .await;
    assert_eq!(received.len() as i64, published, "messages equal marked rows");
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_publish_delete_removes_confirmed_rows() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let ids = db.insert_events(100, "delete.test").await;
    let _relay = RelayProcess::start(&db, &with(fast(&broker), &[("OUTBOX_ON_PUBLISH", "delete")]));
    let received = broker.receive(ids.len(), WAIT).await;
    assert_eq!(received.len(), ids.len());
    eventually(WAIT, "confirmed rows deleted", || async {
        db.count("true").await == 0
    })
    .await;
    broker.cleanup().await;
}
