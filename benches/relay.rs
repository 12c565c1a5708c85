//! The relay benchmark: `cargo bench --bench relay -- [OPTIONS]`.
//!
//! Runs against the local PostgreSQL and RabbitMQ, each scenario in a fresh
//! database with its own exchange and queue, and prints one table:
//!
//! - drain: N prefilled rows (~300-byte payloads) published by 1, 2 and 4
//!   relay processes (the release binary), events/s, peak RSS and CPU;
//! - the broker's own limit: a bare lapin publisher, same messages, same
//!   confirm window as the relay keeps in flight;
//! - the simplest correct relay: a transaction per batch, one publish at a
//!   time waiting for each confirm, one UPDATE per row;
//! - steady state: a producer committing at a fixed rate, lag from its
//!   commit to a consumer receiving the message (p50/p95/p99/max);
//! - what the NOTIFY trigger costs producers: single-row insert throughput
//!   with 8 connections, with and without the trigger.

#[path = "relay/sqs.rs"]
mod sqs;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::Confirmation;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_relay::event::Event;
use outbox_relay::sink::amqp::AmqpSink;
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

#[derive(Debug, Parser)]
#[command(about = "outbox-relay benchmark")]
struct Options {
    /// Rows prefilled for the drain runs.
    #[arg(long, default_value = "100000")]
    rows: usize,
    /// Relay replicas to drain with (comma-separated).
    #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
    replicas: Vec<usize>,
    /// Steady-state producer rates, events/s (comma-separated).
    #[arg(long, default_value = "1000,10000", value_delimiter = ',')]
    rates: Vec<usize>,
    /// Length of each steady-state run.
    #[arg(long, default_value = "30")]
    seconds: u64,
    /// Rows for the simplest-correct-relay run (it is slow).
    #[arg(long, default_value = "3000")]
    naive_rows: usize,
    /// Seconds of each producer-throughput run (NOTIFY trigger cost).
    #[arg(long, default_value = "10")]
    insert_seconds: u64,
    /// Admin connection to PostgreSQL.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pg_url: String,
    /// RabbitMQ.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_url: String,
    /// Relay batch size (OUTBOX_BATCH_SIZE) in every run.
    #[arg(long, default_value = "100")]
    batch_size: usize,
    /// Relay workers (OUTBOX_WORKERS) in every run.
    #[arg(long, default_value = "4")]
    workers: usize,
    /// Runs of each drain scenario (bare publisher, row-lock design, each
    /// replica count); the table shows the median run. The machine is
    /// noisy: single runs vary by ±15%.
    #[arg(long, default_value = "1")]
    repeat: usize,
    /// Rows for each SQS run (standard and FIFO queue); an emulator is slow.
    #[arg(long, default_value = "300")]
    sqs_rows: usize,
    /// SQS endpoint (an emulator: `scripts/bench` starts moto on this port).
    #[arg(long, default_value = "http://127.0.0.1:4566")]
    sqs_endpoint: String,
    /// Leave out the SQS runs.
    #[arg(long)]
    skip_sqs: bool,
    /// Only the SQS runs.
    #[arg(long)]
    only_sqs: bool,
    /// Table fillfactor for the drain runs, instead of the one `migrate`
    /// sets (to try how much room the claim's HOT updates need).
    #[arg(long)]
    fillfactor: Option<u32>,
    /// Only the relay's drain runs (to compare settings quickly).
    #[arg(long)]
    only_drain: bool,
    /// Accepted for `cargo bench` compatibility.
    #[arg(long, hide = true)]
    bench: bool,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

fn payload_sql() -> &'static str {
    // ~300 bytes of JSON per event.
    "jsonb_build_object('order_id', gen_random_uuid(), 'n', n, 'customer', 'customer-' || (n % 977),
        'lines', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (n % 101), 'qty', 1 + n % 3,
        'price', 19.99)), 'note', repeat('x', 160))"
}

async fn connect(url: &str) -> Result<Client, Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

struct BenchDb {
    admin: Client,
    name: String,
    url: String,
    client: Client,
}

impl BenchDb {
    async fn create(options: &Options) -> Result<Self, Error> {
        let admin = connect(&options.pg_url).await?;
        let name = format!("outbox_bench_{}", Uuid::new_v4().simple());
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await?;
        let mut url = url::Url::parse(&options.pg_url)?;
        url.set_path(&format!("/{name}"));
        let url = url.to_string();
        let status = relay_command(&url, options, "unused")
            .arg("migrate")
            .stderr(Stdio::null())
            .status()?;
        assert!(status.success(), "migrate failed");
        let client = connect(&url).await?;
        Ok(Self {
            admin,
            name,
            url,
            client,
        })
    }

