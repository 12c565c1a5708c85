//! A natively partitioned `outbox_event` (`migrate --partitioned`): the
//! table and its partitions, claims across partitions (DEFAULT included),
//! the admin statements, retention dropping only partitions whose every
//! row is published, partitions created ahead (rows waiting in DEFAULT
//! moved into them), and producers inserting while partitions are dropped.

mod common;

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use common::TestDb;
use outbox_relay::store::{ClaimBudget, ClaimStart, DatabaseSettings, Ordering, Store};
use uuid::Uuid;

const RETENTION: Duration = Duration::from_secs(7 * 86_400);

fn store(db: &TestDb) -> Store {
    let database = DatabaseSettings {
        database_url: db.url.clone(),
        table: "outbox_event".into(),
        database_pooler: "none".to_owned(),
    }
    .validate()
    .expect("valid settings");
    Store::new(&database, 4)
}

/// Claims of at most `rows` rows, with room for any payload the tests write.
fn budget(rows: u32) -> ClaimBudget {
    ClaimBudget {
        rows,
        bytes: 1 << 20,
        max_payload: 1 << 20,
    }
}

fn migrate(db: &TestDb, granularity: &str) -> std::process::Output {
    db.relay_command(&["migrate", "--partitioned", granularity], &[])
        .output()
        .expect("run migrate")
}

async fn partitioned_db(granularity: &str) -> TestDb {
    let db = TestDb::create().await;
    let out = migrate(&db, granularity);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    db
}

/// The range partitions of `outbox_event` by name, and whether DEFAULT is there.
async fn partition_names(db: &TestDb) -> (Vec<String>, bool) {
    let names: Vec<String> = db
        .column(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'outbox_event'::regclass ORDER BY 1",
            &[],
        )
        .await;
    let has_default = names.iter().any(|name| name == "outbox_event_default");
    (
        names
            .into_iter()
            .filter(|name| name != "outbox_event_default")
            .collect(),
        has_default,
    )
}

/// A partition for the UTC day `days` from today (negative: the past),
/// made as an operator or an earlier relay would have made it.
async fn day_partition(db: &TestDb, days: i32) -> String {
    let name: String = db
        .client
        .query_one(
            "SELECT 'outbox_event_p' || to_char((now() AT TIME ZONE 'UTC')::date + $1::int, 'YYYYMMDD')",
            &[&days],
        )
        .await
        .unwrap()
        .get(0);
    db.client
        .batch_execute(&format!(
            "CREATE TABLE {name} PARTITION OF outbox_event FOR VALUES
                 FROM ((((now() AT TIME ZONE 'UTC')::date + {days})::timestamp AT TIME ZONE 'UTC'))
                 TO ((((now() AT TIME ZONE 'UTC')::date + {days} + 1)::timestamp AT TIME ZONE 'UTC'))"
        ))
        .await
        .unwrap();
    name
}

