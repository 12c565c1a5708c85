//! The relay benchmark: `cargo bench --bench relay -- [OPTIONS]`.
//!
//! Runs against the local PostgreSQL and RabbitMQ, each scenario in a fresh
//! database with its own exchange and queue, and prints one table:
//!
//! - drain: N prefilled rows (~300-byte payloads, created one after another,
//!   or all at once with `--one-created-at`) published by 1, 2 and 4
//!   relay processes (the release binary), events/s, peak RSS and CPU;
//! - the broker's own limit: a bare lapin publisher, same messages, same
//!   confirm window as the relay keeps in flight;
//! - the simplest correct relay: a transaction per batch, one publish at a
//!   time waiting for each confirm, one UPDATE per row;
//! - steady state: a producer committing at a fixed rate, lag from its
//!   commit to a consumer receiving the message (p50/p95/p99/max);
//! - what the NOTIFY trigger costs producers: single-row insert throughput
//!   with 8 connections, with and without the trigger;
//! - NATS JetStream: the relay against a bare async-nats JetStream
//!   publisher, same messages, same acknowledgements in flight;
//! - Kafka: the relay against a bare rdkafka producer with the relay's own
//!   producer settings, same records, same reports in flight, on
//!   librdkafka's mock cluster;
//! - with `--delete-drain`: the drain with OUTBOX_ON_PUBLISH=delete;
//! - with `--ordered-drain`: the drain with OUTBOX_ORDERING=aggregate;
//! - with `--scale`: a drain behind a large backlog, claim latency behind
//!   rows backing off, the gauge refresh on a large table, and a drain
//!   while retention deletes old published rows;
//! - with `--migrate-lock`: how long `migrate` holds up a producer on a
//!   seed-shaped table of `--migrate-rows` rows;
//! - with `--sources`: one relay serving several databases, a source's
//!   drain alone, beside another draining and beside a faulty one, and the
//!   memory of a relay serving many idle sources;
//! - with `--tracing`: the drain with publish spans off, exported over
//!   OTLP and made but not sampled;
//! - with `--partitioned`: a drain and retention on a daily-partitioned
//!   table against a plain one, producers inserting during retention.
//!
//! One module per kind of run: [`drain`] (the relay), [`baselines`] (what
//! it is measured against), [`steady`], [`notify_cost`], [`sqs`], [`nats`], [`kafka`],
//! [`scale`], [`migrate_lock`], [`sources`], [`tracing_cost`] and [`partitioned`]; what they start from is in [`fixture`],
//! what they measure with in [`meter`], and [`report`] prints the tables.

mod baselines;
mod drain;
mod fixture;
mod kafka;
mod meter;
mod migrate_lock;
mod nats;
mod notify_cost;
mod partitioned;
mod report;
mod scale;
mod sources;
mod sqs;
mod steady;
mod tracing_cost;
mod versus;

use std::time::Duration;

use clap::Parser;

