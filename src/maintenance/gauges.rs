//! Refreshes `outbox_unpublished_events`, `outbox_oldest_unpublished_age_seconds`
//! and `outbox_quarantined_events` from the table.
//!
//! Every replica refreshes its own copy, so whichever replica Prometheus
//! scrapes reports the table, and alerts can take `max()` over replicas.
//! The query reads only the partial indexes of unpublished and quarantined
//! rows (see `store/sql/backlog.sql`), so its cost follows the backlog, not
//! the table, and N replicas every few seconds stay cheap.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::Outage;
use crate::metrics::Metrics;
use crate::store::{Backlog, Store, StoreError};

/// How often the gauges are refreshed: well inside a 15 s scrape interval,
/// so a scrape never sees a value more than one interval old.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// Reads the backlog once and sets the gauges; returns what it read.
pub async fn refresh(store: &Store, metrics: &Metrics) -> Result<Backlog, StoreError> {
    let backlog = store.backlog().await?;
    metrics.unpublished.set(backlog.unpublished);
    metrics
        .oldest_unpublished_age
        .set(backlog.oldest_unpublished_age_seconds);
    metrics.quarantined.set(backlog.quarantined);
    metrics.stuck_aggregates.set(backlog.stuck_aggregates);
    Ok(backlog)
}

/// Refreshes the gauges at once and then every `every`, until `shutdown`.
///
/// While the database is unreachable the gauges keep their last values:
/// zero would read as "no backlog" exactly when there may be one, and
/// `/readyz` and the relay-down alert already report the outage.
pub async fn run(store: Arc<Store>, metrics: Arc<Metrics>, every: Duration, shutdown: CancellationToken) {
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
            result = refresh(&store, &metrics) => result,
            _ = shutdown.cancelled() => return,
        };
        match result {
            Ok(_) => outage.succeeded(),
            Err(error) => outage.failed(&error),
        }
    }
}