    async fn prefill(&self, rows: usize) -> Result<(), Error> {
        self.client
            .execute(
                &format!(
                    "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
                     SELECT gen_random_uuid(), 'order.created', 'order-' || (n % 5000), {}
                     FROM generate_series(1, $1::bigint) AS n",
                    payload_sql()
                ),
                &[&(rows as i64)],
            )
            .await?;
        self.client.batch_execute("VACUUM ANALYZE outbox_event").await?;
        Ok(())
    }

    /// The drain runs' table: `--rows` rows, at `--fillfactor` if given.
    async fn prefill_for_drain(&self, options: &Options) -> Result<(), Error> {
        if let Some(fillfactor) = options.fillfactor {
            self.client
                .batch_execute(&format!(
                    "ALTER TABLE outbox_event SET (fillfactor = {fillfactor})"
                ))
                .await?;
        }
        self.prefill(options.rows).await
    }

    async fn unpublished(&self) -> Result<i64, Error> {
        Ok(self
            .client
            .query_one(
                "SELECT count(*) FROM outbox_event WHERE published_at IS NULL AND quarantined_at IS NULL",
                &[],
            )
            .await?
            .get(0))
    }

    async fn drop(self) -> Result<(), Error> {
        drop(self.client);
        self.admin
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await?;
        Ok(())
    }
}

fn relay_bin() -> &'static str {
    env!("CARGO_BIN_EXE_outbox-relay")
}

fn relay_command(db_url: &str, options: &Options, exchange: &str) -> Command {
    let mut command = Command::new(relay_bin());
    command
        .env_clear()
        .env("OUTBOX_DATABASE_URL", db_url)
        .env("OUTBOX_AMQP_URL", &options.amqp_url)
        .env("OUTBOX_AMQP_EXCHANGE", exchange)
        .env("OUTBOX_RETENTION", "0")
        .env("OUTBOX_HTTP_ADDR", "127.0.0.1:0")
        .env("OUTBOX_BATCH_SIZE", options.batch_size.to_string())
        .env("OUTBOX_WORKERS", options.workers.to_string())
        .env("RUST_LOG", "warn");
    command
}

/// CPU seconds used so far by every process with this command name,
/// counting the children they have reaped (PostgreSQL's ended backends).
fn cpu_seconds_of(command: &str) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut ticks = 0.0;
    for entry in entries.flatten() {
        let path = entry.path();
        let is_match = std::fs::read_to_string(path.join("comm")).is_ok_and(|c| c.trim() == command);
        if !is_match {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
        // utime, stime, cutime, cstime: fields 14 to 17 of the line.
        ticks += after
            .split_whitespace()
            .skip(11)
            .take(4)
            .filter_map(|v| v.parse::<f64>().ok())
            .sum::<f64>();
    }
    ticks / 100.0
}

/// CPU seconds of the servers the relay depends on, to tell which one
/// limits a run: PostgreSQL and RabbitMQ (the Erlang VM).
#[derive(Debug, Clone, Copy, Default)]
struct ServerCpu {
    postgres: f64,
    rabbitmq: f64,
    /// Busy and total CPU time of the whole machine (all cores).
    machine_busy: f64,
    machine_total: f64,
}

impl ServerCpu {
    fn now() -> Self {
        // The first line of /proc/stat: user nice system idle iowait irq
        // softirq steal …, in ticks, summed over all cores.
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<f64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .take(8)
            .filter_map(|v| v.parse().ok())
            .collect();
        let total: f64 = ticks.iter().sum();
        let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
        Self {
            postgres: cpu_seconds_of("postgres"),
            rabbitmq: cpu_seconds_of("beam.smp"),
            machine_busy: total - idle,
            machine_total: total,
        }
    }

    fn since(self, earlier: Self) -> Self {
        Self {
            postgres: self.postgres - earlier.postgres,
            rabbitmq: self.rabbitmq - earlier.rabbitmq,
            machine_busy: self.machine_busy - earlier.machine_busy,
            machine_total: self.machine_total - earlier.machine_total,
        }
    }
}

