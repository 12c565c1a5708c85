//! `outbox-relay migrate`: creates the table and its indexes, is
//! idempotent and safe under concurrent replicas, and upgrades a table in
//! the seed shape without touching producer data.

mod common;

use std::time::Duration;

use common::{RelayProcess, TestBroker, TestDb};
use uuid::Uuid;

fn migrate(db: &TestDb, table: Option<&str>) -> std::process::Output {
    let env: Vec<(&str, &str)> = table.map(|t| vec![("OUTBOX_TABLE", t)]).unwrap_or_default();
    db.relay_command(&["migrate"], &env)
        .output()
        .expect("run migrate")
}

/// The indexes `migrate` leaves on `outbox_event`.
const SPEC_INDEXES: [&str; 7] = [
    "outbox_event_aggregate_idx",
    "outbox_event_fresh_idx",
    "outbox_event_pending_idx",
    "outbox_event_pkey",
    "outbox_event_published_idx",
    "outbox_event_quarantined_idx",
    "outbox_event_retry_idx",
];

/// The valid (finished, maintained) indexes of `table`, by name.
async fn usable_indexes(db: &TestDb, table: &str) -> Vec<String> {
    db.column(
        "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indrelid = quote_ident($1)::regclass AND i.indisvalid AND i.indisready ORDER BY 1",
        &[&table],
    )
    .await
}

/// `rows` rows in a seed-shaped table, as a producer would have them.
async fn seed_rows(db: &TestDb, rows: i64) {
    db.client
        .execute(
            "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload)
             SELECT gen_random_uuid(), gen_random_uuid(), 'seeded', gen_random_uuid(),
                    jsonb_build_object('n', n)
             FROM generate_series(1, $1::bigint) AS n",
            &[&rows],
        )
        .await
        .unwrap();
}

