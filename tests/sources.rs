//! Many sources: one relay serving several databases, each a `[[source]]`
//! of its configuration file, against the real PostgreSQL, RabbitMQ and
//! SQS emulator (moto, started by `scripts/test`).
//!
//! - Three sources (three databases, one with a schema-qualified table, one
//!   behind the test's proxy) routed to two destinations: `migrate` sets
//!   up all three, every event of every source is delivered once, and the
//!   logs and the metrics name each event's source.
//! - One source's database cut off, made read-only, or its table gone,
//!   while the other two drain: they deliver everything meanwhile,
//!   `/readyz` stays 200 and names the faulty source, its
//!   `outbox_source_ready` is 0, its outage is logged once; once its
//!   database is back it recovers by itself, with nothing lost and no
//!   attempt charged. (Rates are the benchmark's: `scripts/bench`.)
//! - The admin commands with `--source`, `status` of every source, and
//!   the errors of a `--source` that cannot be used.
//!
//! Each test has its own databases, queues and exchanges, so they run in
//! parallel.

mod common;

use std::collections::{HashMap, HashSet};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::config_file::{destination, route, ConfigFile};
use common::proxy::Proxy;
use common::rows::Rows;
use common::sqs::{aws_env, SqsReceived, TestQueue};
use common::system::free_port;
use common::{eventually, http_get, metrics_show, RelayProcess, TestBroker, TestDb};
use serde_json::Value;
use uuid::Uuid;

/// Deadline of every wait; a passing test never waits this long.
const WAIT: Duration = Duration::from_secs(120);

/// How long a fault is held once the other sources have drained, for the
/// faulty source's state to show and for its relay to retry a few times.
const HOLD: Duration = Duration::from_secs(3);

// ----------------------------------------------------------------- world

/// Three producer databases: `orders` (a plain table), `billing` (its
/// table `sales.outbox_event`) and `shipping` (reached by the relay
/// through [`World::proxy`] only).
struct World {
    orders: TestDb,
    billing: TestDb,
    shipping: TestDb,
    proxy: Proxy,
    /// `shipping`'s URL through the proxy.
    shipping_via: String,
}

impl World {
    async fn create() -> Self {
        let (orders, billing, shipping) = tokio::join!(TestDb::create(), TestDb::create(), TestDb::create());
        billing
            .client
            .batch_execute("CREATE SCHEMA sales")
            .await
            .expect("create the schema");
        let (proxy, shipping_via) = Proxy::in_front_of(&shipping.url).await;
        Self {
            orders,
            billing,
            shipping,
            proxy,
            shipping_via,
        }
    }

    /// The sources' database URLs, as the file's `${VAR}`s name them.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ORDERS_URL", self.orders.url.clone()),
            ("BILLING_URL", self.billing.url.clone()),
            ("SHIPPING_URL", self.shipping_via.clone()),
        ]
    }

    /// Each source's name and database.
    fn sources(&self) -> [(&'static str, &TestDb); 3] {
        [
            ("orders", &self.orders),
            ("billing", &self.billing),
            ("shipping", &self.shipping),
        ]
    }

    /// After `migrate`: the test's own queries on `billing` reach
    /// `sales.outbox_event` by its plain name.
    async fn migrated(self, file: &ConfigFile) -> Self {
        let out = relay_output(&["migrate"], file, &self.env(), &[]);
        assert!(
            out.status.success(),
            "migrate of every source failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for (name, db) in self.sources() {
            let table = if name == "billing" {
                "sales.outbox_event"
            } else {
                "outbox_event"
            };
            let exists: Vec<Option<String>> = db
                .column(&format!("SELECT to_regclass('{table}')::text"), &[])
                .await;
            assert!(exists[0].is_some(), "migrate created {table} of source {name}");
        }
        self.billing
            .client
            .batch_execute("SET search_path TO sales, public")
            .await
            .expect("search_path");
        self
    }
}

/// The `[[source]]` tables of [`World`], after the top-level settings that
/// make a relay react quickly.
fn sources_toml() -> String {
    "poll_interval = \"50ms\"\nbackoff_base = \"100ms\"\nbackoff_max = \"500ms\"\n\n\
     [[source]]\nname = \"orders\"\ndatabase_url = \"${ORDERS_URL}\"\n\n\
     [[source]]\nname = \"billing\"\ndatabase_url = \"${BILLING_URL}\"\ntable = \"sales.outbox_event\"\n\n\
     [[source]]\nname = \"shipping\"\ndatabase_url = \"${SHIPPING_URL}\"\nworkers = 1\n\n"
        .to_owned()
}

