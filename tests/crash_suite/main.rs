//! Crash safety under chaos: three relays (the real binary) on one table
//! while a producer writes events, relays SIGKILLed and restarted at
//! random, their broker connections cut and their database backends
//! terminated. Then the chaos stops, the relays finish, and the suite
//! checks what a user relies on:
//!
//! - every row is published, none quarantined — except the unroutable
//!   rows mixed in (1% of the RabbitMQ run, an event type no queue is
//!   bound to): none of those is ever marked published;
//! - every routable event reached the consumer, and nothing else did;
//! - duplicates happened only where a crash, a cut, a terminated backend
//!   or a failed publish left a publish unrecorded (bounded by the rows in
//!   flight at those moments), and never more often than the row was
//!   claimed;
//! - the consumer, deduplicating with `outbox_consumer`, applied
//!   every event exactly once, although the broker delivered duplicates
//!   and the consumer itself "crashed" (rolled back, or left a committed
//!   message unacknowledged) on some deliveries;
//! - every delivery carries its row's W3C `traceparent` header (SQS: message
//!   attribute) unchanged;
//! - with `OUTBOX_ORDERING=aggregate`, the first delivery of each event
//!   comes in `(created_at, id)` order within its aggregate.
//!
//! One variant runs on a private RabbitMQ node and a private PostgreSQL
//! cluster and has outages for chaos: memory alarms raised and cleared at
//! random (the node blocks every publisher), fast restarts of the
//! database, and cut connections. An outage is not the rows' fault: each
//! row ends with the one attempt that delivered it, and, three attempts
//! allowed, nothing is quarantined.
//!
//! One run publishes to NATS JetStream, which deduplicates on the event id
//! (`Nats-Msg-Id`) within the stream's duplicate window: there the stream
//! itself must hold every event exactly once, kills and cuts
//! notwithstanding.
//!
//! One run publishes to Kafka (librdkafka's mock cluster, three brokers
//! taken down and brought back at random): every event in the topic, and
//! every copy of a republished event the same record.
//!
//! One run routes the relays' database connections through PgBouncer in
//! transaction mode (`OUTBOX_DATABASE_POOLER=transaction`), with the same
//! chaos and the same checks.
//!
//! One run has routes: every relay reads a configuration file
//! (`OUTBOX_CONFIG`) with two RabbitMQ destinations, each a connection of
//! its own through the relay's proxy to the run's exchange, and a route to
//! each for one of the two event types the producer alternates between.
//! The same chaos (a cut takes both of a relay's connections) and the same
//! checks, and one more: each destination gives its messages a routing key
//! of its own, and every delivery of an event came with the key of the
//! destination its route names.
//!
//! One run has two sources: two relays each serve two databases
//! (`[[source]]` tables), each with its producer and its route (see
//! `sources.rs`).
//!
//! The chaos schedule comes from a seeded RNG; the seed is printed, and
//! `OUTBOX_CRASH_SEED=<seed>` replays the same schedule (the interleaving
//! with the processes still varies: it is timing).

// A test in a directory of its own reaches the tests' shared module only by
// its path.
#[path = "../common/mod.rs"]
mod common;

mod chaos;
mod consumers;
mod producer;
mod sources;
mod verify;

use std::collections::HashSet;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::private_postgres::PrivatePostgres;
use common::private_rabbit::PrivateRabbit;
use common::proxy::Proxy;
use common::servers::PgBouncer;
use common::sqs::TestQueue;
use common::system::{temp_dir, OwnedDir};
use common::{eventually, Stored, TestBroker, TestDb, TestStream};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use chaos::{all_published, outages, ChaosLog, Relays};
use consumers::{
    consumer_database, publish_fence, sqs_queue_empty, start_amqp_consumer, start_sqs_consumer, Ledger,
};
use producer::start_producer;

