//! The consumer library (`outbox_consumer`) against the real
//! PostgreSQL: a message's effect is applied once, however often it comes,
//! and retention forgets only old marks.

use std::time::Duration;

use outbox_consumer::{self as consumer, Claim, Deduplicator};
use outbox_test_support::{eventually, TestDb};
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);

/// A database of its own with `processed_message` created.
async fn setup() -> TestDb {
    let db = TestDb::create().await;
    consumer::migrate(&db.client).await.expect("consumer migrate");
    db
}

/// Another connection to the test's database (a second consumer replica).
async fn connect(db: &TestDb) -> Client {
    let (client, connection) = tokio_postgres::connect(&db.url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// Claims `id` in a transaction of its own and commits.
async fn claim_committed(client: &mut Client, dedup: &Deduplicator, id: Uuid) -> Claim {
    let tx = client.transaction().await.unwrap();
    let claim = dedup.claim(&tx, id).await.unwrap();
    tx.commit().await.unwrap();
    claim
}

async fn marks(client: &Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM processed_message", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_claim_applies_and_the_second_is_a_duplicate() {
    let mut db = setup().await;
    let dedup = Deduplicator::new("billing");
    let id = Uuid::new_v4();
    assert_eq!(claim_committed(&mut db.client, &dedup, id).await, Claim::First);
    assert_eq!(
        claim_committed(&mut db.client, &dedup, id).await,
        Claim::Duplicate
    );
    assert_eq!(
        claim_committed(&mut db.client, &dedup, Uuid::new_v4()).await,
        Claim::First,
        "another id is new"
    );
    let (name, stored_id, recent): (String, Uuid, bool) = db
        .client
        .query_one(
            "SELECT consumer_name, message_id, processed_at > now() - interval '1 minute'
             FROM processed_message WHERE message_id = $1",
            &[&id],
        )
        .await
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .unwrap();
    assert_eq!((name.as_str(), stored_id, recent), ("billing", id, true));
}

#[tokio::test(flavor = "multi_thread")]
async fn each_consumer_name_deduplicates_on_its_own() {
    let mut db = setup().await;
    let id = Uuid::new_v4();
    let billing = Deduplicator::new("billing");
    let shipping = Deduplicator::new("shipping");
    assert_eq!(claim_committed(&mut db.client, &billing, id).await, Claim::First);
    assert_eq!(claim_committed(&mut db.client, &shipping, id).await, Claim::First);
    assert_eq!(
        claim_committed(&mut db.client, &shipping, id).await,
        Claim::Duplicate
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolled_back_effect_takes_its_mark_with_it() {
    let mut db = setup().await;
    db.client
        .batch_execute("CREATE TABLE effect (message_id UUID NOT NULL)")
        .await
        .unwrap();
    let dedup = Deduplicator::new("billing");
    let id = Uuid::new_v4();

    // The consumer fails after claiming and applying, before committing.
    let tx = db.client.transaction().await.unwrap();
    assert_eq!(dedup.claim(&tx, id).await.unwrap(), Claim::First);
    tx.execute("INSERT INTO effect VALUES ($1)", &[&id])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(marks(&db.client).await, 0, "no mark without the effect");

    // The redelivery is new again and applies the effect once.
    let tx = db.client.transaction().await.unwrap();
    assert_eq!(dedup.claim(&tx, id).await.unwrap(), Claim::First);
    tx.execute("INSERT INTO effect VALUES ($1)", &[&id])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        claim_committed(&mut db.client, &dedup, id).await,
        Claim::Duplicate
    );
    let effects: i64 = db
        .client
        .query_one("SELECT count(*) FROM effect", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(effects, 1);
}

/// Whether some backend of the test's database is waiting for a lock (the
/// second claim, queued behind the first transaction's uncommitted mark).
async fn a_claim_is_waiting(db: &TestDb) -> bool {
    db.client
        .query_one(
            "SELECT count(*) > 0 FROM pg_stat_activity
             WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%processed_message%'",
            &[&db.name],
        )
        .await
        .unwrap()
        .get(0)
}

/// Two deliveries of one id in flight at once: the second claim waits for
/// the first transaction and its answer depends on how that one ended.
async fn racing_claim_after(commit_first: bool) -> Claim {
    let db = setup().await;
    let dedup = Deduplicator::new("billing");
    let id = Uuid::new_v4();
    let mut first = connect(&db).await;
    let first_tx = first.transaction().await.unwrap();
    assert_eq!(dedup.claim(&first_tx, id).await.unwrap(), Claim::First);

    let second = {
        let dedup = dedup.clone();
        let mut client = connect(&db).await;
        tokio::spawn(async move { claim_committed(&mut client, &dedup, id).await })
    };
    eventually(WAIT, "the second claim waits on the first", || {
        a_claim_is_waiting(&db)
    })
    .await;
    assert!(!second.is_finished());
    if commit_first {
        first_tx.commit().await.unwrap();
    } else {
        first_tx.rollback().await.unwrap();
    }
    let claim = second.await.unwrap();
    assert_eq!(marks(&db.client).await, 1, "one mark either way");
    claim
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_racing_a_committed_claim_is_a_duplicate() {
    assert_eq!(racing_claim_after(true).await, Claim::Duplicate);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_racing_a_rolled_back_claim_is_the_first() {
    assert_eq!(racing_claim_after(false).await, Claim::First);
}

#[tokio::test(flavor = "multi_thread")]
async fn of_many_concurrent_claims_of_one_id_exactly_one_is_first() {
    let db = setup().await;
    let dedup = Deduplicator::new("billing");
    for _ in 0..20 {
        let id = Uuid::new_v4();
        let mut racers = Vec::new();
        for _ in 0..4 {
            let dedup = dedup.clone();
            let mut client = connect(&db).await;
            racers.push(tokio::spawn(async move {
                claim_committed(&mut client, &dedup, id).await
            }));
        }
        let mut firsts = 0;
        for racer in racers {
            if racer.await.unwrap().is_first() {
                firsts += 1;
            }
        }
        assert_eq!(firsts, 1, "exactly one delivery applies the effect");
    }
    assert_eq!(marks(&db.client).await, 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_deletes_only_marks_older_than_the_age_in_bounded_batches() {
    let mut db = setup().await;
    let billing = Deduplicator::new("billing");
    let shipping = Deduplicator::new("shipping");
    let mut recent = Vec::new();
    for n in 0..20 {
        let id = Uuid::new_v4();
        assert!(claim_committed(&mut db.client, &billing, id).await.is_first());
        assert!(claim_committed(&mut db.client, &shipping, id).await.is_first());
        if n >= 10 {
            recent.push(id);
        }
    }
    // Half of each consumer's marks are ten days old.
    db.client
        .execute(
            "UPDATE processed_message SET processed_at = now() - interval '10 days'
             WHERE NOT (message_id = ANY($1))",
            &[&recent],
        )
        .await
        .unwrap();
    let week = Duration::from_secs(7 * 24 * 3600);

    // 10 old marks in batches of 3: four statements, the last one short.
    assert_eq!(billing.purge_older_than(&db.client, week, 3).await.unwrap(), 10);
    let left: Vec<(String, bool)> = db
        .client
        .query(
            "SELECT consumer_name, message_id = ANY($1) FROM processed_message",
            &[&recent],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let billing_left = left.iter().filter(|(name, _)| name == "billing").count();
    assert_eq!(billing_left, 10, "the recent billing marks stay");
    assert!(
        left.iter()
            .all(|(name, is_recent)| name == "shipping" || *is_recent),
        "only old billing marks went"
    );
    assert_eq!(
        left.iter().filter(|(name, _)| name == "shipping").count(),
        20,
        "another consumer's marks are its own business"
    );
    assert_eq!(billing.purge_older_than(&db.client, week, 3).await.unwrap(), 0);
    // Purged ids are new again: retention must outlast redeliveries.
    let old: Uuid = db
        .client
        .query_one(
            "SELECT message_id FROM processed_message WHERE consumer_name = 'shipping'
             AND NOT (message_id = ANY($1)) LIMIT 1",
            &[&recent],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(claim_committed(&mut db.client, &billing, old).await, Claim::First);
    assert_eq!(
        claim_committed(&mut db.client, &billing, recent[0]).await,
        Claim::Duplicate
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_reads_only_the_marks_it_deletes() {
    let db = setup().await;
    // A consumer's history, mostly old: the batch must come from the
    // retention index, not from sorting every mark of the consumer.
    db.client
        .batch_execute(
            "INSERT INTO processed_message (consumer_name, message_id, processed_at)
             SELECT c, gen_random_uuid(), now() - n * interval '1 minute'
             FROM generate_series(1, 20000) AS n, unnest(ARRAY['billing', 'shipping']) AS c;
             ANALYZE processed_message;",
        )
        .await
        .unwrap();
    let explain = format!("EXPLAIN {}", include_str!("../src/sql/purge.sql"));
    let statement = db
        .client
        .prepare_typed(
            &explain,
            &[
                tokio_postgres::types::Type::TEXT,
                tokio_postgres::types::Type::INT8,
                tokio_postgres::types::Type::INT8,
            ],
        )
        .await
        .unwrap();
    let plan: Vec<String> = db
        .client
        .query(&statement, &[&"billing", &3_600_000_i64, &1000_i64])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(
        plan.contains("Index Scan using processed_message_processed_at_idx")
            && plan.contains("Index Scan using processed_message_pkey")
            && !plan.contains("Seq Scan")
            && !plan.contains("Sort"),
        "{plan}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_is_idempotent_and_safe_to_run_from_every_replica_at_once() {
    let db = TestDb::create().await;
    let mut runs = Vec::new();
    for _ in 0..4 {
        let client = connect(&db).await;
        runs.push(tokio::spawn(async move { consumer::migrate(&client).await }));
    }
    for run in runs {
        run.await.unwrap().expect("concurrent migrate");
    }
    consumer::migrate(&db.client).await.expect("again");
    let index: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'processed_message'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(index, 2, "primary key and the retention index");
}