/// Runs the relay binary with `args`, `file` as its configuration, `env`
/// and `more`, and nothing else of the test's environment but `PATH`.
fn relay_output(args: &[&str], file: &ConfigFile, env: &[(&str, String)], more: &[(&str, &str)]) -> Output {
    let mut command = Command::new(common::relay_bin());
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("OUTBOX_CONFIG", file.path_str());
    for (key, value) in env {
        command.env(key, value);
    }
    for (key, value) in more {
        command.env(key, value);
    }
    command.output().expect("run outbox-relay")
}

/// The relay's log, as JSON values, shared with the thread reading it.
type Log = Arc<Mutex<Vec<Value>>>;

/// Starts `outbox-relay run` with `file` and the emulator's credentials,
/// its HTTP endpoints on `port`, logging JSON at debug level into the
/// returned log.
fn start_relay(world: &World, file: &ConfigFile, port: u16) -> (RelayProcess, Log) {
    let log: Log = Arc::default();
    let mut env = vec![("OUTBOX_HTTP_ADDR", format!("127.0.0.1:{port}"))];
    env.extend(world.env());
    env.extend(aws_env());
    env.push(("OUTBOX_CONFIG", file.path_str().to_owned()));
    env.push(("RUST_LOG", "info,outbox_relay=debug".to_owned()));
    let (relay, _reader) = RelayProcess::start_reading_log(&world.orders, &env, {
        let log = log.clone();
        move |line| {
            if let Ok(entry) = serde_json::from_str::<Value>(line) {
                log.lock().expect("log").push(entry);
            }
        }
    });
    (relay, log)
}

/// The source a log entry was written for: its innermost span's `source`.
fn source_of(entry: &Value) -> Option<&str> {
    entry["span"]["source"].as_str()
}

// ------------------------------------------------------------------- HTTP

/// The `/readyz` line about source `name`.
fn source_line<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    let prefix = format!("source {name}: ");
    body.lines().find(|line| line.starts_with(&prefix))
}

/// Whether `/readyz` answers 200 with `down` not ready and every other
/// source of the world ready.
async fn ready_without(port: u16, down: &str) -> bool {
    let Some((200, body)) = http_get(port, "/readyz").await else {
        return false;
    };
    ["orders", "billing", "shipping"].iter().all(|name| {
        let line = source_line(&body, name);
        if *name == down {
            line.is_some_and(|line| line.starts_with(&format!("source {name}: not ready: ")))
        } else {
            line == Some(format!("source {name}: ready").as_str())
        }
    })
}

// --------------------------------------------------------------- receiving

/// Receives from `broker` until every id of `expected` arrived or [`WAIT`]
/// passed; returns every message id received.
async fn rabbit_receive(broker: &TestBroker, expected: &HashSet<String>) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    let mut received: Vec<String> = Vec::new();
    let mut distinct: HashSet<String> = HashSet::new();
    while !expected.is_subset(&distinct) && Instant::now() < deadline {
        let missing = expected.difference(&distinct).count();
        let batch = broker.receive_ids(missing, Duration::from_secs(2)).await;
        distinct.extend(batch.iter().cloned());
        received.extend(batch);
    }
    received
}

fn id_set(ids: &[Uuid]) -> HashSet<String> {
    ids.iter().map(Uuid::to_string).collect()
}

/// Asserts every id of `want` was received exactly once and nothing else.
fn exactly_once(what: &str, got: &[String], want: &HashSet<String>) {
    let distinct: HashSet<String> = got.iter().cloned().collect();
    assert_eq!(&distinct, want, "{what}: exactly the events routed there");
    assert_eq!(got.len(), want.len(), "{what}: each event once");
}

async fn all_published(db: &TestDb, ids: &[Uuid], what: &str) {
    eventually(WAIT, what, || async {
        count_of(db, ids, "published_at IS NOT NULL").await == ids.len() as i64
    })
    .await;
}

