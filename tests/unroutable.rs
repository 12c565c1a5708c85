//! Unroutable messages on the real broker, interleaved with routable ones,
//! under the default concurrency (several workers, two replicas).
//!
//! RabbitMQ returns a mandatory message that no queue takes (`basic.return`)
//! and then acks it. The relay must tell which row came back: a routable
//! row marked unroutable is charged an attempt it did not earn, and an
//! unroutable row marked published is an event lost without a trace.
//! Each case below drains thousands of rows, so a race that misattributes
//! even one return in a hundred shows up in every CI run.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{eventually, quick_settings, with, RelayProcess, TestBroker, TestDb};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(120);
const ROWS: usize = 3_000;

/// Inserts `ROWS` rows in `(created_at, id)` order, every `every`-th of an
/// event type no queue is bound to; returns (routable, unroutable) ids.
async fn insert_interleaved(db: &TestDb, every: usize) -> (HashSet<Uuid>, HashSet<Uuid>) {
    let ids: Vec<Uuid> = (0..ROWS).map(|_| Uuid::new_v4()).collect();
    let unroutable: Vec<bool> = (1..=ROWS).map(|n| n % every == 0).collect();
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT id, CASE WHEN bad THEN 'bad.event' ELSE 'good.event' END,
                    'agg-' || (ord % 50), jsonb_build_object('n', ord),
                    now() + ord * interval '1 microsecond'
             FROM unnest($1::uuid[], $2::bool[]) WITH ORDINALITY AS u(id, bad, ord)",
            &[&ids, &unroutable],
        )
        .await
        .expect("insert interleaved rows");
    let (bad, good): (Vec<_>, Vec<_>) = ids.into_iter().zip(unroutable).partition(|(_, bad)| *bad);
    (
        good.into_iter().map(|(id, _)| id).collect(),
        bad.into_iter().map(|(id, _)| id).collect(),
    )
}

async fn drain_interleaved(every: usize, max_attempts: &str) {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("good.#").await;
    let (good, bad) = insert_interleaved(&db, every).await;
    // Default batch size and workers: the contract holds under concurrency.
    let mut env = with(broker.env(), &[("OUTBOX_MAX_ATTEMPTS", max_attempts)]);
    env.extend(quick_settings());
    let _first = RelayProcess::start(&db, &env);
    let _second = RelayProcess::start(&db, &env);

    eventually(WAIT, "every row published or quarantined", || async {
        db.count("published_at IS NULL AND quarantined_at IS NULL").await == 0
    })
    .await;

    let published = db.ids_where("published_at IS NOT NULL").await;
    let quarantined = db.ids_where("quarantined_at IS NOT NULL").await;
    let marked_unroutable: Vec<&Uuid> = bad.intersection(&published).collect();
    assert!(
        marked_unroutable.is_empty(),
        "{} of {} unroutable rows marked published though delivered nowhere (1 in {every}, max attempts {max_attempts})",
        marked_unroutable.len(),
        bad.len()
    );
    assert_eq!(quarantined, bad, "exactly the unroutable rows are quarantined");
    assert_eq!(
        db.count("quarantined_at IS NOT NULL AND last_error NOT LIKE '%NO_ROUTE%'")
            .await,
        0,
        "quarantined for being unroutable, and saying so"
    );
    assert_eq!(published, good, "every routable row is marked published");
    assert_eq!(
        db.count("event_type = 'good.event' AND (attempt_count <> 1 OR last_error IS NOT NULL)")
            .await,
        0,
        "no routable row is charged a failed attempt"
    );

    let received = broker.receive(good.len(), WAIT).await;
    let delivered: HashSet<Uuid> = received
        .iter()
        .map(|m| Uuid::parse_str(&m.message_id).expect("message_id is a row id"))
        .collect();
    assert_eq!(
        delivered, good,
        "every routable row is delivered, and nothing else"
    );
    assert_eq!(received.len(), good.len(), "no routable row is delivered twice");
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_percent_unroutable_with_one_attempt() {
    drain_interleaved(100, "1").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_percent_unroutable_with_three_attempts() {
    drain_interleaved(100, "3").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_percent_unroutable_with_one_attempt() {
    drain_interleaved(10, "1").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_percent_unroutable_with_three_attempts() {
    drain_interleaved(10, "3").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn half_unroutable_with_one_attempt() {
    drain_interleaved(2, "1").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn half_unroutable_with_three_attempts() {
    drain_interleaved(2, "3").await;
}
