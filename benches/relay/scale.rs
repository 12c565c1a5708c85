//! Runs on large tables (`--scale`): what a claim and a gauge refresh cost
//! when the table holds hundreds of thousands to millions of rows. The
//! drains at scale (a large backlog, retention deleting old rows during a
//! drain) are drains with a [`Setup`](crate::drain::Setup); this module
//! has the runs that call the store directly. Tables are seeded set-based
//! (one INSERT … SELECT generate_series) with small payloads, then
//! vacuumed and analysed as autovacuum would leave them.

use std::time::{Duration, Instant};

use outbox_relay::maintenance::gauges;
use outbox_relay::metrics::Metrics;
use outbox_relay::store::{ClaimBudget, DatabaseSettings, Ordering, Store};

use crate::fixture::{database, payload_sql, TestDb};
use crate::{Error, Options};

/// Latency of claims behind rows that are backing off.
pub struct ClaimLatency {
    pub backing_off: usize,
    pub claims: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

/// Time of a gauge refresh (the replica that computes the counts).
pub struct GaugeRefresh {
    pub rows: usize,
    pub runs: usize,
    pub median: Duration,
    pub max: Duration,
}

fn store(db: &TestDb) -> Result<Store, Error> {
    let database = DatabaseSettings {
        database_url: db.url.clone(),
        table: "outbox_event".into(),
        database_pooler: "none".to_owned(),
    }
    .validate()?;
    Ok(Store::new(&database, 2))
}

/// The `p` quantile (0 to 1) of `sorted`, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

/// `--backing-off-rows` rows failed and backing off for an hour, older
/// than `--batch-size` × 1,000 due rows (~300-byte payloads) behind them;
/// each claim of a batch is timed, and its rows marked published as the
/// relay would. A thousand claims put the p99 at the tenth slowest: with
/// two hundred it was the second slowest, which measured the machine's
/// worst moments more than the claim (4 to 16 ms between runs).
pub async fn claim_latency(options: &Options) -> Result<ClaimLatency, Error> {
    let db = database(options).await;
    let due = options.batch_size * 1000;
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                       attempt_count, next_attempt_at, last_error)
             SELECT gen_random_uuid(), 'order.created', 'order-' || (n % 5000), jsonb_build_object('n', n),
                    now() - interval '1 day' + n * interval '1 millisecond',
                    3, now() + interval '1 hour' + n * interval '1 millisecond', 'refused by the broker'
             FROM generate_series(1, $1::bigint) AS n",
            &[&(options.backing_off_rows as i64)],
        )
        .await?;
    db.client
        .execute(
            &format!(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
                 SELECT gen_random_uuid(), 'order.created', 'order-' || (n % 5000), {}
                 FROM generate_series(1, $1::bigint) AS n",
                payload_sql()
            ),
            &[&(due as i64)],
        )
        .await?;
    db.client.batch_execute("VACUUM ANALYZE outbox_event").await?;
    let store = store(&db)?;
    let budget = ClaimBudget {
        rows: u32::try_from(options.batch_size)?,
        bytes: 16 * 1024 * 1024,
        max_payload: 16 * 1024 * 1024,
    };
    let mut latencies = Vec::new();
    loop {
        let started = Instant::now();
        let claimed = store
            .claim(budget, Duration::from_secs(65), Ordering::None)
            .await?;
        latencies.push(started.elapsed());
        if claimed.events.is_empty() {
            break;
        }
        let ids: Vec<_> = claimed.events.iter().map(|e| e.id).collect();
        let attempts: Vec<_> = claimed.events.iter().map(|e| e.attempt_count).collect();
        store.mark_published(&ids, &attempts).await?;
    }
    latencies.sort();
    Ok(ClaimLatency {
        backing_off: options.backing_off_rows,
        claims: latencies.len(),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
        max: latencies.last().copied().unwrap_or_default(),
    })
}

/// `--gauge-rows` unpublished rows (one in a thousand failed once, one in
/// ten thousand quarantined); the counts are computed afresh by each of
/// several refreshes, as by the replica whose turn it is.
pub async fn gauge_refresh(options: &Options) -> Result<GaugeRefresh, Error> {
    let db = database(options).await;
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                       attempt_count, last_error, quarantined_at)
             SELECT gen_random_uuid(), 'order.created', 'order-' || (n % 50000), jsonb_build_object('n', n),
                    now() - interval '1 day' + n * interval '10 microseconds',
                    CASE WHEN n % 1000 = 0 THEN 1 ELSE 0 END,
                    CASE WHEN n % 1000 = 0 THEN 'refused' END,
                    CASE WHEN n % 10000 = 0 THEN now() END
             FROM generate_series(1, $1::bigint) AS n",
            &[&(options.gauge_rows as i64)],
        )
        .await?;
    db.client.batch_execute("VACUUM ANALYZE outbox_event").await?;
    let store = store(&db)?;
    let metrics = Metrics::new().source(None);
    let runs = 7;
    let mut times = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        // A max age of zero: the stored counts are always too old, so each
        // refresh computes them.
        gauges::refresh(&store, &metrics, Duration::ZERO).await?;
        times.push(started.elapsed());
    }
    times.sort();
    Ok(GaugeRefresh {
        rows: options.gauge_rows,
        runs,
        median: percentile(&times, 0.5),
        max: times.last().copied().unwrap_or_default(),
    })
}