async fn count_of(db: &TestDb, ids: &[Uuid], condition: &str) -> i64 {
    db.client
        .query_one(
            &format!("SELECT count(*) FROM outbox_event WHERE id = ANY($1) AND {condition}"),
            &[&ids],
        )
        .await
        .expect("count rows")
        .get(0)
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread")]
async fn three_sources_to_two_destinations_deliver_every_event_once_under_its_source() {
    let broker = TestBroker::create("#").await;
    let queue = TestQueue::create(false, None).await;
    let port = free_port();
    // Created events go to RabbitMQ and the rest to SQS, but shipping's
    // own route sends all of its events to RabbitMQ.
    let file = ConfigFile::write(&format!(
        "{}{}\n{}\n{}\n{}\n[[route]]\nsource = \"shipping\"\nevent_type = \"*\"\ndestination = \"events\"\n",
        sources_toml(),
        destination("events", "rabbitmq", &broker.destination_settings()),
        destination("audit", "sqs", &queue.destination_settings()),
        route("*.created", "events"),
        route("*", "audit"),
    ));
    let world = World::create().await.migrated(&file).await;

    let order_created = world.orders.insert_events(30, "order.created").await;
    let order_paid = world.orders.insert_events(20, "order.paid").await;
    let invoice_created = world.billing.insert_events(25, "invoice.created").await;
    let invoice_sent = world.billing.insert_events(15, "invoice.sent").await;
    let parcel_sent = world.shipping.insert_events(20, "parcel.sent").await;
    let (_relay, log) = start_relay(&world, &file, port);

    let to_events: HashSet<String> = [&order_created, &invoice_created, &parcel_sent]
        .into_iter()
        .flat_map(|ids| id_set(ids))
        .collect();
    let to_audit: HashSet<String> = [&order_paid, &invoice_sent]
        .into_iter()
        .flat_map(|ids| id_set(ids))
        .collect();
    let got_events = rabbit_receive(&broker, &to_events).await;
    let got_audit: Vec<String> = queue
        .receive(to_audit.len(), WAIT)
        .await
        .iter()
        .map(SqsReceived::event_id)
        .collect();
    let orders = [order_created.clone(), order_paid.clone()].concat();
    let billing = [invoice_created.clone(), invoice_sent.clone()].concat();
    for (name, db, ids) in [
        ("orders", &world.orders, &orders),
        ("billing", &world.billing, &billing),
        ("shipping", &world.shipping, &parcel_sent),
    ] {
        all_published(db, ids, &format!("every row of source {name} published")).await;
        assert_eq!(
            count_of(db, ids, "attempt_count = 1").await,
            ids.len() as i64,
            "{name}: one attempt each"
        );
    }
    // Nothing more can come: every message was confirmed before its row
    // was marked.
    got_events_more(&broker, &got_events, &to_events).await;
    exactly_once("RabbitMQ (events)", &got_events, &to_events);
    exactly_once("SQS (audit)", &got_audit, &to_audit);

    // The metrics name each event's source and destination.
    let published = "outbox_events_published_total";
    let from_to = |source, destination| [("source", source), ("destination", destination)];
    metrics_show(
        port,
        WAIT,
        &[
            (
                published,
                &from_to("orders", "events"),
                order_created.len() as f64,
            ),
            (published, &from_to("orders", "audit"), order_paid.len() as f64),
            (
                published,
                &from_to("billing", "events"),
                invoice_created.len() as f64,
            ),
            (published, &from_to("billing", "audit"), invoice_sent.len() as f64),
            (
                published,
                &from_to("shipping", "events"),
                parcel_sent.len() as f64,
            ),
            (published, &from_to("shipping", "audit"), 0.0),
            ("outbox_source_ready", &[("source", "orders")], 1.0),
            ("outbox_source_ready", &[("source", "billing")], 1.0),
            ("outbox_source_ready", &[("source", "shipping")], 1.0),
            ("outbox_unpublished_events", &[("source", "billing")], 0.0),
        ],
    )
    .await;
    let (status, body) = http_get(port, "/readyz").await.expect("/readyz answers");
    assert_eq!(status, 200, "{body}");
    for name in ["orders", "billing", "shipping"] {
        assert_eq!(
            source_line(&body, name),
            Some(format!("source {name}: ready").as_str()),
            "{body}"
        );
    }

    // The log's batch reports carry their source: what each source's
    // batches published adds up to its events.
    let mut published_by_source: HashMap<String, u64> = HashMap::new();
    for entry in log.lock().expect("log").iter() {
        if entry["report"] == "batch_recorded" {
            let source =
                source_of(entry).unwrap_or_else(|| panic!("a batch report without its source: {entry}"));
            *published_by_source.entry(source.to_owned()).or_default() +=
                entry["published"].as_u64().unwrap_or(0);
        }
    }
    assert_eq!(
        published_by_source,
        HashMap::from([
            ("orders".to_owned(), orders.len() as u64),
            ("billing".to_owned(), billing.len() as u64),
            ("shipping".to_owned(), parcel_sent.len() as u64),
        ]),
        "events published per source, as the log's batch reports say"
    );
    broker.cleanup().await;
    queue.cleanup().await;
}

/// Receives for a moment more, so a duplicate delivered after the last
/// expected id shows up in `got`'s count.
async fn got_events_more(broker: &TestBroker, got: &[String], expected: &HashSet<String>) {
    let late = broker.receive_ids(1, Duration::from_secs(1)).await;
    assert!(
        late.is_empty(),
        "after {} of {} messages, more arrived: {late:?}",
        got.len(),
        expected.len()
    );
}

/// What happens to the shipping source.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Its connections cut and new ones refused (the proxy).
    Cut,
    /// Its database made read-only (as a standby after a failover is):
    /// every session the relay opens from then on refuses writes.
    ReadOnly,
    /// Its table gone (renamed away, with its rows, and back).
    TableGone,
}