const RELAYS: usize = 3;
/// `OUTBOX_BATCH_SIZE` of every relay.
const BATCH: usize = 100;
/// Generous: only a broken relay gets near it.
const SETTLE: Duration = Duration::from_secs(180);
/// 1 s (lease 7 s) is enough for RabbitMQ to confirm a batch of 100 on a
/// quiet machine, but not on two cores shared with a parallel test run:
/// there batches time out although the broker took them, are published
/// again, and the extra messages slow the broker further (seen: every row
/// delivered twice, 50 attempts on one row). 2 s (lease 9 s) holds up.
const RABBITMQ_PUBLISH_TIMEOUT: &str = "2s";
/// PgBouncer's server connections in the run through it: fewer than the
/// relays' client connections (three relays, eleven each).
const PGBOUNCER_SERVER_CONNECTIONS: u32 = 6;

/// One run of the suite.
struct Scenario {
    name: &'static str,
    events: i64,
    aggregates: i64,
    /// The producer spreads its inserts over this long.
    produce_for: Duration,
    /// Chaos lasts at least this long, and until the producer is done.
    chaos_for: Duration,
    /// `OUTBOX_PUBLISH_TIMEOUT`; the claim lease is twice this plus 5 s.
    publish_timeout: &'static str,
    /// `OUTBOX_WORKERS`: the batches one relay may have published but not
    /// yet recorded at any moment.
    workers: usize,
    ordering: bool,
    /// Every n-th event (0: none) has an event type no queue is bound to.
    unroutable_every: i64,
    /// Every relay reads the configuration file of [`ROUTES`] (RabbitMQ
    /// only), and the producer writes the routes' event types in turn.
    routes: bool,
    /// `OUTBOX_MAX_ATTEMPTS`.
    max_attempts: u32,
    /// Outages only, on private servers: broker alarms, database restarts
    /// and cut connections, and no kills or terminated backends. A kill
    /// rightly charges an attempt to the rows in flight; without kills,
    /// an attempt charged beyond a row's delivery would be an outage
    /// charged to the row.
    outages: bool,
    /// The table is made by `migrate --partitioned hourly`, with a few
    /// narrow partitions by hand over the start of the producer's range,
    /// so rows lie in several partitions and in DEFAULT.
    partitioned: bool,
}

/// Enough that chaos never quarantines a row: every kill charges the rows
/// in flight.
const MANY_ATTEMPTS: u32 = 1000;

/// The main RabbitMQ run; the other runs say how they differ from it.
const MAIN_RUN: Scenario = Scenario {
    name: "rabbitmq",
    events: 20_000,
    aggregates: 200,
    produce_for: Duration::from_secs(15),
    chaos_for: Duration::from_secs(20),
    publish_timeout: RABBITMQ_PUBLISH_TIMEOUT,
    workers: 4,
    ordering: false,
    unroutable_every: 100,
    routes: false,
    max_attempts: MANY_ATTEMPTS,
    outages: false,
    partitioned: false,
};

impl Scenario {
    /// The event types the producer writes, in turn (but for the
    /// unroutable rows).
    fn event_types(&self) -> Vec<&'static str> {
        if self.routes {
            ROUTES.iter().map(|(event_type, _)| *event_type).collect()
        } else {
            vec![producer::EVENT_TYPE]
        }
    }
}

/// The routes of the run with routes, in the file's order: an event type
/// and the destination its route names.
const ROUTES: [(&str, &str); 2] = [("chaos.a", "a"), ("chaos.b", "b")];

/// The routing key an event of `event_type` gets from the destination its
/// route names (its name, a dot, the event type: `amqp_routing_key =
/// "a.{event_type}"`); `None` for a type no route matches.
fn routed_key(event_type: &str) -> Option<String> {
    ROUTES
        .iter()
        .find(|(routed, _)| *routed == event_type)
        .map(|(_, destination)| format!("{destination}.{event_type}"))
}

