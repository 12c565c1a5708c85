//! Relays behind PgBouncer in transaction mode (`OUTBOX_DATABASE_POOLER=
//! transaction`): a PgBouncer of the test's own in front of the shared
//! PostgreSQL, with a pool of four server connections for many relay
//! connections.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::servers::PgBouncer;
use common::{eventually, pg_admin_url, quick_settings, RelayProcess, TestBroker, TestDb};

const EVENTS: usize = 20_000;
/// `default_pool_size`: server connections per database and user.
const SERVER_CONNECTIONS: u32 = 4;

/// `outbox-relay run` with `env`, its log kept for assertions.
fn start_relay(
    db: &TestDb,
    env: &[(&'static str, String)],
    log: Arc<Mutex<String>>,
) -> (RelayProcess, JoinHandle<()>) {
    RelayProcess::start_reading_log(db, env, move |line| {
        let mut log = log.lock().unwrap();
        log.push_str(line);
        log.push('\n');
    })
}

/// What a client of the pool reads for the relay's settings,
/// each `SHOW` in a transaction of its own, so on whichever server
/// connection PgBouncer hands out.
async fn relay_settings_seen(client: &tokio_postgres::Client) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    for setting in [
        "plan_cache_mode",
        "enable_bitmapscan",
        "statement_timeout",
        "synchronous_commit",
    ] {
        let rows = client
            .simple_query(&format!("SHOW {setting}"))
            .await
            .expect("SHOW through PgBouncer");
        for message in rows {
            if let tokio_postgres::SimpleQueryMessage::Row(row) = message {
                seen.push((setting.to_owned(), row.get(0).unwrap_or_default().to_owned()));
            }
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn two_relays_deliver_through_a_transaction_pooler_and_leave_no_settings_behind() {
    let db = TestDb::create().await;
    let bouncer = PgBouncer::start(&pg_admin_url(), SERVER_CONNECTIONS);
    let pooled = bouncer.url_for(&db.url);
    let through_pooler = [
        ("OUTBOX_DATABASE_URL", pooled.clone()),
        ("OUTBOX_DATABASE_POOLER", "transaction".to_owned()),
    ];

    // `migrate` works through the pooler: one transaction, a
    // transaction-level lock, unnamed statements.
    let env: Vec<(&str, &str)> = through_pooler.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let migrate = db
        .relay_command(&["migrate"], &env)
        .output()
        .expect("run migrate");
    assert!(
        migrate.status.success(),
        "migrate through PgBouncer: {}\nPgBouncer log:\n{}",
        String::from_utf8_lossy(&migrate.stderr),
        bouncer.log()
    );

    let broker = TestBroker::create("pooled.#").await;
    let ids: HashSet<String> = db
        .insert_events(EVENTS, "pooled.created")
        .await
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut env = quick_settings();
    env.extend(broker.env());
    env.extend(through_pooler.iter().cloned());
    let log = Arc::new(Mutex::new(String::new()));
    let (relays, readers): (Vec<_>, Vec<_>) = (0..2).map(|_| start_relay(&db, &env, log.clone())).unzip();

    // Another client of the same pool, all along.
    let (observer, connection) = tokio_postgres::connect(&pooled, tokio_postgres::NoTls)
        .await
        .expect("connect through PgBouncer");
    tokio::spawn(connection);
    let watching = tokio::spawn(async move {
        let mut seen = HashSet::new();
        for _ in 0..200 {
            seen.extend(relay_settings_seen(&observer).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (observer, seen)
    });

    let started = std::time::Instant::now();
    let received = broker.receive(EVENTS, Duration::from_secs(300)).await;
    eprintln!(
        "{} events delivered through PgBouncer ({SERVER_CONNECTIONS} server connections, two relays) in {:.1} s",
        received.len(),
        started.elapsed().as_secs_f64()
    );
    let delivered: HashSet<String> = received.iter().map(|m| m.message_id.clone()).collect();
    assert_eq!(delivered.len(), EVENTS, "every event delivered once at least");
    assert_eq!(delivered, ids);
    eventually(Duration::from_secs(30), "every row marked published", || async {
        db.count("published_at IS NULL").await == 0
    })
    .await;

    // No LISTEN went through the pooler (it could never fire there).
    let listening: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND query ILIKE 'LISTEN%'",
            &[&db.name],
        )
        .await
        .expect("pg_stat_activity")
        .get(0);
    assert_eq!(listening, 0, "a LISTEN reached the server through PgBouncer");

    let (observer, mut seen) = watching.await.expect("observer");
    // And afterwards, from several transactions.
    for _ in 0..20 {
        seen.extend(relay_settings_seen(&observer).await);
    }
    let defaults: HashSet<(String, String)> = [
        ("plan_cache_mode".to_owned(), "auto".to_owned()),
        ("enable_bitmapscan".to_owned(), "on".to_owned()),
        ("statement_timeout".to_owned(), "0".to_owned()),
        ("synchronous_commit".to_owned(), "on".to_owned()),
    ]
    .into();
    assert_eq!(
        seen, defaults,
        "another client of the pool saw the relay's settings"
    );

    drop(relays);
    for reader in readers {
        reader.join().expect("log reader");
    }
    broker.cleanup().await;
    let log = log.lock().unwrap().clone();
    assert!(
        !log.contains("prepared statement"),
        "prepared statement errors through PgBouncer:\n{log}"
    );
    // Each relay says once, at start-up, that it polls (the `report`
    // field names the line, not its wording).
    let polling = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| {
            let fields = entry.get("fields").unwrap_or(entry);
            fields["report"] == "polling_without_listen"
        })
        .count();
    assert_eq!(polling, 2, "one polling notice per relay:\n{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn behind_a_transaction_pooler_new_rows_wake_the_relay_through_the_direct_listen_url() {
    let db = TestDb::create().await;
    let bouncer = PgBouncer::start(&pg_admin_url(), SERVER_CONNECTIONS);
    let pooled = bouncer.url_for(&db.url);
    let migrate = db
        .relay_command(
            &["migrate"],
            &[
                ("OUTBOX_DATABASE_URL", &pooled),
                ("OUTBOX_DATABASE_POOLER", "transaction"),
            ],
        )
        .output()
        .expect("run migrate");
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let broker = TestBroker::create("woken.#").await;
    let mut env = broker.env();
    env.extend([
        ("OUTBOX_DATABASE_URL", pooled.clone()),
        ("OUTBOX_DATABASE_POOLER", "transaction".to_owned()),
        ("OUTBOX_LISTEN_DATABASE_URL", db.url.clone()),
        // Far longer than the test may wait: only a notification can wake
        // the relay in time.
        ("OUTBOX_POLL_INTERVAL", "10m".to_owned()),
    ]);
    let relay = RelayProcess::start(&db, &env);
    eventually(
        Duration::from_secs(30),
        "the relay LISTENs on the direct URL",
        || async {
            let listening: i64 = db
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = $1 AND application_name = 'outbox-relay' AND query ILIKE 'LISTEN%'",
                    &[&db.name],
                )
                .await
                .expect("pg_stat_activity")
                .get(0);
            listening == 1
        },
    )
    .await;
    let ids = db.insert_events(1, "woken.created").await;
    let received = broker.receive(1, Duration::from_secs(30)).await;
    assert_eq!(received.len(), 1, "the notification woke the relay");
    assert_eq!(received[0].message_id, ids[0].to_string());
    drop(relay);
    broker.cleanup().await;
}
