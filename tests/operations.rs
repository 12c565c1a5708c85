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
use common::{eventually, http_get_at, metrics_show, series, RelayProcess, TestBroker, TestDb};
use outbox_relay::maintenance::{gauges, retention};
use outbox_relay::metrics::Metrics;
use outbox_relay::relay::CatchUp;
use outbox_relay::store::{BacklogCounts, DatabaseSettings, GaugeReading, Store, COUNT_CAP, STUCK_SCAN};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- factories

const HOUR: i64 = 3_600;
const DAY: i64 = 86_400;

/// A `Store` on the test database, as the relay builds it.
fn store(db: &TestDb) -> Store {
    store_at(&db.url)
}

/// A `Store` on the outbox table of the database at `url`.
fn store_at(url: &str) -> Store {
    let database = DatabaseSettings {
        database_url: url.to_owned(),
        table: "outbox_event".to_owned(),
        database_pooler: "none".to_owned(),
    }
    .validate()
    .expect("valid test settings");
    Store::new(&database, 2)
}

/// A refresh that computes the counts whenever no other replica is.
const ALWAYS: Duration = Duration::ZERO;

/// The counts a refresh left, and when they were computed.
fn counts(reading: &GaugeReading) -> (BacklogCounts, f64) {
    reading.counts.expect("counts stored")
}

// ------------------------------------------------------------------- HTTP

async fn scrape(addr: SocketAddr) -> Option<String> {
    match http_get_at(addr, "/metrics", Duration::from_secs(10)).await {
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
    let registry = Metrics::new();
    let metrics = registry.source(None);

    let empty = gauges::refresh(&store, &metrics, ALWAYS).await.expect("refresh");
    assert!(empty.computed, "the only replica computes");
    let (empty_counts, _) = counts(&empty);
    assert_eq!(empty_counts.unpublished, 0);
    assert_eq!(empty_counts.quarantined, 0);
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

    let reading = gauges::refresh(&store, &metrics, ALWAYS).await.expect("refresh");
    let (backlog, _) = counts(&reading);
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
    assert!(
        backlog.unpublished_exact && backlog.quarantined_exact && backlog.stuck_aggregates_exact,
        "small counts are exact: {backlog:?}"
    );
    let age = reading.oldest_unpublished_age_seconds;
    // Older quarantined (2 h) and published (3 h) rows must not count.
    assert!((3600.0..7200.0).contains(&age), "oldest unpublished age {age}");

    let text = registry.render();
    assert_eq!(
        series(&text, "outbox_unpublished_events", &[]),
        Some(13.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "outbox_quarantined_events", &[]),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "outbox_oldest_unpublished_age_seconds", &[]),
        Some(age),
        "{text}"
    );
}