/// Writes the configuration file of [`ROUTES`], which every relay of the
/// run reads: two RabbitMQ destinations, each publishing to the exchange
/// `${CHAOS_AMQP_EXCHANGE}` through `${CHAOS_AMQP_URL}` (the relay's own
/// proxy, from its environment) with the routing key [`routed_key`]
/// says, and a route to each. Returns the file's directory, removed when
/// dropped, and the file's path.
fn write_routes_file() -> (OwnedDir, String) {
    let mut toml = String::new();
    for (_, destination) in ROUTES {
        toml.push_str(&format!(
            "[[destination]]\nname = \"{destination}\"\nsink = \"rabbitmq\"\n\
             amqp_url = \"${{CHAOS_AMQP_URL}}\"\namqp_exchange = \"${{CHAOS_AMQP_EXCHANGE}}\"\n\
             amqp_routing_key = \"{destination}.{{event_type}}\"\n\n"
        ));
    }
    for (event_type, destination) in ROUTES {
        toml.push_str(&format!(
            "[[route]]\nevent_type = \"{event_type}\"\ndestination = \"{destination}\"\n\n"
        ));
    }
    let dir = temp_dir("crash-suite-routes");
    let path = dir.path.join("outbox-relay.toml");
    std::fs::write(&path, toml).expect("write the configuration file");
    let path = path.to_str().expect("temporary paths are UTF-8").to_owned();
    (dir, path)
}

fn seed() -> u64 {
    std::env::var("OUTBOX_CRASH_SEED")
        .ok()
        .and_then(|raw| raw.parse().ok())
        .unwrap_or_else(rand::random)
}

/// Settings every relay of the suite shares: quick to react, and a short
/// claim lease (2 × the publish timeout + 5 s: a killed relay's rows come
/// back after at most that).
fn relay_settings(scenario: &Scenario) -> Vec<(&'static str, String)> {
    let mut env: Vec<(&'static str, String)> = [
        ("OUTBOX_PUBLISH_TIMEOUT", scenario.publish_timeout),
        ("OUTBOX_POLL_INTERVAL", "50ms"),
        ("OUTBOX_BACKOFF_BASE", "100ms"),
        ("OUTBOX_BACKOFF_MAX", "1s"),
        ("OUTBOX_RETENTION", "0"),
        // The suite reads the warnings (failed publishes) from the logs.
        ("RUST_LOG", "warn"),
    ]
    .into_iter()
    .map(|(key, value)| (key, value.to_owned()))
    .collect();
    env.push(("OUTBOX_MAX_ATTEMPTS", scenario.max_attempts.to_string()));
    env.push(("OUTBOX_BATCH_SIZE", BATCH.to_string()));
    env.push(("OUTBOX_WORKERS", scenario.workers.to_string()));
    if scenario.ordering {
        env.push(("OUTBOX_ORDERING", "aggregate".to_owned()));
    }
    env
}

/// One run of a scenario, from its seed to the checks: the part of the
/// flow every broker's run shares.
struct Run {
    scenario: Scenario,
    started: Instant,
    seed: u64,
    rng: StdRng,
    db: TestDb,
    /// The consumer's own database: `processed_message` and the effects.
    consumer_db: TestDb,
    ledger: Arc<Mutex<Ledger>>,
    /// Stops the consumer.
    stop: CancellationToken,
    /// When each phase ended, for the summary line.
    phases: Vec<(&'static str, Instant)>,
    /// The servers an outages scenario disturbs (`db` lives on the
    /// PostgreSQL one). Declared after the databases, so dropped after them.
    private: Option<(PrivatePostgres, PrivateRabbit)>,
}

impl Run {
    /// Draws (or replays) the seed and creates the databases.
    async fn begin(scenario: Scenario) -> Self {
        let started = Instant::now();
        let seed = seed();
        eprintln!(
            "crash suite [{}]: seed {seed} (OUTBOX_CRASH_SEED={seed} replays the chaos schedule)",
            scenario.name
        );
        let rng = StdRng::seed_from_u64(seed);
        // Outages disturb their servers: private ones. The consumer's
        // database stays on the shared server, out of their way.
        let private = if scenario.outages {
            Some(tokio::join!(PrivatePostgres::start(), PrivateRabbit::start("")))
        } else {
            None
        };
        let db = match &private {
            Some((postgres, _)) => postgres.migrated_database().await,
            None if scenario.partitioned => partitioned_database().await,
            None => TestDb::migrated().await,
        };
        // The producer writes a W3C traceparent into every row, which every
        // delivery must carry unchanged (see producer.rs).
        db.client
            .batch_execute("ALTER TABLE outbox_event ADD COLUMN headers JSONB")
            .await
            .expect("add the headers column");
        let consumer_db = consumer_database().await;
        Self {
            scenario,
            started,
            seed,
            rng,
            db,
            consumer_db,
            ledger: Arc::new(Mutex::new(Ledger::default())),
            stop: CancellationToken::new(),
            phases: Vec::new(),
            private,
        }
    }

