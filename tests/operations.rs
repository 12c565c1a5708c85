//! Operating the relay: the backlog gauges, /metrics, /healthz and /readyz,
//! retention of published rows, and replay — against the real PostgreSQL
//! and RabbitMQ, each test with a database of its own.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use common::proxy::Proxy;
use common::rows::Rows;
use common::system::free_addr;
use common::{eventually, RelayProcess, TestBroker, TestDb};
use outbox_relay::config::DatabaseSettings;
use outbox_relay::maintenance::{gauges, retention};
use outbox_relay::metrics::Metrics;
use outbox_relay::store::Store;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- factories

const HOUR: i64 = 3_600;
const DAY: i64 = 86_400;

/// A `Store` on the test database, as the relay builds it.
fn store(db: &TestDb) -> Store {
    let database = DatabaseSettings {
        database_url: db.url.clone(),
        table: "outbox_event".to_owned(),
        database_pooler: "none".to_owned(),
    }
    .validate()
    .expect("valid test settings");
    Store::new(&database, 2)
}

// ------------------------------------------------------------------- HTTP

/// `(status, body)` of `GET http://addr/path`, or `None` while nothing answers.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http client");
    let response = client.get(format!("http://{addr}{path}")).send().await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

/// The value of an unlabelled series in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn scrape(addr: SocketAddr) -> Option<String> {
    match get(addr, "/metrics").await {
        Some((200, body)) => Some(body),
        _ => None,
    }
}

