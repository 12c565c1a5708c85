//! Real faults, not simulated ones: a broker memory alarm, a broker that
//! refuses a message too large for it, a relay frozen past its lease, a
//! database restart and a database crash, rows the relay cannot read as
//! they are, and payloads large enough to test the relay's memory. An
//! outage is not the row's fault (no attempt is charged for it, nothing is
//! quarantined), and no row can stop the relay.
//!
//! Tests that disturb a server start a private one (see
//! `common::private_rabbit` and `common::private_postgres`); the others use
//! the shared servers like every other test.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::private_postgres::PrivatePostgres;
use common::private_rabbit::PrivateRabbit;
use common::system::free_port;
use common::{eventually, http_get, quick_settings, with, RelayProcess, TestBroker, TestDb};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(120);

/// Waits until no row is waiting any more (each one published or
/// quarantined), so what follows can tell the two apart.
async fn settled(db: &TestDb, within: Duration) {
    eventually(within, "every row published or quarantined", || async {
        db.count("published_at IS NULL AND quarantined_at IS NULL").await == 0
    })
    .await;
}

/// The quarantined rows with their attempts and reasons, for a failure
/// message.
async fn quarantined(db: &TestDb) -> Vec<(Uuid, i64, String)> {
    db.client
        .query(
            "SELECT id, attempt_count::bigint, coalesce(last_error, '') FROM outbox_event
             WHERE quarantined_at IS NOT NULL ORDER BY id",
            &[],
        )
        .await
        .expect("read quarantined rows")
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

async fn assert_nothing_quarantined(db: &TestDb, cause: &str) {
    let rows = quarantined(db).await;
    assert!(
        rows.is_empty(),
        "{} rows quarantined although {cause}; first (id, attempts, last_error): {:?}",
        rows.len(),
        rows.first()
    );
}

fn id_set(ids: &[Uuid]) -> HashSet<String> {
    ids.iter().map(Uuid::to_string).collect()
}

/// Receives until every id of `expected` arrived (duplicates allowed) or
/// `within` passed, and says which are missing or unexpected.
async fn receive_all(broker: &TestBroker, expected: &HashSet<String>, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut received: Vec<String> = Vec::new();
    let mut distinct: HashSet<String> = HashSet::new();
    while !expected.is_subset(&distinct) && Instant::now() < deadline {
        let batch = broker
            .receive_ids(
                expected.len() - distinct.len().min(expected.len()),
                Duration::from_secs(2),
            )
            .await;
        distinct.extend(batch.iter().cloned());
        received.extend(batch);
    }
    let missing = expected.difference(&distinct).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} rows never reached the queue within {within:?}",
        expected.len()
    );
    let unexpected: Vec<&String> = distinct.difference(expected).collect();
    assert!(
        unexpected.is_empty(),
        "messages that are no expected row: {unexpected:?}"
    );
    received
}