    /// Starts the producer and the relays, each relay behind a proxy of its
    /// own to `broker` with the settings `sink_env` gives for that proxy;
    /// runs the chaos until the producer is done, then waits until every
    /// row is published and stops the relays.
    async fn relays_under_chaos(
        &mut self,
        broker: SocketAddr,
        sink_env: impl Fn(&Proxy) -> Vec<(&'static str, String)>,
    ) -> ChaosLog {
        let mut proxies = Vec::new();
        let mut settings = Vec::new();
        for _ in 0..RELAYS {
            let proxy = Proxy::start(broker).await;
            let mut env = relay_settings(&self.scenario);
            env.extend(sink_env(&proxy));
            settings.push(env);
            proxies.push(proxy);
        }
        let producer = start_producer(&self.db, &self.scenario);
        let mut relays = Relays::start(&self.db, settings, proxies);
        let until = Instant::now() + self.scenario.chaos_for;
        let mut chaos = match &self.private {
            Some((postgres, rabbit)) => {
                let (cuts, outages) = tokio::join!(
                    relays.chaos(&self.db, &mut self.rng, until, &producer, true),
                    outages(rabbit, postgres, self.seed, until, &producer)
                );
                ChaosLog {
                    cuts: cuts.cuts,
                    ..outages
                }
            }
            None => {
                relays
                    .chaos(&self.db, &mut self.rng, until, &producer, false)
                    .await
            }
        };
        producer.await.expect("producer");
        self.phases.push(("chaos over", Instant::now()));
        if chaos.restarts > 0 {
            self.db.reconnect().await;
        }
        all_published(&self.db).await;
        self.phases.push(("all published", Instant::now()));
        relays.stop(&mut chaos);
        eprintln!("crash suite [{}]: {chaos:?}", self.scenario.name);
        chaos
    }

    /// For the runs that read the broker back whole: every event the
    /// producer wrote (`rows`) is published, none quarantined, and the ids
    /// found in the broker's `place` are exactly those rows.
    async fn assert_every_event_published_and_in(
        &self,
        rows: &HashSet<String>,
        found: &HashSet<String>,
        place: &str,
    ) {
        assert_eq!(
            rows.len(),
            usize::try_from(self.scenario.events).unwrap(),
            "the producer inserted every event"
        );
        assert_eq!(
            self.db.count("quarantined_at IS NOT NULL").await,
            0,
            "nothing quarantined"
        );
        assert_eq!(
            self.db.count("published_at IS NULL").await,
            0,
            "every row published"
        );
        assert_eq!(
            found.difference(rows).count(),
            0,
            "nothing in the {place} that is not a row"
        );
        assert_eq!(
            rows.difference(found).count(),
            0,
            "0 lost: every event is in the {place}"
        );
    }

    /// Stops `consumer`, which has seen everything, and checks the run.
    async fn verify(
        mut self,
        consumer: tokio::task::JoinHandle<()>,
        chaos: ChaosLog,
        one_publish_per_attempt: bool,
    ) {
        self.phases.push(("all consumed", Instant::now()));
        self.stop.cancel();
        consumer.await.expect("consumer");
        let ledger = std::mem::take(&mut *self.ledger.lock().unwrap());
        verify::verify(&self, &ledger, &chaos, one_publish_per_attempt).await;
    }
}

/// A database whose outbox table `migrate --partitioned hourly` made, with
/// three 5-second partitions from an hour ago, where the producer's rows
/// begin (see producer.rs): its events fill those, then DEFAULT.
async fn partitioned_database() -> TestDb {
    let db = TestDb::create().await;
    let out = db
        .relay_command(&["migrate", "--partitioned", "hourly"], &[])
        .output()
        .expect("run migrate");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    db.client
        .batch_execute(
            "DO $$
             DECLARE
                 start timestamptz := date_trunc('second', now() - interval '1 hour');
             BEGIN
                 FOR i IN 0..2 LOOP
                     -- Never over the current hour's partition.
                     EXIT WHEN start + (i + 1) * interval '5 seconds' > date_trunc('hour', now());
                     EXECUTE format(
                         'CREATE TABLE outbox_event_chaos_%s PARTITION OF outbox_event FOR VALUES FROM (%L) TO (%L)',
                         i, start + i * interval '5 seconds', start + (i + 1) * interval '5 seconds');
                 END LOOP;
             END $$",
        )
        .await
        .expect("narrow partitions");
    db
}

fn amqp_addr(url: &str) -> SocketAddr {
    let url = url::Url::parse(url).expect("the AMQP URL is a URL");
    let host = url.host_str().expect("the AMQP URL has a host").to_owned();
    (host.as_str(), url.port().unwrap_or(5672))
        .to_socket_addrs()
        .expect("resolve RabbitMQ")
        .next()
        .expect("RabbitMQ has an address")
}

/// The URL of the RabbitMQ at `url`, through `proxy`.
fn amqp_via(proxy: &Proxy, url: &str) -> String {
    let mut url = url::Url::parse(url).expect("the AMQP URL is a URL");
    url.set_host(Some(&proxy.addr.ip().to_string())).expect("a host");
    url.set_port(Some(proxy.addr.port())).expect("a port");
    url.to_string()
}

async fn rabbitmq_under_chaos(scenario: Scenario) {
    rabbitmq_under_chaos_through(scenario, false).await;
}

/// With `through_pgbouncer`, the relays reach the database through a
/// PgBouncer of the run's own in transaction mode
/// (`OUTBOX_DATABASE_POOLER=transaction`), with fewer server connections
/// than relay connections; the backends the chaos terminates are then
/// PgBouncer's server connections.
async fn rabbitmq_under_chaos_through(scenario: Scenario, through_pgbouncer: bool) {
    let mut run = Run::begin(scenario).await;
    let bouncer = through_pgbouncer.then(|| {
        let admin_url = match &run.private {
            Some((postgres, _)) => postgres.admin_url(),
            None => common::pg_admin_url(),
        };
        PgBouncer::start(&admin_url, PGBOUNCER_SERVER_CONNECTIONS)
    });
    let database_env: Vec<(&'static str, String)> = match &bouncer {
        Some(bouncer) => vec![
            ("OUTBOX_DATABASE_URL", bouncer.url_for(&run.db.url)),
            ("OUTBOX_DATABASE_POOLER", "transaction".to_owned()),
        ],
        None => Vec::new(),
    };
    // The destinations of the run with routes put their name before the
    // event type in the routing key: bound to every key, the queue also
    // receives what a destination publishes that its route does not name,
    // for the checks to see.
    let binding = if run.scenario.routes { "#" } else { "chaos.#" };
    let broker = match &run.private {
        Some((_, rabbit)) => rabbit.broker(binding).await,
        None => TestBroker::create(binding).await,
    };
    let routes_file = run.scenario.routes.then(write_routes_file);
    let consumer = start_amqp_consumer(&broker, &run);
    let chaos = run
        .relays_under_chaos(amqp_addr(&broker.url), |proxy| {
            let via = amqp_via(proxy, &broker.url);
            let mut env = match &routes_file {
                // The relay is also given OUTBOX_AMQP_URL, the broker
                // itself (see TestDb::relay_command): with [[destination]]
                // tables it must not use it. Were it used, its messages
                // would bypass the proxy and go to no exchange of the run.
                Some((_, path)) => vec![
                    ("OUTBOX_CONFIG", path.clone()),
                    ("CHAOS_AMQP_URL", via),
                    ("CHAOS_AMQP_EXCHANGE", broker.exchange.clone()),
                ],
                None => {
                    let mut env = broker.env();
                    env.push(("OUTBOX_AMQP_URL", via));
                    env
                }
            };
            env.extend(database_env.iter().cloned());
            env
        })
        .await;
    publish_fence(&broker).await;
    eventually(SETTLE, "the consumer reached the fence", || async {
        let ledger = run.ledger.lock().unwrap();
        ledger.fence_seen && ledger.awaiting_redelivery == 0 && ledger.in_flight == 0
    })
    .await;
    run.verify(consumer, chaos, true).await;
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_relays_killed_and_cut_at_random_lose_nothing_and_effects_apply_once() {
    rabbitmq_under_chaos(MAIN_RUN).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_on_a_partitioned_table_relays_killed_and_cut_at_random_lose_nothing() {
    rabbitmq_under_chaos(Scenario {
        name: "rabbitmq-partitioned",
        partitioned: true,
        ..MAIN_RUN
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_broker_alarms_and_database_restarts_lose_nothing_and_quarantine_nothing() {
    rabbitmq_under_chaos(Scenario {
        name: "rabbitmq, alarms and restarts",
        // Small enough that the outages, not the volume, set the pace: the
        // variant, its two private servers included, stays near half a
        // minute.
        events: 5_000,
        aggregates: 100,
        produce_for: Duration::from_secs(10),
        chaos_for: Duration::from_secs(15),
        // An unroutable row would rightly be quarantined after its attempts.
        unroutable_every: 0,
        // A batch held up by an alarm times out within the publish timeout
        // and its rows are due again a second or so later: charged for
        // alarms, rows would reach this many attempts within one alarm.
        max_attempts: 3,
        outages: true,
        ..MAIN_RUN
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_through_pgbouncer_in_transaction_mode_under_chaos_loses_nothing() {
    rabbitmq_under_chaos_through(
        Scenario {
            name: "rabbitmq through pgbouncer",
            // Half the main run: the same chaos, a smaller budget.
            events: 10_000,
            ..MAIN_RUN
        },
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_with_aggregate_ordering_first_deliveries_stay_in_order_under_chaos() {
    rabbitmq_under_chaos(Scenario {
        name: "rabbitmq, ordered",
        // Fifty events per aggregate is plenty to see an order broken;
        // half the main run keeps the two within the CI budget together.
        events: 10_000,
        ordering: true,
        // An unroutable row would stall its aggregate until quarantine.
        unroutable_every: 0,
        ..MAIN_RUN
    })
    .await;
}

/// Routes: the main run's chaos against relays that publish through two
/// destinations, each event type routed to one of them.
#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_with_routes_to_two_destinations_under_chaos_loses_nothing_and_misroutes_nothing() {
    rabbitmq_under_chaos(Scenario {
        name: "rabbitmq, routes",
        // With routes, a row no route matches is quarantined on its first
        // attempt, which the checks would take for the chaos's doing.
        unroutable_every: 0,
        routes: true,
        ..MAIN_RUN
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqs_fifo_with_aggregate_ordering_under_chaos_keeps_group_order_and_applies_once() {
    let scenario = Scenario {
        name: "sqs fifo, ordered",
        // Small: the emulator (moto, one Python process) spends CPU on
        // every message sent or received in proportion to the queue's
        // depth, so it keeps up only while the queue stays shallow; on two
        // busy cores that is a few dozen messages a second. With ordering,
        // a claim takes each aggregate's head only: at least
        // events / aggregates claim rounds.
        events: 500,
        aggregates: 50,
        // 1 s is often not enough for a SendMessageBatch on a loaded
        // machine, and every timed-out request the emulator still executes
        // feeds a spiral of resends. 3 s keeps timeouts rare (lease 11 s).
        publish_timeout: "3s",
        // One batch at a time per relay: the emulator gains nothing from
        // more requests at once, only longer queues and more timeouts.
        workers: 1,
        ordering: true,
        // SQS has no routing: every message lands in the queue.
        unroutable_every: 0,
        ..MAIN_RUN
    };
    let mut run = Run::begin(scenario).await;
    let queue = TestQueue::create(true, None).await;
    // Receiving and deleting all along keeps the queue shallow.
    let consumer = start_sqs_consumer(&queue, &run);
    let chaos = run
        .relays_under_chaos(common::sqs::endpoint_addr(), |proxy| {
            queue.env_via(&format!("http://{}", proxy.addr))
        })
        .await;
    let events = usize::try_from(run.scenario.events).unwrap();
    eventually(
        SETTLE,
        "the consumer received everything and emptied the queue",
        || async {
            let all_received = {
                let ledger = run.ledger.lock().unwrap();
                let distinct: HashSet<Uuid> = ledger.deliveries.iter().map(|(id, _)| *id).collect();
                distinct.len() >= events && ledger.awaiting_redelivery == 0
            };
            all_received && sqs_queue_empty(&queue).await
        },
    )
    .await;
    // The SDK may resend a request within one attempt, so deliveries are
    // not bounded by attempts here; FIFO deduplication usually hides those.
    run.verify(consumer, chaos, false).await;
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_jetstream_relays_killed_and_cut_at_random_store_every_event_exactly_once() {
    let scenario = Scenario {
        name: "nats jetstream",
        // Half the main run: the same chaos, and the stream is read back
        // message by message at the end.
        events: 10_000,
        // JetStream routes by subject; every row has a stream.
        unroutable_every: 0,
        ..MAIN_RUN
    };
    let mut run = Run::begin(scenario).await;
    // Its duplicate window (10 minutes) outlasts the run, so every
    // republication meets the first copy.
    let stream = TestStream::create().await;
    let chaos = run
        .relays_under_chaos(common::nats::nats_addr(), |proxy| {
            stream.env_via(&format!("nats://{}", proxy.addr))
        })
        .await;
    let stored = stream.messages().await;
    let mut copies: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for message in &stored {
        *copies.entry(message.msg_id()).or_default() += 1;
    }
    let duplicated = copies.values().filter(|&&count| count > 1).count();
    let rows: HashSet<String> = run
        .db
        .ids_where("true")
        .await
        .iter()
        .map(Uuid::to_string)
        .collect();
    let in_stream: HashSet<String> = stored.iter().map(Stored::msg_id).collect();
    let attempts = run
        .db
        .column::<i64>("SELECT sum(attempt_count)::bigint FROM outbox_event", &[])
        .await;
    eprintln!(
        "crash suite [{}]: seed {}, {} events, {} messages in the stream, {} attempts in all, {:?}",
        run.scenario.name,
        run.seed,
        rows.len(),
        stored.len(),
        attempts[0],
        run.started.elapsed()
    );
    run.assert_every_event_published_and_in(&rows, &in_stream, "stream")
        .await;
    assert_eq!(
        duplicated, 0,
        "0 duplicates in the stream, whatever the chaos ({chaos:?})"
    );
    assert_eq!(stored.len(), rows.len());
    run.stop.cancel();
    stream.cleanup().await;
}

/// Kafka: relays killed at random, database backends terminated, and the
/// cluster's brokers taken down and brought back while they publish (the
/// Kafka client connects to each broker the cluster advertises, past any
/// proxy, so the brokers themselves drop the connections). Kafka keeps
/// every record the relays send, so a republished row is a second record:
/// none may be lost, and every copy of an event carries its `event_id`,
/// key and value unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_relays_killed_and_brokers_dropped_at_random_lose_nothing() {
    let scenario = Scenario {
        name: "kafka",
        // Half the main run, as for NATS: the topic is read back record by
        // record at the end.
        events: 10_000,
        // The topic template has one topic for every row.
        unroutable_every: 0,
        ..MAIN_RUN
    };
    let mut run = Run::begin(scenario).await;
    let cluster = std::sync::Arc::new(common::kafka::KafkaMock::start(3));
    let prefix = common::kafka::unique_topic("crash");
    // The producer's event type.
    let topic = format!("{prefix}.{}", producer::EVENT_TYPE);
    cluster.create_topic(&topic, 6);
    let template = format!("{prefix}.{{event_type}}");
    // Brokers go down one at a time for up to 1.5 s, every 1 to 4 s, while
    // the chaos lasts; all are up again after it.
    let flapping = {
        let cluster = cluster.clone();
        let mut rng = StdRng::seed_from_u64(run.seed ^ 0x006b_6166_6b61);
        let until = Instant::now() + run.scenario.chaos_for;
        std::thread::spawn(move || {
            let mut downs = 0;
            while Instant::now() < until {
                std::thread::sleep(Duration::from_millis(rand::Rng::random_range(
                    &mut rng,
                    1_000..=4_000,
                )));
                let broker = rand::Rng::random_range(&mut rng, 1..=cluster.brokers);
                cluster.broker_down(broker);
                std::thread::sleep(Duration::from_millis(rand::Rng::random_range(
                    &mut rng,
                    100..=1_500,
                )));
                cluster.broker_up(broker);
                downs += 1;
            }
            downs
        })
    };
    // The proxies the suite puts before each relay see only the relays'
    // first connection to the cluster, not the brokers': the relay is
    // given the cluster itself.
    let chaos = run
        .relays_under_chaos(common::system::free_addr(), |_proxy| cluster.env(&template))
        .await;
    let downs = flapping.join().expect("the broker chaos thread");
    let records = cluster.read(&topic).await;
    let mut copies: std::collections::HashMap<String, Vec<&common::kafka::KafkaRecord>> =
        std::collections::HashMap::new();
    for record in &records {
        copies.entry(record.event_id()).or_default().push(record);
    }
    let rows: HashSet<String> = run
        .db
        .ids_where("true")
        .await
        .iter()
        .map(Uuid::to_string)
        .collect();
    let in_topic: HashSet<String> = copies.keys().cloned().collect();
    let duplicated = copies.values().filter(|copies| copies.len() > 1).count();
    let attempts = run
        .db
        .column::<i64>("SELECT sum(attempt_count)::bigint FROM outbox_event", &[])
        .await;
    eprintln!(
        "crash suite [{}]: seed {}, {} events, {} records in the topic, {duplicated} events duplicated, \
         {} attempts in all, {downs} broker outages, {:?}, {chaos:?}",
        run.scenario.name,
        run.seed,
        rows.len(),
        records.len(),
        attempts[0],
        run.started.elapsed()
    );
    run.assert_every_event_published_and_in(&rows, &in_topic, "topic")
        .await;
    for (event_id, copies) in &copies {
        let first = copies[0];
        for copy in &copies[1..] {
            assert_eq!(
                (&copy.key, &copy.value, copy.partition),
                (&first.key, &first.value, first.partition),
                "every copy of event {event_id} is the same record, on the same partition"
            );
        }
    }
    run.stop.cancel();
}
