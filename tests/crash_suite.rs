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
//! - with `OUTBOX_ORDERING=aggregate`, the first delivery of each event
//!   comes in `(created_at, id)` order within its aggregate.
//!
//! One run routes the relays' database connections through PgBouncer in
//! transaction mode (`OUTBOX_DATABASE_POOLER=transaction`), with the same
//! chaos and the same checks.
//!
//! The chaos schedule comes from a seeded RNG; the seed is printed, and
//! `OUTBOX_CRASH_SEED=<seed>` replays the same schedule (the interleaving
//! with the processes still varies: it is timing).

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, QueueAttributeName};
use common::proxy::Proxy;
use common::servers::PgBouncer;
use common::sqs::TestQueue;
use common::{eventually, RelayProcess, TestBroker, TestDb};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use outbox_consumer::{self as consumer, Claim, Deduplicator};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

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
/// PgBouncer's server connections in the suite's run through it: fewer
/// than the relays' client connections (three relays, eleven each).
const PGBOUNCER_SERVER_CONNECTIONS: u32 = 6;
/// The chance, per first delivery, that the consumer "crashes" before its
/// commit, and, separately, after its commit but before the ack.
const CONSUMER_CRASH: f64 = 0.01;

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
}

/// The event type of the rows the broker cannot route (the suite's queue
/// is bound to `chaos.#`).
const UNROUTABLE: &str = "unrouted.event";

fn seed() -> u64 {
    std::env::var("OUTBOX_CRASH_SEED")
        .ok()
        .and_then(|raw| raw.parse().ok())
        .unwrap_or_else(rand::random)
}

/// Settings every relay of the suite shares: quick to react, a short claim
/// lease (2 × the publish timeout + 5 s: a killed relay's rows come back
/// after at most that), and attempts enough that chaos never quarantines.
fn relay_settings(scenario: &Scenario) -> Vec<(&'static str, String)> {
    let mut env: Vec<(&'static str, String)> = [
        ("OUTBOX_PUBLISH_TIMEOUT", scenario.publish_timeout),
        ("OUTBOX_POLL_INTERVAL", "50ms"),
        ("OUTBOX_BACKOFF_BASE", "100ms"),
        ("OUTBOX_BACKOFF_MAX", "1s"),
        ("OUTBOX_MAX_ATTEMPTS", "1000"),
        ("OUTBOX_RETENTION", "0"),
        // The suite reads the warnings (failed publishes) from the logs.
        ("RUST_LOG", "warn"),
    ]
    .into_iter()
    .map(|(key, value)| (key, value.to_owned()))
    .collect();
    env.push(("OUTBOX_BATCH_SIZE", BATCH.to_string()));
    env.push(("OUTBOX_WORKERS", scenario.workers.to_string()));
    if scenario.ordering {
        env.push(("OUTBOX_ORDERING", "aggregate".to_owned()));
    }
    env
}

fn amqp_addr() -> SocketAddr {
    let url = url::Url::parse(&common::amqp_url()).expect("OUTBOX_TEST_AMQP_URL is a URL");
    let host = url.host_str().expect("the AMQP URL has a host").to_owned();
    (host.as_str(), url.port().unwrap_or(5672))
        .to_socket_addrs()
        .expect("resolve RabbitMQ")
        .next()
        .expect("RabbitMQ has an address")
}

/// Inserts the scenario's events at a steady pace, as producers would:
/// aggregate `agg-(n % aggregates)`, and `created_at` strictly increasing
/// with `n` (1 ms apart), so the order within an aggregate is well defined
/// and rows are never inserted behind rows already published.
fn start_producer(db: &TestDb, scenario: &Scenario) -> tokio::task::JoinHandle<()> {
    let url = db.url.clone();
    let (events, aggregates, unroutable_every) =
        (scenario.events, scenario.aggregates, scenario.unroutable_every);
    let chunks = 100_i64;
    let pause = scenario.produce_for / chunks as u32;
    tokio::spawn(async move {
        let (client, connection) = tokio_postgres::connect(&url, NoTls)
            .await
            .expect("producer connects");
        tokio::spawn(connection);
        let base: chrono::DateTime<chrono::Utc> = client
            .query_one("SELECT now() - interval '1 hour'", &[])
            .await
            .expect("base time")
            .get(0);
        let per_chunk = (events + chunks - 1) / chunks;
        let mut from = 0;
        while from < events {
            let to = (from + per_chunk).min(events) - 1;
            client
                .execute(
                    "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
                     SELECT gen_random_uuid(),
                            CASE WHEN $5::bigint > 0 AND n % $5::bigint = 0 THEN $6 ELSE 'chaos.test' END,
                            'agg-' || (n % $3),
                            jsonb_build_object('n', n), $4::timestamptz + n * interval '1 millisecond'
                     FROM generate_series($1::bigint, $2::bigint) AS n",
                    &[&from, &to, &aggregates, &base, &unroutable_every, &UNROUTABLE],
                )
                .await
                .expect("produce events");
            from = to + 1;
            tokio::time::sleep(pause).await;
        }
    })
}