/// Past the cap the count is an estimate and says so; the oldest age stays
/// exact. Only the cap's worth of index entries is read, whatever the size.
#[tokio::test(flavor = "multi_thread")]
async fn counts_past_the_cap_are_estimates_and_the_age_stays_exact() {
    let db = TestDb::migrated().await;
    let over = COUNT_CAP + 5_000;
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT gen_random_uuid(), 'order.created', 'agg-' || (g % 97), '{}'::jsonb,
                    now() - g * interval '1 second'
             FROM generate_series(1, $1::bigint) AS g",
            &[&over],
        )
        .await
        .expect("insert backlog");
    db.client
        .batch_execute("VACUUM ANALYZE outbox_event")
        .await
        .expect("vacuum");
    let backlog = store(&db).backlog().await.expect("backlog");
    let counts = backlog.counts;
    assert!(!counts.unpublished_exact, "{counts:?}");
    assert!(
        counts.unpublished >= COUNT_CAP && (counts.unpublished - over).abs() < over / 10,
        "the estimate after VACUUM is close to {over}: {counts:?}"
    );
    assert!(counts.quarantined_exact && counts.quarantined == 0);
    assert!(
        !counts.stuck_aggregates_exact,
        "the stuck scan stopped at its cap: {counts:?}"
    );
    let age = backlog.oldest_unpublished_age_seconds;
    assert!(
        (over as f64..over as f64 + 600.0).contains(&age),
        "the oldest row is {over} s old: {age}"
    );

    // `status` says which numbers are estimates.
    let out = db
        .relay_command(&["status", "--json"], &[])
        .output()
        .expect("status");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["unpublished_exact"], false, "{status}");
    assert_eq!(status["stuck_aggregates_exact"], false, "{status}");
    assert_eq!(status["quarantined_exact"], true, "{status}");
    let out = db.relay_command(&["status"], &[]).output().expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("estimated: more than {COUNT_CAP}")),
        "{text}"
    );
    assert!(text.contains("at least"), "{text}");
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
    // A quarantine too long to sort for one page: a page must follow the
    // index (incident sized, e.g. a broker refusing a whole event type).
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                       attempt_count, last_error, quarantined_at)
             SELECT gen_random_uuid(), 'order.created', 'agg-' || (g % 97), '{}'::jsonb,
                    now() - interval '2 days', 10, 'rejected', now() - g * interval '1 second'
             FROM generate_series(1, 5000) AS g",
            &[],
        )
        .await
        .expect("insert quarantine");
    Rows::pending(10).insert(&db).await;
    // The readers' statement finds the state table's row.
    gauges::refresh(&store(&db), &Metrics::new().source(None), ALWAYS)
        .await
        .expect("refresh");
    db.client
        .batch_execute("ANALYZE outbox_event")
        .await
        .expect("analyze");

    let render = |sql: &str| {
        outbox_relay::store::render_column_reads(
            &sql.replace("{table}", "\"outbox_event\"")
                .replace("{gauges_table}", "\"outbox_relay_gauges\""),
        )
    };
    let since: DateTime<Utc> = Utc::now() - chrono::Duration::hours(2);
    let until: Option<DateTime<Utc>> = None;
    let no_type: Option<&str> = None;
    let seven_days_ms: i64 = 7 * DAY * 1000;
    let hour_ms: i64 = HOUR * 1000;
    let batch: i64 = retention::BATCH_SIZE;
    let (cap, scan) = (COUNT_CAP, STUCK_SCAN);
    let (pending_idx, quarantined_idx) = ("\"outbox_event_pending_idx\"", "\"outbox_event_quarantined_idx\"");
    let key = "outbox_event";
    let max_age_ms: i64 = 3_750;
    let page: i64 = 100;
    let (first_page, no_id): (Option<DateTime<Utc>>, Option<Uuid>) = (None, None);
    let (cursor_at, cursor_id) = (Some(Utc::now() - chrono::Duration::minutes(1)), Some(Uuid::nil()));
    type Params<'a> = Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)>;
    // The backlog statements run with sequential scans off (see
    // set_local_index_scans.sql): these quarantined rows would otherwise
    // make the planner expect 4,000 pending rows where there are 10.
    let backlog_settings = include_str!("../src/store/sql/set_local_index_scans.sql");
    let cases: Vec<(&str, String, Params<'_>, &[&str])> = vec![
        (
            "backlog counts (status, and the replica computing the gauges)",
            render(include_str!("../src/store/sql/backlog.sql")),
            vec![&cap, &scan, &pending_idx, &quarantined_idx],
            &[
                "outbox_event_pending_idx",
                "outbox_event_quarantined_idx",
                "outbox_event_aggregate_idx",
            ],
        ),
        (
            "gauges read by every replica",
            render(include_str!("../src/store/sql/gauges_read.sql")),
            vec![&key, &max_age_ms],
            &["outbox_event_pending_idx"],
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
            "quarantine list, first page",
            render(include_str!("../src/store/sql/list_quarantined.sql")),
            vec![&first_page, &no_id, &page],
            &["outbox_event_quarantined_idx"],
        ),
        (
            "quarantine list, a later page",
            render(include_str!("../src/store/sql/list_quarantined.sql")),
            vec![&cursor_at, &cursor_id, &page],
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
    // Planned on a connection of the relay's own pool, with its planner
    // settings (see `relay_connections_plan_for_the_table_as_it_is`).
    let relay_store = store(&db);
    let relay_client = relay_store.client().await.expect("pooled connection");
    for (what, sql, params, indexes) in cases {
        relay_client.batch_execute("BEGIN").await.expect("begin");
        if what.starts_with("backlog") || what.starts_with("gauges") {
            relay_client
                .query_one(backlog_settings, &[])
                .await
                .expect("settings");
        }
        // Plain EXPLAIN plans without running, so the writes change nothing.
        let plan: Vec<String> = relay_client
            .query(&format!("EXPLAIN {sql}"), &params)
            .await
            .unwrap_or_else(|e| panic!("explain {what}: {e}"))
            .iter()
            .map(|row| row.get(0))
            .collect();
        relay_client.batch_execute("ROLLBACK").await.expect("rollback");
        let plan = plan.join("\n");
        // The gauges' state table is one row per outbox table: scanning
        // it is right. The outbox table must never be scanned.
        assert!(
            !plan.contains("Seq Scan on outbox_event"),
            "{what} scans the table:\n{plan}"
        );
        for index in indexes {
            assert!(plan.contains(index), "{what} does not use {index}:\n{plan}");
        }
        // A page follows the index order; only ties of quarantined_at are
        // sorted (Incremental Sort), never the whole quarantine.
        let full_sort = plan.lines().any(|line| {
            line.trim_start()
                .trim_start_matches("->  ")
                .starts_with("Sort  (")
        });
        assert!(!full_sort, "{what} sorts its whole input:\n{plan}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gauge_refresher_outlives_dropped_database_connections() {
    let db = TestDb::migrated().await;
    let store = std::sync::Arc::new(store(&db));
    let metrics = Metrics::new().source(None);
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

/// `outbox_gauges_refreshed_timestamp_seconds` is what the stale-gauges
/// alert watches: set by a refresh, frozen while the database cannot be
/// reached (the other gauges keep their last values then), moving again
/// once it can.
#[tokio::test(flavor = "multi_thread")]
async fn the_refresh_time_stops_while_the_database_is_unreachable() {
    let db = TestDb::migrated().await;
    let mut url = url::Url::parse(&db.url).expect("database URL");
    let target = tokio::net::lookup_host((
        url.host_str().expect("database host").to_owned(),
        url.port().unwrap_or(5432),
    ))
    .await
    .expect("resolve PostgreSQL")
    .next()
    .expect("an address for PostgreSQL");
    let proxy = Proxy::start(target).await;
    url.set_host(Some("127.0.0.1")).expect("host");
    url.set_port(Some(proxy.addr.port())).expect("port");
    let store = store_at(url.as_str());
    let registry = Metrics::new();
    let metrics = registry.source(None);
    Rows::pending(2).insert(&db).await;

    let refreshed = || {
        series(
            &registry.render(),
            "outbox_gauges_refreshed_timestamp_seconds",
            &[],
        )
    };
    assert_eq!(refreshed(), Some(0.0), "never refreshed yet");
    gauges::refresh(&store, &metrics, ALWAYS).await.expect("refresh");
    let first = refreshed().expect("refresh time");
    let now = Utc::now().timestamp() as f64;
    assert!(
        (now - 60.0..now + 60.0).contains(&first),
        "Unix seconds, now: {first}"
    );

    proxy.refuse(true);
    proxy.cut();
    for _ in 0..3 {
        let failed = gauges::refresh(&store, &metrics, ALWAYS).await;
        assert!(failed.is_err(), "the database is unreachable: {failed:?}");
        assert_eq!(refreshed(), Some(first), "not advanced by a failed refresh");
    }
    assert_eq!(metrics.unpublished.get(), 2, "the last value is kept");

    proxy.refuse(false);
    Rows::pending(1).insert(&db).await;
    eventually(WAIT, "a refresh once the database is back", || async {
        gauges::refresh(&store, &metrics, ALWAYS).await.is_ok()
    })
    .await;
    assert!(refreshed().expect("refresh time") > first, "advanced again");
    assert_eq!(metrics.unpublished.get(), 3);
}

/// However many replicas refresh, one computes the counts at a time and
/// the others show what it stored. A replica held in the middle of its
/// computation (its write waits on a lock the test holds on the state
/// table) keeps the other from computing until it is done.
#[tokio::test(flavor = "multi_thread")]
async fn one_replica_at_a_time_computes_the_counts() {
    let db = TestDb::migrated().await;
    let (store_a, store_b) = (std::sync::Arc::new(store(&db)), store(&db));
    let (registry_a, registry_b) = (Metrics::new(), Metrics::new());
    let (metrics_a, metrics_b) = (registry_a.source(None), registry_b.source(None));
    Rows::pending(3).insert(&db).await;

    // Stored counts younger than max_age are read, not recomputed, by
    // every replica, the one that computed them included.
    let long = Duration::from_secs(3_600);
    let first = gauges::refresh(&store_b, &metrics_b, long)
        .await
        .expect("refresh");
    assert!(first.computed, "nothing stored yet: B computes");
    let (stored, stamp) = counts(&first);
    assert_eq!(stored.unpublished, 3);
    Rows::pending(2).insert(&db).await;
    for (store, metrics, registry) in [
        (&*store_a, &metrics_a, &registry_a),
        (&store_b, &metrics_b, &registry_b),
    ] {
        let reading = gauges::refresh(store, metrics, long).await.expect("refresh");
        assert!(!reading.computed, "fresh counts are read");
        assert_eq!(counts(&reading), (stored, stamp), "what B stored");
        assert_eq!(metrics.unpublished.get(), 3);
        assert_eq!(
            series(
                &registry.render(),
                "outbox_gauges_refreshed_timestamp_seconds",
                &[]
            ),
            Some(stamp),
            "the time the values were computed, not read"
        );
    }

    // A computes, and is held before it can store its counts.
    let mut holder = db.connect().await;
    let hold = holder.transaction().await.expect("begin");
    hold.batch_execute("LOCK TABLE outbox_relay_gauges IN EXCLUSIVE MODE")
        .await
        .expect("lock the state table");
    let computing = tokio::spawn({
        let (store_a, metrics_a) = (store_a.clone(), metrics_a.clone());
        async move { gauges::refresh(&store_a, &metrics_a, ALWAYS).await }
    });
    eventually(WAIT, "A waits to store its counts", || async {
        db.client
            .query_one(
                "SELECT count(*) FROM pg_locks
                 WHERE relation = 'outbox_relay_gauges'::regclass AND NOT granted",
                &[],
            )
            .await
            .expect("pg_locks")
            .get::<_, i64>(0)
            == 1
    })
    .await;
    let meanwhile = gauges::refresh(&store_b, &metrics_b, ALWAYS)
        .await
        .expect("refresh");
    assert!(
        !meanwhile.computed,
        "B does not compute while A is computing, even though it would (max_age 0)"
    );
    assert_eq!(counts(&meanwhile), (stored, stamp), "B shows the stored counts");

    hold.commit().await.expect("release");
    let done = tokio::time::timeout(WAIT, computing)
        .await
        .expect("A finishes")
        .expect("no panic")
        .expect("refresh");
    assert!(done.computed, "A computed");
    let (recounted, later) = counts(&done);
    assert_eq!(recounted.unpublished, 5);
    assert!(later > stamp);

    let after = gauges::refresh(&store_b, &metrics_b, long)
        .await
        .expect("refresh");
    assert!(!after.computed);
    assert_eq!(counts(&after), (recounted, later), "B now shows what A stored");
    assert_eq!(metrics_b.unpublished.get(), 5);
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
        series(&text, "outbox_unpublished_events", &[]) == Some(5.0)
            && series(&text, "outbox_quarantined_events", &[]) == Some(2.0)
            && series(&text, "outbox_oldest_unpublished_age_seconds", &[]).is_some_and(|age| age >= 3600.0)
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
    metrics_show(http.port(), WAIT, &[("outbox_unpublished_events", &[], 8.0)]).await;

    // The sink is not usable (missing exchange): alive, but not ready, and
    // the reason says why.
    let (status, _) = http_get_at(http, "/healthz", Duration::from_secs(10))
        .await
        .expect("healthz answers");
    assert_eq!(status, 200);
    let (status, body) = http_get_at(http, "/readyz", Duration::from_secs(10))
        .await
        .expect("readyz answers");
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
        http_get_at(http, "/readyz", Duration::from_secs(10))
            .await
            .is_some_and(|(status, _)| status == expected)
    };
    eventually(WAIT, "ready with the broker reachable", || ready(200)).await;

    proxy.refuse(true);
    proxy.cut();
    eventually(WAIT, "not ready while the broker is unreachable", || ready(503)).await;
    let (_, reason) = http_get_at(http, "/readyz", Duration::from_secs(10))
        .await
        .expect("readyz answers");
    assert!(reason.contains("rabbitmq"), "the reason names the sink: {reason}");
    assert!(
        !reason.contains("guest:guest"),
        "no credentials in the reason: {reason}"
    );
    let (status, _) = http_get_at(http, "/healthz", Duration::from_secs(10))
        .await
        .expect("healthz answers");
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
    metrics_show(
        http.port(),
        WAIT,
        &[("outbox_retention_deleted_total", &[], 2500.0)],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_runs_in_bounded_batches_on_one_replica_at_a_time() {
    let db = TestDb::migrated().await;
    Rows::pending(25).published_ago(8 * DAY).insert(&db).await;
    Rows::pending(3).published_ago(HOUR).insert(&db).await;
    let store = store(&db);
    let metrics = Metrics::new().source(None);
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
    let pass = retention::run_pass(&store, seven_days, 10, &metrics, &CatchUp::default(), &shutdown)
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
    // While the relay catches up with a backlog the pass gives way between
    // batches, and still deletes everything due.
    let catch_up = CatchUp::default();
    catch_up.full_claim();
    let pass = retention::run_pass(&store, seven_days, 10, &metrics, &catch_up, &shutdown)
        .await
        .expect("pass");
    assert_eq!(
        (pass.deleted, pass.batches, pass.busy),
        (25, 3, false),
        "10 + 10 + a short batch of 5"
    );
    assert!(pass.paused > Duration::ZERO, "{pass:?}");
    assert_eq!(metrics.retention_deleted_total.get(), 25);
    assert_eq!(db.count("TRUE").await, 3);

    let pass = retention::run_pass(&store, seven_days, 10, &metrics, &CatchUp::default(), &shutdown)
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
