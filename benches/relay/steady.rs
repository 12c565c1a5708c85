//! Steady state: producers committing at a fixed rate, and the lag from a
//! producer's commit to a consumer receiving the message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_test_support::RelayProcess;
use uuid::Uuid;

use crate::fixture::{arrivals, broker, database, payload_sql, relay_settings, set_fillfactor};
use crate::meter::{proc_usage, Meter, Run};
use crate::{Error, Options};

pub struct Steady {
    pub rate: usize,
    pub sent: usize,
    /// Events not received within 60 s after the producer stopped.
    pub missing: usize,
    pub p50: Duration,
    pub p95: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub peak_rss_mib: f64,
    pub cpu_percent: f64,
    /// While the producers ran: their commit rate and the servers' load.
    pub load: Run,
}

/// A producer commits `rate` events/s in 10 ms ticks; lag is from the
/// producer's commit returning to the consumer receiving the message.
pub async fn steady(options: &Options, rate: usize) -> Result<Steady, Error> {
    let db = database(options).await;
    set_fillfactor(&db, options).await?;
    let broker = broker(options).await;
    let arrivals = arrivals(&broker).await?;
    let relay = RelayProcess::start(&db, &relay_settings(options, &broker.exchange));
    // Let the relay connect and go idle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, cpu_before) = proc_usage(relay.child.id());

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
        let producer = db.connect().await;
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
    let (_, cpu_after) = proc_usage(relay.child.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    while arrivals.lock().unwrap().len() < commits.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (peak_kib, _) = proc_usage(relay.child.id());
    drop(relay);
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
    broker.cleanup().await;
    Ok(result)
}
