//! Every operator command, run as the binary, on each table shape the relay
//! supports besides its own (docs/operations.md, Start-up table check): the
//! seed design upgraded by `migrate`, and the older column types the claim
//! casts (`attempt_count` as `smallint` or `bigint`, times without time
//! zone, `aggregate_id uuid`, `event_type` of any type, `payload` as `json`
//! or `text`). The admin commands read rows through the same casts as the
//! claim, so each must work here exactly as on the spec table.

mod common;

use std::process::Output;

use chrono::{DateTime, Duration as TimeDelta, SecondsFormat, Utc};
use common::config_file::{destination, route, ConfigFile};
use common::TestDb;
use outbox_relay::store::{ClaimBudget, ClaimStart, DatabaseSettings, Ordering, RouteFilter, Store};
use uuid::Uuid;

/// A table shape: its columns before `migrate`, which adds the relay's
/// missing columns and converts none of these.
struct Shape {
    columns: &'static [(&'static str, &'static str)],
    /// Statements run before the table is created (a type it uses).
    before: &'static str,
}

/// The seed design's columns, which every shape starts from.
const SEED: &[(&str, &str)] = &[
    ("id", "UUID PRIMARY KEY"),
    ("causation_id", "UUID NOT NULL"),
    ("event_type", "VARCHAR(150) NOT NULL"),
    ("aggregate_id", "UUID NOT NULL"),
    ("payload", "JSONB NOT NULL"),
    ("created_at", "TIMESTAMPTZ NOT NULL DEFAULT now()"),
    ("published_at", "TIMESTAMPTZ"),
];

/// Creates the shape's table (the seed columns with its changes and
/// additions), runs `migrate` over it and checks that it passed.
async fn migrated(shape: &Shape) -> TestDb {
    let db = TestDb::create().await;
    let mut columns: Vec<(&str, &str)> = SEED.to_vec();
    for &(name, ddl) in shape.columns {
        match columns.iter_mut().find(|(column, _)| *column == name) {
            Some(column) => column.1 = ddl,
            None => columns.push((name, ddl)),
        }
    }
    let body: Vec<String> = columns
        .iter()
        .map(|(name, ddl)| format!("{name} {ddl}"))
        .collect();
    db.client
        .batch_execute(&format!(
            "{}CREATE TABLE outbox_event ({})",
            shape.before,
            body.join(", ")
        ))
        .await
        .expect("create the table");
    let out = run(&db, &["migrate"]);
    assert_exit(&out, 0);
    db
}

/// Inserts one row; every value is an untyped literal or an expression of
/// now(), so it fits whatever types the shape's columns have.
async fn insert(
    db: &TestDb,
    event_type: &str,
    created: &str,
    published: &str,
    attempts: i32,
    last_error: &str,
    quarantined: &str,
) -> Uuid {
    let id = Uuid::new_v4();
    db.client
        .batch_execute(&format!(
            "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload,
                                       created_at, published_at, attempt_count, next_attempt_at,
                                       last_error, quarantined_at)
             VALUES ('{id}', '{id}', '{event_type}', '{id}', '{{\"n\": 1}}',
                     now() - interval '{created}', {published}, '{attempts}', now(),
                     {last_error}, {quarantined})"
        ))
        .await
        .expect("insert a row");
    id
}