/// Throughput of one run and what it cost the servers.
#[derive(Debug, Clone, Copy)]
struct Run {
    events_per_second: f64,
    seconds: f64,
    /// CPU used by PostgreSQL and RabbitMQ during the run, in % of a core.
    postgres_percent: f64,
    rabbitmq_percent: f64,
    /// Share of the whole machine's CPU time that was busy, in %.
    machine_busy_percent: f64,
}

/// Measures a run from its start.
struct Meter {
    started: Instant,
    servers: ServerCpu,
}

impl Meter {
    fn start() -> Self {
        Self {
            started: Instant::now(),
            servers: ServerCpu::now(),
        }
    }

    fn finish(self, events: usize) -> Run {
        let seconds = self.started.elapsed().as_secs_f64();
        let used = ServerCpu::now().since(self.servers);
        Run {
            events_per_second: events as f64 / seconds,
            seconds,
            postgres_percent: used.postgres / seconds * 100.0,
            rabbitmq_percent: used.rabbitmq / seconds * 100.0,
            machine_busy_percent: used.machine_busy / used.machine_total.max(1.0) * 100.0,
        }
    }
}

/// Peak RSS (KiB) and CPU seconds of a process, from /proc.
fn proc_usage(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let peak_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line.
    let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (peak_kib, ticks / 100.0)
}

struct Broker {
    connection: Connection,
    exchange: String,
    queue: String,
}

