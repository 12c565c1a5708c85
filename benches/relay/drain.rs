//! The relay's own runs: a prefilled table drained by 1, 2, 4 … relay
//! processes (the release binary).

use std::time::Duration;

use outbox_test_support::RelayProcess;

use crate::fixture::{arrivals, broker, database, prefill_for_drain, relay_settings, unpublished};
use crate::meter::{proc_usage, Meter, Run};
use crate::{Error, Options};

pub struct Drain {
    pub replicas: usize,
    pub run: Run,
    pub peak_rss_mib: f64,
    /// CPU of all replicas together, in % of a core.
    pub relay_percent: f64,
    /// Share of row updates that were HOT (no new index entries).
    pub hot_share: f64,
}

pub async fn drain(options: &Options, replicas: usize) -> Result<Drain, Error> {
    let db = database(options).await;
    let broker = broker(options).await;
    prefill_for_drain(&db, options).await?;
    let arrivals = arrivals(&broker).await?;
    let meter = Meter::start();
    let settings = relay_settings(options, &broker.exchange);
    let relays: Vec<RelayProcess> = (0..replicas)
        .map(|_| RelayProcess::start(&db, &settings))
        .collect();
    let mut last_usage = vec![(0, 0.0); replicas];
    loop {
        for (relay, usage) in relays.iter().zip(last_usage.iter_mut()) {
            *usage = proc_usage(relay.child.id());
        }
        // Counting rows costs PostgreSQL a scan, so only once every
        // message has arrived (rows are marked after their confirms).
        let all_arrived = arrivals.lock().unwrap().len() >= options.rows;
        if all_arrived && unpublished(&db).await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = meter.finish(options.rows);
    // Dropping a RelayProcess kills it and waits for it.
    drop(relays);
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
    broker.cleanup().await;
    Ok(Drain {
        replicas,
        run,
        peak_rss_mib: last_usage.iter().map(|u| u.0).max().unwrap_or(0) as f64 / 1024.0,
        relay_percent: last_usage.iter().map(|u| u.1).sum::<f64>() / run.seconds * 100.0,
        hot_share: hot_updates as f64 / updates.max(1) as f64,
    })
}