/// Rows with payloads of `bytes` bytes of JSON (`{"blob": "xxx…"}`), each
/// created just after the previous row of the test. PostgreSQL compresses
/// the repeated character, so the table stays small on disk; the relay
/// reads the full text.
async fn insert_large(db: &TestDb, count: usize, bytes: usize) -> Vec<Uuid> {
    let ids: Vec<Uuid> = (0..count).map(|_| Uuid::new_v4()).collect();
    // `{"blob": ""}` is 12 bytes around the string.
    let filler = i32::try_from(bytes - 12).expect("a payload under 2 GiB");
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT id, 'large.event', 'agg-large', jsonb_build_object('blob', repeat('x', $2)),
                    clock_timestamp()
             FROM unnest($1::uuid[]) AS u(id)",
            &[&ids, &filler],
        )
        .await
        .expect("insert large rows");
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_memory_alarm_quarantines_nothing_and_everything_is_delivered_after() {
    let rabbit = PrivateRabbit::start("").await;
    let db = TestDb::migrated().await;
    let broker = rabbit.broker("#").await;
    let http = free_port();
    let env = with(
        broker.env(),
        &[
            ("OUTBOX_POLL_INTERVAL", "50ms"),
            ("OUTBOX_MAX_ATTEMPTS", "3"),
            ("OUTBOX_PUBLISH_TIMEOUT", "1s"),
            ("OUTBOX_BACKOFF_BASE", "100ms"),
            ("OUTBOX_BACKOFF_MAX", "1s"),
            ("OUTBOX_HTTP_ADDR", &format!("127.0.0.1:{http}")),
        ],
    );
    let mut relay = RelayProcess::start(&db, &env);
    eventually(WAIT, "the relay ready before the alarm", || async {
        matches!(http_get(http, "/readyz").await, Some((200, _)))
    })
    .await;

    let alarm_started = Instant::now();
    rabbit.set_memory_alarm(true).await;
    let alarm_raised_in = alarm_started.elapsed();
    let ids = db.insert_events(500, "alarm.event").await;

    // The alarm lasts 30 s, whatever the relay does meanwhile; readiness
    // is sampled all along.
    let alarm_for = Duration::from_secs(30);
    let mut not_ready: Vec<(Duration, String)> = Vec::new();
    let mut samples = 0;
    while alarm_started.elapsed() < alarm_for {
        samples += 1;
        if let Some((503, reason)) = http_get(http, "/readyz").await {
            not_ready.push((alarm_started.elapsed(), reason));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let pending_during_alarm = db.count("published_at IS NULL").await;
    let clear_started = Instant::now();
    rabbit.set_memory_alarm(false).await;
    eprintln!(
        "memory alarm: raised in {alarm_raised_in:.1?} (rabbitmqctl), cleared in {:.1?}; /readyz 503 in \
         {} of {samples} samples, first at {:.1?} into the alarm: {:?}; rows unpublished at the end of \
         the alarm: {pending_during_alarm}",
        clear_started.elapsed(),
        not_ready.len(),
        not_ready.first().map(|(at, _)| *at).unwrap_or_default(),
        not_ready.first().map(|(_, reason)| reason.trim()),
    );

    settled(&db, WAIT).await;
    assert_nothing_quarantined(&db, "the only fault was the broker's memory alarm").await;
    receive_all(&broker, &id_set(&ids), WAIT).await;
    eventually(WAIT, "every row marked published", || async {
        db.count("published_at IS NOT NULL").await == 500
    })
    .await;
    // The alarm's attempts were given back: each row shows the one attempt
    // that delivered it.
    let charged = db.count("attempt_count <> 1").await;
    assert_eq!(
        charged, 0,
        "{charged} rows show more than their delivering attempt: the broker's alarm was charged to them"
    );
    assert!(
        pending_during_alarm > 0,
        "the rows were published during the alarm: the alarm did not block the relay"
    );
    let named = not_ready.iter().any(|(_, reason)| {
        let reason = reason.to_lowercase();
        ["alarm", "blocked", "memory"]
            .iter()
            .any(|word| reason.contains(word))
    });
    assert!(
        named,
        "/readyz never answered 503 naming the broker's alarm during it (503s: {:?})",
        not_ready.first()
    );
    assert!(
        relay.child.try_wait().expect("relay status").is_none(),
        "the relay exited"
    );
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_above_the_broker_max_message_size_is_quarantined_alone() {
    let rabbit = PrivateRabbit::start("max_message_size = 1048576").await;

    // Told the broker's limit, the relay quarantines the row on its first
    // attempt without sending it.
    let (big, small, db, broker) = oversized_among_small(&rabbit, Some("1048576")).await;
    let big_row = db
        .client
        .query_one(
            "SELECT attempt_count::bigint, coalesce(last_error, ''), quarantined_at IS NOT NULL
             FROM outbox_event WHERE id = $1",
            &[&big],
        )
        .await
        .expect("read the large row");
    let (attempts, error, is_quarantined): (i64, String, bool) =
        (big_row.get(0), big_row.get(1), big_row.get(2));
    assert!(is_quarantined, "the large row is quarantined: {error}");
    assert_eq!(attempts, 1, "quarantined on its first attempt: {error}");
    assert_eq!(
        db.count("attempt_count > 1").await,
        0,
        "no row was charged a second attempt for the large one"
    );
    let received = receive_all(&broker, &id_set(&small), WAIT).await;
    assert!(!received.contains(&big.to_string()), "the large row was sent");
    broker.cleanup().await;
    drop(db);

    // Left at its default (16 MiB, above this broker's 1 MiB), the relay
    // sends the row; the broker closes the channel. The row is found among
    // its batch-mates and quarantined with the broker's reason.
    let (big, small, db, broker) = oversized_among_small(&rabbit, None).await;
    let big_row = db
        .client
        .query_one(
            "SELECT attempt_count::bigint, coalesce(last_error, '') FROM outbox_event WHERE id = $1",
            &[&big],
        )
        .await
        .expect("read the large row");
    let (attempts, error): (i64, String) = (big_row.get(0), big_row.get(1));
    assert!(
        attempts < MAX_ATTEMPTS,
        "the large row was quarantined for running out of attempts ({attempts}), not for what the \
         broker said about it: {error}"
    );
    let lowered = error.to_lowercase();
    assert!(
        ["precondition_failed", "max size", "message size", "too large"]
            .iter()
            .any(|word| lowered.contains(word)),
        "the large row's last_error gives the broker's reason: {error}"
    );
    receive_all(&broker, &id_set(&small), WAIT).await;
    broker.cleanup().await;
}

/// `OUTBOX_MAX_ATTEMPTS` of the oversized-row cases: a row quarantined for
/// what it is gets there well before its attempts run out.
const MAX_ATTEMPTS: i64 = 10;

/// One row of 2 MiB among 100 of a few bytes, all in one batch, published
/// through `rabbit` with `OUTBOX_AMQP_MAX_MESSAGE_BYTES` (the default when
/// `None`); returns once every row is settled, after checking that only
/// the large one is quarantined.
async fn oversized_among_small(
    rabbit: &PrivateRabbit,
    max_message_bytes: Option<&str>,
) -> (Uuid, Vec<Uuid>, TestDb, TestBroker) {
    let db = TestDb::migrated().await;
    let broker = rabbit.broker("#").await;
    let mut small = db.insert_events(50, "small.event").await;
    let big = insert_large(&db, 1, 2 * 1024 * 1024).await[0];
    small.extend(db.insert_events(50, "small.event").await);
    let mut env = with(
        broker.env(),
        &[
            ("OUTBOX_MAX_ATTEMPTS", &MAX_ATTEMPTS.to_string()),
            ("OUTBOX_PUBLISH_TIMEOUT", "5s"),
        ],
    );
    env.extend(quick_settings());
    if let Some(bytes) = max_message_bytes {
        env.push(("OUTBOX_AMQP_MAX_MESSAGE_BYTES", bytes.to_owned()));
    }
    let mut relay = RelayProcess::start(&db, &env);
    settled(&db, WAIT).await;
    let wrongly: Vec<(Uuid, i64, String)> = quarantined(&db)
        .await
        .into_iter()
        .filter(|(id, _, _)| *id != big)
        .collect();
    assert!(
        wrongly.is_empty(),
        "{} small rows quarantined with the large one (max message bytes {max_message_bytes:?}); \
         first (id, attempts, last_error): {:?}",
        wrongly.len(),
        wrongly.first()
    );
    assert_eq!(
        db.count("quarantined_at IS NOT NULL").await,
        1,
        "the large row is quarantined"
    );
    assert!(
        relay.child.try_wait().expect("relay status").is_none(),
        "the relay exited"
    );
    (big, small, db, broker)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_stopped_past_its_lease_loses_nothing() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let ids = db.insert_events(20_000, "frozen.event").await;
    let env = with(
        broker.env(),
        &[
            ("OUTBOX_POLL_INTERVAL", "50ms"),
            ("OUTBOX_BACKOFF_BASE", "100ms"),
            ("OUTBOX_BACKOFF_MAX", "1s"),
            // The lease is 2 × 1 s + 5 s = 7 s, shorter than the freeze.
            ("OUTBOX_PUBLISH_TIMEOUT", "1s"),
        ],
    );
    let mut frozen = RelayProcess::start(&db, &env);
    eventually(WAIT, "the first relay publishing", || async {
        db.count("published_at IS NOT NULL").await > 0
    })
    .await;
    frozen.signal("STOP");
    // Every leased row is the frozen relay's: the other is not started yet.
    let leased = db
        .ids_where("published_at IS NULL AND attempt_count > 0 AND leased_until > now()")
        .await;
    let mut other = RelayProcess::start(&db, &env);
    // A fault that must last: the freeze outlives the lease.
    tokio::time::sleep(Duration::from_secs(10)).await;
    frozen.signal("CONT");

    let received = receive_all(&broker, &id_set(&ids), WAIT).await;
    settled(&db, WAIT).await;
    assert_nothing_quarantined(&db, "a relay was only frozen").await;
    eventually(WAIT, "every row marked published", || async {
        db.count("published_at IS NOT NULL").await == 20_000
    })
    .await;
    // Nothing is marked published that the queue did not get: every id is
    // in `received`, which holds only ids of the table.
    let distinct: HashSet<&String> = received.iter().collect();
    eprintln!(
        "frozen relay: {} rows leased when it stopped, {} messages for {} rows ({} duplicates)",
        leased.len(),
        received.len(),
        distinct.len(),
        received.len() - distinct.len()
    );
    assert!(
        !leased.is_empty(),
        "the frozen relay held no lease when it stopped: the test proved nothing"
    );
    assert!(
        frozen.child.try_wait().expect("relay status").is_none(),
        "the frozen relay exited"
    );
    assert!(
        other.child.try_wait().expect("relay status").is_none(),
        "the other relay exited"
    );
    broker.cleanup().await;
}

/// What happens to the private PostgreSQL mid-drain.
#[derive(Debug, Clone, Copy)]
enum DatabaseFault {
    /// An operator's fast restart: sessions are disconnected, committed
    /// transactions checkpointed.
    Restart,
    /// A crash (an immediate stop: no checkpoint, the WAL replayed at
    /// start). The relay's commits do not wait for the WAL flush
    /// (OUTBOX_SYNCHRONOUS_COMMIT=off, the default), so the crash may undo
    /// its latest leases and marks; those rows must be published again.
    Crash,
}

/// Drains 20,000 rows through `fault`: every row is delivered and marked
/// published, none quarantined, and the relay waits the fault out
/// without restarting.
async fn a_relay_drains_through(fault: DatabaseFault) {
    let postgres = PrivatePostgres::start().await;
    let mut db: TestDb = postgres.migrated_database().await;
    let broker = TestBroker::create("#").await;
    let ids = db.insert_events(20_000, "fault.event").await;
    let mut env = broker.env();
    env.extend(quick_settings());
    let mut relay = RelayProcess::start(&db, &env);
    let pid = relay.child.id();
    eventually(WAIT, "the relay publishing", || async {
        db.count("published_at IS NOT NULL").await >= 2_000
    })
    .await;
    let before = db.count("published_at IS NOT NULL").await;
    let fault_started = Instant::now();
    match fault {
        DatabaseFault::Restart => postgres.restart_fast().await,
        DatabaseFault::Crash => {
            postgres.pg_ctl(&["restart", "--mode=immediate"]).await;
        }
    }
    let took = fault_started.elapsed();
    db.reconnect().await;
    let after = db.count("published_at IS NOT NULL").await;
    eprintln!(
        "database {fault:?}: {before} of 20000 rows marked published before, {after} right after; pg_ctl took {took:.1?}"
    );
    assert!(
        after < 20_000,
        "the relay had finished before the {fault:?}: the test proved nothing"
    );

    receive_all(&broker, &id_set(&ids), WAIT).await;
    settled(&db, WAIT).await;
    assert_nothing_quarantined(&db, &format!("the only fault was a database {fault:?}")).await;
    assert_eq!(
        db.count("published_at IS NULL").await,
        0,
        "every row marked published"
    );
    assert!(
        relay.child.try_wait().expect("relay status").is_none(),
        "the relay exited instead of waiting the {fault:?} out"
    );
    assert_eq!(relay.child.id(), pid);
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_restart_mid_drain_is_survived_without_restarting_the_relay() {
    a_relay_drains_through(DatabaseFault::Restart).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_crash_mid_drain_undoes_only_the_latest_commits_and_loses_no_row() {
    a_relay_drains_through(DatabaseFault::Crash).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_with_nulls_or_unexpected_types_are_quarantined_and_the_rest_flow() {
    let db = TestDb::migrated_over_older_table().await;

    let ids: Vec<Uuid> = (0..200).map(|_| Uuid::new_v4()).collect();
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT id, 'odd.event', CASE WHEN n % 20 = 0 THEN NULL ELSE 'agg-' || n END,
                    jsonb_build_object('n', n), localtimestamp + n * interval '1 millisecond'
             FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n)",
            &[&ids],
        )
        .await
        .expect("insert rows");
    let nulls = db.ids_where("aggregate_id IS NULL").await;
    let good: Vec<Uuid> = ids.iter().filter(|id| !nulls.contains(id)).copied().collect();
    assert_eq!(nulls.len(), 10);

    let broker = TestBroker::create("#").await;
    let http = free_port();
    let env = with(
        broker.env(),
        &[
            ("OUTBOX_POLL_INTERVAL", "50ms"),
            ("OUTBOX_BACKOFF_BASE", "100ms"),
            ("OUTBOX_BACKOFF_MAX", "500ms"),
            ("OUTBOX_MAX_ATTEMPTS", "3"),
            ("OUTBOX_HTTP_ADDR", &format!("127.0.0.1:{http}")),
        ],
    );
    let mut relay = RelayProcess::start(&db, &env);
    let started = Instant::now();
    // The relay must neither exit nor stall on the rows it cannot read.
    loop {
        if let Some(status) = relay.child.try_wait().expect("relay status") {
            panic!("the relay exited: {status}");
        }
        if db.count("published_at IS NULL AND quarantined_at IS NULL").await == 0 {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "rows still waiting after {WAIT:?}: {} unpublished, {} quarantined",
            db.count("published_at IS NULL AND quarantined_at IS NULL").await,
            db.count("quarantined_at IS NOT NULL").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("odd rows settled in {:.1?}", started.elapsed());
    let quarantined = quarantined(&db).await;
    let quarantined_ids: HashSet<Uuid> = quarantined.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(
        quarantined_ids, nulls,
        "exactly the rows without an aggregate_id are quarantined: {quarantined:?}"
    );
    for (id, _, error) in &quarantined {
        assert!(
            error.contains("aggregate_id"),
            "the reason for {id} names the column aggregate_id: {error}"
        );
    }
    receive_all(&broker, &id_set(&good), WAIT).await;
    eventually(WAIT, "every readable row marked published", || async {
        db.count("published_at IS NOT NULL").await == i64::try_from(good.len()).unwrap()
    })
    .await;
    assert!(
        matches!(http_get(http, "/healthz").await, Some((200, _))),
        "/healthz answers 200"
    );
    assert!(
        relay.child.try_wait().expect("relay status").is_none(),
        "the relay exited"
    );
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_four_rows_of_ten_mebibytes_fit_the_chart_memory_limit() {
    const MIB: usize = 1024 * 1024;
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let mut ids = db.insert_events(500, "small.event").await;
    ids.extend(insert_large(&db, 24, 10 * MIB).await);
    ids.extend(db.insert_events(500, "small.event").await);
    let env = with(broker.env(), &[("OUTBOX_AMQP_MAX_MESSAGE_BYTES", "16777216")]);
    let relay = RelayProcess::start(&db, &env);
    let started = Instant::now();
    receive_all(&broker, &id_set(&ids), WAIT).await;
    settled(&db, WAIT).await;
    let drained_in = started.elapsed();
    assert_nothing_quarantined(&db, "every row fits the broker").await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", relay.child.id()))
        .expect("read the relay's /proc status");
    let peak_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    let peak_mib = peak_kib as f64 / 1024.0;
    eprintln!(
        "large payloads: 24 × 10 MiB among 1000 small rows drained in {drained_in:.1?}; relay peak RSS \
         (VmHWM) {peak_mib:.1} MiB"
    );
    // The sizing rule: workers × OUTBOX_MAX_BATCH_BYTES × 4, 256 MiB with
    // the defaults (the chart's limit adds a margin on top).
    assert!(
        peak_mib < 256.0,
        "the relay's peak RSS was {peak_mib:.1} MiB, above the sizing rule's 256 MiB"
    );
    broker.cleanup().await;
}
