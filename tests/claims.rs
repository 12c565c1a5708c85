//! The claim and the recording statements against the real PostgreSQL,
//! through the store's API: what one claim may take (rows, bytes, payloads
//! the sink could never publish, rows with NULLs), and that every outcome
//! applies only to the claim it belongs to.

mod common;

use std::time::Duration;

use common::rows::Rows;
use common::TestDb;
use outbox_relay::store::{ClaimBudget, DatabaseConfig, DatabaseSettings, OnPublish, Ordering, Store};
use uuid::Uuid;

/// The test database as the relay's settings describe it.
fn database(db: &TestDb) -> DatabaseConfig {
    DatabaseSettings {
        database_url: db.url.clone(),
        table: "outbox_event".into(),
        database_pooler: "none".to_owned(),
    }
    .validate()
    .expect("valid settings")
}

fn store(db: &TestDb) -> Store {
    Store::new(&database(db), 2)
}

const GENEROUS: ClaimBudget = ClaimBudget {
    rows: 100,
    bytes: 16 * 1024 * 1024,
    max_payload: 16 * 1024 * 1024,
};

/// A lease long enough that nothing comes due again during a test.
const LEASE: Duration = Duration::from_secs(600);

/// Inserts rows whose payloads are `sizes` bytes of JSON text each, in
/// this order (`created_at` one millisecond apart).
async fn insert_sized(db: &TestDb, sizes: &[usize]) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for (n, size) in sizes.iter().enumerate() {
        let id = Uuid::new_v4();
        // `{"x": "…"}` is 9 bytes around the string.
        let filler = "y".repeat(size - 9);
        db.client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
                 VALUES ($1, 'sized', 'a', jsonb_build_object('x', $2::text), now() + $3 * interval '1 millisecond')",
                &[&id, &filler, &(n as f64)],
            )
            .await
            .unwrap();
        ids.push(id);
    }
    let lengths: Vec<i32> = db
        .column(
            "SELECT octet_length(payload::text) FROM outbox_event ORDER BY created_at",
            &[],
        )
        .await;
    assert_eq!(
        lengths,
        sizes.iter().map(|s| *s as i32).collect::<Vec<_>>(),
        "payload sizes as intended"
    );
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_stops_at_the_byte_budget_but_always_takes_one_row() {
    let db = TestDb::migrated().await;
    let ids = insert_sized(&db, &[400, 400, 400, 1000, 100]).await;
    let store = store(&db);
    let budget = ClaimBudget {
        bytes: 1000,
        ..GENEROUS
    };

    let first = store.claim(budget, LEASE, Ordering::None).await.unwrap();
    let taken: Vec<Uuid> = first.events.iter().map(|e| e.id).collect();
    assert_eq!(
        taken,
        ids[..2],
        "400 + 400 fit in 1000 bytes, a third row would not"
    );
    assert!(first.cut_by_bytes, "the claim says it left rows out");

    let second = store.claim(budget, LEASE, Ordering::None).await.unwrap();
    let taken: Vec<Uuid> = second.events.iter().map(|e| e.id).collect();
    assert_eq!(
        taken,
        ids[2..3],
        "the next claim starts where the last one stopped"
    );

    let third = store.claim(budget, LEASE, Ordering::None).await.unwrap();
    let taken: Vec<Uuid> = third.events.iter().map(|e| e.id).collect();
    assert_eq!(taken, ids[3..4], "a row as large as the budget is taken alone");
    assert!(third.cut_by_bytes, "the last row did not fit beside it");

    let ordered = store.claim(budget, LEASE, Ordering::Aggregate).await;
    // Under per-aggregate ordering the last row waits for its predecessors,
    // which are leased, not published: nothing to claim.
    let ordered = ordered.unwrap();
    assert!(ordered.events.is_empty());
    assert!(!ordered.cut_by_bytes);
    assert_eq!(
        db.count("attempt_count = 1").await,
        4,
        "only claimed rows were counted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payload_the_sink_cannot_publish_is_not_loaded_and_comes_back_unpublishable() {
    let db = TestDb::migrated().await;
    let ids = insert_sized(&db, &[200, 5000, 200]).await;
    let store = store(&db);
    let budget = ClaimBudget {
        max_payload: 1000,
        ..GENEROUS
    };
    let claimed = store.claim(budget, LEASE, Ordering::None).await.unwrap();
    let published: Vec<Uuid> = claimed.events.iter().map(|e| e.id).collect();
    assert_eq!(published, vec![ids[0], ids[2]]);
    assert_eq!(claimed.unpublishable.len(), 1);
    let oversized = &claimed.unpublishable[0];
    assert_eq!(oversized.id, ids[1]);
    assert_eq!(oversized.attempt_count, 1);
    assert!(
        oversized.reason.contains("5000 bytes") && oversized.reason.contains("1000 bytes"),
        "{}",
        oversized.reason
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_with_nulls_or_older_column_types_are_read_or_named() {
    let db = TestDb::migrated_over_older_table().await;
    let (good, orphan) = (Uuid::new_v4(), Uuid::new_v4());
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
             VALUES ($1, 'ok', 'agg', '{}'), ($2, 'ok', NULL, '{}')",
            &[&good, &orphan],
        )
        .await
        .unwrap();
    let claimed = store(&db).claim(GENEROUS, LEASE, Ordering::None).await.unwrap();
    assert_eq!(claimed.events.len(), 1);
    assert_eq!(
        claimed.events[0].id, good,
        "TIMESTAMP and BIGINT columns are read as they are"
    );
    assert_eq!(claimed.unpublishable.len(), 1);
    assert_eq!(claimed.unpublishable[0].id, orphan);
    assert_eq!(claimed.unpublishable[0].reason, "column aggregate_id is NULL");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outcome_applies_only_to_the_claim_it_belongs_to() {
    let db = TestDb::migrated().await;
    Rows::pending(4).insert(&db).await;
    let store = store(&db);
    // A lease that runs out at once: the rows are claimed again at once, as
    // after a relay that stalled past its lease.
    let first = store
        .claim(GENEROUS, Duration::ZERO, Ordering::None)
        .await
        .unwrap();
    let second = store.claim(GENEROUS, LEASE, Ordering::None).await.unwrap();
    assert_eq!(first.events.len(), 4);
    assert_eq!(second.events.len(), 4);
    let stale: Vec<i32> = first.events.iter().map(|e| e.attempt_count).collect();
    let current: Vec<i32> = second.events.iter().map(|e| e.attempt_count).collect();
    let first_ids: Vec<Uuid> = first.events.iter().map(|e| e.id).collect();
    let second_ids: Vec<Uuid> = second.events.iter().map(|e| e.id).collect();

    // The stalled claim's late outcomes touch nothing.
    assert_eq!(
        store.mark_published(&first_ids[..1], &stale[..1]).await.unwrap(),
        0
    );
    let error = ["late"];
    assert_eq!(
        store
            .quarantine(&first_ids[1..2], &stale[1..2], &error)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .reschedule(&first_ids[2..3], &stale[2..3], &error, &[Duration::from_secs(60)])
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.defer(&first_ids[3..], &stale[3..]).await.unwrap(), 0);
    assert_eq!(
        db.count("published_at IS NULL AND quarantined_at IS NULL AND attempt_count = 2")
            .await,
        4
    );

    // The current claim's do.
    assert_eq!(
        store
            .mark_published(&second_ids[..1], &current[..1])
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        db.count(&format!("id = '{}' AND published_at IS NOT NULL", second_ids[0]))
            .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deferred_row_gets_its_attempt_back_once() {
    let db = TestDb::migrated().await;
    Rows::pending(3).insert(&db).await;
    let store = store(&db);
    let claimed = store.claim(GENEROUS, LEASE, Ordering::None).await.unwrap();
    let ids: Vec<Uuid> = claimed.events.iter().map(|e| e.id).collect();
    let attempts: Vec<i32> = claimed.events.iter().map(|e| e.attempt_count).collect();
    assert_eq!(attempts, vec![1, 1, 1]);

    assert_eq!(store.defer(&ids, &attempts).await.unwrap(), 3);
    // A recording statement retried after an error the server did commit.
    assert_eq!(
        store.defer(&ids, &attempts).await.unwrap(),
        0,
        "never given back twice"
    );
    assert_eq!(
        db.count("attempt_count = 0 AND next_attempt_at <= now() AND last_error IS NULL")
            .await,
        3,
        "not charged, due again at once"
    );
    let again = store.claim(GENEROUS, LEASE, Ordering::None).await.unwrap();
    assert_eq!(again.events.len(), 3, "claimable again at once");
}

fn pairs(claimed: &outbox_relay::store::Claimed) -> (Vec<Uuid>, Vec<i32>) {
    claimed.events.iter().map(|e| (e.id, e.attempt_count)).unzip()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_records_the_previous_batch_in_the_same_statement() {
    for on_publish in [OnPublish::Mark, OnPublish::Delete] {
        let db = TestDb::migrated().await;
        let recorded = || async {
            match on_publish {
                OnPublish::Mark => db.count("published_at IS NOT NULL").await,
                OnPublish::Delete => 5 - db.count("true").await,
            }
        };
        Rows::pending(5).insert(&db).await;
        let store = store(&db);
        let two = ClaimBudget { rows: 2, ..GENEROUS };
        let first = store.claim(two, LEASE, Ordering::None).await.unwrap();
        let (ids, attempts) = pairs(&first);

        let second = store
            .record_and_claim(on_publish, &ids, &attempts, two, LEASE)
            .await
            .unwrap();
        assert_eq!(second.events.len(), 2, "{on_publish:?}: the next batch");
        assert!(second.events.iter().all(|e| !ids.contains(&e.id)));
        assert_eq!(recorded().await, 2, "{on_publish:?}: the first batch recorded");

        // Nothing left to claim: the confirmed rows are recorded all the same.
        let (ids, attempts) = pairs(&second);
        let last = store.claim(GENEROUS, LEASE, Ordering::None).await.unwrap();
        let (last_ids, last_attempts) = pairs(&last);
        assert_eq!(last_ids.len(), 1);
        let ids = [ids, last_ids].concat();
        let attempts = [attempts, last_attempts].concat();
        let empty = store
            .record_and_claim(on_publish, &ids, &attempts, GENEROUS, LEASE)
            .await
            .unwrap();
        assert!(empty.events.is_empty() && empty.unpublishable.is_empty());
        assert_eq!(recorded().await, 5, "{on_publish:?}: every batch recorded");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_confirmed_row_whose_lease_ran_out_is_recorded_not_claimed_again() {
    let db = TestDb::migrated().await;
    Rows::pending(3).insert(&db).await;
    let store = store(&db);
    // Leases that run out at once: these rows are due again by the time
    // their confirmations are recorded.
    let first = store
        .claim(GENEROUS, Duration::ZERO, Ordering::None)
        .await
        .unwrap();
    let (ids, attempts) = pairs(&first);
    let next = store
        .record_and_claim(OnPublish::Mark, &ids[..2], &attempts[..2], GENEROUS, LEASE)
        .await
        .unwrap();
    assert_eq!(
        next.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![ids[2]],
        "only the unconfirmed row is claimed again"
    );
    assert_eq!(
        db.count("published_at IS NOT NULL AND attempt_count = 1").await,
        2
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_confirmation_recorded_with_a_claim_leaves_a_row_claimed_since() {
    let db = TestDb::migrated().await;
    Rows::pending(2).insert(&db).await;
    let store = store(&db);
    let stalled = store
        .claim(GENEROUS, Duration::ZERO, Ordering::None)
        .await
        .unwrap();
    // Another replica takes the rows after the stalled lease ran out.
    let current = store.claim(GENEROUS, LEASE, Ordering::None).await.unwrap();
    assert_eq!(current.events.len(), 2);
    let (ids, stale) = pairs(&stalled);
    let next = store
        .record_and_claim(OnPublish::Delete, &ids, &stale, GENEROUS, LEASE)
        .await
        .unwrap();
    assert!(next.events.is_empty(), "the rows are leased by the current claim");
    assert_eq!(
        db.count("published_at IS NULL AND attempt_count = 2").await,
        2,
        "left to the claim that holds them"
    );
}

/// A claim that waited for a pooled connection still gets the whole client
/// bound for its statement, which the server's own `statement_timeout`
/// undercuts: so whatever the claim's caller was told is what the
/// database did. Before, the wait for a connection counted against the
/// client's bound: the client gave up on a claim that the server then
/// committed, leaving rows leased with an attempt counted and nobody
/// publishing them.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_the_caller_was_told_failed_did_not_lease_rows() {
    let db = TestDb::migrated().await;
    let database = database(&db);
    let store = std::sync::Arc::new(Store::new(&database, 1));
    // A first claim looks the optional columns up and prepares its
    // statement on the pool's connection, as a running relay has: the
    // claim below then waits in its execution, not in its parsing.
    store
        .claim(GENEROUS, LEASE, Ordering::None)
        .await
        .expect("a first, empty claim");
    Rows::pending(5).insert(&db).await;

    // The pool's one connection is busy for 8 s...
    let busy = store.client().await.expect("the pool's connection");
    let released = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(8)).await;
        drop(busy);
    });
    // ...and the table locked for 31 s: past the 30 s the client once
    // allowed in all, before the server's 25 s on the statement itself.
    let locker = db.connect().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE outbox_event IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock the table");
    let unlock = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(31)).await;
        locker.batch_execute("ROLLBACK").await.expect("unlock");
    });

    let claimed = store.claim(GENEROUS, LEASE, Ordering::None).await;
    unlock.await.expect("unlocked");
    released.await.expect("released");
    // Whatever the claim statement did commits or rolls back once it is
    // no longer running.
    common::eventually(Duration::from_secs(60), "the claim statement has ended", || async {
        db.client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'outbox-relay' AND state = 'active'",
                &[],
            )
            .await
            .expect("read activity")
            .get::<_, i64>(0)
            == 0
    })
    .await;
    let leased = db.count("attempt_count > 0").await;
    match claimed {
        Ok(batch) => assert_eq!(
            leased,
            batch.events.len() as i64,
            "the rows leased are the ones the claim returned"
        ),
        Err(e) => assert_eq!(leased, 0, "a claim reported as failed ({e}) leased {leased} rows"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_held_up_by_a_row_lock_gives_way_and_changes_nothing() {
    let db = TestDb::migrated().await;
    Rows::pending(4).insert(&db).await;
    let store = store(&db);
    let two = ClaimBudget { rows: 2, ..GENEROUS };
    let first = store.claim(two, LEASE, Ordering::None).await.unwrap();
    let (ids, attempts) = pairs(&first);

    // Another session holds one of the confirmed rows, as a second
    // worker's claim that follows an updated row version does.
    let (mut other, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("a second session");
    tokio::spawn(connection);
    let holder = other.transaction().await.unwrap();
    holder
        .execute("SELECT 1 FROM outbox_event WHERE id = $1 FOR UPDATE", &[&ids[0]])
        .await
        .unwrap();

    let held_up = store
        .record_and_claim(OnPublish::Mark, &ids, &attempts, two, LEASE)
        .await
        .expect_err("the claim cannot record a row another session holds");
    assert!(held_up.is_contention(), "a lock wait, not an outage: {held_up}");
    assert_eq!(db.count("published_at IS NOT NULL").await, 0, "nothing recorded");
    assert_eq!(db.count("attempt_count > 0").await, 2, "nothing more leased");

    holder.rollback().await.unwrap();
    let next = store
        .record_and_claim(OnPublish::Mark, &ids, &attempts, two, LEASE)
        .await
        .expect("the same claim once the row is free");
    assert_eq!(next.events.len(), 2);
    assert_eq!(db.count("published_at IS NOT NULL").await, 2);
}

/// The relay's store commits its own transactions at the level it was
/// given (OUTBOX_SYNCHRONOUS_COMMIT, `off` by default); a store for an
/// operator's command keeps the server's, so that a `replay` is durable
/// once it returns. The claim and its records still take effect.
#[tokio::test(flavor = "multi_thread")]
async fn the_relays_transactions_commit_at_its_level_and_an_operators_at_the_servers() {
    let db = TestDb::migrated().await;
    let database = database(&db);
    // The database's own level, whatever the server's is: new sessions
    // start from it.
    db.client
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET synchronous_commit = local",
            db.name
        ))
        .await
        .expect("set the database's level");

    let show = |store: Store| async move {
        let client = store.client().await.expect("a pooled connection");
        let level: String = client
            .query_one("SHOW synchronous_commit", &[])
            .await
            .expect("SHOW")
            .get(0);
        level
    };
    assert_eq!(show(Store::for_relay(&database, 1, "off")).await, "off");
    assert_eq!(
        show(Store::for_relay(&database, 1, "remote_apply")).await,
        "remote_apply"
    );
    assert_eq!(show(Store::new(&database, 1)).await, "local");

    Rows::pending(3).insert(&db).await;
    let relay = Store::for_relay(&database, 1, "off");
    let claimed = relay.claim(GENEROUS, LEASE, Ordering::None).await.expect("claim");
    assert_eq!(claimed.events.len(), 3);
    let (ids, attempts) = pairs(&claimed);
    let next = relay
        .record_and_claim(OnPublish::Mark, &ids, &attempts, GENEROUS, LEASE)
        .await
        .expect("record and claim");
    assert!(next.events.is_empty());
    assert_eq!(db.count("published_at IS NOT NULL").await, 3);
}
