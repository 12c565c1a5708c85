//! Throughput of the relay into SQS next to the emulator's own ceiling.
//!
//! ```text
//! moto_server -H 127.0.0.1 -p 4566 &      # or any SQS endpoint
//! cargo run --release --example sqs_bench [EVENTS]
//! ```
//!
//! For a standard and a FIFO queue it measures, in one run against the same
//! endpoint:
//!
//! - **ceiling**: a bare `SendMessageBatch` loop (10 entries a request, the
//!   sink's number of requests in flight) sending the same messages to a
//!   fresh queue: the most any client gets from this endpoint;
//! - **relay**: the relay (claim → SQS sink → mark, in this process) moving
//!   the same number of outbox rows to another fresh queue.
//!
//! Both start from an empty queue and end at EVENTS messages, so they see
//! the same queue depths: some emulators (moto) slow down as a queue fills,
//! which makes only the side-by-side ratio meaningful, never the absolute
//! numbers. Settings: `OUTBOX_BENCH_PG_URL` (an admin connection that may
//! create databases), `OUTBOX_BENCH_SQS_ENDPOINT`, and the relay's own
//! `OUTBOX_*` variables (`OUTBOX_BATCH_SIZE`, `OUTBOX_WORKERS`, …). The
//! database and queues it creates are dropped at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry};
use clap::Parser;
use futures::StreamExt;
use outbox_relay::config::{DatabaseSettings, RelayConfig, RelaySettings, SinkConfig, SqsConfig};
use outbox_relay::metrics::Metrics;
use outbox_relay::relay::Relay;
use outbox_relay::sink::sqs::IN_FLIGHT;
use outbox_relay::store::Store;
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Aggregates the rows are spread over (the FIFO message groups).
const AGGREGATES: usize = 50;

struct Bench {
    admin_url: String,
    endpoint: String,
    sqs: aws_sdk_sqs::Client,
    events: usize,
    relay: RelayConfig,
}

/// The relay's own settings: the `run` defaults and `OUTBOX_*` variables,
/// with a short idle poll so the start is not measured as a sleep.
#[derive(Parser)]
struct Settings {
    #[command(flatten)]
    relay: RelaySettings,
}

fn main() -> anyhow::Result<()> {
    // The relay's sink takes its credentials from the standard chain; an
    // emulator needs some, any. Set before any thread starts.
    for (key, value) in [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ] {
        if std::env::var_os(key).is_none() {
            std::env::set_var(key, value);
        }
    }
    // Relay logs (backoff, outages) go to stderr at RUST_LOG's level.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Runtime::new()?.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let events: usize = match std::env::args().nth(1) {
        Some(raw) => raw.parse().context("EVENTS must be a whole number")?,
        None => 1000,
    };
    let endpoint =
        std::env::var("OUTBOX_BENCH_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into());
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "bench"))
            .endpoint_url(&endpoint)
            .build(),
    );
    let bench = Bench {
        admin_url: std::env::var("OUTBOX_BENCH_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into()),
        endpoint,
        sqs,
        events,
        relay: Settings::try_parse_from(["sqs_bench", "--poll-interval", "50ms", "--retention", "0"])?
            .relay
            .validate()?,
    };
    println!(
        "sqs_bench: {events} events per run; batch size {}, {} workers, {IN_FLIGHT} requests in flight per batch; {}",
        bench.relay.batch_size, bench.relay.workers, bench.endpoint
    );
    println!(
        "{:<10} {:>14} {:>14} {:>8}",
        "queue", "ceiling ev/s", "relay ev/s", "ratio"
    );
    for fifo in [false, true] {
        let ceiling = bench.ceiling(fifo).await?;
        let relay = bench.relay(fifo).await?;
        println!(
            "{:<10} {:>14.0} {:>14.0} {:>7.0}%",
            if fifo { "fifo" } else { "standard" },
            ceiling,
            relay,
            100.0 * relay / ceiling
        );
    }
    Ok(())
}

/// The payload every benchmark message carries (about 200 bytes, a typical
/// small domain event).
fn payload(n: usize) -> String {
    format!(
        r#"{{"n": {n}, "order": {{"id": "ord-{n}", "lines": [{{"sku": "A-1", "qty": 2}}, {{"sku": "B-7", "qty": 1}}], "total": "129.90", "currency": "EUR"}}, "note": "benchmark event"}}"#
    )
}

impl Bench {
    async fn create_queue(&self, fifo: bool) -> anyhow::Result<String> {
        let name = format!(
            "outbox-bench-{}{}",
            Uuid::new_v4().simple(),
            if fifo { ".fifo" } else { "" }
        );
        let mut request = self.sqs.create_queue().queue_name(name);
        if fifo {
            request = request.attributes(QueueAttributeName::FifoQueue, "true");
        }
        let created = request.send().await.map_err(|e| {
            anyhow!(
                "CreateQueue on {}: {}",
                self.endpoint,
                aws_sdk_sqs::error::DisplayErrorContext(e)
            )
        })?;
        created
            .queue_url()
            .map(str::to_owned)
            .context("CreateQueue returned no URL")
    }