fn run(db: &TestDb, args: &[&str]) -> Output {
    db.relay_command(args, &[]).output().expect("run outbox-relay")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn json(out: &Output) -> serde_json::Value {
    assert_exit(out, 0);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(out)))
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Runs `status`, `quarantine list`, `quarantine release` and `replay` (the
/// reading ones in text and JSON) on a table of the shape holding pending,
/// quarantined and published rows, checking the output and the effect.
async fn every_admin_command_works_on(shape: Shape) {
    let db = migrated(&shape).await;
    for _ in 0..3 {
        insert(&db, "order.created", "1 hour", "NULL", 0, "NULL", "NULL").await;
    }
    // Quarantined two and one minutes ago: the list's order.
    let older = insert(
        &db,
        "invoice.issued",
        "2 hours",
        "NULL",
        10,
        "'gave up after 10 attempts: nack'",
        "now() - interval '2 minutes'",
    )
    .await;
    let newer = insert(
        &db,
        "order.created",
        "2 hours",
        "NULL",
        7,
        "'rejected by sink: body too large'",
        "now() - interval '1 minute'",
    )
    .await;
    for event_type in ["order.created", "order.created", "invoice.issued"] {
        insert(
            &db,
            event_type,
            "1 day",
            "now() - interval '10 minutes'",
            1,
            "NULL",
            "NULL",
        )
        .await;
    }

    // status, both forms.
    let status = json(&run(&db, &["status", "--json"]));
    assert_eq!(status["unpublished"], 3, "{status}");
    assert_eq!(status["quarantined"], 2, "{status}");
    assert_eq!(status["published_last_hour"], 3, "{status}");
    let age = status["oldest_unpublished_age_seconds"]
        .as_f64()
        .expect("a number");
    assert!((3600.0..3700.0).contains(&age), "the 1-hour-old rows: {age}");
    let out = run(&db, &["status"]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(
        text.lines()
            .any(|line| line.starts_with("quarantined") && line.trim_end().ends_with(" 2")),
        "{text}"
    );

    // quarantine list --json: both rows, oldest quarantine first, as stored.
    let list = json(&run(&db, &["quarantine", "list", "--json"]));
    let items = list.as_array().expect("an array");
    let ids: Vec<&str> = items.iter().map(|item| item["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [older.to_string(), newer.to_string()], "{list}");
    assert_eq!(items[0]["event_type"], "invoice.issued", "{list}");
    assert_eq!(items[0]["attempt_count"], 10, "{list}");
    assert_eq!(items[1]["attempt_count"], 7, "{list}");
    assert_eq!(
        items[0]["last_error"], "gave up after 10 attempts: nack",
        "{list}"
    );
    let now = Utc::now();
    for (item, minutes) in items.iter().zip([2, 1]) {
        let at = DateTime::parse_from_rfc3339(item["quarantined_at"].as_str().unwrap())
            .expect("RFC 3339")
            .with_timezone(&Utc);
        let expected = now - TimeDelta::minutes(minutes);
        assert!(
            (at - expected).num_seconds().abs() < 30,
            "quarantined {minutes} min ago: {item}"
        );
    }

    // quarantine list, text, and its pages: the cursor of a time without
    // time zone continues exactly after the first row.
    let out = run(&db, &["quarantine", "list"]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    for id in [older, newer] {
        assert!(text.contains(&id.to_string()), "{id} listed:\n{text}");
    }
    assert!(
        text.contains("invoice.issued") && text.contains("gave up after 10"),
        "{text}"
    );
    let page = json(&run(&db, &["quarantine", "list", "--json", "--limit", "1"]));
    let cursor = format!(
        "{},{}",
        page[0]["quarantined_at"].as_str().unwrap(),
        page[0]["id"].as_str().unwrap()
    );
    let next = json(&run(
        &db,
        &["quarantine", "list", "--json", "--limit", "1", "--after", &cursor],
    ));
    assert_eq!(next[0]["id"], newer.to_string(), "the second page: {next}");
    let after_last = format!("{},{newer}", next[0]["quarantined_at"].as_str().unwrap());
    let last = json(&run(
        &db,
        &["quarantine", "list", "--json", "--after", &after_last],
    ));
    assert_eq!(last, serde_json::json!([]), "nothing after the last row");

    // quarantine release <id>, then --all.
    let out = run(&db, &["quarantine", "release", &older.to_string()]);
    assert_exit(&out, 0);
    assert!(stdout(&out).starts_with("released 1 row "), "{}", stdout(&out));
    assert_eq!(
        db.count(&format!(
            "id = '{older}' AND quarantined_at IS NULL AND attempt_count = 0 AND next_attempt_at <= now()"
        ))
        .await,
        1,
        "released: due now, attempts reset"
    );
    let out = run(&db, &["quarantine", "release", "--all"]);
    assert_exit(&out, 0);
    assert!(stdout(&out).starts_with("released 1 row "), "{}", stdout(&out));
    assert_eq!(db.count("quarantined_at IS NOT NULL").await, 0);

    // replay, of one event type, then the rest of the window.
    let since = rfc3339(now - TimeDelta::hours(1));
    let out = run(
        &db,
        &["replay", "--since", &since, "--event-type", "invoice.issued"],
    );
    assert_exit(&out, 0);
    assert!(stdout(&out).starts_with("re-queued 1 row "), "{}", stdout(&out));
    let until = rfc3339(Utc::now() + TimeDelta::minutes(1));
    let out = run(&db, &["replay", "--since", &since, "--until", &until]);
    assert_exit(&out, 0);
    assert!(stdout(&out).starts_with("re-queued 2 rows "), "{}", stdout(&out));

    let status = json(&run(&db, &["status", "--json"]));
    assert_eq!(status["unpublished"], 8, "{status}");
    assert_eq!(status["quarantined"], 0, "{status}");
    assert_eq!(status["published_last_hour"], 0, "{status}");
    let out = run(&db, &["quarantine", "list"]);
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), "no quarantined rows in outbox_event\n");
}

/// The seed design as producers have it, upgraded by `migrate`.
#[tokio::test(flavor = "multi_thread")]
async fn on_the_seed_table() {
    every_admin_command_works_on(Shape {
        columns: &[],
        before: "",
    })
    .await;
}

/// The table `TestDb::migrated_over_older_table` builds: a BIGINT attempt
/// count of the producer's own, `created_at` without time zone, a nullable
/// text aggregate id.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_bigint_attempt_count() {
    every_admin_command_works_on(Shape {
        columns: &[
            ("causation_id", "UUID"),
            ("aggregate_id", "TEXT"),
            ("created_at", "TIMESTAMP WITHOUT TIME ZONE NOT NULL DEFAULT now()"),
            ("attempt_count", "BIGINT NOT NULL DEFAULT 0"),
        ],
        before: "",
    })
    .await;
}

/// A SMALLINT attempt count, a text event type and a `json` payload.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_smallint_attempt_count() {
    every_admin_command_works_on(Shape {
        columns: &[
            ("event_type", "TEXT NOT NULL"),
            ("payload", "JSON NOT NULL"),
            ("attempt_count", "SMALLINT NOT NULL DEFAULT 0"),
        ],
        before: "",
    })
    .await;
}

/// Every time without time zone, quarantined_at included, and a `text`
/// payload.
#[tokio::test(flavor = "multi_thread")]
async fn with_times_without_time_zone() {
    every_admin_command_works_on(Shape {
        columns: &[
            ("payload", "TEXT NOT NULL"),
            ("created_at", "TIMESTAMP NOT NULL DEFAULT now()"),
            ("published_at", "TIMESTAMP"),
            ("next_attempt_at", "TIMESTAMP NOT NULL DEFAULT now()"),
            ("quarantined_at", "TIMESTAMP"),
            ("attempt_count", "INTEGER NOT NULL DEFAULT 0"),
            ("last_error", "VARCHAR(1000)"),
        ],
        before: "",
    })
    .await;
}

const ENUM_EVENT_TYPE: Shape = Shape {
    columns: &[("event_type", "event_kind NOT NULL")],
    before: "CREATE TYPE event_kind AS ENUM ('order.created', 'invoice.issued'); ",
};

/// `event_type` of the producer's own enum type: read as text, so
/// `replay --event-type` matches it as text too.
#[tokio::test(flavor = "multi_thread")]
async fn with_an_enum_event_type() {
    every_admin_command_works_on(ENUM_EVENT_TYPE).await;
}

/// Routes match event types with `LIKE`, which an enum does not have: a
/// relay with several destinations filters its claims by route whenever
/// one is down, and every such claim failed on an enum column, holding
/// back the destinations that were up too. The claims of both orderings
/// and `status`'s count per destination, on the enum and on the seed's
/// `varchar`.
#[tokio::test(flavor = "multi_thread")]
async fn routes_match_an_enum_event_type_as_text() {
    routes_match_event_types_on(ENUM_EVENT_TYPE).await;
    routes_match_event_types_on(Shape {
        columns: &[],
        before: "",
    })
    .await;
}

/// An `aggregate_id` of the producer's own domain over `uuid`, beside a
/// producer column of a domain that rules out NULL: an ordered claim turns
/// the aggregates it is given (as text) back into the column's own type,
/// which must work whatever the table's other columns are.
#[tokio::test(flavor = "multi_thread")]
async fn ordered_claims_look_up_aggregates_of_a_domain_type_beside_a_not_null_domain() {
    routes_match_event_types_on(Shape {
        columns: &[
            ("aggregate_id", "aggregate_key NOT NULL"),
            ("tenant", "tenant_name"),
        ],
        before: "CREATE DOMAIN aggregate_key AS uuid; \
                 CREATE DOMAIN tenant_name AS text NOT NULL DEFAULT 'main'; ",
    })
    .await;
}

/// An `aggregate_id` of an array type: each aggregate an ordered claim is
/// given is cast as one value, not taken apart.
#[tokio::test(flavor = "multi_thread")]
async fn ordered_claims_look_up_aggregates_of_an_array_type() {
    let db = migrated(&Shape {
        columns: &[("aggregate_id", "TEXT[] NOT NULL")],
        before: "",
    })
    .await;
    let mut ids = Vec::new();
    for aggregate in ["{a,b}", "{c}"] {
        let id = Uuid::new_v4();
        db.client
            .execute(
                "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload, created_at)
                 VALUES ($1, $1, 'order.created', $2::text::text[], '{}', now() - interval '1 hour')",
                &[&id, &aggregate],
            )
            .await
            .expect("insert a row");
        ids.push(id);
    }
    let store = Store::new(&store_settings(&db), 1);
    let past_every_row = ClaimStart::Window {
        from: Some((Utc::now() + TimeDelta::hours(1), Uuid::nil())),
        to: None,
    };
    let claimed = store
        .claim_following(
            ClaimBudget {
                rows: 10,
                bytes: 1024 * 1024,
                max_payload: 1024 * 1024,
            },
            std::time::Duration::from_secs(600),
            Ordering::Aggregate,
            None,
            past_every_row,
            &["{a,b}".to_owned()],
        )
        .await
        .unwrap_or_else(|e| panic!("ordered claim given an array aggregate: {e}"));
    let claimed: Vec<Uuid> = claimed.events.iter().map(|event| event.id).collect();
    assert_eq!(claimed, ids[..1], "the row of aggregate {{a,b}} alone");
}

/// A producer's `last_error` shorter than the relay's reasons (up to
/// 1,000 characters): each reason is cut to the column's length, on the
/// column's own `varchar(n)` and on a domain's. Before, the one statement
/// recording a batch's failures failed on a long reason, and the rows
/// were retried and failed the same way, never backing off or quarantined.
#[tokio::test(flavor = "multi_thread")]
async fn reasons_are_cut_to_a_short_last_error_column() {
    for shape in [
        Shape {
            columns: &[("last_error", "VARCHAR(40)")],
            before: "",
        },
        Shape {
            columns: &[("last_error", "short_reason")],
            before: "CREATE DOMAIN short_reason AS VARCHAR(40); ",
        },
        Shape {
            columns: &[("last_error", "VARCHAR(1000)")],
            before: "",
        },
    ] {
        // On a column with room for the relay's own cut: 997 bytes of
        // ASCII text and the ellipsis.
        let room = if shape.columns[0].1 == "VARCHAR(1000)" {
            998
        } else {
            40
        };
        let db = migrated(&shape).await;
        let id = insert(&db, "order.created", "1 hour", "NULL", 1, "NULL", "NULL").await;
        let store = Store::new(&store_settings(&db), 1);
        let long = "refused: ".to_owned() + &"x".repeat(3000);
        let stored = || async {
            let row = db
                .client
                .query_one(
                    "SELECT char_length(last_error), quarantined_at IS NOT NULL FROM outbox_event WHERE id = $1",
                    &[&id],
                )
                .await
                .expect("read the row");
            (row.get::<_, i32>(0), row.get::<_, bool>(1))
        };
        let rescheduled = store
            .reschedule(&[id], &[1], &[&long], &[std::time::Duration::ZERO])
            .await
            .unwrap_or_else(|e| panic!("{}: reschedule: {e}", shape.columns[0].1));
        assert_eq!(rescheduled, 1);
        assert_eq!(stored().await, (room, false), "{}", shape.columns[0].1);
        let quarantined = store
            .quarantine(&[id], &[1], &[&long])
            .await
            .unwrap_or_else(|e| panic!("{}: quarantine: {e}", shape.columns[0].1));
        assert_eq!(quarantined, 1);
        assert_eq!(stored().await, (room, true), "{}", shape.columns[0].1);
    }
}

fn store_settings(db: &TestDb) -> outbox_relay::store::DatabaseConfig {
    DatabaseSettings {
        database_url: db.url.clone(),
        table: "outbox_event".into(),
        database_pooler: "none".to_owned(),
    }
    .validate()
    .expect("valid settings")
}

async fn routes_match_event_types_on(shape: Shape) {
    let db = migrated(&shape).await;
    let mut orders = Vec::new();
    for _ in 0..2 {
        orders.push(insert(&db, "order.created", "1 hour", "NULL", 0, "NULL", "NULL").await);
    }
    let invoice = insert(&db, "invoice.issued", "1 hour", "NULL", 0, "NULL", "NULL").await;

    let broker = [("amqp_url", "amqp://127.0.0.1:1".to_owned())];
    let file = ConfigFile::write(&format!(
        "{}\n{}\n{}\n{}",
        destination("orders", "rabbitmq", &broker),
        destination("invoices", "rabbitmq", &broker),
        route("order.*", "orders"),
        route("invoice.*", "invoices"),
    ));
    let status = json(
        &db.relay_command(&["status", "--json"], &[("OUTBOX_CONFIG", file.path_str())])
            .output()
            .expect("run outbox-relay"),
    );
    assert_eq!(status["destinations"]["orders"], 2, "{status}");
    assert_eq!(status["destinations"]["invoices"], 1, "{status}");
    assert_eq!(status["unrouted"], 0, "{status}");

    let store = Store::new(&store_settings(&db), 1).with_routes(2);
    // The invoices' destination down: only the orders' rows are taken.
    let orders_only = RouteFilter {
        patterns: vec!["order.%".to_owned(), "invoice.%".to_owned()],
        take: vec![true, false, false],
    };
    let budget = ClaimBudget {
        rows: 10,
        bytes: 1024 * 1024,
        max_payload: 1024 * 1024,
    };
    for ordering in [Ordering::None, Ordering::Aggregate] {
        let claimed = store
            .claim_routed(
                budget,
                std::time::Duration::from_secs(600),
                ordering,
                Some(&orders_only),
            )
            .await
            .unwrap_or_else(|e| panic!("{ordering:?} claim with a route filter: {e}"));
        let mut ids: Vec<Uuid> = claimed.events.iter().map(|event| event.id).collect();
        ids.sort();
        let mut expected = orders.clone();
        expected.sort();
        assert_eq!(ids, expected, "{ordering:?}: the orders' rows and not {invoice}");
        // Let the next ordering claim the same rows.
        db.client
            .execute("UPDATE outbox_event SET leased_until = NULL", &[])
            .await
            .expect("end the leases");
    }
    // An ordered window that starts past every row takes, behind its
    // start, only the next rows of the aggregates just published, named as
    // the relay reads them, as text, whatever the column's type (each row
    // here is its own aggregate, its id as the value).
    let past_every_row = ClaimStart::Window {
        from: Some((Utc::now() + TimeDelta::hours(1), Uuid::nil())),
        to: None,
    };
    let mut published = Vec::new();
    for id in [orders[0], invoice] {
        let row = db
            .client
            .query_one(
                "SELECT aggregate_id::text FROM outbox_event WHERE id = $1",
                &[&id],
            )
            .await
            .expect("read an aggregate as the relay does");
        published.push(row.get::<_, String>(0));
    }
    let claimed = store
        .claim_following(
            budget,
            std::time::Duration::from_secs(600),
            Ordering::Aggregate,
            Some(&orders_only),
            past_every_row,
            &published,
        )
        .await
        .unwrap_or_else(|e| panic!("ordered window claim with aggregates just published: {e}"));
    let ids: Vec<Uuid> = claimed.events.iter().map(|event| event.id).collect();
    assert_eq!(
        ids,
        [orders[0]],
        "the row of the published aggregate routed to a destination that is up, and no other"
    );
}
