//! Refreshes the table gauges: `outbox_unpublished_events`,
//! `outbox_oldest_unpublished_age_seconds`, `outbox_quarantined_events`,
//! `outbox_stuck_aggregates`, and `outbox_gauges_refreshed_timestamp_seconds`
//! saying when their values were computed.
//!
//! Every replica shows the same table-wide values, so whichever replica
//! Prometheus scrapes reports the table, and alerts take `max()` over
//! replicas. The oldest age is one index entry and every replica computes
//! it on every refresh: the main alert never depends on another replica.
//! The counts stop at a cap (see `store/sql/backlog.sql`), and even so only
//! one replica at a time computes them, at most once per [`max_age`]; the
//! others show what it stored. The database's work per interval is then
//! the same for one replica or fifty, and bounded at any table size.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Outage;
use crate::metrics::SourceMetrics;
use crate::store::{GaugeReading, Store, StoreError};

/// How often the gauges are refreshed: well inside a 15 s scrape interval,
/// so a scrape never sees a value more than one interval old.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// How old stored counts may be before a refresh computes them again:
/// under the interval, so the replica that computed last finds them due on
/// its next tick (a refresh a little early would otherwise skip a round).
pub fn max_age(every: Duration) -> Duration {
    every * 3 / 4
}

/// Refreshes once and sets the gauges; returns what it read or computed.
/// `max_age` is how old stored counts may be before this refresh computes
/// them itself (when no other replica is computing them right now).
///
/// Counts nobody has stored yet (another replica is computing the first
/// ones right now) leave those gauges, and the refresh time, as they were.
pub async fn refresh(
    store: &Store,
    metrics: &SourceMetrics,
    max_age: Duration,
) -> Result<GaugeReading, StoreError> {
    let reading = store.refresh_gauges(max_age).await?;
    metrics
        .oldest_unpublished_age
        .set(reading.oldest_unpublished_age_seconds);
    if let Some((counts, refreshed_at)) = reading.counts {
        metrics.unpublished.set(counts.unpublished);
        metrics.quarantined.set(counts.quarantined);
        metrics.stuck_aggregates.set(counts.stuck_aggregates);
        metrics.gauges_refreshed.set(refreshed_at);
    }
    Ok(reading)
}

/// Refreshes the gauges at once and then every `every`, until `shutdown`.
///
/// While the database is unreachable the gauges keep their last values:
/// zero would read as "no backlog" exactly when there may be one, and
/// `/readyz` and the relay-down alert already report the outage. The
/// refresh time stops advancing, which the stale-gauges alert watches.
pub async fn run(store: Arc<Store>, metrics: SourceMetrics, every: Duration, shutdown: CancellationToken) {
    let mut outage = Outage::new("gauges");
    let mut ticker = tokio::time::interval(every);
    // After a slow query, wait a full interval rather than firing a burst.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let result = tokio::select! {
            result = refresh(&store, &metrics, max_age(every)) => result,
            _ = shutdown.cancelled() => return,
        };
        match result {
            Ok(_) => outage.succeeded(),
            Err(error) => outage.failed(&error),
        }
    }
}