impl Broker {
    async fn create(options: &Options) -> Result<Self, Error> {
        let connection = Connection::connect(&options.amqp_url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        let exchange = format!("outbox-bench-{}", Uuid::new_v4().simple());
        let queue = format!("outbox-bench-{}", Uuid::new_v4().simple());
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(Self {
            connection,
            exchange,
            queue,
        })
    }

    /// Consumes (auto-ack) in the background, recording when each message
    /// id arrived.
    async fn consume(&self) -> Result<Arc<Mutex<HashMap<String, Instant>>>, Error> {
        let arrivals = Arc::new(Mutex::new(HashMap::new()));
        let channel = self.connection.create_channel().await?;
        let mut consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                "bench".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let sink = arrivals.clone();
        tokio::spawn(async move {
            let _channel = channel;
            while let Some(Ok(delivery)) = consumer.next().await {
                let now = Instant::now();
                if let Some(id) = delivery.properties.message_id() {
                    sink.lock().unwrap().entry(id.to_string()).or_insert(now);
                }
            }
        });
        Ok(arrivals)
    }

    async fn delete(self) -> Result<(), Error> {
        let channel = self.connection.create_channel().await?;
        channel
            .queue_delete(self.queue.as_str().into(), Default::default())
            .await?;
        channel
            .exchange_delete(self.exchange.as_str().into(), Default::default())
            .await?;
        Ok(())
    }
}

struct Drain {
    replicas: usize,
    run: Run,
    peak_rss_mib: f64,
    /// CPU of all replicas together, in % of a core.
    relay_percent: f64,
    /// Share of row updates that were HOT (no new index entries).
    hot_share: f64,
}

async fn drain(options: &Options, replicas: usize) -> Result<Drain, Error> {
    let db = BenchDb::create(options).await?;
    let broker = Broker::create(options).await?;
    db.prefill_for_drain(options).await?;
    let arrivals = broker.consume().await?;
    let meter = Meter::start();
    let mut relays: Vec<Child> = (0..replicas)
        .map(|_| {
            relay_command(&db.url, options, &broker.exchange)
                .stderr(Stdio::inherit())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut last_usage = vec![(0, 0.0); replicas];
    loop {
        for (relay, usage) in relays.iter().zip(last_usage.iter_mut()) {
            *usage = proc_usage(relay.id());
        }
        // Counting rows costs PostgreSQL a scan, so only once every
        // message has arrived (rows are marked after their confirms).
        let all_arrived = arrivals.lock().unwrap().len() >= options.rows;
        if all_arrived && db.unpublished().await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = meter.finish(options.rows);
    for relay in &mut relays {
        let _ = relay.kill();
        let _ = relay.wait();
    }
    // Backends report their statistics when they end.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (updates, hot_updates): (i64, i64) = db
        .client
        .query_one(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'outbox_event'::regclass",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))?;
    broker.delete().await?;
    db.drop().await?;
    Ok(Drain {
        replicas,
        run,
        peak_rss_mib: last_usage.iter().map(|u| u.0).max().unwrap_or(0) as f64 / 1024.0,
        relay_percent: last_usage.iter().map(|u| u.1).sum::<f64>() / run.seconds * 100.0,
        hot_share: hot_updates as f64 / updates.max(1) as f64,
    })
}

/// An event like the prefilled rows, for publishers without a database.
fn sample_event(n: usize) -> Event {
    let payload = format!(
        r#"{{"n": {n}, "note": "{}", "lines": [{{"qty": 1, "sku": "SKU-{}", "price": 19.99}}], "customer": "customer-{}", "order_id": "{}"}}"#,
        "x".repeat(160),
        n % 101,
        n % 977,
        Uuid::new_v4()
    );
    Event {
        id: Uuid::new_v4(),
        causation_id: None,
        event_type: "order.created".to_owned(),
        aggregate_id: format!("order-{}", n % 5000),
        payload,
        created_at: chrono::Utc::now(),
        attempt_count: 1,
    }
}

/// A bare publisher: the relay's messages (same properties, same size),
/// the same confirm window the relay keeps in flight (batch size ×
/// workers, over as many channels), no database at all. Each channel keeps
/// its window full: a new message goes out as soon as one is confirmed.
async fn bare_publisher(options: &Options) -> Result<Run, Error> {
    let broker = Broker::create(options).await?;
    let _arrivals = broker.consume().await?;
    let events: Arc<Vec<Event>> = Arc::new((0..options.rows).map(sample_event).collect());
    let meter = Meter::start();
    let mut loops = Vec::new();
    for lane in 0..options.workers {
        let channel = broker.connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        let (events, exchange, window) = (events.clone(), broker.exchange.clone(), options.batch_size);
        let workers = options.workers;
        loops.push(tokio::spawn(async move {
            let mut in_flight = futures::stream::FuturesUnordered::new();
            for event in events.iter().skip(lane).step_by(workers) {
                if in_flight.len() >= window {
                    let confirmation: Result<Confirmation, lapin::Error> =
                        in_flight.next().await.expect("a confirm");
                    assert!(confirmation?.is_ack());
                }
                let (channel, exchange) = (&channel, exchange.as_str());
                in_flight.push(async move { publish(channel, exchange, event).await?.await });
            }
            while let Some(confirmation) = in_flight.next().await {
                assert!(confirmation?.is_ack());
            }
            Ok::<(), Error>(())
        }));
    }
    for handle in loops {
        handle.await??;
    }
    let run = meter.finish(options.rows);
    broker.delete().await?;
    Ok(run)
}

/// Claims rows of the prefilled table inside `tx`, locking them.
const LOCKING_CLAIM: &str =
    "SELECT id, causation_id, event_type::text, aggregate_id::text, payload::text, created_at
     FROM outbox_event
     WHERE published_at IS NULL AND quarantined_at IS NULL AND next_attempt_at <= now()
     ORDER BY created_at, id LIMIT $1 FOR UPDATE SKIP LOCKED";

fn event_of(row: &tokio_postgres::Row) -> Event {
    Event {
        id: row.get(0),
        causation_id: row.get(1),
        event_type: row.get(2),
        aggregate_id: row.get(3),
        payload: row.get(4),
        created_at: row.get(5),
        attempt_count: 1,
    }
}

async fn publish(
    channel: &lapin::Channel,
    exchange: &str,
    event: &Event,
) -> Result<lapin::PublisherConfirm, lapin::Error> {
    channel
        .basic_publish(
            exchange.into(),
            event.event_type.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            event.payload.as_bytes(),
            AmqpSink::properties(event),
        )
        .await
}

/// The simplest correct relay: per batch one transaction; each row
/// published and its confirm awaited before the next; one UPDATE per row.
async fn naive_relay(options: &Options) -> Result<Run, Error> {
    let db = BenchDb::create(options).await?;
    let broker = Broker::create(options).await?;
    db.prefill(options.naive_rows).await?;
    let _arrivals = broker.consume().await?;
    let channel = broker.connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut client = connect(&db.url).await?;
    let meter = Meter::start();
    loop {
        let tx = client.transaction().await?;
        let rows = tx.query(LOCKING_CLAIM, &[&100i64]).await?;
        if rows.is_empty() {
            break;
        }
        for row in &rows {
            let event = event_of(row);
            let confirmation = publish(&channel, &broker.exchange, &event).await?.await?;
            assert!(confirmation.is_ack());
            tx.execute(
                "UPDATE outbox_event SET published_at = now() WHERE id = $1",
                &[&event.id],
            )
            .await?;
        }
        tx.commit().await?;
    }
    let run = meter.finish(options.naive_rows);
    broker.delete().await?;
    db.drop().await?;
    Ok(run)
}

/// The row-lock alternative to the committed lease, at its best: per batch
/// one transaction holding the rows' locks across the publish, the batch's
/// publishes started together and their confirms awaited together, one
/// UPDATE for the batch; `--workers` loops at once, a channel each, like
/// the relay. One row version per publish instead of the lease's two, but
/// a transaction stays open for every broker round trip.
async fn lock_relay(options: &Options) -> Result<Run, Error> {
    let db = BenchDb::create(options).await?;
    let broker = Broker::create(options).await?;
    db.prefill_for_drain(options).await?;
    let arrivals = broker.consume().await?;
    let meter = Meter::start();
    let mut loops = Vec::new();
    for _ in 0..options.workers {
        let mut client = connect(&db.url).await?;
        let channel = broker.connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        let exchange = broker.exchange.clone();
        let batch_size = options.batch_size as i64;
        loops.push(tokio::spawn(async move {
            loop {
                let tx = client.transaction().await?;
                let rows = tx.query(LOCKING_CLAIM, &[&batch_size]).await?;
                if rows.is_empty() {
                    return Ok::<(), Error>(());
                }
                let events: Vec<Event> = rows.iter().map(event_of).collect();
                let sent =
                    futures::future::join_all(events.iter().map(|e| publish(&channel, &exchange, e))).await;
                let mut confirms = Vec::with_capacity(sent.len());
                for confirm in sent {
                    confirms.push(confirm?);
                }
                for confirmation in futures::future::join_all(confirms).await {
                    assert!(confirmation?.is_ack());
                }
                let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
                tx.execute(
                    "UPDATE outbox_event SET published_at = now() WHERE id = ANY($1)",
                    &[&ids],
                )
                .await?;
                tx.commit().await?;
            }
        }));
    }
    for handle in loops {
        handle.await??;
    }
    while arrivals.lock().unwrap().len() < options.rows {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = meter.finish(options.rows);
    broker.delete().await?;
    db.drop().await?;
    Ok(run)
}

struct Steady {
    rate: usize,
    sent: usize,
    /// Events not received within 60 s after the producer stopped.
    missing: usize,
    p50: Duration,
    p95: Duration,
    p99: Duration,
    max: Duration,
    peak_rss_mib: f64,
    cpu_percent: f64,
    /// While the producers ran: their commit rate and the servers' load.
    load: Run,
}

/// A producer commits `rate` events/s in 10 ms ticks; lag is from the
/// producer's commit returning to the consumer receiving the message.
async fn steady(options: &Options, rate: usize) -> Result<Steady, Error> {
    let db = BenchDb::create(options).await?;
    let broker = Broker::create(options).await?;
    let arrivals = broker.consume().await?;
    let mut relay = relay_command(&db.url, options, &broker.exchange)
        .stderr(Stdio::inherit())
        .spawn()?;
    // Let the relay connect and go idle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, cpu_before) = proc_usage(relay.id());

    let ticks_per_second = 100;
    let per_tick = (rate / ticks_per_second).max(1);
    let insert = format!(
        "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
         SELECT id, 'order.created', 'order-' || n, {}
         FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n)",
        payload_sql()
    );
    // Several producer connections, like a real service: one connection
    // alone cannot commit 10,000 events/s here.
    const PRODUCERS: usize = 4;
    let commits: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let meter = Meter::start();
    let started = Instant::now();
    let run_for = Duration::from_secs(options.seconds);
    let mut producers = Vec::new();
    for producer_index in 0..PRODUCERS {
        // The tick's rows split as evenly as they go: the rate is exact.
        let per_tick = per_tick / PRODUCERS + usize::from(producer_index < per_tick % PRODUCERS);
        let producer = connect(&db.url).await?;
        let statement = producer.prepare(&insert).await?;
        let commits = commits.clone();
        producers.push(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_millis(1000 / ticks_per_second as u64));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while started.elapsed() < run_for {
                ticker.tick().await;
                let ids: Vec<Uuid> = (0..per_tick).map(|_| Uuid::new_v4()).collect();
                producer.execute(&statement, &[&ids]).await?;
                let committed = Instant::now();
                commits
                    .lock()
                    .unwrap()
                    .extend(ids.iter().map(|id| (id.to_string(), committed)));
            }
            Ok::<(), Error>(())
        }));
    }
    for producer in producers {
        producer.await??;
    }
    let commits = commits.lock().unwrap().clone();
    let load = meter.finish(commits.len());
    let elapsed = started.elapsed().as_secs_f64();
    let (_, cpu_after) = proc_usage(relay.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    while arrivals.lock().unwrap().len() < commits.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (peak_kib, _) = proc_usage(relay.id());
    let _ = relay.kill();
    let _ = relay.wait();
    let arrived = arrivals.lock().unwrap().clone();
    let mut lags: Vec<Duration> = commits
        .iter()
        .filter_map(|(id, committed)| arrived.get(id).map(|at| at.saturating_duration_since(*committed)))
        .collect();
    let missing = commits.len() - lags.len();
    if lags.is_empty() {
        return Err("no event arrived".into());
    }
    lags.sort();
    let at = |q: f64| lags[((lags.len() as f64 * q).ceil() as usize).clamp(1, lags.len()) - 1];
    let result = Steady {
        rate,
        sent: commits.len(),
        missing,
        p50: at(0.50),
        p95: at(0.95),
        p99: at(0.99),
        max: *lags.last().expect("at least one event"),
        peak_rss_mib: peak_kib as f64 / 1024.0,
        cpu_percent: (cpu_after - cpu_before) / elapsed * 100.0,
        load,
    };
    broker.delete().await?;
    db.drop().await?;
    Ok(result)
}

/// Single-row insert transactions from 8 connections for a fixed time.
async fn producer_throughput(options: &Options, with_trigger: bool) -> Result<f64, Error> {
    let db = BenchDb::create(options).await?;
    if !with_trigger {
        db.client
            .batch_execute("DROP TRIGGER outbox_event_relay_notify ON outbox_event")
            .await?;
    }
    let deadline = Instant::now() + Duration::from_secs(options.insert_seconds);
    let insert = format!(
        "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
         SELECT gen_random_uuid(), 'order.created', 'order-1', {} FROM (SELECT 1 AS n) AS one",
        payload_sql()
    );
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = connect(&db.url).await?;
        let insert = insert.clone();
        tasks.push(tokio::spawn(async move {
            let statement = client.prepare(&insert).await?;
            let mut count = 0u64;
            while Instant::now() < deadline {
                client.execute(&statement, &[]).await?;
                count += 1;
            }
            Ok::<u64, Error>(count)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    db.drop().await?;
    Ok(total as f64 / options.insert_seconds as f64)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Runs a scenario `times` times and keeps the median run by `key`.
async fn median_of<T, F, Fut>(times: usize, mut scenario: F, key: impl Fn(&T) -> f64) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut runs = Vec::with_capacity(times.max(1));
    for _ in 0..times.max(1) {
        runs.push(scenario().await?);
    }
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let middle = runs.len() / 2;
    Ok(runs.swap_remove(middle))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let options = Options::parse();
    eprintln!(
        "outbox-relay benchmark: {} rows; relay {}",
        options.rows,
        relay_bin()
    );

    if options.only_sqs {
        for run in sqs::run(&options, &options.sqs_endpoint).await? {
            println!(
                "SQS {}: ceiling {:.0}/s, relay {:.0}/s",
                if run.fifo { "FIFO" } else { "standard" },
                run.ceiling,
                run.relay
            );
        }
        return Ok(());
    }
    let bare = median_of(
        options.repeat,
        || bare_publisher(&options),
        |r| r.events_per_second,
    )
    .await?;
    eprintln!("bare publisher: {:.0} msg/s", bare.events_per_second);
    let naive = if options.only_drain {
        None
    } else {
        let naive = naive_relay(&options).await?;
        eprintln!("simplest correct relay: {:.0} events/s", naive.events_per_second);
        Some(naive)
    };
    let locked = median_of(options.repeat, || lock_relay(&options), |r| r.events_per_second).await?;
    eprintln!("row-lock design: {:.0} events/s", locked.events_per_second);
    let mut drains = Vec::new();
    for &replicas in &options.replicas {
        let result = median_of(
            options.repeat,
            || drain(&options, replicas),
            |d| d.run.events_per_second,
        )
        .await?;
        eprintln!(
            "drain with {replicas}: {:.0} events/s",
            result.run.events_per_second
        );
        drains.push(result);
    }

    println!(
        "\n| drain ({} rows, ~300 B payloads; batch {} × {} workers) | events/s | vs bare publisher | vs simplest relay | relay peak RSS | relay CPU | PostgreSQL CPU | RabbitMQ CPU | machine busy |",
        options.rows, options.batch_size, options.workers
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let row = |name: String, run: &Run, relay: Option<(f64, f64)>| {
        let rate = run.events_per_second;
        let versus_naive = naive
            .map(|n| format!("{:.0}x", rate / n.events_per_second))
            .unwrap_or_default();
        let (rss, cpu) = relay
            .map(|(rss, cpu)| (format!("{rss:.1} MiB"), format!("{cpu:.0}%")))
            .unwrap_or_default();
        println!(
            "| {name} | {rate:.0} | {:.1}% | {versus_naive} | {rss} | {cpu} | {:.0}% | {:.0}% | {:.0}% |",
            rate / bare.events_per_second * 100.0,
            run.postgres_percent,
            run.rabbitmq_percent,
            run.machine_busy_percent
        );
    };
    row(
        format!(
            "bare lapin publisher, {}-message confirm window",
            options.batch_size * options.workers
        ),
        &bare,
        None,
    );
    if let Some(naive) = &naive {
        row(
            format!("simplest correct relay ({} rows)", options.naive_rows),
            naive,
            None,
        );
    }
    row(
        format!(
            "row lock held across the publish, {} loops, batched confirms",
            options.workers
        ),
        &locked,
        None,
    );
    for d in &drains {
        row(
            format!(
                "outbox-relay, {} replica{}",
                d.replicas,
                if d.replicas == 1 { "" } else { "s" }
            ),
            &d.run,
            Some((d.peak_rss_mib, d.relay_percent)),
        );
    }
    println!(
        "\nEach row: the median of {} run(s). CPU in % of one core, averaged over the run; HOT updates in the relay's runs: {}.",
        options.repeat.max(1),
        drains
            .iter()
            .map(|d| format!("{:.0}%", d.hot_share * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if options.only_drain {
        return Ok(());
    }

    let sqs_runs = if options.skip_sqs {
        Vec::new()
    } else {
        sqs::run(&options, &options.sqs_endpoint).await?
    };
    let mut steadies = Vec::new();
    for &rate in &options.rates {
        let result = steady(&options, rate).await?;
        eprintln!("steady {rate}/s: p99 {}", ms(result.p99));
        steadies.push(result);
    }
    let with_trigger = producer_throughput(&options, true).await?;
    let without_trigger = producer_throughput(&options, false).await?;

    if !sqs_runs.is_empty() {
        println!(
            "\n| SQS emulator at {} ({} rows a run, each from an empty queue) | emulator ceiling, events/s | outbox-relay, events/s | relay vs ceiling | relay peak RSS |",
            options.sqs_endpoint, options.sqs_rows
        );
        println!("|---|---:|---:|---:|---:|");
        for run in &sqs_runs {
            println!(
                "| {} queue | {:.0} | {:.0} | {:.0}% | {:.1} MiB |",
                if run.fifo { "FIFO" } else { "standard" },
                run.ceiling,
                run.relay,
                run.relay / run.ceiling * 100.0,
                run.relay_peak_rss_mib
            );
        }
    }
    println!("\n| steady state | events (late) | committed/s | p50 | p95 | p99 | max | relay RSS | relay CPU | PostgreSQL CPU | RabbitMQ CPU | machine busy |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in &steadies {
        println!(
            "| {}/s for {} s | {} ({}) | {:.0} | {} | {} | {} | {} | {:.1} MiB | {:.0}% | {:.0}% | {:.0}% | {:.0}% |",
            s.rate,
            options.seconds,
            s.sent,
            s.missing,
            s.load.events_per_second,
            ms(s.p50),
            ms(s.p95),
            ms(s.p99),
            ms(s.max),
            s.peak_rss_mib,
            s.cpu_percent,
            s.load.postgres_percent,
            s.load.rabbitmq_percent,
            s.load.machine_busy_percent
        );
    }
    println!("\n| producer inserts, 8 connections, single-row transactions | inserts/s |");
    println!("|---|---:|");
    println!("| with the NOTIFY trigger | {with_trigger:.0} |");
    println!("| without it | {without_trigger:.0} |");
    println!(
        "| cost of the trigger | {:.1}% |",
        (1.0 - with_trigger / without_trigger) * 100.0
    );
    Ok(())
}