/// A relay that never claims: its exchange does not exist, so the sink is
/// not ready and rows stay exactly as the test left them, while the
/// gauges, retention and HTTP endpoints run as usual.
fn idle_relay(db: &TestDb, http: SocketAddr, extra: &[(&'static str, &str)]) -> RelayProcess {
    let mut env = vec![
        (
            "OUTBOX_AMQP_EXCHANGE",
            format!("outbox-test-missing-{}", Uuid::new_v4().simple()),
        ),
        ("OUTBOX_HTTP_ADDR", http.to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    RelayProcess::start(db, &env)
}

// ----------------------------------------------------------------- gauges

/// Without these settings, prepared statements switch to a generic plan
/// costed for the table as it was when the relay started, and a claim on
/// stale statistics sorts the whole backlog (see `Store::new`).
#[tokio::test(flavor = "multi_thread")]
async fn relay_connections_plan_for_the_table_as_it_is() {
    let db = TestDb::migrated().await;
    let store = store(&db);
    let client = store.client().await.expect("pooled connection");
    for (setting, expected) in [
        ("plan_cache_mode", "force_custom_plan"),
        ("enable_bitmapscan", "off"),
    ] {
        let value: String = client
            .query_one(&format!("SHOW {setting}"), &[])
            .await
            .expect("show")
            .get(0);
        assert_eq!(value, expected, "{setting}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn gauges_equal_the_table() {
    let db = TestDb::migrated().await;
    let store = store(&db);
    let metrics = Metrics::new();

    let empty = gauges::refresh(&store, &metrics).await.expect("refresh");
    assert_eq!(empty.unpublished, 0);
    assert_eq!(empty.quarantined, 0);
    assert_eq!(
        empty.oldest_unpublished_age_seconds, 0.0,
        "0 when there is no backlog"
    );

    Rows::pending(7).insert(&db).await;
    Rows::pending(4).due_in(HOUR).insert(&db).await; // backing off: still unpublished
    Rows::pending(2).created_ago(HOUR).insert(&db).await; // the oldest unpublished
    Rows::pending(5)
        .created_ago(2 * HOUR)
        .quarantined("rejected")
        .insert(&db)
        .await;
    Rows::pending(6)
        .created_ago(3 * HOUR)
        .published_ago(HOUR)
        .insert(&db)
        .await;

    let backlog = gauges::refresh(&store, &metrics).await.expect("refresh");
    assert_eq!(
        backlog.unpublished, 13,
        "due, backing-off and old rows; not quarantined or published"
    );
    assert_eq!(
        backlog.unpublished,
        db.count("published_at IS NULL AND quarantined_at IS NULL").await
    );
    assert_eq!(backlog.quarantined, 5);
    assert_eq!(backlog.quarantined, db.count("quarantined_at IS NOT NULL").await);
    let age = backlog.oldest_unpublished_age_seconds;
    // Older quarantined (2 h) and published (3 h) rows must not count.
    assert!((3600.0..7200.0).contains(&age), "oldest unpublished age {age}");

    let text = metrics.render();
    assert_eq!(metric(&text, "outbox_unpublished_events"), Some(13.0), "{text}");
    assert_eq!(metric(&text, "outbox_quarantined_events"), Some(5.0), "{text}");
    assert_eq!(
        metric(&text, "outbox_oldest_unpublished_age_seconds"),
        Some(age),
        "{text}"
    );
}

/// The gauges run every few seconds on every replica, so they must never
/// read published rows: with 20,000 published rows and a small backlog,
/// statistics gathered, the planner itself must choose the partial
/// indexes. Same for retention, `status` and the operator commands.
#[tokio::test(flavor = "multi_thread")]
async fn maintenance_and_admin_queries_are_served_by_the_partial_indexes() {
    let db = TestDb::migrated().await;
    // Ten days of published history, one row every 43 s, as retention would
    // leave behind with OUTBOX_RETENTION=10d.
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at, published_at)
             SELECT gen_random_uuid(), 'order.created', 'agg-' || (g % 97), '{\"n\": 1}'::jsonb,
                    now() - g * interval '43.2 seconds' - interval '1 second',
                    now() - g * interval '43.2 seconds'
             FROM generate_series(1, 20000) AS g",
            &[],
        )
        .await
        .expect("insert history");
    Rows::pending(10).insert(&db).await;
    Rows::pending(3).quarantined("rejected").insert(&db).await;
    db.client
        .batch_execute("ANALYZE outbox_event")
        .await
        .expect("analyze");

    let render = |sql: &str| sql.replace("{table}", "\"outbox_event\"");
    let since: DateTime<Utc> = Utc::now() - chrono::Duration::hours(2);
    let until: Option<DateTime<Utc>> = None;
    let no_type: Option<&str> = None;
    let seven_days_ms: i64 = 7 * DAY * 1000;
    let hour_ms: i64 = HOUR * 1000;
    let batch: i64 = retention::BATCH_SIZE;
    type Params<'a> = Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)>;
    let cases: Vec<(&str, String, Params<'_>, &[&str])> = vec![
        (
            "backlog gauges",
            render(include_str!("../src/store/sql/backlog.sql")),
            vec![],
            &["outbox_event_pending_idx", "outbox_event_quarantined_idx"],
        ),
        (
            "published last hour",
            render(include_str!("../src/store/sql/published_since.sql")),
            vec![&hour_ms],
            &["outbox_event_published_idx"],
        ),
        (
            "retention batch",
            render(include_str!("../src/store/sql/delete_retained.sql")),
            vec![&seven_days_ms, &batch],
            &["outbox_event_published_idx", "outbox_event_pkey"],
        ),
        (
            "quarantine list",
            render(include_str!("../src/store/sql/list_quarantined.sql")),
            vec![],
            &["outbox_event_quarantined_idx"],
        ),
        (
            "quarantine release --all",
            render(include_str!("../src/store/sql/release_all_quarantined.sql")),
            vec![],
            &["outbox_event_quarantined_idx"],
        ),
        (
            "replay of the last two hours",
            render(include_str!("../src/store/sql/replay.sql")),
            vec![&since, &until, &no_type],
            &["outbox_event_published_idx"],
        ),
    ];
    for (what, sql, params, indexes) in cases {
        // Plain EXPLAIN plans without running, so the writes change nothing.
        let plan: Vec<String> = db
            .client
            .query(&format!("EXPLAIN {sql}"), &params)
            .await
            .unwrap_or_else(|e| panic!("explain {what}: {e}"))
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "{what} scans the table:\n{plan}");
        for index in indexes {
            assert!(plan.contains(index), "{what} does not use {index}:\n{plan}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gauge_refresher_outlives_dropped_database_connections() {
    let db = TestDb::migrated().await;
    let store = std::sync::Arc::new(store(&db));
    let metrics = std::sync::Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(gauges::run(
        store.clone(),
        metrics.clone(),
        Duration::from_millis(100),
        shutdown.clone(),
    ));
    Rows::pending(2).insert(&db).await;
    eventually(WAIT, "first refresh", || async { metrics.unpublished.get() == 2 }).await;

    // Kill the refresher's connections (an outage, or a failover): the next
    // refresh fails, a later one reconnects.
    eventually(WAIT, "backends terminated", || async {
        db.terminate_relay_backends().await > 0
    })
    .await;
    Rows::pending(3).insert(&db).await;
    eventually(WAIT, "refresh after reconnecting", || async {
        metrics.unpublished.get() == 5
    })
    .await;
    assert!(!task.is_finished(), "the refresher keeps running");

    shutdown.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("stops on shutdown")
        .expect("no panic");
}

// ------------------------------------------------------------- endpoints

#[tokio::test(flavor = "multi_thread")]
async fn metrics_of_a_running_relay_report_the_backlog() {
    let db = TestDb::migrated().await;
    Rows::pending(4).created_ago(HOUR).insert(&db).await;
    Rows::pending(1).due_in(HOUR).insert(&db).await;
    Rows::pending(2)
        .quarantined("rejected by sink: too large")
        .insert(&db)
        .await;
    Rows::pending(9).published_ago(60).insert(&db).await;
    let http = free_addr();
    let _relay = idle_relay(&db, http, &[]);

    eventually(WAIT, "gauges reflect the table", || async {
        let Some(text) = scrape(http).await else {
            return false;
        };
        metric(&text, "outbox_unpublished_events") == Some(5.0)
            && metric(&text, "outbox_quarantined_events") == Some(2.0)
            && metric(&text, "outbox_oldest_unpublished_age_seconds").is_some_and(|age| age >= 3600.0)
    })
    .await;
    let text = scrape(http).await.expect("metrics");
    for name in [
        "# TYPE outbox_unpublished_events gauge",
        "# TYPE outbox_oldest_unpublished_age_seconds gauge",
        "# TYPE outbox_quarantined_events gauge",
        "outbox_retention_deleted_total ",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }

    // New rows show up within a refresh interval or so.
    Rows::pending(3).insert(&db).await;
    eventually(WAIT, "the gauge follows new rows", || async {
        scrape(http)
            .await
            .is_some_and(|text| metric(&text, "outbox_unpublished_events") == Some(8.0))
    })
    .await;

    // The sink is not usable (missing exchange): alive, but not ready, and
    // the reason says why.
    let (status, _) = get(http, "/healthz").await.expect("healthz answers");
    assert_eq!(status, 200);
    let (status, body) = get(http, "/readyz").await.expect("readyz answers");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("rabbitmq") && body.contains("outbox-test-missing-"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_follows_the_broker() {
    let db = TestDb::migrated().await;
    let broker_url = url::Url::parse(&common::amqp_url()).expect("AMQP URL");
    let target = tokio::net::lookup_host((
        broker_url.host_str().expect("AMQP host"),
        broker_url.port().unwrap_or(5672),
    ))
    .await
    .expect("resolve RabbitMQ")
    .next()
    .expect("an address for RabbitMQ");
    let proxy = Proxy::start(target).await;
    let mut via_proxy = broker_url.clone();
    via_proxy.set_host(Some("127.0.0.1")).expect("host");
    via_proxy.set_port(Some(proxy.addr.port())).expect("port");
    let http = free_addr();
    let _relay = RelayProcess::start(
        &db,
        &[
            ("OUTBOX_AMQP_URL", via_proxy.to_string()),
            ("OUTBOX_HTTP_ADDR", http.to_string()),
        ],
    );

    let ready = |expected: u16| async move {
        get(http, "/readyz")
            .await
            .is_some_and(|(status, _)| status == expected)
    };
    eventually(WAIT, "ready with the broker reachable", || ready(200)).await;

    proxy.refuse(true);
    proxy.cut();
    eventually(WAIT, "not ready while the broker is unreachable", || ready(503)).await;
    let (_, reason) = get(http, "/readyz").await.expect("readyz answers");
    assert!(reason.contains("rabbitmq"), "the reason names the sink: {reason}");
    assert!(
        !reason.contains("guest:guest"),
        "no credentials in the reason: {reason}"
    );
    let (status, _) = get(http, "/healthz").await.expect("healthz answers");
    assert_eq!(status, 200, "alive through a broker outage");

    proxy.refuse(false);
    eventually(WAIT, "ready again once the broker is back", || ready(200)).await;
}

// -------------------------------------------------------------- retention

#[tokio::test(flavor = "multi_thread")]
async fn retention_deletes_exactly_the_rows_published_before_the_cutoff() {
    let db = TestDb::migrated().await;
    // More than two batches' worth, so the pass has to loop.
    let expired = Rows::pending(2_500)
        .created_ago(8 * DAY + 60)
        .published_ago(8 * DAY)
        .insert(&db)
        .await;
    let mut kept = HashSet::new();
    kept.extend(
        Rows::pending(5)
            .created_ago(DAY + 60)
            .published_ago(DAY)
            .insert(&db)
            .await,
    );
    kept.extend(Rows::pending(5).created_ago(10 * DAY).insert(&db).await);
    kept.extend(
        Rows::pending(4)
            .created_ago(10 * DAY)
            .quarantined("rejected")
            .insert(&db)
            .await,
    );
    let http = free_addr();
    let _relay = idle_relay(&db, http, &[("OUTBOX_RETENTION", "7d")]);

    eventually(WAIT, "rows published 8 days ago deleted", || async {
        db.count("TRUE").await == kept.len() as i64
    })
    .await;
    assert_eq!(
        db.ids_where("TRUE").await,
        kept,
        "exactly the expired rows are gone"
    );
    let expired: HashSet<Uuid> = expired.into_iter().collect();
    assert!(db.ids_where("TRUE").await.is_disjoint(&expired));
    assert_eq!(
        db.count("published_at IS NULL AND quarantined_at IS NULL").await,
        5
    );
    assert_eq!(db.count("quarantined_at IS NOT NULL").await, 4);
    eventually(WAIT, "the deletions are counted", || async {
        scrape(http)
            .await
            .is_some_and(|text| metric(&text, "outbox_retention_deleted_total") == Some(2500.0))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_runs_in_bounded_batches_on_one_replica_at_a_time() {
    let db = TestDb::migrated().await;
    Rows::pending(25).published_ago(8 * DAY).insert(&db).await;
    Rows::pending(3).published_ago(HOUR).insert(&db).await;
    let store = store(&db);
    let metrics = Metrics::new();
    let shutdown = CancellationToken::new();
    let seven_days = Duration::from_secs(7 * DAY as u64);

    // Another replica in the middle of a batch: this one skips its pass.
    let (other, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("second connection");
    tokio::spawn(connection);
    other
        .execute(
            "SELECT pg_advisory_lock(hashtext('outbox-relay retention'), 'outbox_event'::regclass::oid::int4)",
            &[],
        )
        .await
        .expect("take the retention lock");
    let pass = retention::run_pass(&store, seven_days, 10, &metrics, &shutdown)
        .await
        .expect("pass");
    assert!(pass.busy, "{pass:?}");
    assert_eq!(pass.deleted, 0);
    assert_eq!(db.count("TRUE").await, 28);

    other
        .execute(
            "SELECT pg_advisory_unlock(hashtext('outbox-relay retention'), 'outbox_event'::regclass::oid::int4)",
            &[],
        )
        .await
        .expect("release the retention lock");
    let pass = retention::run_pass(&store, seven_days, 10, &metrics, &shutdown)
        .await
        .expect("pass");
    assert_eq!(
        pass,
        retention::Pass {
            deleted: 25,
            batches: 3,
            busy: false
        },
        "10 + 10 + a short batch of 5"
    );
    assert_eq!(metrics.retention_deleted_total.get(), 25);
    assert_eq!(db.count("TRUE").await, 3);

    let pass = retention::run_pass(&store, seven_days, 10, &metrics, &shutdown)
        .await
        .expect("pass");
    assert_eq!(
        (pass.deleted, pass.batches),
        (0, 1),
        "nothing left: one empty batch"
    );
}

// ----------------------------------------------------------------- replay

#[tokio::test(flavor = "multi_thread")]
async fn replay_republishes_under_the_same_ids() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let before: DateTime<Utc> = db
        .client
        .query_one("SELECT now() - interval '1 minute'", &[])
        .await
        .expect("now")
        .get(0);
    let ids: HashSet<String> = db
        .insert_events(5, "order.created")
        .await
        .iter()
        .map(Uuid::to_string)
        .collect();
    let mut env = broker.env();
    env.push(("OUTBOX_POLL_INTERVAL", "50ms".to_owned()));
    let _relay = RelayProcess::start(&db, &env);

    let first: HashSet<String> = broker
        .receive(5, WAIT)
        .await
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    assert_eq!(first, ids);
    eventually(WAIT, "rows marked published", || async {
        db.count("published_at IS NOT NULL").await == 5
    })
    .await;

    let since = before.to_rfc3339_opts(SecondsFormat::Micros, true);
    let out = db
        .relay_command(&["replay", "--since", &since], &[])
        .output()
        .expect("run replay");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("re-queued 5 rows published in ["), "{stdout}");

    let again: HashSet<String> = broker
        .receive(5, WAIT)
        .await
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    assert_eq!(again, ids, "the same ids, published again");
    eventually(WAIT, "rows marked published again", || async {
        db.count("published_at IS NOT NULL").await == 5
    })
    .await;
    broker.cleanup().await;
}
