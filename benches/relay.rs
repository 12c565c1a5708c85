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
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
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
    rows: usize,
    seconds: f64,
    peak_rss_mib: f64,
    cpu_seconds: f64,
}

async fn drain(options: &Options, replicas: usize) -> Result<Drain, Error> {
    let db = BenchDb::create(options).await?;
    let broker = Broker::create(options).await?;
    db.prefill(options.rows).await?;
    let arrivals = broker.consume().await?;
    let started = Instant::now();
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
        if db.unpublished().await? == 0 && arrivals.lock().unwrap().len() >= options.rows {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    for relay in &mut relays {
        let _ = relay.kill();
        let _ = relay.wait();
    }
    broker.delete().await?;
    db.drop().await?;
    Ok(Drain {
        replicas,
        rows: options.rows,
        seconds,
        peak_rss_mib: last_usage.iter().map(|u| u.0).max().unwrap_or(0) as f64 / 1024.0,
        cpu_seconds: last_usage.iter().map(|u| u.1).sum(),
    })
}

/// A bare publisher: the same messages with the same confirm window the
/// relay keeps in flight (batch size × workers), no database at all.
async fn bare_publisher(options: &Options) -> Result<f64, Error> {
    let broker = Broker::create(options).await?;
    let _arrivals = broker.consume().await?;
    let channel = broker.connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    let body = vec![b'x'; 300];
    let window = options.batch_size * options.workers;
    let started = Instant::now();
    let mut in_flight = futures::stream::FuturesUnordered::new();
    for n in 0..options.rows {
        if in_flight.len() >= window {
            in_flight.next().await.expect("a confirm")?;
        }
        let confirm = channel
            .basic_publish(
                broker.exchange.as_str().into(),
                "order.created".into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &body,
                BasicProperties::default()
                    .with_message_id(n.to_string().into())
                    .with_delivery_mode(2),
            )
            .await?;
        in_flight.push(confirm);
    }
    while let Some(confirm) = in_flight.next().await {
        confirm?;
    }
    let rate = options.rows as f64 / started.elapsed().as_secs_f64();
    broker.delete().await?;
    Ok(rate)
}

/// The simplest correct relay: per batch one transaction; each row
/// published and its confirm awaited before the next; one UPDATE per row.
async fn naive_relay(options: &Options) -> Result<f64, Error> {
    let db = BenchDb::create(options).await?;
    let broker = Broker::create(options).await?;
    db.prefill(options.naive_rows).await?;
    let _arrivals = broker.consume().await?;
    let channel = broker.connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut client = connect(&db.url).await?;
    let started = Instant::now();
    loop {
        let tx = client.transaction().await?;
        let rows = tx
            .query(
                "SELECT id, event_type, payload::text FROM outbox_event
                 WHERE published_at IS NULL ORDER BY created_at, id LIMIT 100 FOR UPDATE SKIP LOCKED",
                &[],
            )
            .await?;
        if rows.is_empty() {
            break;
        }
        for row in rows {
            let id: Uuid = row.get(0);
            let event_type: String = row.get(1);
            let payload: String = row.get(2);
            let confirmation = channel
                .basic_publish(
                    broker.exchange.as_str().into(),
                    event_type.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    payload.as_bytes(),
                    BasicProperties::default()
                        .with_message_id(id.to_string().into())
                        .with_delivery_mode(2),
                )
                .await?
                .await?;
            assert!(confirmation.is_ack());
            tx.execute(
                "UPDATE outbox_event SET published_at = now() WHERE id = $1",
                &[&id],
            )
            .await?;
        }
        tx.commit().await?;
    }
    let rate = options.naive_rows as f64 / started.elapsed().as_secs_f64();
    broker.delete().await?;
    db.drop().await?;
    Ok(rate)
}

/// The row-lock alternative to the committed lease, at its best: per batch
/// one transaction holding the rows' locks across the publish, the batch's
/// confirms awaited together, one UPDATE for the batch; `--workers` loops at
/// once like the relay. One row version per publish instead of the lease's
/// two, but a transaction stays open for every broker round trip.
async fn lock_relay(options: &Options) -> Result<f64, Error> {
    let db = BenchDb::create(options).await?;
    let broker = Broker::create(options).await?;
    db.prefill(options.rows).await?;
    let arrivals = broker.consume().await?;
    let started = Instant::now();
    let mut loops = Vec::new();
    for _ in 0..options.workers {
        let mut client = connect(&db.url).await?;
        let channel = broker.connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        let exchange = broker.exchange.clone();
        let batch_size = options.batch_size;
        loops.push(tokio::spawn(async move {
            loop {
                let tx = client.transaction().await?;
                let rows = tx
                    .query(
                        "SELECT id, event_type, payload::text FROM outbox_event
                         WHERE published_at IS NULL AND quarantined_at IS NULL AND next_attempt_at <= now()
                         ORDER BY created_at, id LIMIT $1 FOR UPDATE SKIP LOCKED",
                        &[&(batch_size as i64)],
                    )
                    .await?;
                if rows.is_empty() {
                    return Ok::<(), Error>(());
                }
                let mut confirms = Vec::with_capacity(rows.len());
                let mut ids = Vec::with_capacity(rows.len());
                for row in &rows {
                    let id: Uuid = row.get(0);
                    let event_type: &str = row.get(1);
                    let payload: &str = row.get(2);
                    confirms.push(
                        channel
                            .basic_publish(
                                exchange.as_str().into(),
                                event_type.into(),
                                BasicPublishOptions {
                                    mandatory: true,
                                    ..Default::default()
                                },
                                payload.as_bytes(),
                                BasicProperties::default()
                                    .with_message_id(id.to_string().into())
                                    .with_delivery_mode(2),
                            )
                            .await?,
                    );
                    ids.push(id);
                }
                for confirmation in futures::future::join_all(confirms).await {
                    assert!(confirmation?.is_ack());
                }
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
    let rate = options.rows as f64 / started.elapsed().as_secs_f64();
    broker.delete().await?;
    db.drop().await?;
    Ok(rate)
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
    let per_tick = rate.div_ceil(ticks_per_second);
    let insert = format!(
        "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
         SELECT id, 'order.created', 'order-' || n, {}
         FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n)",
        payload_sql()
    );
    // Several producer connections, like a real service: one connection
    // alone cannot commit 10,000 events/s here.
    const PRODUCERS: usize = 4;
    let per_tick = per_tick.div_ceil(PRODUCERS);
    let commits: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let started = Instant::now();
    let run_for = Duration::from_secs(options.seconds);
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
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

#[tokio::main]
async fn main() -> Result<(), Error> {
    let options = Options::parse();
    eprintln!(
        "outbox-relay benchmark: {} rows; relay {}",
        options.rows,
        relay_bin()
    );

    if options.only_drain {
        for &replicas in &options.replicas {
            let d = drain(&options, replicas).await?;
            println!(
                "drain, {replicas} replica(s), batch {} × {} workers: {:.0} events/s, {:.0}% of a core",
                options.batch_size,
                options.workers,
                d.rows as f64 / d.seconds,
                d.cpu_seconds / d.seconds * 100.0
            );
        }
        return Ok(());
    }
    let bare = bare_publisher(&options).await?;
    eprintln!("bare publisher: {bare:.0} msg/s");
    let naive = naive_relay(&options).await?;
    eprintln!("simplest correct relay: {naive:.0} events/s");
    let locked = lock_relay(&options).await?;
    eprintln!("row-lock design: {locked:.0} events/s");
    let mut drains = Vec::new();
    for &replicas in &options.replicas {
        let result = drain(&options, replicas).await?;
        eprintln!(
            "drain with {replicas}: {:.0} events/s",
            result.rows as f64 / result.seconds
        );
        drains.push(result);
    }
    let mut steadies = Vec::new();
    for &rate in &options.rates {
        let result = steady(&options, rate).await?;
        eprintln!("steady {rate}/s: p99 {}", ms(result.p99));
        steadies.push(result);
    }
    let with_trigger = producer_throughput(&options, true).await?;
    let without_trigger = producer_throughput(&options, false).await?;

    println!("\n| drain ({} rows, ~300 B payloads) | events/s | vs bare publisher | vs simplest relay | peak RSS | CPU |", options.rows);
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "| bare lapin publisher, {}-message confirm window | {bare:.0} | 100% | | | |",
        options.batch_size * options.workers
    );
    println!(
        "| simplest correct relay ({} rows) | {naive:.0} | {:.1}% | 1.0x | | |",
        options.naive_rows,
        naive / bare * 100.0
    );
    println!(
        "| row lock held across the publish, {} loops, batched confirms | {locked:.0} | {:.1}% | {:.0}x | | |",
        options.workers,
        locked / bare * 100.0,
        locked / naive
    );
    for d in &drains {
        let rate = d.rows as f64 / d.seconds;
        println!(
            "| outbox-relay, {} replica{} | {rate:.0} | {:.1}% | {:.0}x | {:.1} MiB | {:.0}% of a core |",
            d.replicas,
            if d.replicas == 1 { "" } else { "s" },
            rate / bare * 100.0,
            rate / naive,
            d.peak_rss_mib,
            d.cpu_seconds / d.seconds * 100.0
        );
    }
    println!("\n| steady state | events (late) | p50 | p95 | p99 | max | relay RSS | relay CPU |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for s in &steadies {
        println!(
            "| {}/s for {} s | {} ({}) | {} | {} | {} | {} | {:.1} MiB | {:.0}% |",
            s.rate,
            options.seconds,
            s.sent,
            s.missing,
            ms(s.p50),
            ms(s.p95),
            ms(s.p99),
            ms(s.max),
            s.peak_rss_mib,
            s.cpu_percent
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
