//! The relay against the row-lock loop in pairs: each pair drains the same
//! rows once with each, back to back, so that both see the same machine.
//! On a shared 2-core machine the throughput of a run drifts by ±20% over
//! minutes; a median of one design's runs taken after the other's compares
//! the drift as much as the designs. The ratio within a pair does not.

use crate::baselines::lock_relay;
use crate::drain::drain;
use crate::meter::proc_usage;
use crate::report::postgres_us_per_event;
use crate::{Error, Options};

/// One pair's numbers.
struct Pair {
    lock_rate: f64,
    relay_rate: f64,
    lock_postgres_us: f64,
    relay_postgres_us: f64,
    /// CPU of the loop's own code per event: the benchmark process's CPU
    /// during the loop's run less its CPU during the relay's run (the
    /// consumer that counts arrivals runs in both).
    loop_us: f64,
    relay_us: f64,
}

/// CPU seconds of this benchmark process so far.
fn own_cpu_seconds() -> f64 {
    proc_usage(std::process::id()).1
}

pub async fn run(options: &Options) -> Result<(), Error> {
    let pairs = options.repeat.max(1);
    let mut results = Vec::with_capacity(pairs);
    for pair in 1..=pairs {
        // Within a pair the machine drifts too: the second run of each pair
        // alternates, so that a drift over the pair favours neither side.
        let relay_first = pair % 2 == 0;
        let relayed_before = if relay_first {
            let before = own_cpu_seconds();
            Some((drain(options, 1).await?, own_cpu_seconds() - before))
        } else {
            None
        };
        let before = own_cpu_seconds();
        let locked = lock_relay(options).await?;
        let lock_client = own_cpu_seconds() - before;
        let (relayed, consumer) = match relayed_before {
            Some(relayed) => relayed,
            None => {
                let before = own_cpu_seconds();
                (drain(options, 1).await?, own_cpu_seconds() - before)
            }
        };
        let events = options.rows as f64;
        let result = Pair {
            lock_rate: locked.events_per_second,
            relay_rate: relayed.run.events_per_second,
            lock_postgres_us: postgres_us_per_event(&locked),
            relay_postgres_us: postgres_us_per_event(&relayed.run),
            loop_us: (lock_client - consumer).max(0.0) / events * 1e6,
            relay_us: relayed.relay_percent / 100.0 * relayed.run.seconds / events * 1e6,
        };
        eprintln!(
            "pair {pair} ({} first): row lock {:.0} events/s, relay {:.0} events/s ({:.2}×)",
            if relay_first { "relay" } else { "row lock" },
            result.lock_rate,
            result.relay_rate,
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
        "\nOdd pairs run the row lock first, even pairs the relay. Each median is taken on its own column. Client CPU: the relay process's, against the loop's own code \
         (the benchmark process's CPU during the loop's run less its CPU during the relay's, when only its \
         consumer runs)."
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