use fixture::OutboxRelay;
use outbox_test_support::proxy::Proxy;
use outbox_test_support::RelayBinary;

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
    /// Admin connection to PostgreSQL; the relays and the row-lock loop
    /// connect to their databases on it the same way. Without TLS by
    /// default, as the loop (tokio-postgres without a TLS connector)
    /// always connects: the relay's default `sslmode=prefer` would
    /// otherwise negotiate TLS with a server that offers it, and the
    /// pairs would compare a relay behind TLS with a loop without.
    #[arg(
        long,
        default_value = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
    )]
    pg_url: String,
    /// A round trip, in milliseconds, added between PostgreSQL and every
    /// client of it in the runs (the relays, the row-lock loop, the
    /// seeding and the measures): a proxy in this process holds what it
    /// reads for half of it each way. For a database that is not beside
    /// the relay; off by default.
    #[arg(long, value_name = "MS")]
    pg_round_trip_ms: Option<f64>,
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
    /// Rows for each NATS JetStream run (bare publisher and relay).
    #[arg(long, default_value = "50000")]
    nats_rows: usize,
    /// Leave out the NATS runs.
    #[arg(long)]
    skip_nats: bool,
    /// Only the NATS runs.
    #[arg(long)]
    only_nats: bool,
    /// Rows for each Kafka run (bare producer and relay).
    #[arg(long, default_value = "50000")]
    kafka_rows: usize,
    /// Leave out the Kafka runs.
    #[arg(long)]
    skip_kafka: bool,
    /// Only the Kafka runs.
    #[arg(long)]
    only_kafka: bool,
    /// Table fillfactor for the drain and steady-state runs, instead of
    /// the one `migrate` sets (to try how much room the leases need).
    #[arg(long)]
    fillfactor: Option<u32>,
    /// Seed the drain runs' rows (the row lock's and the relay's) all with
    /// one created_at, as a single transaction writing them would, instead
    /// of one after another. Claims then take the rows in id order, which
    /// with random ids is a random walk over the table's pages.
    #[arg(long)]
    one_created_at: bool,
    /// Only the relay's drain runs (to compare settings quickly).
    #[arg(long)]
    only_drain: bool,
    /// Also the row-lock loop and the relay (1 replica) in `--repeat`
    /// pairs, each pair back to back (odd pairs the loop first, even pairs
    /// the relay), with the ratio of each pair and the medians.
    #[arg(long)]
    versus: bool,
    /// Only the pairs of `--versus`.
    #[arg(long)]
    only_versus: bool,
    /// A variable for every relay the benchmark starts, `NAME=VALUE`
    /// (repeatable): to measure a setting against the defaults.
    #[arg(long, value_parser = parse_variable)]
    relay_env: Vec<(&'static str, String)>,
    /// Only the drain of one relay with its destination from the
    /// environment, then from a configuration file, alternating `--repeat`
    /// times.
    #[arg(long)]
    only_config_file: bool,
    /// Also drain with OUTBOX_ON_PUBLISH=delete (1 replica), against mark.
    #[arg(long)]
    delete_drain: bool,
    /// Also drain with OUTBOX_ORDERING=aggregate (1 replica; the rows are
    /// in 5,000 aggregates), against unordered.
    #[arg(long)]
    ordered_drain: bool,
    /// Also the runs on large tables (sizes below); they take minutes.
    #[arg(long)]
    scale: bool,
    /// `--scale`: rows of the large backlog drained by 1 replica, against
    /// the `--rows` drain.
    #[arg(long, default_value = "1000000")]
    backlog_rows: usize,
    /// `--scale`: rows backing off ahead of the due rows the claims take.
    #[arg(long, default_value = "500000")]
    backing_off_rows: usize,
    /// `--scale`: unpublished rows when the gauges are refreshed.
    #[arg(long, default_value = "5000000")]
    gauge_rows: usize,
    /// `--scale`: old published rows retention deletes during a drain.
    #[arg(long, default_value = "5000000")]
    retained_rows: usize,
    /// Also measure how long `migrate` holds up a producer on a big
    /// seed-shaped table (it takes minutes to seed at the default size).
    #[arg(long)]
    migrate_lock: bool,
    /// Only the `migrate` run (implies `--migrate-lock`).
    #[arg(long)]
    only_migrate: bool,
    /// Rows of the seed-shaped table `migrate` upgrades.
    #[arg(long, default_value = "5000000")]
    migrate_rows: usize,
    /// Also the many-sources runs (a private PostgreSQL cluster for the
    /// idle sources).
    #[arg(long)]
    sources: bool,
    /// Only the many-sources runs.
    #[arg(long)]
    only_sources: bool,
    /// `--sources`: rows of each draining source.
    #[arg(long, default_value = "50000")]
    source_rows: usize,
    /// `--sources`: how many idle sources a relay serves, one run each
    /// (comma-separated).
    #[arg(long, default_value = "1,10,50", value_delimiter = ',')]
    idle_sources: Vec<usize>,
    /// `--sources`: how long the relay idles before its memory is read.
    #[arg(long, default_value = "15")]
    idle_seconds: u64,
    /// Also the drain with publish spans off, exported and unsampled.
    #[arg(long)]
    tracing: bool,
    /// Only the tracing runs.
    #[arg(long)]
    only_tracing: bool,
    /// Also a drain and retention on a daily-partitioned table against a
    /// plain one (retention seeds take minutes at the default size).
    #[arg(long)]
    partitioned: bool,
    /// Only the partitioned-table runs.
    #[arg(long)]
    only_partitioned: bool,
    /// `--partitioned`: rows of each drain, created over the last three
    /// days and today.
    #[arg(long, default_value = "100000")]
    partition_rows: usize,
    /// `--partitioned`: old published rows retention removes, on each
    /// kind of table.
    #[arg(long, default_value = "2000000")]
    partition_retained_rows: usize,
    /// `--partitioned`: producer connections inserting single rows during
    /// retention.
    #[arg(long, default_value = "4")]
    partition_producers: usize,
    /// Accepted for `cargo bench` compatibility.
    #[arg(long, hide = true)]
    bench: bool,
    /// `synchronous_commit` for the row-lock loop's sessions; the server's
    /// (`on`) by default. `off` gives the loop what the relay's default
    /// OUTBOX_SYNCHRONOUS_COMMIT gives the relay.
    #[arg(long)]
    row_lock_synchronous_commit: Option<String>,
    /// Internal: run only the row-lock loop against this database URL, in
    /// a process of its own (the benchmark starts itself so), publishing
    /// to `--row-lock-exchange` with `--batch-size` and `--workers`.
    #[arg(long, hide = true, requires = "row_lock_exchange")]
    row_lock_database: Option<String>,
    /// Internal: the row-lock loop's exchange.
    #[arg(long, hide = true)]
    row_lock_exchange: Option<String>,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A `--relay-env` argument. The name is leaked, once per argument, so
/// that it sits beside the fixed names of `fixture::relay_settings`.
fn parse_variable(text: &str) -> Result<(&'static str, String), String> {
    text.split_once('=')
        .map(|(name, value)| (&*Box::leak(name.to_owned().into_boxed_str()), value.to_owned()))
        .ok_or_else(|| format!("expected NAME=VALUE, got '{text}'"))
}

/// Runs a scenario `times` times and keeps the median run by `key`.
/// The cost of reading the destination from a configuration file: the
/// same drain, alternately configured by the environment and by the file,
/// so that both see the same machine.
async fn config_file(options: &Options) -> Result<(), Error> {
    let mut runs: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..options.repeat.max(1) {
        for (config_file, rates) in [false, true].into_iter().zip(runs.iter_mut()) {
            let setup = drain::Setup {
                config_file,
                ..Default::default()
            };
            let run = drain::drain_with(options, 1, options.rows, setup).await?;
            eprintln!(
                "drain, destination from the {}: {:.0} events/s",
                if config_file { "file" } else { "environment" },
                run.run.events_per_second
            );
            rates.push(run.run.events_per_second);
        }
    }
    let median = |rates: &mut Vec<f64>| {
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    };
    let (environment, file) = (median(&mut runs[0]), median(&mut runs[1]));
    println!(
        "| destination from | events/s (median of {}) |\n|---|---|\n| environment | {environment:.0} |\n| configuration file | {file:.0} ({:.2}×) |",
        options.repeat.max(1),
        file / environment
    );
    Ok(())
}

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

/// `url` rewritten to reach its server through a proxy that holds what
/// passes for at least `each_way` in either direction, for as long as the
/// process lives. The proxy has a thread and runtime of its own: the
/// benchmark blocks its own threads at times while a child process or a
/// dropped database goes through the proxy, and the proxy's timing should
/// not wait on the benchmark's consumers.
fn far_database(url: &str, each_way: Duration) -> String {
    let (started, via) = std::sync::mpsc::channel();
    let url = url.to_owned();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the proxy");
        runtime.block_on(async move {
            let (_proxy, via) = Proxy::in_front_of_with_latency(&url, each_way).await;
            started.send(via).expect("the benchmark waits for the proxy");
            std::future::pending::<()>().await
        })
    });
    via.recv().expect("the proxy started")
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut options = Options::parse();
    if let (Some(database), Some(exchange)) = (&options.row_lock_database, &options.row_lock_exchange) {
        return baselines::row_lock_loops(&options, database, exchange).await;
    }
    // Every database a run makes is reached through this URL, so the
    // proxy stands between PostgreSQL and all of its clients until the
    // benchmark ends.
    if let Some(round_trip) = options.pg_round_trip_ms.filter(|ms| *ms > 0.0) {
        options.pg_url = far_database(&options.pg_url, Duration::from_secs_f64(round_trip / 2000.0));
        eprintln!("PostgreSQL behind a proxy adding at least {round_trip} ms a round trip");
    }
    eprintln!(
        "outbox-relay benchmark: {} rows; relay {}",
        options.rows,
        OutboxRelay::PATH
    );

    if options.only_nats {
        report::nats_table(&options, Some(&nats::run(&options).await?));
        return Ok(());
    }
    if options.only_kafka {
        report::kafka_table(&options, Some(&kafka::run(&options).await?));
        return Ok(());
    }
    if options.only_migrate {
        return migrate_lock(&options).await;
    }
    if options.only_sqs {
        report::sqs_lines(&sqs::run(&options, &options.sqs_endpoint).await?);
        return Ok(());
    }
    if options.only_config_file {
        return config_file(&options).await;
    }
    if options.only_sources {
        return sources::run(&options).await;
    }
    if options.only_tracing {
        return tracing_cost::run(&options).await;
    }
    if options.only_partitioned {
        return partitioned::run(&options).await;
    }
    if options.only_versus {
        return versus::run(&options).await;
    }
    let bare = median_of(
        options.repeat,
        || baselines::bare_publisher(&options),
        |r| r.events_per_second,
    )
    .await?;
    eprintln!("bare publisher: {:.0} msg/s", bare.events_per_second);
    let naive = if options.only_drain {
        None
    } else {
        let naive = baselines::naive_relay(&options).await?;
        eprintln!("simplest correct relay: {:.0} events/s", naive.events_per_second);
        Some(naive)
    };
    let locked = median_of(
        options.repeat,
        || baselines::lock_relay(&options),
        |r| r.run.events_per_second,
    )
    .await?
    .run;
    eprintln!("row-lock design: {:.0} events/s", locked.events_per_second);
    let mut drains = Vec::new();
    for &replicas in &options.replicas {
        let result = median_of(
            options.repeat,
            || drain::drain(&options, replicas),
            |d| d.run.events_per_second,
        )
        .await?;
        eprintln!(
            "drain with {replicas}: {:.0} events/s",
            result.run.events_per_second
        );
        drains.push(result);
    }
    // One replica with one setting changed, against the drains above.
    let variants = [
        (
            options.delete_drain,
            drain::Setup {
                delete: true,
                ..Default::default()
            },
            "OUTBOX_ON_PUBLISH=delete",
        ),
        (
            options.ordered_drain,
            drain::Setup {
                ordered: true,
                ..Default::default()
            },
            "OUTBOX_ORDERING=aggregate",
        ),
    ];
    for (_, setup, setting) in variants.into_iter().filter(|(wanted, _, _)| *wanted) {
        let result = median_of(
            options.repeat,
            || drain::drain_with(&options, 1, options.rows, setup),
            |d| d.run.events_per_second,
        )
        .await?;
        eprintln!(
            "drain with 1, {setting}: {:.0} events/s",
            result.run.events_per_second
        );
        drains.push(result);
    }
    report::drain_table(&options, &bare, naive.as_ref(), &locked, &drains);
    if options.scale {
        let base = match drains.iter().position(|d| d.replicas == 1) {
            Some(index) => drains.swap_remove(index),
            None => drain::drain(&options, 1).await?,
        };
        let backlog = drain::drain_with(&options, 1, options.backlog_rows, drain::Setup::default()).await?;
        eprintln!(
            "drain of {} rows: {:.0} events/s",
            options.backlog_rows, backlog.run.events_per_second
        );
        let claims = scale::claim_latency(&options).await?;
        eprintln!(
            "claims behind {} backing off: p99 {}",
            claims.backing_off,
            report::ms(claims.p99)
        );
        let gauges = scale::gauge_refresh(&options).await?;
        eprintln!(
            "gauge refresh at {} rows: {}",
            gauges.rows,
            report::ms(gauges.median)
        );
        let retention = drain::drain_with(
            &options,
            1,
            options.rows,
            drain::Setup {
                retained: options.retained_rows,
                ..Default::default()
            },
        )
        .await?;
        eprintln!(
            "drain during retention: {:.0} events/s, {} rows deleted",
            retention.run.events_per_second, retention.retention_deleted
        );
        report::scale_table(&options, &base, &backlog, &claims, &gauges, &retention);
    }
    if options.only_drain {
        return Ok(());
    }

    let sqs_runs = if options.skip_sqs {
        Vec::new()
    } else {
        sqs::run(&options, &options.sqs_endpoint).await?
    };
    let nats_run = if options.skip_nats {
        None
    } else {
        Some(nats::run(&options).await?)
    };
    let kafka_run = if options.skip_kafka {
        None
    } else {
        Some(kafka::run(&options).await?)
    };
    let mut steadies = Vec::new();
    for &rate in &options.rates {
        let result = steady::steady(&options, rate).await?;
        eprintln!("steady {rate}/s: p99 {}", report::ms(result.p99));
        steadies.push(result);
    }
    let with_trigger = notify_cost::producer_throughput(&options, true).await?;
    let without_trigger = notify_cost::producer_throughput(&options, false).await?;

    report::sqs_table(&options, &sqs_runs);
    report::nats_table(&options, nats_run.as_ref());
    report::kafka_table(&options, kafka_run.as_ref());
    report::steady_table(&options, &steadies);
    report::notify_cost_table(with_trigger, without_trigger);
    if options.migrate_lock {
        migrate_lock(&options).await?;
    }
    if options.sources {
        sources::run(&options).await?;
    }
    if options.tracing {
        tracing_cost::run(&options).await?;
    }
    if options.partitioned {
        partitioned::run(&options).await?;
    }
    if options.versus {
        versus::run(&options).await?;
    }
    Ok(())
}

/// The `migrate` runs, concurrent builds against one transaction.
async fn migrate_lock(options: &Options) -> Result<(), Error> {
    let mut runs = Vec::new();
    for in_transaction in [false, true] {
        let run = migrate_lock::run(options, in_transaction).await?;
        eprintln!(
            "migrate ({}): {:.2} s, longest insert {:.1} ms",
            if in_transaction {
                "one transaction"
            } else {
                "concurrent"
            },
            run.total.as_secs_f64(),
            run.longest_insert.as_secs_f64() * 1000.0
        );
        runs.push(run);
    }
    migrate_lock::table(options, &runs);
    Ok(())
}