/// Inserts `count` rows created at noon UTC `days` from today, published
/// `published_days_ago` days ago (unpublished when `None`).
async fn insert_on_day(db: &TestDb, days: i32, count: i64, published_days_ago: Option<i32>) -> Vec<Uuid> {
    db.column(
        "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at, published_at)
         SELECT gen_random_uuid(), 'day', 'agg-' || (n % 5), jsonb_build_object('n', n),
                (((now() AT TIME ZONE 'UTC')::date + $1::int)::timestamp AT TIME ZONE 'UTC') + interval '12 hours' + n * interval '1 ms',
                now() - $3::int * interval '1 day'
         FROM generate_series(1, $2::bigint) AS n
         RETURNING id",
        &[&days, &count, &published_days_ago],
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_partitioned_creates_the_table_daily_and_hourly() {
    for (granularity, ranges) in [("daily", 4), ("hourly", 13)] {
        let db = partitioned_db(granularity).await;
        let kind: Vec<String> = db
            .column(
                "SELECT relkind::text FROM pg_class WHERE oid = 'outbox_event'::regclass",
                &[],
            )
            .await;
        assert_eq!(kind, ["p"], "{granularity}");
        let (names, has_default) = partition_names(&db).await;
        assert!(has_default, "{granularity}: a DEFAULT partition");
        assert_eq!(
            names.len(),
            ranges,
            "{granularity}: the current partition and those ahead: {names:?}"
        );
        let key: Vec<String> = db
            .column(
                "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'outbox_event'::regclass AND indisprimary",
                &[],
            )
            .await;
        assert!(key[0].contains("(id, created_at)"), "{key:?}");
        let valid: Vec<String> = db
            .column(
                "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                 WHERE i.indrelid = 'outbox_event'::regclass AND i.indisvalid ORDER BY 1",
                &[],
            )
            .await;
        assert_eq!(valid.len(), 7, "every index on the parent, valid: {valid:?}");
        // Room on each page for every row's lease (migrations/0009), on
        // each partition, DEFAULT included: the parent holds no rows.
        let storage: Vec<String> = db
            .column(
                "SELECT DISTINCT array_to_string(c.reloptions, ',') FROM pg_inherits i
                 JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'outbox_event'::regclass",
                &[],
            )
            .await;
        assert_eq!(storage, ["fillfactor=50"], "{granularity}");
        // Idempotent, flag or not; the relay sees the table as partitioned.
        for args in [&["migrate"][..], &["migrate", "--partitioned", granularity][..]] {
            let out = db.relay_command(args, &[]).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        assert_eq!(partition_names(&db).await.0.len(), ranges);
        assert!(store(&db).is_partitioned().await.unwrap());
        // A producer's row of today lands in a range partition.
        db.insert_events(3, "now").await;
        let in_default: Vec<i64> = db.column("SELECT count(*) FROM outbox_event_default", &[]).await;
        assert_eq!(in_default, [0]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_partitioned_refuses_to_convert_a_plain_table() {
    let db = TestDb::migrated().await;
    let out = migrate(&db, "daily");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not partitioned"), "{stderr}");
    assert!(!store(&db).is_partitioned().await.unwrap());
    let out = migrate(&db, "weekly");
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown granularity is a usage error"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_take_every_row_across_partitions_once_and_in_order() {
    for ordering in [Ordering::None, Ordering::Aggregate] {
        let db = partitioned_db("daily").await;
        // Old rows (no partition covers them: DEFAULT), today's, tomorrow's.
        let mut ids = insert_on_day(&db, -3, 7, None).await;
        ids.extend(insert_on_day(&db, 0, 11, None).await);
        ids.extend(insert_on_day(&db, 1, 5, None).await);
        let in_default: Vec<i64> = db.column("SELECT count(*) FROM outbox_event_default", &[]).await;
        assert_eq!(in_default, [7]);
        let store = store(&db);
        let batch = budget(4);
        let mut taken = Vec::new();
        loop {
            let claimed = store
                .claim(batch, Duration::from_secs(600), ordering)
                .await
                .unwrap();
            if claimed.events.is_empty() {
                break;
            }
            let ids: Vec<Uuid> = claimed.events.iter().map(|e| e.id).collect();
            let attempts: Vec<i32> = claimed.events.iter().map(|e| e.attempt_count).collect();
            assert_eq!(
                store.mark_published(&ids, &attempts).await.unwrap(),
                ids.len() as u64
            );
            taken.extend(ids);
        }
        // Inserted in (created_at, id) order per day, days in order.
        match ordering {
            Ordering::None => assert_eq!(taken, ids, "every row once, oldest first"),
            // Heads of several aggregates share a batch: the order holds
            // within each aggregate.
            _ => {
                let mut sorted = taken.clone();
                sorted.sort();
                let mut expected = ids.clone();
                expected.sort();
                assert_eq!(sorted, expected, "every row once");
                for aggregate in 0..5 {
                    let of: Vec<Uuid> = db
                        .column(
                            "SELECT id FROM outbox_event WHERE aggregate_id = 'agg-' || $1::int",
                            &[&aggregate],
                        )
                        .await;
                    let in_taken: Vec<Uuid> = taken.iter().filter(|id| of.contains(id)).copied().collect();
                    let in_ids: Vec<Uuid> = ids.iter().filter(|id| of.contains(id)).copied().collect();
                    assert_eq!(in_taken, in_ids, "aggregate {aggregate} in order");
                }
            }
        }
        assert_eq!(db.count("published_at IS NULL").await, 0);
    }
}

/// How many row addresses (ctid) of the outbox table, across the
/// relations that hold its rows, name two rows.
async fn addresses_of_two_rows(db: &TestDb) -> i64 {
    db.column::<i64>(
        "SELECT count(*) FROM (SELECT ctid FROM outbox_event GROUP BY ctid HAVING count(*) = 2) AS shared",
        &[],
    )
    .await[0]
}

/// A table `outbox_event_inheritor` that inherits from the outbox, and
/// ten rows created in turn: the odd ones (`order-1`, `order-3`, …) in the
/// outbox itself, the even ones in the inheritor.
async fn inheritor_with_rows(db: &TestDb) {
    db.client
        .batch_execute(
            "CREATE TABLE outbox_event_inheritor () INHERITS (outbox_event);
             INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(), 'order.created', 'order-' || n, '{}',
                    now() - interval '1 hour' + n * interval '1 millisecond'
             FROM generate_series(1, 10, 2) AS n;
             INSERT INTO outbox_event_inheritor (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(), 'order.created', 'order-' || n, '{}',
                    now() - interval '1 hour' + n * interval '1 millisecond'
             FROM generate_series(2, 10, 2) AS n;",
        )
        .await
        .expect("an inheriting table with rows");
}

/// A relay that runs while its table is converted to a partitioned one
/// (docs/operations.md) claims with the statements written for a plain
/// table until it looks at the table again. Those lease the rows they
/// locked by their addresses, which name a row only within a partition:
/// they must lease nothing, never the rows of other partitions that have
/// the same addresses. Such a claim comes back with the rows it locked
/// and did not lease, the relay looks at the table at once, and claims
/// again by key: each kind of claim takes its rows at the first try, and
/// leases exactly the rows it returns.
#[tokio::test(flavor = "multi_thread")]
async fn claims_written_for_a_plain_table_notice_at_once_that_it_is_partitioned() {
    let db = TestDb::migrated().await;
    let lease = Duration::from_secs(600);
    // One store per kind of claim, each remembering the table as plain:
    // the first to notice the conversion would tell the others otherwise.
    let remembering_plain = [store(&db), store(&db), store(&db)];
    for remembers_plain in &remembering_plain {
        for ordering in [Ordering::None, Ordering::Aggregate] {
            let claimed = remembers_plain.claim(budget(100), lease, ordering).await.unwrap();
            assert!(claimed.events.is_empty(), "nothing to claim yet");
        }
    }
    // Converted as by hand, with rows at the same addresses in both
    // partitions.
    db.client
        .batch_execute(
            "ALTER TABLE outbox_event RENAME TO outbox_event_old;
             CREATE TABLE outbox_event (LIKE outbox_event_old INCLUDING DEFAULTS)
                 PARTITION BY RANGE (created_at);
             CREATE TABLE outbox_event_older PARTITION OF outbox_event
                 FOR VALUES FROM (MINVALUE) TO ('2000-01-01');
             CREATE TABLE outbox_event_newer PARTITION OF outbox_event DEFAULT;
             INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(), 'order.created', 'order-' || n, '{}',
                    CASE WHEN n % 2 = 0 THEN timestamptz '1999-12-31' ELSE now() END
                        + n * interval '1 millisecond'
             FROM generate_series(1, 10) AS n;",
        )
        .await
        .expect("convert the table");
    assert_eq!(
        addresses_of_two_rows(&db).await,
        5,
        "each address names a row in both partitions"
    );
    // A batch smaller than the rows: without the `tableoid` test, the
    // three rows each claim locks would share their addresses with three
    // rows of the other partition, which it would lease unseen.
    let three = budget(3);
    let [unordered, ordered, recording] = &remembering_plain;
    let first = unordered.claim(three, lease, Ordering::None).await.unwrap();
    // The recording claim marks the first claim's rows as the broker's
    // confirms would, in the statement that finds the table converted:
    // that recording stands, and only its claim is made again.
    let (ids, attempts): (Vec<Uuid>, Vec<i32>) = first.events.iter().map(|e| (e.id, e.attempt_count)).unzip();
    let claims = [
        ("unordered", first),
        (
            "recording",
            recording
                .record_and_claim(
                    outbox_relay::store::OnPublish::Mark,
                    &ids,
                    &attempts,
                    three,
                    lease,
                )
                .await
                .unwrap(),
        ),
        (
            "ordered",
            ordered.claim(three, lease, Ordering::Aggregate).await.unwrap(),
        ),
    ];
    let mut in_flight = Vec::new();
    for (kind, claimed) in &claims {
        assert_eq!(claimed.events.len(), 3, "the {kind} claim took its batch at once");
        assert_eq!(
            claimed.unleased, 0,
            "the {kind} claim's second try leased what it locked"
        );
        if *kind != "unordered" {
            in_flight.extend(claimed.events.iter().map(|event| event.id));
        }
    }
    let sorted = |mut ids: Vec<Uuid>| {
        ids.sort();
        ids
    };
    let published: Vec<Uuid> = db
        .column("SELECT id FROM outbox_event WHERE published_at IS NOT NULL", &[])
        .await;
    assert_eq!(sorted(published), sorted(ids), "the recording stood");
    let leased: Vec<Uuid> = db
        .column(
            "SELECT id FROM outbox_event WHERE published_at IS NULL AND attempt_count = 1 AND leased_until > now()",
            &[],
        )
        .await;
    assert_eq!(
        sorted(leased),
        sorted(in_flight),
        "the claims leased exactly the rows they returned"
    );
    assert_eq!(db.count("attempt_count > 1").await, 0, "no row was charged twice");
    assert_eq!(
        db.count("attempt_count = 0").await,
        1,
        "the last row is still due"
    );
}

/// A plain table that other tables inherit from keeps rows in them too,
/// at addresses its own rows share: its claims lease their rows by key,
/// each claim exactly the rows it returns, and take the children's rows
/// with the parent's.
#[tokio::test(flavor = "multi_thread")]
async fn claims_of_a_table_other_tables_inherit_from_take_the_rows_of_both() {
    let db = TestDb::migrated().await;
    inheritor_with_rows(&db).await;
    assert_eq!(
        addresses_of_two_rows(&db).await,
        5,
        "each address names a row in both tables"
    );
    let three = budget(3);
    let lease = Duration::from_secs(600);
    let store = store(&db);
    let mut taken: Vec<Uuid> = Vec::new();
    for _ in 0..10 {
        let claimed = store.claim(three, lease, Ordering::None).await.unwrap();
        if claimed.events.is_empty() {
            break;
        }
        taken.extend(claimed.events.iter().map(|event| event.id));
        assert_eq!(
            db.count("leased_until IS NOT NULL").await,
            taken.len() as i64,
            "every leased row was returned by a claim"
        );
    }
    let mut distinct = taken.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), taken.len(), "no row taken twice");
    assert_eq!(taken.len(), 10, "the rows of both tables taken");
}

/// A relay that runs while other tables begin to inherit from its plain
/// table claims with the statements written for a plain table, which
/// lease the parent's rows and leave the inheritors' locked but not
/// leased. The claim returns the parent's rows, and the relay looks at the
/// table's kind at once: its next claim leases by key and takes the
/// inheritors' rows too, instead of leaving them until the periodic look.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_that_left_an_inheritors_rows_unleased_makes_the_next_claim_take_them() {
    let db = TestDb::migrated().await;
    let lease = Duration::from_secs(600);
    let store = store(&db);
    let claimed = store.claim(budget(100), lease, Ordering::None).await.unwrap();
    assert!(
        claimed.events.is_empty(),
        "nothing to claim yet; the table is plain"
    );
    inheritor_with_rows(&db).await;
    let inheritors: Vec<Uuid> = db.column("SELECT id FROM ONLY outbox_event_inheritor", &[]).await;
    let four = budget(4);
    // Rows 1 to 4 are the candidates, parent and inheritor in turn.
    let first = store.claim(four, lease, Ordering::None).await.unwrap();
    assert_eq!(first.events.len(), 2, "the parent's two rows are taken");
    assert_eq!(first.unleased, 2, "the inheritor's two are locked, not leased");
    assert!(
        first.events.iter().all(|event| !inheritors.contains(&event.id)),
        "no inheritor's row is returned by a claim that did not lease it"
    );
    let second = store.claim(four, lease, Ordering::None).await.unwrap();
    assert_eq!(second.unleased, 0, "the next claim leases by key");
    assert_eq!(second.events.len(), 4, "and takes a full batch");
    let mut second_rows: Vec<&str> = second
        .events
        .iter()
        .map(|event| event.aggregate_id.as_str())
        .collect();
    second_rows.sort();
    assert_eq!(
        second_rows,
        ["order-2", "order-4", "order-5", "order-6"],
        "the inheritor's rows the first claim left come first"
    );
    let mut taken: Vec<Uuid> = first
        .events
        .iter()
        .chain(&second.events)
        .map(|event| event.id)
        .collect();
    taken.sort();
    let mut leased: Vec<Uuid> = db
        .column("SELECT id FROM outbox_event WHERE leased_until > now()", &[])
        .await;
    leased.sort();
    assert_eq!(leased, taken, "the claims leased exactly the rows they returned");
}

/// An ordered claim on a partitioned table reads the heads it finds
/// behind its window's start in their own partitions (joined on id and
/// created_at, see claim_ordered.sql), wherever they lie: here in a day
/// partition and DEFAULT, behind a window that starts today.
#[tokio::test(flavor = "multi_thread")]
async fn an_ordered_window_takes_the_heads_behind_it_from_their_own_partitions() {
    let db = partitioned_db("daily").await;
    day_partition(&db, -2).await;
    day_partition(&db, -1).await;
    // In (created_at, id) order, each on the day given (-5 has no
    // partition: DEFAULT). a1, b1 and c1 are published, e1 is in flight:
    // a2, b2, c2 and d1 are heads, e2 is not.
    let rows = [
        ("a1", -5, true, false),
        ("a2", -5, false, false),
        ("b1", -2, true, false),
        ("b2", -2, false, false),
        ("c1", -2, true, false),
        ("c2", -1, false, false),
        ("e1", -1, false, true),
        ("e2", -1, false, false),
        ("d1", 0, false, false),
    ];
    let mut ids = std::collections::HashMap::new();
    for (n, (name, day, published, in_flight)) in rows.iter().enumerate() {
        let id = Uuid::new_v4();
        db.client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                           published_at, attempt_count, leased_until)
                 VALUES ($1, 'order.created', $2, '{}',
                         (((now() AT TIME ZONE 'UTC')::date + $3::int)::timestamp AT TIME ZONE 'UTC')
                             + interval '1 hour' + $4::int * interval '1 millisecond',
                         CASE WHEN $5 THEN now() END, CASE WHEN $6 THEN 1 ELSE 0 END,
                         CASE WHEN $6 THEN now() + interval '10 minutes' END)",
                &[&id, &&name[..1], day, &(n as i32), published, in_flight],
            )
            .await
            .expect("insert a row");
        ids.insert(*name, id);
    }
    let partitions_holding: Vec<i64> = db
        .column(
            "SELECT count(DISTINCT tableoid) FROM outbox_event WHERE published_at IS NULL",
            &[],
        )
        .await;
    assert_eq!(
        partitions_holding,
        [4],
        "the unpublished rows lie in four partitions, DEFAULT included"
    );
    let store = store(&db);
    let d1_created_at: chrono::DateTime<Utc> = db
        .client
        .query_one("SELECT created_at FROM outbox_event WHERE id = $1", &[&ids["d1"]])
        .await
        .unwrap()
        .get(0);
    let from_d1 = ClaimStart::Window {
        from: Some((d1_created_at, ids["d1"])),
        to: None,
    };
    let batch = budget(100);
    let claim = |published: &[&str], start: ClaimStart| {
        let published: Vec<String> = published.iter().map(|name| (*name).to_owned()).collect();
        let store = &store;
        async move {
            store
                .claim_following(
                    batch,
                    Duration::from_secs(600),
                    Ordering::Aggregate,
                    None,
                    start,
                    &published,
                )
                .await
                .unwrap()
        }
    };
    let names_of = |claimed: &outbox_relay::store::Claimed| -> Vec<&str> {
        claimed
            .events
            .iter()
            .map(|event| *ids.iter().find(|(_, id)| **id == event.id).unwrap().0)
            .collect()
    };
    assert_eq!(
        names_of(&claim(&["a", "b", "e"], from_d1).await),
        ["a2", "b2", "d1"],
        "behind the start, the heads of the aggregates just published, from DEFAULT and a day's \
         partition; not e2, whose predecessor is in flight; and the window's own head"
    );
    assert_eq!(
        names_of(&claim(&["a", "b", "c", "e"], ClaimStart::Oldest).await),
        ["c2"],
        "a claim from the oldest row finds the rest itself"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_statements_work_across_partitions() {
    let db = partitioned_db("daily").await;
    let old = insert_on_day(&db, -2, 3, Some(0)).await;
    let today = insert_on_day(&db, 0, 4, Some(0)).await;
    let store = store(&db);
    let replayed = store
        .replay(Utc::now() - chrono::TimeDelta::hours(1), None, None)
        .await
        .unwrap();
    assert_eq!(replayed, 7, "rows of DEFAULT and of a range partition");
    db.client
        .execute(
            "UPDATE outbox_event SET quarantined_at = now(), last_error = 'bad' WHERE id = ANY($1)",
            &[&vec![old[0], today[0]]],
        )
        .await
        .unwrap();
    let mut listed = Vec::new();
    store
        .quarantined_rows(None, 100, |row| {
            listed.push(row.id);
            std::ops::ControlFlow::Continue(())
        })
        .await
        .unwrap();
    listed.sort();
    let mut expected = vec![old[0], today[0]];
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(
        store.release_quarantined(&[today[0]]).await.unwrap(),
        vec![today[0]]
    );
    assert_eq!(store.release_all_quarantined().await.unwrap(), 1);
    let backlog = store.backlog().await.unwrap();
    assert_eq!(backlog.counts.unpublished, 7, "{backlog:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_drops_only_partitions_whose_every_row_is_published() {
    let db = partitioned_db("daily").await;
    let settled = day_partition(&db, -12).await;
    let unpublished = day_partition(&db, -11).await;
    let quarantined = day_partition(&db, -10).await;
    let recent = day_partition(&db, -9).await;
    insert_on_day(&db, -12, 50, Some(10)).await;
    insert_on_day(&db, -11, 50, Some(10)).await;
    insert_on_day(&db, -11, 1, None).await;
    insert_on_day(&db, -10, 50, Some(10)).await;
    let poison = insert_on_day(&db, -10, 1, None).await;
    db.client
        .execute(
            "UPDATE outbox_event SET quarantined_at = now() WHERE id = $1",
            &[&poison[0]],
        )
        .await
        .unwrap();
    // Every row published, the last of them only two days ago.
    insert_on_day(&db, -9, 50, Some(2)).await;
    // Published long ago, but in DEFAULT: deleted row by row.
    insert_on_day(&db, -30, 20, Some(20)).await;

    let store = store(&db);
    let pass = store.maintain_partitions(None, Some(RETENTION)).await.unwrap();
    assert_eq!(pass.dropped, [format!("public.{settled}")], "{pass:?}");
    let mut kept = pass.kept.clone();
    kept.sort();
    assert_eq!(
        kept,
        [
            format!("public.{unpublished}"),
            format!("public.{quarantined}"),
            format!("public.{recent}")
        ]
    );
    let (names, _) = partition_names(&db).await;
    assert!(!names.contains(&settled));
    for stays in [&unpublished, &quarantined, &recent] {
        assert!(names.contains(stays), "{stays} stays: {names:?}");
    }
    // Every row of day -9 and before (they are created at noon, so a
    // bound relative to now() would depend on the time of day).
    assert_eq!(
        db.count("created_at < ((now() AT TIME ZONE 'UTC')::date - 8)::timestamp AT TIME ZONE 'UTC'")
            .await,
        102 + 50 + 20
    );

    let metrics = outbox_relay::metrics::Metrics::new().source(None);
    let pass = retention_pass(&store, &metrics).await;
    assert_eq!(pass.1.deleted, 20, "the DEFAULT partition's old published rows");
    assert_eq!(
        db.count("created_at < ((now() AT TIME ZONE 'UTC')::date - 8)::timestamp AT TIME ZONE 'UTC'")
            .await,
        102 + 50
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_created_late_takes_over_its_rows_from_default() {
    let db = partitioned_db("daily").await;
    let (names, _) = partition_names(&db).await;
    let tomorrow = names[1].clone();
    db.client
        .batch_execute(&format!(
            "ALTER TABLE outbox_event DETACH PARTITION {tomorrow}; DROP TABLE {tomorrow}"
        ))
        .await
        .unwrap();
    let early = insert_on_day(&db, 1, 6, None).await;
    let in_default: Vec<i64> = db.column("SELECT count(*) FROM outbox_event_default", &[]).await;
    assert_eq!(in_default, [6]);

    let pass = store(&db).maintain_partitions(None, None).await.unwrap();
    assert_eq!(pass.created, [format!("\"{tomorrow}\"")]);
    assert_eq!(pass.moved, 6);
    let moved: Vec<Uuid> = db
        .column(&format!("SELECT id FROM {tomorrow} ORDER BY created_at"), &[])
        .await;
    assert_eq!(moved, early);
    let in_default: Vec<i64> = db.column("SELECT count(*) FROM outbox_event_default", &[]).await;
    assert_eq!(in_default, [0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn producers_keep_inserting_while_partitions_are_dropped() {
    let db = partitioned_db("daily").await;
    let mut old = Vec::new();
    for days in -14..=-9 {
        old.push(day_partition(&db, days).await);
        insert_on_day(&db, days, 20_000, Some(10)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for _ in 0..4 {
        let client = db.connect().await;
        let stop = stop.clone();
        producers.push(tokio::spawn(async move {
            let (mut inserted, mut longest) = (0u64, Duration::ZERO);
            while !stop.load(AtomicOrdering::Relaxed) {
                let started = Instant::now();
                client
                    .execute(
                        "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
                         VALUES ($1, 'during-drop', 'p', '{}')",
                        &[&Uuid::new_v4()],
                    )
                    .await
                    .expect("a producer's INSERT never fails while partitions are dropped");
                longest = longest.max(started.elapsed());
                inserted += 1;
            }
            (inserted, longest)
        }));
    }
    // Producers get going before retention starts.
    common::eventually(Duration::from_secs(10), "producers inserting", || async {
        db.count("event_type = 'during-drop'").await > 100
    })
    .await;
    let store = store(&db);
    let started = Instant::now();
    let pass = store.maintain_partitions(None, Some(RETENTION)).await.unwrap();
    let took = started.elapsed();
    stop.store(true, AtomicOrdering::Relaxed);
    let (mut inserted, mut longest) = (0, Duration::ZERO);
    for producer in producers {
        let (n, wait) = producer.await.unwrap();
        inserted += n;
        longest = longest.max(wait);
    }
    assert_eq!(pass.dropped.len(), old.len(), "{pass:?}");
    assert_eq!(db.count("event_type = 'during-drop'").await, inserted as i64);
    println!(
        "dropped {} partitions of 20,000 rows in {took:?}; {inserted} producer INSERTs, longest {longest:?}",
        pass.dropped.len()
    );
    // The drop's lock wait is capped at 100 ms, and it holds the lock for
    // a catalog change: a producer waits well under a second.
    assert!(
        longest < Duration::from_secs(1),
        "longest producer INSERT took {longest:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_partition_is_counted_in_its_own_metric() {
    let db = partitioned_db("daily").await;
    day_partition(&db, -12).await;
    insert_on_day(&db, -12, 20, Some(10)).await;
    let store = store(&db);
    let metrics = outbox_relay::metrics::Metrics::new().source(None);
    let (partitions, rows) = retention_pass(&store, &metrics).await;
    assert_eq!(partitions.dropped.len(), 1, "{partitions:?}");
    assert_eq!(metrics.retention_partitions_dropped_total.get(), 1);
    assert_eq!(rows.deleted, 0);
    assert_eq!(
        metrics.retention_deleted_total.get(),
        0,
        "the dropped partition's rows are not counted as deleted rows"
    );
}

/// One pass of the relay's retention on a partitioned table, as its
/// maintenance task runs it every minute.
async fn retention_pass(
    store: &outbox_relay::store::Store,
    metrics: &outbox_relay::metrics::SourceMetrics,
) -> (
    outbox_relay::store::PartitionPass,
    outbox_relay::maintenance::retention::Pass,
) {
    outbox_relay::maintenance::retention::run_partitioned_pass(
        store,
        Some(RETENTION),
        metrics,
        &outbox_relay::relay::CatchUp::default(),
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap()
    .expect("a partitioned table")
}