impl Fault {
    async fn begin(self, world: &World) {
        let shipping = &world.shipping;
        match self {
            Fault::Cut => {
                world.proxy.refuse(true);
                world.proxy.cut();
            }
            Fault::ReadOnly => {
                shipping
                    .client
                    .batch_execute(&format!(
                        "ALTER DATABASE {} SET default_transaction_read_only = on",
                        shipping.name
                    ))
                    .await
                    .expect("make the database read-only");
                // The setting holds for new sessions: the relay's must be.
                shipping.terminate_relay_backends().await;
            }
            Fault::TableGone => shipping
                .client
                .batch_execute("ALTER TABLE outbox_event RENAME TO outbox_event_away")
                .await
                .expect("take the table away"),
        }
    }

    /// Inserts `count` events into the shipping source while the fault
    /// lasts (the test's own session is direct and writable).
    async fn insert(self, world: &World, count: usize) -> Vec<Uuid> {
        let shipping = &world.shipping;
        match self {
            Fault::TableGone => {
                let ids: Vec<Uuid> = (0..count).map(|_| Uuid::new_v4()).collect();
                shipping
                    .client
                    .execute(
                        "INSERT INTO outbox_event_away (id, event_type, aggregate_id, payload)
                         SELECT id, 'parcel.sent', 'parcel', '{}' FROM unnest($1::uuid[]) AS u(id)",
                        &[&ids],
                    )
                    .await
                    .expect("insert into the table away");
                ids
            }
            Fault::Cut | Fault::ReadOnly => shipping.insert_events(count, "parcel.sent").await,
        }
    }

    /// Ends the fault, without touching the relay: it must find out.
    async fn end(self, world: &World) {
        let shipping = &world.shipping;
        match self {
            Fault::Cut => world.proxy.refuse(false),
            Fault::ReadOnly => shipping
                .client
                .batch_execute(&format!(
                    "ALTER DATABASE {} RESET default_transaction_read_only",
                    shipping.name
                ))
                .await
                .expect("make the database writable"),
            Fault::TableGone => shipping
                .client
                .batch_execute("ALTER TABLE outbox_event_away RENAME TO outbox_event")
                .await
                .expect("bring the table back"),
        }
    }
}