    async fn delete_queue(&self, url: &str) {
        let _ = self.sqs.delete_queue().queue_url(url).send().await;
    }

    /// Events per second of a bare `SendMessageBatch` loop.
    async fn ceiling(&self, fifo: bool) -> anyhow::Result<f64> {
        let url = self.create_queue(fifo).await?;
        let requests: Vec<Vec<SendMessageBatchRequestEntry>> = (0..self.events)
            .collect::<Vec<_>>()
            .chunks(10)
            .map(|chunk| {
                chunk
                    .iter()
                    .enumerate()
                    .map(|(position, &n)| {
                        let id = Uuid::new_v4().to_string();
                        let aggregate = format!("agg-{}", n % AGGREGATES);
                        let attribute = |value: &str| {
                            MessageAttributeValue::builder()
                                .data_type("String")
                                .string_value(value)
                                .build()
                                .expect("data type is set")
                        };
                        let mut entry = SendMessageBatchRequestEntry::builder()
                            .id(position.to_string())
                            .message_body(payload(n))
                            .message_attributes("event_id", attribute(&id))
                            .message_attributes("event_type", attribute("order.created"))
                            .message_attributes("aggregate_id", attribute(&aggregate));
                        if fifo {
                            entry = entry.message_group_id(aggregate).message_deduplication_id(id);
                        }
                        entry.build().expect("id and body are set")
                    })
                    .collect()
            })
            .collect();
        let started = Instant::now();
        let results: Vec<Result<usize, String>> = futures::stream::iter(requests)
            .map(|entries| {
                let sqs = self.sqs.clone();
                let url = url.clone();
                async move {
                    let count = entries.len();
                    let output = sqs
                        .send_message_batch()
                        .queue_url(url)
                        .set_entries(Some(entries))
                        .send()
                        .await
                        .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
                    if !output.failed().is_empty() {
                        return Err(format!("{} entries failed", output.failed().len()));
                    }
                    Ok(count)
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        let elapsed = started.elapsed();
        self.delete_queue(&url).await;
        let sent: usize = results
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow!(e))?
            .iter()
            .sum();
        Ok(sent as f64 / elapsed.as_secs_f64())
    }

    /// Events per second of the relay, from start to the last row marked.
    async fn relay(&self, fifo: bool) -> anyhow::Result<f64> {
        let url = self.create_queue(fifo).await?;
        let (admin, connection) = tokio_postgres::connect(&self.admin_url, NoTls)
            .await
            .with_context(|| format!("PostgreSQL at {}", self.admin_url))?;
        tokio::spawn(connection);
        let database = format!("outbox_bench_{}", Uuid::new_v4().simple());
        admin
            .batch_execute(&format!("CREATE DATABASE {database}"))
            .await?;
        let result = self.relay_in(&database, &url).await;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
            .await?;
        self.delete_queue(&url).await;
        result
    }

    async fn relay_in(&self, database: &str, queue_url: &str) -> anyhow::Result<f64> {
        let mut url = url::Url::parse(&self.admin_url)?;
        url.set_path(&format!("/{database}"));
        let database = DatabaseSettings {
            database_url: url.to_string(),
            table: "outbox_event".into(),
        }
        .validate()?;
        let (mut client, connection) = tokio_postgres::connect(url.as_str(), NoTls).await?;
        tokio::spawn(connection);
        outbox_relay::store::migrate(&mut client, &database.table, true).await?;
        client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
                 SELECT gen_random_uuid(), 'order.created', 'agg-' || (n % $2::bigint),
                        $3::text::jsonb || jsonb_build_object('n', n), clock_timestamp()
                 FROM generate_series(0, $1::bigint - 1) AS n",
                &[&(self.events as i64), &(AGGREGATES as i64), &payload(0)],
            )
            .await?;
        let sink = outbox_relay::sink::build(&SinkConfig::Sqs(SqsConfig {
            queue_url: queue_url.to_owned(),
            endpoint_url: Some(self.endpoint.clone()),
        }))
        .await?;
        let store = Arc::new(Store::new(&database, 8));
        let relay = Relay::new(store, sink.into(), self.relay.clone(), Arc::new(Metrics::new()));
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { relay.run(shutdown).await }
        });
        let total = self.events as i64;
        loop {
            let done: i64 = client
                .query_one(
                    "SELECT count(*) FROM outbox_event WHERE published_at IS NOT NULL OR quarantined_at IS NOT NULL",
                    &[],
                )
                .await?
                .get(0);
            if done >= total {
                break;
            }
            if started.elapsed() > Duration::from_secs(600) {
                shutdown.cancel();
                return Err(anyhow!("only {done} of {total} rows done after 10 minutes"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let elapsed = started.elapsed();
        shutdown.cancel();
        task.await?;
        let published: i64 = client
            .query_one(
                "SELECT count(*) FROM outbox_event WHERE published_at IS NOT NULL",
                &[],
            )
            .await?
            .get(0);
        if published != total {
            return Err(anyhow!("{} rows were quarantined", total - published));
        }
        Ok(total as f64 / elapsed.as_secs_f64())
    }
}