/// What the chaos did.
#[derive(Debug, Default)]
struct ChaosLog {
    kills: usize,
    cuts: usize,
    /// Calls that terminated at least one relay backend.
    terminations: usize,
    backends_terminated: i64,
    /// Rows of publishes that failed, as the relays logged them: cuts, and
    /// publish timeouts on a starved machine, with or without chaos.
    failed_publish_rows: usize,
    /// Times a relay logged that it could not record outcomes before the
    /// lease ran out (its batch will be published again).
    unrecorded_batches: usize,
}

impl ChaosLog {
    /// The most duplicates the run can explain. A row is published again
    /// only if the broker took it and its relay did not record that: the
    /// relay was killed in between (its rows in flight), its broker
    /// connection was cut before the confirms arrived (that relay's rows
    /// in flight), its database backend was terminated and the mark did not
    /// get through before the lease ran out (every relay's rows in flight,
    /// and the relay logs it), or the publish failed although the broker
    /// had taken some of the batch (a timeout: the relay logs the rows).
    /// The last one happens without any chaos on a starved machine, which
    /// is why the relays' own reports are part of the bound.
    fn duplicate_bound(&self, workers: usize) -> usize {
        let windows = self.kills + self.cuts + self.terminations * RELAYS + self.unrecorded_batches;
        windows * BATCH * workers + self.failed_publish_rows
    }
}

/// Waits for the relays to publish every row once the chaos has stopped,
/// printing the backlog now and then so a stuck run says where it stuck.
async fn all_published(db: &TestDb) {
    let next_report = &std::cell::Cell::new(Instant::now() + Duration::from_secs(10));
    let what = "every row published once the chaos stopped";
    eventually(SETTLE, what, || async move {
        let pending = db
            .count(&format!(
                "published_at IS NULL AND quarantined_at IS NULL AND event_type <> '{UNROUTABLE}'"
            ))
            .await;
        if pending > 0 && Instant::now() >= next_report.get() {
            next_report.set(Instant::now() + Duration::from_secs(10));
            report_backlog(db, pending).await;
        }
        pending == 0
    })
    .await;
}

async fn report_backlog(db: &TestDb, pending: i64) {
    let row = db
        .client
        .query_one(
            "SELECT count(*) FILTER (WHERE next_attempt_at > now()), max(attempt_count),
                    count(DISTINCT aggregate_id), left(max(last_error), 200)
             FROM outbox_event WHERE published_at IS NULL AND quarantined_at IS NULL",
            &[],
        )
        .await
        .expect("backlog");
    let (waiting, attempts, aggregates, error): (i64, i32, i64, Option<String>) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    eprintln!(
        "waiting: {pending} rows unpublished ({waiting} leased or backing off) in {aggregates} \
         aggregates, max attempts {attempts}, an error: {error:?}"
    );
}

/// What the relays' logs said, for the duplicate bound.
#[derive(Debug, Default)]
struct RelayReports {
    failed_publish_rows: AtomicUsize,
    unrecorded_batches: AtomicUsize,
}

/// Starts `outbox-relay run` like [`RelayProcess::start`], with JSON logs
/// that a thread copies to the test's output and reads for failed
/// publishes.
fn start_relay(
    db: &TestDb,
    env: &[(&'static str, String)],
    reports: Arc<RelayReports>,
) -> (RelayProcess, std::thread::JoinHandle<()>) {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut child = db
        .relay_command(&["run"], &env)
        .env("OUTBOX_HTTP_ADDR", "127.0.0.1:0")
        .env("OUTBOX_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start relay");
    let stderr = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            // Fields are at the top level (flattened) or under "fields".
            let fields = entry.get("fields").unwrap_or(&entry);
            // The relay's `report` field, not its wording, says what a line is.
            let report = fields["report"].as_str().unwrap_or_default();
            if report == "publish_failed" {
                let rows = fields["rows"].as_u64().unwrap_or(BATCH as u64);
                reports
                    .failed_publish_rows
                    .fetch_add(usize::try_from(rows).unwrap_or(BATCH), AtomicOrdering::SeqCst);
            } else if report == "outcomes_unrecorded" {
                reports.unrecorded_batches.fetch_add(1, AtomicOrdering::SeqCst);
            }
        }
    });
    (RelayProcess { child }, reader)
}

