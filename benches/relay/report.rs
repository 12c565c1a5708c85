//! The tables the benchmark prints (Markdown, as docs/performance.md
//! quotes them).

use std::time::Duration;

use crate::drain::Drain;
use crate::kafka::KafkaRun;
use crate::meter::Run;
use crate::nats::NatsRun;
use crate::scale::{ClaimLatency, GaugeRefresh};
use crate::sqs::SqsRun;
use crate::steady::Steady;
use crate::Options;

pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn sqs_queue_kind(run: &SqsRun) -> &'static str {
    if run.fifo {
        "FIFO"
    } else {
        "standard"
    }
}

/// One line per SQS run, for `--only-sqs`.
pub fn sqs_lines(runs: &[SqsRun]) {
    for run in runs {
        println!(
            "SQS {}: ceiling {:.0}/s, relay {:.0}/s",
            sqs_queue_kind(run),
            run.ceiling,
            run.relay
        );
    }
}

/// The drain table: the relay's runs against the bare publisher, the
/// simplest correct relay (unless `--only-drain` left it out) and the
/// row-lock design.
pub fn drain_table(options: &Options, bare: &Run, naive: Option<&Run>, locked: &Run, drains: &[Drain]) {
    println!(
        "\n| drain ({} rows, ~300 B payloads; batch {} × {} workers) | events/s | vs bare publisher | vs simplest relay | relay peak RSS | relay CPU | PostgreSQL CPU | PostgreSQL CPU per event | RabbitMQ CPU | machine busy |",
        options.rows, options.batch_size, options.workers
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let row = |name: String, run: &Run, relay: Option<(f64, f64)>| {
        let rate = run.events_per_second;
        let versus_naive = naive
            .map(|n| format!("{:.0}x", rate / n.events_per_second))
            .unwrap_or_default();
        let (rss, cpu) = relay
            .map(|(rss, cpu)| (format!("{rss:.1} MiB"), format!("{cpu:.0}%")))
            .unwrap_or_default();
        println!(
            "| {name} | {rate:.0} | {:.1}% | {versus_naive} | {rss} | {cpu} | {:.0}% | {:.0} µs | {:.0}% | {:.0}% |",
            rate / bare.events_per_second * 100.0,
            run.postgres_percent,
            postgres_us_per_event(run),
            run.rabbitmq_percent,
            run.machine_busy_percent
        );
    };
    row(
        format!(
            "bare lapin publisher, {}-message confirm window",
            options.batch_size * options.workers
        ),
        bare,
        None,
    );
    if let Some(naive) = naive {
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
        locked,
        None,
    );
    for d in drains {
        row(
            format!(
                "outbox-relay, {} replica{}{}",
                d.replicas,
                if d.replicas == 1 { "" } else { "s" },
                match (d.deletes, d.ordered) {
                    (true, _) => ", OUTBOX_ON_PUBLISH=delete",
                    (false, true) => ", OUTBOX_ORDERING=aggregate",
                    (false, false) => "",
                }
            ),
            &d.run,
            Some((d.peak_rss_mib, d.relay_percent)),
        );
    }
    println!(
        "\nEach row: the median of {} run(s). CPU in % of one core, averaged over the run; HOT updates in the relay's runs: {}; dead row versions left: {}.",
        options.repeat.max(1),
        drains
            .iter()
            .map(|d| format!("{:.0}%", d.hot_share * 100.0))
            .collect::<Vec<_>>()
            .join(", "),
        drains
            .iter()
            .map(|d| d.dead_tuples.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// PostgreSQL's CPU time per event of a run, in microseconds.
pub fn postgres_us_per_event(run: &Run) -> f64 {
    run.postgres_percent / 100.0 / run.events_per_second * 1e6
}

/// The runs at scale, each against its goal; `base` is the `--rows` drain
/// with 1 replica of the same run.
pub fn scale_table(
    options: &Options,
    base: &Drain,
    backlog: &Drain,
    claims: &ClaimLatency,
    gauges: &GaugeRefresh,
    retention: &Drain,
) {
    let ratio = |d: &Drain| d.run.events_per_second / base.run.events_per_second;
    println!(
        "\n| at scale (batch {} × {} workers, 1 replica) | measured | goal |",
        options.batch_size, options.workers
    );
    println!("|---|---|---|");
    println!(
        "| drain of a {}-row backlog against {} rows | {:.0} against {:.0} events/s: {:.2}×; PostgreSQL {:.0} against {:.0} µs/event | ≥ 0.9× |",
        backlog.rows,
        base.rows,
        backlog.run.events_per_second,
        base.run.events_per_second,
        ratio(backlog),
        postgres_us_per_event(&backlog.run),
        postgres_us_per_event(&base.run),
    );
    println!(
        "| claim of {} rows behind {} rows backing off ({} claims) | p50 {}, p99 {}, max {} | p99 ≤ 5 ms |",
        options.batch_size,
        claims.backing_off,
        claims.claims,
        ms(claims.p50),
        ms(claims.p99),
        ms(claims.max)
    );
    println!(
        "| gauge refresh (counts computed) at {} rows | median {}, max {} of {} | ≤ 100 ms |",
        gauges.rows,
        ms(gauges.median),
        ms(gauges.max),
        gauges.runs
    );
    println!(
        "| drain of {} rows while retention deletes {} old published rows | {:.0} against {:.0} events/s: {:.2}×; {} rows deleted during the drain | ≥ 0.8× |",
        retention.rows,
        options.retained_rows,
        retention.run.events_per_second,
        base.run.events_per_second,
        ratio(retention),
        retention.retention_deleted
    );
}

/// The SQS table: each queue kind's ceiling next to the relay; nothing
/// when the SQS runs were left out.
pub fn sqs_table(options: &Options, runs: &[SqsRun]) {
    if runs.is_empty() {
        return;
    }
    println!(
        "\n| SQS emulator at {} ({} rows a run, each from an empty queue) | emulator ceiling, events/s | outbox-relay, events/s | relay vs ceiling | relay peak RSS |",
        options.sqs_endpoint, options.sqs_rows
    );
    println!("|---|---:|---:|---:|---:|");
    for run in runs {
        println!(
            "| {} queue | {:.0} | {:.0} | {:.0}% | {:.1} MiB |",
            sqs_queue_kind(run),
            run.ceiling,
            run.relay,
            run.relay / run.ceiling * 100.0,
            run.relay_peak_rss_mib
        );
    }
}

/// The NATS table: the bare JetStream publisher next to the relay;
/// nothing when the NATS runs were left out.
pub fn nats_table(options: &Options, run: Option<&NatsRun>) {
    let Some(run) = run else { return };
    println!(
        "\n| NATS JetStream ({} rows a run, each into a fresh stream; {} acknowledgements in flight) | events/s | vs bare publisher | relay peak RSS |",
        options.nats_rows, run.in_flight
    );
    println!("|---|---:|---:|---:|");
    println!("| bare async-nats publisher | {:.0} | 100% | |", run.bare);
    println!(
        "| outbox-relay (1 replica) | {:.0} | {:.1}% | {:.1} MiB |",
        run.relay,
        run.relay / run.bare * 100.0,
        run.relay_peak_rss_mib
    );
}

/// The Kafka table: the bare producer next to the relay; nothing when the
/// Kafka runs were left out.
pub fn kafka_table(options: &Options, run: Option<&KafkaRun>) {
    let Some(run) = run else { return };
    println!(
        "\n| Kafka ({} rows a run, each into a fresh 6-partition topic of librdkafka's mock cluster; {} records in flight) | events/s | vs bare producer | relay peak RSS |",
        options.kafka_rows, run.in_flight
    );
    println!("|---|---:|---:|---:|");
    println!(
        "| bare rdkafka producer, the relay's settings | {:.0} | 100% | |",
        run.bare
    );
    println!(
        "| outbox-relay (1 replica) | {:.0} | {:.1}% | {:.1} MiB |",
        run.relay,
        run.relay / run.bare * 100.0,
        run.relay_peak_rss_mib
    );
}

/// The steady-state table: lag percentiles and load per producer rate.
pub fn steady_table(options: &Options, steadies: &[Steady]) {
    println!("\n| steady state | events (late) | committed/s | p50 | p95 | p99 | max | relay RSS | relay CPU | PostgreSQL CPU | RabbitMQ CPU | machine busy |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in steadies {
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
}

/// The producers' insert rate with and without the NOTIFY trigger.
pub fn notify_cost_table(with_trigger: f64, without_trigger: f64) {
    println!("\n| producer inserts, 8 connections, single-row transactions | inserts/s |");
    println!("|---|---:|");
    println!("| with the NOTIFY trigger | {with_trigger:.0} |");
    println!("| without it | {without_trigger:.0} |");
    println!(
        "| cost of the trigger | {:.1}% |",
        (1.0 - with_trigger / without_trigger) * 100.0
    );
}
