//! The table changing under a running relay: an optional column dropped
//! (a producer's rollback) or added is picked up without a restart, and a
//! claim that keeps failing for a database reason makes `/readyz` answer
//! 503 with that reason, although the database answers `SELECT 1`.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::system::free_port;
use common::{eventually, quick_settings, RelayProcess, TestBroker, TestDb};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(120);

async fn readyz(port: u16) -> Option<(u16, String)> {
    let response = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.unwrap_or_default()))
}

/// Waits until every id of `ids` arrived at `broker`.
async fn arrive(broker: &TestBroker, ids: &[Uuid], arrived: &mut HashSet<String>) {
    let expected: HashSet<String> = ids.iter().map(Uuid::to_string).collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !expected.is_subset(arrived) && tokio::time::Instant::now() < deadline {
        arrived.extend(broker.receive_ids(expected.len(), Duration::from_secs(2)).await);
    }
    let missing = expected.difference(arrived).count();
    assert_eq!(missing, 0, "{missing} of {} rows never arrived", ids.len());
}

fn relay_env(broker: &TestBroker, http: u16) -> Vec<(&'static str, String)> {
    let mut env = quick_settings();
    env.extend(broker.env());
    env.push(("OUTBOX_HTTP_ADDR", format!("127.0.0.1:{http}")));
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn publishing_goes_on_when_the_headers_column_is_dropped_and_added_again() {
    let db = TestDb::migrated().await;
    db.client
        .batch_execute("ALTER TABLE outbox_event ADD COLUMN headers JSONB")
        .await
        .expect("add the headers column");
    let broker = TestBroker::create("#").await;
    let http = free_port();
    let _relay = RelayProcess::start(&db, &relay_env(&broker, http));
    let mut arrived = HashSet::new();

    let before = db.insert_events(50, "schema.before").await;
    arrive(&broker, &before, &mut arrived).await;

    // The producer rolls back the migration that added the column.
    db.client
        .batch_execute("ALTER TABLE outbox_event DROP COLUMN headers")
        .await
        .expect("drop the headers column");
    let after_drop = db.insert_events(50, "schema.dropped").await;
    arrive(&broker, &after_drop, &mut arrived).await;
    eventually(WAIT, "every row is recorded as published", || async {
        db.count("published_at IS NULL").await == 0
    })
    .await;
    assert_eq!(
        db.count("quarantined_at IS NOT NULL").await,
        0,
        "nothing quarantined"
    );
    assert_eq!(
        db.count("last_error IS NOT NULL").await,
        0,
        "no row charged for it"
    );
    assert!(
        matches!(readyz(http).await, Some((200, _))),
        "ready again once claims go through"
    );

    // And adds it again: its content is carried once the relay looks again
    // (within 30 s).
    db.client
        .batch_execute("ALTER TABLE outbox_event ADD COLUMN headers JSONB")
        .await
        .expect("add the headers column again");
    // A row inserted every second until one arrives with its header.
    let deadline = tokio::time::Instant::now() + WAIT;
    let carried = loop {
        db.client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, headers)
                 VALUES ($1, 'schema.readded', 'a', '{}', '{\"tenant\": \"t1\"}')",
                &[&Uuid::new_v4()],
            )
            .await
            .expect("insert a row with headers");
        let received = broker.receive(1, Duration::from_secs(1)).await;
        if received
            .iter()
            .any(|message| message.headers.get("tenant").map(String::as_str) == Some("t1"))
        {
            break true;
        }
        if tokio::time::Instant::now() >= deadline {
            break false;
        }
    };
    assert!(
        carried,
        "the re-added column's headers are carried without a restart"
    );
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_that_keeps_failing_makes_the_relay_not_ready() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let http = free_port();
    let _relay = RelayProcess::start(&db, &relay_env(&broker, http));
    let mut arrived = HashSet::new();
    let before = db.insert_events(20, "schema.before").await;
    arrive(&broker, &before, &mut arrived).await;
    eventually(WAIT, "/readyz answers 200", || async {
        matches!(readyz(http).await, Some((200, _)))
    })
    .await;

    // The database answers SELECT 1, but every claim fails.
    db.client
        .batch_execute("ALTER TABLE outbox_event RENAME TO outbox_event_away")
        .await
        .expect("rename the table");
    eventually(WAIT, "/readyz answers 503 naming the failing claims", || async {
        matches!(readyz(http).await, Some((503, body)) if body.contains("claims have failed") && body.contains("outbox_event"))
    })
    .await;

    db.client
        .batch_execute("ALTER TABLE outbox_event_away RENAME TO outbox_event")
        .await
        .expect("rename the table back");
    let after = db.insert_events(20, "schema.after").await;
    arrive(&broker, &after, &mut arrived).await;
    eventually(WAIT, "/readyz answers 200 again", || async {
        matches!(readyz(http).await, Some((200, _)))
    })
    .await;
    broker.cleanup().await;
}