/// The relays and what stands between them and their servers.
struct Relays {
    processes: Vec<RelayProcess>,
    /// Readers of the relays' logs, past and present.
    readers: Vec<std::thread::JoinHandle<()>>,
    reports: Arc<RelayReports>,
    settings: Vec<Vec<(&'static str, String)>>,
    /// Each relay's own proxy to its broker, so a cut hits one relay.
    proxies: Vec<Proxy>,
}

impl Relays {
    fn start(db: &TestDb, settings: Vec<Vec<(&'static str, String)>>, proxies: Vec<Proxy>) -> Self {
        let reports = Arc::new(RelayReports::default());
        let mut readers = Vec::new();
        let processes = settings
            .iter()
            .map(|env| {
                let (process, reader) = start_relay(db, env, reports.clone());
                readers.push(reader);
                process
            })
            .collect();
        Self {
            processes,
            readers,
            reports,
            settings,
            proxies,
        }
    }

    /// Kills, cuts and terminates at random every 1–3 s until `until`
    /// has passed and `producer` is done.
    async fn chaos(
        &mut self,
        db: &TestDb,
        rng: &mut StdRng,
        until: Instant,
        producer: &tokio::task::JoinHandle<()>,
    ) -> ChaosLog {
        let mut log = ChaosLog::default();
        while Instant::now() < until || !producer.is_finished() {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..=3_000))).await;
            let victim = rng.random_range(0..self.processes.len());
            self.processes[victim].signal("KILL");
            self.processes[victim]
                .wait(Duration::from_secs(30))
                .await
                .expect("a SIGKILLed relay exits");
            let (process, reader) = start_relay(db, &self.settings[victim], self.reports.clone());
            self.processes[victim] = process;
            self.readers.push(reader);
            log.kills += 1;
            if rng.random_bool(0.5) {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
                self.proxies[rng.random_range(0..self.proxies.len())].cut();
                log.cuts += 1;
            }
            if rng.random_bool(0.3) {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
                let terminated = db.terminate_relay_backends().await;
                if terminated > 0 {
                    log.terminations += 1;
                    log.backends_terminated += terminated;
                }
            }
        }
        log
    }

    /// Kills every relay and adds what their logs reported to `log`.
    fn stop(self, log: &mut ChaosLog) {
        // Dropping a RelayProcess kills it and waits for it; its log pipe
        // then closes and its reader finishes.
        drop(self.processes);
        for reader in self.readers {
            reader.join().expect("log reader");
        }
        log.failed_publish_rows = self.reports.failed_publish_rows.load(AtomicOrdering::SeqCst);
        log.unrecorded_batches = self.reports.unrecorded_batches.load(AtomicOrdering::SeqCst);
    }
}

/// What the consumer saw and did.
#[derive(Debug, Default)]
struct Ledger {
    /// Every delivery of an event, in the order received: the id and
    /// whether it came back because the consumer itself did not ack it.
    deliveries: Vec<(Uuid, bool)>,
    /// Messages whose id is not a UUID.
    malformed: Vec<String>,
    /// Claims that were `First` and committed: effects applied.
    applied: usize,
    /// Claims that were `Duplicate`: effects skipped.
    skipped: usize,
    /// Claims that were `First` but rolled back by a simulated crash.
    rolled_back: usize,
    /// Simulated consumer crashes before the commit (rolled back, not acked).
    crashed_before_commit: usize,
    /// Simulated consumer crashes after the commit, before the ack.
    crashed_after_commit: usize,
    /// Messages the consumer left unacknowledged that have not come back yet.
    awaiting_redelivery: usize,
    /// Deliveries received and not yet acknowledged or handed back.
    in_flight: usize,
    /// The end-of-stream fence arrived (RabbitMQ).
    fence_seen: bool,
}

/// What the consumer does with a first delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Claim, apply, commit, ack.
    Normal,
    /// Claim, apply, then die before the commit: everything rolls back and
    /// the message comes again.
    CrashBeforeCommit,
    /// Claim, apply, commit, then die before the ack: the message comes
    /// again and must be a duplicate.
    CrashAfterCommit,
}

impl Fate {
    fn draw(rng: &mut StdRng, redelivered: bool) -> Self {
        // A redelivery is processed normally, so every crash is followed by
        // exactly one redelivery.
        if redelivered {
            return Fate::Normal;
        }
        let roll: f64 = rng.random();
        if roll < CONSUMER_CRASH {
            Fate::CrashBeforeCommit
        } else if roll < 2.0 * CONSUMER_CRASH {
            Fate::CrashAfterCommit
        } else {
            Fate::Normal
        }
    }
}

/// The consumer's database: `processed_message` and the effect table.
async fn consumer_database() -> TestDb {
    let db = TestDb::create().await;
    consumer::migrate(&db.client).await.expect("consumer migrate");
    // No constraint on message_id: a duplicate effect must be visible.
    db.client
        .batch_execute("CREATE TABLE effect (message_id UUID NOT NULL, applied_at TIMESTAMPTZ DEFAULT now())")
        .await
        .expect("create effect table");
    db
}