async fn columns(db: &TestDb, schema: &str, table: &str) -> Vec<(String, String, String)> {
    db.client
        .query(
            "SELECT column_name::text, data_type::text, is_nullable::text FROM information_schema.columns
             WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
            &[&schema, &table],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn creates_the_spec_table_with_its_indexes_and_is_idempotent() {
    let db = TestDb::create().await;
    for _ in 0..2 {
        let out = migrate(&db, None);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let names: Vec<String> = columns(&db, "public", "outbox_event")
        .await
        .into_iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(
        names,
        [
            "id",
            "causation_id",
            "event_type",
            "aggregate_id",
            "payload",
            "created_at",
            "published_at",
            "attempt_count",
            "next_attempt_at",
            "last_error",
            "quarantined_at",
            "leased_until"
        ]
    );
    assert_eq!(usable_indexes(&db, "outbox_event").await, SPEC_INDEXES);
    let storage: Vec<String> = db
        .client
        .query_one(
            "SELECT reloptions FROM pg_class WHERE oid = 'outbox_event'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(storage, ["fillfactor=50"], "room for every row's lease");
    let history: i64 = db
        .client
        .query_one("SELECT count(*) FROM outbox_relay_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(history, 9, "each migration recorded once");
}

/// Runs overlap: each waits for the one holding the lock (which builds
/// the indexes of a table with rows, so there is something to wait for),
/// then finds nothing left to do.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_replicas_migrate_safely() {
    let db = TestDb::create().await;
    seed_table_with(&db, &[]).await;
    seed_rows(&db, 20_000).await;
    let children: Vec<_> = (0..4)
        .map(|_| {
            db.relay_command(&["migrate"], &[])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(db.count("true").await, 20_000);
    assert_eq!(usable_indexes(&db, "outbox_event").await, SPEC_INDEXES);
    let history: i64 = db
        .client
        .query_one("SELECT count(*) FROM outbox_relay_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(history, 9, "each migration recorded once");
}

/// The seed design's columns of every row, as text.
async fn seed_columns(db: &TestDb) -> Vec<String> {
    db.column(
        "SELECT json_build_object('id', id, 'causation_id', causation_id,
             'event_type', event_type, 'aggregate_id', aggregate_id, 'payload', payload,
             'created_at', created_at, 'published_at', published_at)::text FROM outbox_event ORDER BY id",
        &[],
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrades_a_seed_shaped_table_without_touching_its_rows() {
    let db = TestDb::create().await;
    db.client
        .batch_execute(
            "CREATE TABLE outbox_event (
                 id            UUID PRIMARY KEY,
                 causation_id  UUID NOT NULL,
                 event_type    VARCHAR(150) NOT NULL,
                 aggregate_id  UUID NOT NULL,
                 payload       JSONB NOT NULL,
                 created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
                 published_at  TIMESTAMPTZ
             );",
        )
        .await
        .unwrap();
    let (unpublished, published, aggregate, causation) =
        (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    db.client
        .execute(
            "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload, created_at, published_at)
             VALUES ($1, $3, 'a', $4, '{\"k\": 1}', '2025-01-01T00:00:00Z', NULL),
                    ($2, $3, 'b', $4, '{\"k\": 2}', '2025-01-01T00:00:01Z', '2025-01-01T00:01:00Z')",
            &[&unpublished, &published, &causation, &aggregate],
        )
        .await
        .unwrap();
    let before = seed_columns(&db).await;

    let out = migrate(&db, None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let cols = columns(&db, "public", "outbox_event").await;
    let find = |name: &str| cols.iter().find(|c| c.0 == name).cloned().unwrap();
    assert_eq!(find("causation_id").2, "YES", "causation_id may now be null");
    assert_eq!(find("aggregate_id").1, "uuid", "aggregate_id is not rewritten");
    for added in ["attempt_count", "next_attempt_at", "last_error", "quarantined_at"] {
        assert!(cols.iter().any(|c| c.0 == added), "{added} added");
    }
    // The original columns of every row are unchanged.
    let after = seed_columns(&db).await;
    assert_eq!(before, after);
    // The unpublished seed row is due for the relay; a new producer row
    // without causation works.
    assert_eq!(
        db.count("published_at IS NULL AND next_attempt_at <= now() AND attempt_count = 0")
            .await,
        1
    );
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload) VALUES ($1, 'c', $2, '{}')",
            &[&Uuid::new_v4(), &aggregate],
        )
        .await
        .unwrap();

    // And the relay publishes from it, the UUID aggregate id as text.
    let broker = TestBroker::create("#").await;
    let _relay = RelayProcess::start(&db, &broker.env());
    let received = broker.receive(2, Duration::from_secs(60)).await;
    assert_eq!(received.len(), 2);
    assert!(received
        .iter()
        .all(|m| m.headers.get("aggregate_id") == Some(&aggregate.to_string())));
    assert!(received.iter().any(|m| m.message_id == unpublished.to_string()));
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_schema_qualified_table_is_created_in_its_schema() {
    let db = TestDb::create().await;
    let out = migrate(&db, Some("billing.events_out"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(columns(&db, "billing", "events_out").await.len(), 12);
    let index: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = 'billing' AND indexname = 'events_out_pending_idx'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(index, 1);
}

async fn has_notify_trigger(db: &TestDb) -> bool {
    db.client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'outbox_event'::regclass
                                                     AND tgname = 'outbox_event_relay_notify')",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_notify_trigger_follows_the_setting_on_every_migrate() {
    let db = TestDb::create().await;
    let run = |value: &str| {
        db.relay_command(&["migrate"], &[("OUTBOX_NOTIFY_TRIGGER", value)])
            .output()
            .unwrap()
    };
    assert!(run("on").status.success());
    assert!(has_notify_trigger(&db).await, "installed by default setting 'on'");
    assert!(run("off").status.success());
    assert!(!has_notify_trigger(&db).await, "removed with 'off'");
    assert!(run("off").status.success(), "idempotent");
    assert!(run("on").status.success());
    assert!(has_notify_trigger(&db).await, "installed again");

    let bad = run("sometimes");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("OUTBOX_NOTIFY_TRIGGER"));
}

/// The seed design's table with some columns changed: `(column,
/// definition)` pairs.
async fn seed_table_with(db: &TestDb, changes: &[(&str, &str)]) {
    let mut columns = [
        ("id", "UUID PRIMARY KEY"),
        ("causation_id", "UUID NOT NULL"),
        ("event_type", "VARCHAR(150) NOT NULL"),
        ("aggregate_id", "UUID NOT NULL"),
        ("payload", "JSONB NOT NULL"),
        ("created_at", "TIMESTAMPTZ NOT NULL DEFAULT now()"),
        ("published_at", "TIMESTAMPTZ"),
    ];
    for (name, ddl) in columns.iter_mut() {
        if let Some((_, definition)) = changes.iter().find(|(column, _)| column == name) {
            *ddl = definition;
        }
    }
    let body: Vec<String> = columns
        .iter()
        .map(|(name, ddl)| format!("{name} {ddl}"))
        .collect();
    db.client
        .batch_execute(&format!("CREATE TABLE outbox_event ({})", body.join(", ")))
        .await
        .unwrap();
}

/// The `table_check` reports in a JSON log: `(severity, column)`, sorted.
fn table_reports(stderr: &[u8]) -> Vec<(String, String)> {
    let mut reports: Vec<(String, String)> = String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["report"] == "table_check")
        .map(|line| {
            (
                line["severity"].as_str().unwrap_or_default().to_owned(),
                line["column"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    reports.sort();
    reports
}

fn report(severity: &str, column: &str) -> (String, String) {
    (severity.to_owned(), column.to_owned())
}

/// `causation_id text`: the claim casts it to uuid, so one value that is
/// not a UUID would fail every claim. Such a table is refused up front.
#[tokio::test(flavor = "multi_thread")]
async fn a_column_type_the_relay_cannot_work_with_fails_migrate_and_stops_run() {
    let db = TestDb::create().await;
    seed_table_with(&db, &[("causation_id", "TEXT")]).await;
    let id = Uuid::new_v4();
    db.client
        .execute(
            "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload)
             VALUES ($1, 'not a uuid', 'a', $1, '{}')",
            &[&id],
        )
        .await
        .unwrap();

    let out = db
        .relay_command(&["migrate"], &[("OUTBOX_LOG_FORMAT", "json")])
        .output()
        .expect("run migrate");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(table_reports(&out.stderr), [report("unusable", "causation_id")]);
    // The last line, the error, names the column, what was found, and the fix.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error = stderr.lines().last().unwrap_or_default();
    for part in ["causation_id", "is text, expected uuid", "ALTER TABLE"] {
        assert!(error.contains(part), "{part} missing from: {error}");
    }

    // `run` refuses to start on it (exit 1) rather than claiming.
    let broker = TestBroker::create("#").await;
    let mut relay = RelayProcess::start(&db, &broker.env());
    let status = relay
        .wait(Duration::from_secs(60))
        .await
        .expect("run stops on a table it cannot work with");
    assert_eq!(status.code(), Some(1));
    assert_eq!(
        db.count("attempt_count = 0 AND quarantined_at IS NULL").await,
        1,
        "the row was never claimed"
    );
    broker.cleanup().await;
}

/// `created_at timestamp` (cast by the claim) and a nullable
/// `aggregate_id` are reported with their fixes, and the relay runs: rows
/// are published, and the one row with NULL there is quarantined alone.
#[tokio::test(flavor = "multi_thread")]
async fn columns_the_claim_copes_with_are_reported_and_the_relay_runs() {
    let db = TestDb::create().await;
    seed_table_with(
        &db,
        &[
            ("aggregate_id", "UUID"),
            ("created_at", "TIMESTAMP NOT NULL DEFAULT now()"),
        ],
    )
    .await;
    let out = db
        .relay_command(&["migrate"], &[("OUTBOX_LOG_FORMAT", "json")])
        .output()
        .expect("run migrate");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        table_reports(&out.stderr),
        [
            report("tolerated", "aggregate_id"),
            report("tolerated", "created_at")
        ]
    );

    let ids: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    db.client
        .execute(
            "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload)
             SELECT id, id, 'a', id, '{}' FROM unnest($1::uuid[]) AS u(id)",
            &[&ids],
        )
        .await
        .unwrap();
    let orphan = Uuid::new_v4();
    db.client
        .execute(
            "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload)
             VALUES ($1, $1, 'a', NULL, '{}')",
            &[&orphan],
        )
        .await
        .unwrap();
    let broker = TestBroker::create("#").await;
    let mut relay = RelayProcess::start(&db, &broker.env());
    let received = broker.receive(3, Duration::from_secs(60)).await;
    assert_eq!(received.len(), 3);
    common::eventually(Duration::from_secs(60), "the NULL row quarantined", || async {
        db.count(&format!("id = '{orphan}' AND quarantined_at IS NOT NULL"))
            .await
            == 1
    })
    .await;
    assert!(
        relay.child.try_wait().expect("try_wait").is_none(),
        "the relay keeps running"
    );
    broker.cleanup().await;
}

/// PostgreSQL cuts identifiers at 63 bytes, so names derived by appending
/// to a long table name must be shortened without two of them becoming one
/// (or one becoming the table's own name). At every length up to the limit,
/// migrate creates every index and the trigger, and the relay works.
#[tokio::test(flavor = "multi_thread")]
async fn tables_named_up_to_the_identifier_limit_get_every_index() {
    let db = TestDb::create().await;
    let names: Vec<String> = [61, 62, 63]
        .map(|length| format!("outbox_{}", "x".repeat(length - 7)))
        .to_vec();
    for name in &names {
        for _ in 0..2 {
            let out = migrate(&db, Some(name));
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    for name in &names {
        let indexes: Vec<String> = db
            .column(
                "SELECT indexname::text FROM pg_indexes WHERE tablename = $1 ORDER BY 1",
                &[name],
            )
            .await;
        assert_eq!(
            indexes.len(),
            7,
            "{}-character table: the primary key and six partial indexes, got {indexes:?}",
            name.len()
        );
        let triggers: i64 = db
            .client
            .query_one(
                &format!("SELECT count(*) FROM pg_trigger WHERE tgrelid = '\"{name}\"'::regclass AND NOT tgisinternal"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            triggers,
            1,
            "the NOTIFY trigger of the {}-character table",
            name.len()
        );
    }

    // The relay claims and publishes from the longest.
    let longest = names.last().unwrap();
    let id = Uuid::new_v4();
    db.client
        .execute(
            &format!(
                "INSERT INTO \"{longest}\" (id, event_type, aggregate_id, payload)
                 VALUES ($1, 'order.created', 'agg-1', '{{}}')"
            ),
            &[&id],
        )
        .await
        .unwrap();
    let broker = TestBroker::create("#").await;
    let mut env = broker.env();
    env.push(("OUTBOX_TABLE", longest.clone()));
    let _relay = RelayProcess::start(&db, &env);
    let received = broker.receive(1, Duration::from_secs(60)).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].message_id, id.to_string());
    broker.cleanup().await;
}

/// The index builds do not block producers: while `migrate` is held in a
/// concurrent build (it waits for a transaction that was open before it,
/// as `CREATE INDEX CONCURRENTLY` does), a producer's INSERT commits. The
/// columns were added before, in a short catalog transaction.
#[tokio::test(flavor = "multi_thread")]
async fn a_producer_inserts_while_migrate_builds_the_indexes_of_a_seed_table() {
    let db = TestDb::create().await;
    seed_table_with(&db, &[]).await;
    seed_rows(&db, 10_000).await;
    // An open transaction with a snapshot: every concurrent build waits
    // for it to end before it finishes.
    let older = db.connect().await;
    older
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    let mut migrate = db
        .relay_command(&["migrate"], &[])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let building = "SELECT count(*) FROM pg_stat_progress_create_index
                    WHERE datname = current_database() AND command = 'CREATE INDEX CONCURRENTLY'
                      AND phase = 'waiting for old snapshots'";
    common::eventually(
        Duration::from_secs(60),
        "migrate waiting in a concurrent build",
        || async {
            let waiting: i64 = db.client.query_one(building, &[]).await.unwrap().get(0);
            waiting == 1
        },
    )
    .await;

    // The producer's row commits (the bound only turns a regression into a
    // failure instead of a hang), and the build is still going on.
    let producer = db.connect().await;
    producer
        .batch_execute(
            "SET lock_timeout = '60s';
             INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
             VALUES (gen_random_uuid(), 'during.migrate', gen_random_uuid(), '{}')",
        )
        .await
        .expect("a producer's INSERT during the index build");
    let still: i64 = db.client.query_one(building, &[]).await.unwrap().get(0);
    assert_eq!(still, 1, "the insert committed while the build was waiting");
    assert!(migrate.try_wait().unwrap().is_none(), "migrate is still running");

    older.batch_execute("COMMIT").await.unwrap();
    let out = migrate.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(usable_indexes(&db, "outbox_event").await, SPEC_INDEXES);
    assert_eq!(db.count("event_type = 'during.migrate'").await, 1);
    assert_eq!(
        db.count("attempt_count = 0 AND published_at IS NULL").await,
        10_001
    );
}

/// A concurrent build that fails (here a unique index on duplicate values;
/// a cancelled or killed build ends the same way) leaves an invalid index
/// under the expected name. `CREATE INDEX IF NOT EXISTS` would skip it;
/// `migrate` drops it and builds the index the migration defines.
#[tokio::test(flavor = "multi_thread")]
async fn an_index_left_invalid_by_an_interrupted_build_is_rebuilt() {
    rebuilds_an_invalid_index(&[]).await;
}

/// The same through a transaction pooler, where migrate builds inside its
/// transaction (here the setting on a direct URL: what migrate does is
/// the same).
#[tokio::test(flavor = "multi_thread")]
async fn through_a_transaction_pooler_an_invalid_index_is_rebuilt_in_the_transaction() {
    rebuilds_an_invalid_index(&[("OUTBOX_DATABASE_POOLER", "transaction")]).await;
}

async fn rebuilds_an_invalid_index(env: &[(&str, &str)]) {
    let db = TestDb::migrated().await;
    db.insert_events(50, "same.type").await;
    db.client
        .batch_execute("DROP INDEX outbox_event_pending_idx")
        .await
        .unwrap();
    let failed = db
        .client
        .batch_execute(
            "CREATE UNIQUE INDEX CONCURRENTLY outbox_event_pending_idx ON outbox_event (event_type)",
        )
        .await;
    assert!(failed.is_err(), "the unique build fails on duplicates");
    let valid: Vec<bool> = db
        .column(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_event_pending_idx'::regclass",
            &[],
        )
        .await;
    assert_eq!(valid, [false], "an invalid index is left under the expected name");

    let out = db.relay_command(&["migrate"], env).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(usable_indexes(&db, "outbox_event").await, SPEC_INDEXES);
    let definition: Vec<String> = db
        .column(
            "SELECT pg_get_indexdef('outbox_event_pending_idx'::regclass)",
            &[],
        )
        .await;
    assert!(
        definition[0]
            .contains("(created_at, id) WHERE ((published_at IS NULL) AND (quarantined_at IS NULL))")
            && !definition[0].contains("UNIQUE"),
        "the migration's definition: {}",
        definition[0]
    );
    // Producers can write duplicate event types again.
    db.insert_events(2, "same.type").await;
}

/// Older versions cut derived names at 63 bytes, so tables named 61 to 63
/// characters were left without some indexes while the history says every
/// migration was applied. `migrate` checks the indexes on every run, by
/// their expected names, and builds what is missing.
#[tokio::test(flavor = "multi_thread")]
async fn indexes_missing_whatever_the_history_says_are_built() {
    let db = TestDb::create().await;
    for length in [61, 63] {
        let name = format!("outbox_{}", "r".repeat(length - 7));
        let out = migrate(&db, Some(&name));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let expected = usable_indexes(&db, &name).await;
        assert_eq!(expected.len(), 7, "{expected:?}");
        // What an older version left: the primary key only, history complete.
        let secondary: Vec<String> = db
            .column(
                "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                 WHERE i.indrelid = quote_ident($1)::regclass AND NOT i.indisprimary",
                &[&name],
            )
            .await;
        assert_eq!(secondary.len(), 6, "{secondary:?}");
        for index in &secondary {
            db.client
                .batch_execute(&format!("DROP INDEX \"{index}\""))
                .await
                .unwrap();
        }
        let out = migrate(&db, Some(&name));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(usable_indexes(&db, &name).await, expected, "{length} characters");
    }
}
