//! The relay against the row-lock loop in pairs: each pair drains the same
//! rows once with each, back to back, so that both see the same machine.
//! On a shared 2-core machine the throughput of a run drifts by ±20% over
//! minutes; a median of one design's runs taken after the other's compares
//! the drift as much as the designs. The ratio within a pair does not.

use crate::baselines::lock_relay;
use crate::drain::drain;
use crate::report::postgres_us_per_event;
use crate::{Error, Options};

/// One pair's numbers.
struct Pair {
    lock_rate: f64,
    relay_rate: f64,
    lock_postgres_us: f64,
    relay_postgres_us: f64,
    /// CPU per event of the loop's process and of the relay's, read alike.
    loop_us: f64,
    relay_us: f64,
}

pub async fn run(options: &Options) -> Result<(), Error> {
    let pairs = options.repeat.max(1);
    let mut results = Vec::with_capacity(pairs);
    for pair in 1..=pairs {
        // Within a pair the machine drifts too: the second run of each pair
        // alternates, so that a drift over the pair favours neither side.
        let relay_first = pair % 2 == 0;
        let relayed_before = if relay_first {
            Some(drain(options, 1).await?)
        } else {
            None
        };
        let locked = lock_relay(options).await?;
        let relayed = match relayed_before {
            Some(relayed) => relayed,
            None => drain(options, 1).await?,
        };
        let events = options.rows as f64;
        let result = Pair {
            lock_rate: locked.run.events_per_second,
            relay_rate: relayed.run.events_per_second,
            lock_postgres_us: postgres_us_per_event(&locked.run),
            relay_postgres_us: postgres_us_per_event(&relayed.run),
            loop_us: locked.client_cpu_seconds / events * 1e6,
            relay_us: relayed.relay_percent / 100.0 * relayed.run.seconds / events * 1e6,
        };
        // Whether the run was bound by the machine's CPU, and what the
        // broker spent: the same messages should cost it the same.
        let busy = |run: &crate::meter::Run| {
            format!(
                "machine {:.0}% busy, RabbitMQ {:.0} µs/event",
                run.machine_busy_percent,
                run.rabbitmq_percent / 100.0 / run.events_per_second * 1e6
            )
        };
        eprintln!(
            "pair {pair} ({} first): row lock {:.0} events/s ({}), relay {:.0} events/s ({}) ({:.2}×)",
            if relay_first { "relay" } else { "row lock" },
            result.lock_rate,
            busy(&locked.run),
            result.relay_rate,
            busy(&relayed.run),
            result.relay_rate / result.lock_rate
        );
        results.push(result);
    }
    println!(
        "\n| pair ({} rows, batch {} × {} workers, 1 replica) | row lock events/s | relay events/s | relay ÷ row lock | PostgreSQL CPU per event, row lock | relay | client CPU per event, loop | relay |",
        options.rows, options.batch_size, options.workers
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (index, p) in results.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0} | {:.2}× | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs |",
            index + 1,
            p.lock_rate,
            p.relay_rate,
            p.relay_rate / p.lock_rate,
            p.lock_postgres_us,
            p.relay_postgres_us,
            p.loop_us,
            p.relay_us
        );
    }
    let median = |value: &dyn Fn(&Pair) -> f64| median(results.iter().map(value).collect());
    println!(
        "| median | {:.0} | {:.0} | {:.2}× | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs |",
        median(&|p| p.lock_rate),
        median(&|p| p.relay_rate),
        median(&|p| p.relay_rate / p.lock_rate),
        median(&|p| p.lock_postgres_us),
        median(&|p| p.relay_postgres_us),
        median(&|p| p.loop_us),
        median(&|p| p.relay_us)
    );
    if !options.relay_env.is_empty() {
        let variables: Vec<String> = options
            .relay_env
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        println!("\nThe relay ran with {}.", variables.join(" "));
    }
    println!(
        "\nOdd pairs run the row lock first, even pairs the relay. Each median is taken on its own column. Client CPU: the relay's process and the loop's, each read from /proc \
         the same way (the consumer that counts arrivals runs in the benchmark's own process)."
    );
    Ok(())
}

/// The middle value, or the mean of the two middle values of an even count:
/// the upper one alone would lean every even-sized series the same way.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}