async fn consumer_connection(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("consumer connects");
    tokio::spawn(connection);
    // The consumer database is not what is under test; skipping the WAL
    // flush per commit keeps the consumer ahead of three relays.
    client
        .batch_execute("SET synchronous_commit = off")
        .await
        .expect("consumer session settings");
    client
}

/// The consumer's unit of work: claim and effect in one transaction.
async fn apply(client: &mut Client, dedup: &Deduplicator, id: Uuid, fate: Fate, ledger: &Mutex<Ledger>) {
    let tx = client.transaction().await.expect("begin");
    let claim = dedup.claim(&tx, id).await.expect("claim");
    if claim == Claim::First {
        tx.execute_typed(
            "INSERT INTO effect (message_id) VALUES ($1)",
            &[(&id, Type::UUID)],
        )
        .await
        .expect("apply effect");
    }
    if fate == Fate::CrashBeforeCommit {
        tx.rollback().await.expect("rollback");
    } else {
        tx.commit().await.expect("commit");
    }
    let mut ledger = ledger.lock().unwrap();
    match (claim, fate) {
        (Claim::Duplicate, _) => ledger.skipped += 1,
        (Claim::First, Fate::CrashBeforeCommit) => ledger.rolled_back += 1,
        (Claim::First, _) => ledger.applied += 1,
    }
    match fate {
        Fate::Normal => {}
        Fate::CrashBeforeCommit => ledger.crashed_before_commit += 1,
        Fate::CrashAfterCommit => ledger.crashed_after_commit += 1,
    }
    if fate != Fate::Normal {
        ledger.awaiting_redelivery += 1;
    }
}

const FENCE: &str = "end-of-test-fence";

/// Consumer workers, each with its own database connection. Deliveries go
/// to them round robin, so a duplicate can be claimed while its original
/// is still in another worker's transaction: the race `claim` settles.
const AMQP_WORKERS: usize = 8;

/// A RabbitMQ consumer with manual acks: begin → claim → effect → commit →
/// ack. Some first deliveries "crash" and are handed back with a nack; the
/// broker redelivers them flagged `redelivered`. Deliveries are recorded
/// in the order the broker hands them out, then processed by
/// [`AMQP_WORKERS`] workers. Runs until `stop`.
fn start_amqp_consumer(
    broker: &TestBroker,
    consumer_db: &TestDb,
    seed: u64,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let queue = broker.queue.clone();
    let url = consumer_db.url.clone();
    tokio::spawn(async move {
        let mut workers = Vec::new();
        let mut senders = Vec::new();
        for worker in 0..AMQP_WORKERS {
            let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<lapin::message::Delivery>();
            senders.push(sender);
            let mut client = consumer_connection(&url).await;
            let ledger = ledger.clone();
            workers.push(tokio::spawn(async move {
                let dedup = Deduplicator::new("crash-suite");
                let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed ^ worker as u64);
                while let Some(delivery) = receiver.recv().await {
                    let id = delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .and_then(|id| Uuid::parse_str(id.as_str()).ok())
                        .expect("checked on receipt");
                    let fate = Fate::draw(&mut rng, delivery.redelivered);
                    apply(&mut client, &dedup, id, fate, &ledger).await;
                    if fate == Fate::Normal {
                        delivery.ack(BasicAckOptions::default()).await.expect("ack");
                    } else {
                        delivery
                            .nack(BasicNackOptions {
                                requeue: true,
                                ..BasicNackOptions::default()
                            })
                            .await
                            .expect("nack");
                    }
                    ledger.lock().unwrap().in_flight -= 1;
                }
            }));
        }
        let connection = Connection::connect(&common::amqp_url(), ConnectionProperties::default())
            .await
            .expect("consumer reaches RabbitMQ");
        let channel = connection.create_channel().await.expect("consumer channel");
        channel
            .basic_qos(500, BasicQosOptions::default())
            .await
            .expect("prefetch");
        let mut deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                "crash-suite".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let mut next_worker = 0;
        loop {
            let delivery = tokio::select! {
                next = deliveries.next() => match next {
                    Some(delivery) => delivery.expect("delivery"),
                    None => break,
                },
                _ = stop.cancelled() => break,
            };
            let message_id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .unwrap_or_default();
            if message_id == FENCE {
                delivery.ack(BasicAckOptions::default()).await.expect("ack");
                ledger.lock().unwrap().fence_seen = true;
                continue;
            }
            let Ok(id) = Uuid::parse_str(&message_id) else {
                ledger.lock().unwrap().malformed.push(message_id);
                delivery.ack(BasicAckOptions::default()).await.expect("ack");
                continue;
            };
            {
                let mut ledger = ledger.lock().unwrap();
                ledger.deliveries.push((id, delivery.redelivered));
                ledger.in_flight += 1;
                if delivery.redelivered {
                    ledger.awaiting_redelivery -= 1;
                }
            }
            senders[next_worker].send(delivery).expect("worker running");
            next_worker = (next_worker + 1) % senders.len();
        }
        drop(senders);
        for worker in workers {
            worker.await.expect("consumer worker");
        }
        let _ = connection.close(200, "done".into()).await;
    })
}