/// The relay's log entries for source `name` from `from` on that report its
/// claims' database as unavailable, and as back.
fn outage_reports(log: &Log, from: usize, name: &str) -> (usize, usize) {
    let log = log.lock().expect("log");
    let of_claims = |entry: &&Value| source_of(entry) == Some(name) && entry["dependency"] == "database";
    let down = log[from..]
        .iter()
        .filter(of_claims)
        .filter(|entry| entry["level"] == "WARN")
        .count();
    let back = log[from..]
        .iter()
        .filter(of_claims)
        .filter(|entry| entry["level"] == "INFO")
        .count();
    (down, back)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_source_cut_off_read_only_or_without_its_table_holds_back_only_itself_and_recovers() {
    let broker = TestBroker::create("#").await;
    let port = free_port();
    let file = ConfigFile::write(&format!(
        "{}{}",
        sources_toml(),
        destination("events", "rabbitmq", &broker.destination_settings()),
    ));
    let world = World::create().await.migrated(&file).await;
    let (_relay, log) = start_relay(&world, &file, port);
    eventually(WAIT, "every source ready", || async {
        matches!(http_get(port, "/readyz").await, Some((200, body)) if ["orders", "billing", "shipping"]
            .iter()
            .all(|name| source_line(&body, name) == Some(format!("source {name}: ready").as_str())))
    })
    .await;

    for fault in [Fault::Cut, Fault::ReadOnly, Fault::TableGone] {
        eprintln!("fault: {fault:?}");
        let log_from = log.lock().expect("log").len();
        fault.begin(&world).await;
        let orders = world.orders.insert_events(200, "order.created").await;
        let billing = world.billing.insert_events(200, "invoice.created").await;
        let shipping = fault.insert(&world, 50).await;
        let expected: HashSet<String> = id_set(&orders).union(&id_set(&billing)).cloned().collect();

        // The others drain while shipping is down.
        let got = rabbit_receive(&broker, &expected).await;
        exactly_once(&format!("{fault:?}: the other sources' events"), &got, &expected);
        all_published(&world.orders, &orders, "orders drained").await;
        all_published(&world.billing, &billing, "billing drained").await;
        eventually(
            WAIT,
            &format!("{fault:?}: /readyz 200 with shipping not ready"),
            || ready_without(port, "shipping"),
        )
        .await;
        metrics_show(
            port,
            WAIT,
            &[
                ("outbox_source_ready", &[("source", "shipping")], 0.0),
                ("outbox_source_ready", &[("source", "orders")], 1.0),
                ("outbox_source_ready", &[("source", "billing")], 1.0),
            ],
        )
        .await;
        tokio::time::sleep(HOLD).await;
        let table = if matches!(fault, Fault::TableGone) {
            "outbox_event_away"
        } else {
            "outbox_event"
        };
        let untouched: i64 = world
            .shipping
            .client
            .query_one(
                &format!(
                    "SELECT count(*) FROM {table} WHERE id = ANY($1)
                     AND published_at IS NULL AND attempt_count = 0 AND quarantined_at IS NULL"
                ),
                &[&shipping],
            )
            .await
            .expect("count shipping's rows")
            .get(0);
        assert_eq!(
            untouched,
            shipping.len() as i64,
            "{fault:?}: shipping's rows wait, uncharged"
        );

        // Back: shipping recovers by itself, nothing lost, nothing charged.
        fault.end(&world).await;
        let got = rabbit_receive(&broker, &id_set(&shipping)).await;
        all_published(
            &world.shipping,
            &shipping,
            &format!("{fault:?}: shipping recovered"),
        )
        .await;
        exactly_once(&format!("{fault:?}: shipping's events"), &got, &id_set(&shipping));
        assert_eq!(
            count_of(
                &world.shipping,
                &shipping,
                "attempt_count = 1 AND quarantined_at IS NULL"
            )
            .await,
            shipping.len() as i64,
            "{fault:?}: one attempt each, the one that published"
        );
        metrics_show(
            port,
            WAIT,
            &[("outbox_source_ready", &[("source", "shipping")], 1.0)],
        )
        .await;
        eventually(WAIT, "the recovery logged", || async {
            outage_reports(&log, log_from, "shipping").1 >= 1
        })
        .await;
        assert_eq!(
            outage_reports(&log, log_from, "shipping"),
            (1, 1),
            "{fault:?}: the outage of shipping's claims logged once, and its end once"
        );
        for name in ["orders", "billing"] {
            assert_eq!(
                outage_reports(&log, log_from, name),
                (0, 0),
                "{fault:?}: {name} had no outage"
            );
        }
    }
    assert_eq!(
        world.orders.count("quarantined_at IS NOT NULL").await
            + world.billing.count("quarantined_at IS NOT NULL").await
            + world.shipping.count("quarantined_at IS NOT NULL").await,
        0,
        "nothing quarantined"
    );
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_commands_act_on_the_source_named_and_status_on_every_source() {
    let file = ConfigFile::write(&sources_toml());
    let world = World::create().await.migrated(&file).await;
    let env = world.env();
    Rows::pending(3).insert(&world.orders).await;
    let orders_quarantined = Rows::pending(1)
        .quarantined("rejected")
        .insert(&world.orders)
        .await;
    let billing_quarantined = Rows::pending(2)
        .quarantined("rejected")
        .insert(&world.billing)
        .await;
    Rows::pending(4).published_ago(60).insert(&world.billing).await;

    // status: every source, in the file's order, each naming itself.
    let out = relay_output(&["status", "--json"], &file, &env, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let sources = status["sources"].as_array().expect("a list of sources");
    let summary: Vec<(String, i64, i64)> = sources
        .iter()
        .map(|source| {
            (
                source["source"].as_str().unwrap_or_default().to_owned(),
                source["unpublished"].as_i64().unwrap_or(-1),
                source["quarantined"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("orders".to_owned(), 3, 1),
            ("billing".to_owned(), 0, 2),
            ("shipping".to_owned(), 0, 0)
        ],
        "{status}"
    );
    let out = relay_output(&["status"], &file, &env, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for name in ["orders", "billing", "shipping"] {
        assert!(
            text.lines()
                .any(|line| line.starts_with("source") && line.ends_with(name)),
            "status names source {name}:\n{text}"
        );
    }
    assert!(text.contains("sales.outbox_event"), "billing's table:\n{text}");
    let out = relay_output(&["status", "--source", "billing", "--json"], &file, &env, &[]);
    let billing: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        (billing["source"].as_str(), billing["quarantined"].as_i64()),
        (Some("billing"), Some(2)),
        "{billing}"
    );

    // A source unreachable: status shows the others and exits 1.
    world.proxy.refuse(true);
    let out = relay_output(&["status", "--json"], &file, &env, &[]);
    world.proxy.refuse(false);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["sources"][0]["unpublished"], 3, "{status}");
    assert!(status["sources"][2]["error"].is_string(), "{status}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("shipping"));

    // quarantine list: one source's rows, each naming it.
    let out = relay_output(
        &["quarantine", "list", "--source", "billing", "--json"],
        &file,
        &env,
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let listed = listed.as_array().expect("a list");
    let ids: HashSet<String> = listed
        .iter()
        .map(|row| row["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, id_set(&billing_quarantined));
    assert!(listed.iter().all(|row| row["source"] == "billing"), "{listed:?}");

    // quarantine release on one source leaves the other's rows alone.
    let out = relay_output(
        &["quarantine", "release", "--source", "orders", "--all"],
        &file,
        &env,
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("source orders"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        count_of(&world.orders, &orders_quarantined, "quarantined_at IS NULL").await,
        1
    );
    assert_eq!(world.billing.count("quarantined_at IS NOT NULL").await, 2);

    // replay on one source.
    let since = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let out = relay_output(
        &["replay", "--source", "billing", "--since", &since],
        &file,
        &env,
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        world
            .billing
            .count("published_at IS NULL AND quarantined_at IS NULL")
            .await,
        4
    );

    // check: every source and its line.
    let out = relay_output(&["check"], &file, &env, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["orders", "billing", "shipping"] {
        assert!(
            stdout.contains(&format!("source {name}")),
            "check names source {name}:\n{stdout}"
        );
    }

    // The errors: exit 2, one line saying what to do.
    for (args, says) in [
        (
            vec!["quarantine", "list"],
            "several sources (orders, billing, shipping); name the one",
        ),
        (vec!["replay", "--since", since.as_str()], "several sources"),
        (
            vec!["status", "--source", "nope"],
            "no source is named \"nope\" (they are: orders, billing, shipping)",
        ),
    ] {
        let out = relay_output(&args, &file, &env, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let plain = ConfigFile::write("workers = 1\n");
    let out = relay_output(
        &["status", "--source", "orders"],
        &plain,
        &[],
        &[("OUTBOX_DATABASE_URL", &world.orders.url)],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("has no [[source]] tables"), "{stderr}");
}