/// Publishes a fence behind everything the relays published: the queue
/// hands messages out in order, so once the consumer has seen the fence
/// (and got back what it handed back itself), it has seen everything.
async fn publish_fence(broker: &TestBroker) {
    let connection = Connection::connect(&common::amqp_url(), ConnectionProperties::default())
        .await
        .expect("fence publisher reaches RabbitMQ");
    let channel = connection.create_channel().await.expect("fence channel");
    channel
        .basic_publish(
            broker.exchange.as_str().into(),
            "chaos.fence".into(),
            BasicPublishOptions::default(),
            b"{}",
            BasicProperties::default().with_message_id(FENCE.into()),
        )
        .await
        .expect("publish fence")
        .await
        .expect("fence sent");
    let _ = connection.close(200, "done".into()).await;
}

/// An SQS consumer: receive → (claim → effect → commit) per message →
/// delete. Some first deliveries "crash": the message is made visible
/// again at once instead of being deleted. Runs until `stop`.
fn start_sqs_consumer(
    queue: &TestQueue,
    consumer_db: &TestDb,
    seed: u64,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (sqs, queue_url, url) = (queue.client.clone(), queue.url.clone(), consumer_db.url.clone());
    tokio::spawn(async move {
        let mut client = consumer_connection(&url).await;
        let dedup = Deduplicator::new("crash-suite");
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        // Ids this consumer handed back and has not received again yet.
        let mut handed_back: HashSet<Uuid> = HashSet::new();
        while !stop.is_cancelled() {
            let answer = sqs
                .receive_message()
                .queue_url(&queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .visibility_timeout(120)
                .message_attribute_names("All")
                .send()
                .await
                .expect("ReceiveMessage");
            let mut done = Vec::new();
            for message in answer.messages() {
                let receipt = message.receipt_handle().unwrap_or_default().to_owned();
                let event_id = message
                    .message_attributes()
                    .and_then(|attributes| attributes.get("event_id"))
                    .and_then(|value| value.string_value())
                    .unwrap_or_default()
                    .to_owned();
                let Ok(id) = Uuid::parse_str(&event_id) else {
                    ledger.lock().unwrap().malformed.push(event_id);
                    done.push(receipt);
                    continue;
                };
                let redelivered = handed_back.remove(&id);
                {
                    let mut ledger = ledger.lock().unwrap();
                    ledger.deliveries.push((id, redelivered));
                    if redelivered {
                        ledger.awaiting_redelivery -= 1;
                    }
                }
                let fate = Fate::draw(&mut rng, redelivered);
                apply(&mut client, &dedup, id, fate, &ledger).await;
                if fate == Fate::Normal {
                    done.push(receipt);
                } else {
                    handed_back.insert(id);
                    sqs.change_message_visibility()
                        .queue_url(&queue_url)
                        .receipt_handle(receipt)
                        .visibility_timeout(0)
                        .send()
                        .await
                        .expect("ChangeMessageVisibility");
                }
            }
            if !done.is_empty() {
                let entries = done
                    .into_iter()
                    .enumerate()
                    .map(|(n, receipt)| {
                        DeleteMessageBatchRequestEntry::builder()
                            .id(n.to_string())
                            .receipt_handle(receipt)
                            .build()
                            .expect("entry has an id and a receipt")
                    })
                    .collect();
                let deleted = sqs
                    .delete_message_batch()
                    .queue_url(&queue_url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .expect("DeleteMessageBatch");
                assert!(
                    deleted.failed().is_empty(),
                    "delete failed: {:?}",
                    deleted.failed()
                );
            }
        }
    })
}

/// Whether the queue holds nothing, visible or in flight.
async fn sqs_queue_empty(queue: &TestQueue) -> bool {
    let answer = queue
        .client
        .get_queue_attributes()
        .queue_url(&queue.url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("GetQueueAttributes");
    let count = |name: QueueAttributeName| {
        answer
            .attributes()
            .and_then(|attributes| attributes.get(&name))
            .map(String::as_str)
            .unwrap_or("?")
            .to_owned()
    };
    count(QueueAttributeName::ApproximateNumberOfMessages) == "0"
        && count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible) == "0"
}

/// One outbox row as the suite checks it.
struct Row {
    id: Uuid,
    aggregate_id: String,
    attempt_count: i32,
}

/// The end-of-run checks, and the summary line.
#[allow(clippy::too_many_arguments)]
async fn verify(
    scenario: &Scenario,
    seed: u64,
    started: Instant,
    phases: &[(&str, Instant)],
    db: &TestDb,
    consumer_db: &TestDb,
    ledger: &Ledger,
    chaos: &ChaosLog,
    one_publish_per_attempt: bool,
) {
    assert_eq!(
        db.count("true").await,
        scenario.events,
        "the producer inserted every event"
    );
    let unroutable_rows = db.ids_where(&format!("event_type = '{UNROUTABLE}'")).await;
    let routable = scenario.events - i64::try_from(unroutable_rows.len()).unwrap();
    let events = usize::try_from(routable).unwrap();
    assert_eq!(
        db.count(&format!("published_at IS NULL AND event_type <> '{UNROUTABLE}'"))
            .await,
        0,
        "every routable row published"
    );
    assert_eq!(
        db.count(&format!(
            "published_at IS NOT NULL AND event_type = '{UNROUTABLE}'"
        ))
        .await,
        0,
        "no unroutable row marked published"
    );
    assert_eq!(
        db.count(&format!(
            "event_type = '{UNROUTABLE}' AND (attempt_count = 0 OR last_error NOT LIKE '%NO_ROUTE%')"
        ))
        .await,
        0,
        "every unroutable row was tried, and failed as unroutable"
    );
    assert_eq!(
        db.count("quarantined_at IS NOT NULL").await,
        0,
        "chaos quarantined nothing"
    );
    let rows: Vec<Row> = db
        .client
        .query(
            "SELECT id, aggregate_id, attempt_count FROM outbox_event
             WHERE event_type <> $1 ORDER BY created_at, id",
            &[&UNROUTABLE],
        )
        .await
        .expect("read the table")
        .iter()
        .map(|row| Row {
            id: row.get(0),
            aggregate_id: row.get(1),
            attempt_count: row.get(2),
        })
        .collect();
    let by_id: HashMap<Uuid, &Row> = rows.iter().map(|row| (row.id, row)).collect();

    // Everything arrived, and nothing else.
    assert!(
        ledger.malformed.is_empty(),
        "messages without an event id: {:?}",
        ledger.malformed
    );
    let received: HashSet<Uuid> = ledger.deliveries.iter().map(|(id, _)| *id).collect();
    let undeliverable: Vec<&Uuid> = received.intersection(&unroutable_rows).collect();
    assert!(
        undeliverable.is_empty(),
        "{} unroutable rows reached the consumer",
        undeliverable.len()
    );
    let unknown: Vec<&Uuid> = received.iter().filter(|id| !by_id.contains_key(id)).collect();
    assert!(
        unknown.is_empty(),
        "{} unknown ids, e.g. {:?}",
        unknown.len(),
        unknown.first()
    );
    let missing = rows.iter().filter(|row| !received.contains(&row.id)).count();
    assert_eq!(missing, 0, "{missing} events never reached the consumer");

    // Duplicates: what the relays sent more than once, apart from what the
    // consumer handed back itself.
    let mut from_relays: HashMap<Uuid, i32> = HashMap::new();
    let mut handed_back = 0;
    for (id, redelivered) in &ledger.deliveries {
        if *redelivered {
            handed_back += 1;
        } else {
            *from_relays.entry(*id).or_default() += 1;
        }
    }
    let duplicates = from_relays.values().map(|n| (*n - 1) as usize).sum::<usize>();
    assert_eq!(
        handed_back,
        ledger.crashed_before_commit + ledger.crashed_after_commit,
        "every message the consumer handed back came back once"
    );
    if one_publish_per_attempt {
        // A message reaches the broker once per claim at most: a duplicate
        // needs a second claim, which the table counts.
        let over: Vec<(Uuid, i32, i32)> = from_relays
            .iter()
            .filter(|(id, n)| **n > by_id[*id].attempt_count)
            .map(|(id, n)| (*id, *n, by_id[id].attempt_count))
            .take(5)
            .collect();
        assert!(
            over.is_empty(),
            "delivered more often than claimed (id, deliveries, attempts): {over:?}"
        );
    }

    // The consumer applied each event once.
    let (effects, distinct_effects): (i64, i64) = consumer_db
        .client
        .query_one("SELECT count(*), count(DISTINCT message_id) FROM effect", &[])
        .await
        .map(|row| (row.get(0), row.get(1)))
        .expect("count effects");
    let duplicate_effects = effects - distinct_effects;
    let marks: i64 = consumer_db
        .client
        .query_one(
            "SELECT count(*) FROM processed_message WHERE consumer_name = 'crash-suite'",
            &[],
        )
        .await
        .expect("count marks")
        .get(0);

    // First deliveries, per aggregate, against the table's order.
    let mut expected: HashMap<&str, Vec<Uuid>> = HashMap::new();
    for row in &rows {
        expected.entry(&row.aggregate_id).or_default().push(row.id);
    }
    let mut first_seen: HashMap<&str, Vec<Uuid>> = HashMap::new();
    let mut seen = HashSet::new();
    for (id, _) in &ledger.deliveries {
        if seen.insert(*id) {
            first_seen.entry(&by_id[id].aggregate_id).or_default().push(*id);
        }
    }
    let mut out_of_order: Vec<(&str, usize)> = expected
        .iter()
        .filter_map(|(aggregate, order)| {
            let got = &first_seen[aggregate];
            order
                .iter()
                .zip(got)
                .position(|(want, got)| want != got)
                .map(|at| (*aggregate, at))
        })
        .collect();
    out_of_order.sort();

    let bound = chaos.duplicate_bound(scenario.workers);
    let timeline: Vec<String> = phases
        .iter()
        .map(|(phase, at)| format!("{phase} at {:.1}s", (*at - started).as_secs_f64()))
        .collect();
    eprintln!(
        "crash suite [{}, ordering={}, seed={seed}]: events={events} unroutable={} kills={} cuts={} \
         terminations={} (backends {}) failed_publish_rows={} duplicates_delivered={duplicates} (bound {bound}) \
         consumer_crashes={} (before commit {}, after commit {}) duplicates_skipped={} \
         duplicate_effects={duplicate_effects} aggregates_out_of_order={} max_attempts={} runtime={:.1}s ({})",
        scenario.name,
        if scenario.ordering { "aggregate" } else { "none" },
        unroutable_rows.len(),
        chaos.kills,
        chaos.cuts,
        chaos.terminations,
        chaos.backends_terminated,
        chaos.failed_publish_rows,
        handed_back,
        ledger.crashed_before_commit,
        ledger.crashed_after_commit,
        ledger.skipped,
        out_of_order.len(),
        rows.iter().map(|row| row.attempt_count).max().unwrap_or(0),
        started.elapsed().as_secs_f64(),
        timeline.join(", "),
    );

    assert_eq!(duplicate_effects, 0, "an event's effect was applied twice");
    assert_eq!(effects, routable, "every event applied");
    assert_eq!(marks, routable, "one processed_message mark per event");
    assert_eq!(ledger.applied, events, "one committed First claim per event");
    assert_eq!(
        ledger.applied + ledger.rolled_back + ledger.skipped,
        ledger.deliveries.len(),
        "every delivery was claimed"
    );
    assert!(
        duplicates <= bound,
        "{duplicates} duplicates delivered, more than the chaos explains ({bound})"
    );
    if scenario.ordering {
        assert!(
            out_of_order.is_empty(),
            "{} aggregates had a first delivery out of (created_at, id) order, e.g. {} at position {}",
            out_of_order.len(),
            out_of_order[0].0,
            out_of_order[0].1
        );
    }
}

/// The relay settings that reach RabbitMQ through `proxy`.
fn amqp_via(proxy: &Proxy) -> String {
    let mut url = url::Url::parse(&common::amqp_url()).expect("OUTBOX_TEST_AMQP_URL is a URL");
    url.set_host(Some(&proxy.addr.ip().to_string())).expect("a host");
    url.set_port(Some(proxy.addr.port())).expect("a port");
    url.to_string()
}

async fn rabbitmq_under_chaos(scenario: Scenario) {
    rabbitmq_under_chaos_through(scenario, false).await;
}

/// With `through_pgbouncer`, the relays reach the database through a
/// PgBouncer of the suite's own in transaction mode
/// (`OUTBOX_DATABASE_POOLER=transaction`), fewer server connections than
/// relay connections; the backends the chaos terminates are PgBouncer's
/// server connections then.
async fn rabbitmq_under_chaos_through(scenario: Scenario, through_pgbouncer: bool) {
    let started = Instant::now();
    let seed = seed();
    eprintln!(
        "crash suite [{}]: seed {seed} (OUTBOX_CRASH_SEED={seed} replays the chaos schedule)",
        scenario.name
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let db = TestDb::migrated().await;
    let consumer_db = consumer_database().await;
    let broker = TestBroker::create("chaos.#").await;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = CancellationToken::new();
    let consumer = start_amqp_consumer(&broker, &consumer_db, seed, ledger.clone(), stop.clone());
    let bouncer = through_pgbouncer.then(|| {
        let server = url::Url::parse(&common::pg_admin_url()).expect("OUTBOX_TEST_PG_URL is a URL");
        PgBouncer::start(
            server.host_str().expect("a host"),
            server.port().unwrap_or(5432),
            PGBOUNCER_SERVER_CONNECTIONS,
        )
    });

    let mut proxies = Vec::new();
    let mut settings = Vec::new();
    for _ in 0..RELAYS {
        let proxy = Proxy::start(amqp_addr()).await;
        let mut env = relay_settings(&scenario);
        env.extend(broker.env());
        env.push(("OUTBOX_AMQP_URL", amqp_via(&proxy)));
        if let Some(bouncer) = &bouncer {
            env.push(("OUTBOX_DATABASE_URL", bouncer.url_for(&db.url)));
            env.push(("OUTBOX_DATABASE_POOLER", "transaction".to_owned()));
        }
        settings.push(env);
        proxies.push(proxy);
    }
    let producer = start_producer(&db, &scenario);
    let mut relays = Relays::start(&db, settings, proxies);
    let mut chaos = relays
        .chaos(&db, &mut rng, Instant::now() + scenario.chaos_for, &producer)
        .await;
    producer.await.expect("producer");
    let chaos_over = Instant::now();
    all_published(&db).await;
    let published = Instant::now();
    relays.stop(&mut chaos);
    publish_fence(&broker).await;
    eventually(SETTLE, "the consumer reached the fence", || async {
        let ledger = ledger.lock().unwrap();
        ledger.fence_seen && ledger.awaiting_redelivery == 0 && ledger.in_flight == 0
    })
    .await;
    let consumed = Instant::now();
    stop.cancel();
    consumer.await.expect("consumer");
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let phases = [
        ("chaos over", chaos_over),
        ("all published", published),
        ("all consumed", consumed),
    ];
    verify(
        &scenario,
        seed,
        started,
        &phases,
        &db,
        &consumer_db,
        &ledger,
        &chaos,
        true,
    )
    .await;
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_relays_killed_and_cut_at_random_lose_nothing_and_effects_apply_once() {
    rabbitmq_under_chaos(Scenario {
        name: "rabbitmq",
        events: 20_000,
        aggregates: 200,
        produce_for: Duration::from_secs(15),
        chaos_for: Duration::from_secs(20),
        publish_timeout: RABBITMQ_PUBLISH_TIMEOUT,
        workers: 4,
        ordering: false,
        unroutable_every: 100,
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
            aggregates: 200,
            produce_for: Duration::from_secs(15),
            chaos_for: Duration::from_secs(20),
            publish_timeout: RABBITMQ_PUBLISH_TIMEOUT,
            workers: 4,
            ordering: false,
            unroutable_every: 100,
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
        aggregates: 200,
        produce_for: Duration::from_secs(15),
        chaos_for: Duration::from_secs(20),
        publish_timeout: RABBITMQ_PUBLISH_TIMEOUT,
        workers: 4,
        ordering: true,
        // An unroutable row would stall its aggregate until quarantine.
        unroutable_every: 0,
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
        produce_for: Duration::from_secs(15),
        chaos_for: Duration::from_secs(20),
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
    };
    let started = Instant::now();
    let seed = seed();
    eprintln!(
        "crash suite [{}]: seed {seed} (OUTBOX_CRASH_SEED={seed} replays the chaos schedule)",
        scenario.name
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let db = TestDb::migrated().await;
    let consumer_db = consumer_database().await;
    let queue = TestQueue::create(true, None).await;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = CancellationToken::new();
    // Receiving and deleting all along keeps the queue shallow.
    let consumer = start_sqs_consumer(&queue, &consumer_db, seed, ledger.clone(), stop.clone());

    let mut proxies = Vec::new();
    let mut settings = Vec::new();
    for _ in 0..RELAYS {
        let proxy = Proxy::start(common::sqs::endpoint_addr()).await;
        let mut env = relay_settings(&scenario);
        env.extend(queue.env_via(&format!("http://{}", proxy.addr)));
        settings.push(env);
        proxies.push(proxy);
    }
    let producer = start_producer(&db, &scenario);
    let mut relays = Relays::start(&db, settings, proxies);
    let mut chaos = relays
        .chaos(&db, &mut rng, Instant::now() + scenario.chaos_for, &producer)
        .await;
    producer.await.expect("producer");
    let chaos_over = Instant::now();
    all_published(&db).await;
    let published = Instant::now();
    relays.stop(&mut chaos);
    let events = usize::try_from(scenario.events).unwrap();
    eventually(
        SETTLE,
        "the consumer received everything and emptied the queue",
        || async {
            let all_received = {
                let ledger = ledger.lock().unwrap();
                let distinct: HashSet<Uuid> = ledger.deliveries.iter().map(|(id, _)| *id).collect();
                distinct.len() >= events && ledger.awaiting_redelivery == 0
            };
            all_received && sqs_queue_empty(&queue).await
        },
    )
    .await;
    let consumed = Instant::now();
    stop.cancel();
    consumer.await.expect("consumer");
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let phases = [
        ("chaos over", chaos_over),
        ("all published", published),
        ("all consumed", consumed),
    ];
    // The SDK may resend a request within one attempt, so deliveries are
    // not bounded by attempts here; FIFO deduplication usually hides those.
    verify(
        &scenario,
        seed,
        started,
        &phases,
        &db,
        &consumer_db,
        &ledger,
        &chaos,
        false,
    )
    .await;
    queue.cleanup().await;
}
