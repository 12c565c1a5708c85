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
//!
//! Bounded in entries, not in dead ones: the pending index keeps an entry
//! for every row version a claim or a mark replaced until a vacuum removes
//! it (two per event), and the oldest-age and count queries start at its
//! old end, where a drain leaves them. During a drain of 1,000,000 rows
//! they took up to a second per refresh and slowed the drain by a quarter.
//! So while the relay is catching up with a backlog ([`CatchUp`]),
//! refreshes come [`CATCH_UP_SLOWDOWN`] times less often (every 30 s by
//! default, well inside the stale-gauges alert's two minutes).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Outage;
use crate::metrics::Metrics;
use crate::relay::CatchUp;
use crate::store::{GaugeReading, Store, StoreError};

/// How often the gauges are refreshed: well inside a 15 s scrape interval,
/// so a scrape never sees a value more than one interval old.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// While the relay catches up with a backlog, refreshes come this many
/// times less often.
pub const CATCH_UP_SLOWDOWN: u32 = 6;

/// The time from one refresh's start to the next.
fn interval(every: Duration, catching_up: bool) -> Duration {
    if catching_up {
        every * CATCH_UP_SLOWDOWN
    } else {
        every
    }
}

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
    metrics: &Metrics,
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

/// Refreshes the gauges at once and then every `every` (less often while
/// `catch_up` says the relay is catching up), until `shutdown`.
pub async fn run(
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    every: Duration,
    catch_up: Arc<CatchUp>,
    shutdown: CancellationToken,
) {
    let mut outage = Outage::new("gauges");
    let mut next = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = shutdown.cancelled() => return,
        }
        let started = Instant::now();
        let every = interval(every, catch_up.catching_up());
        let result = tokio::select! {
            result = refresh(&store, &metrics, max_age(every)) => result,
            _ = shutdown.cancelled() => return,
        };
        match result {
            Ok(_) => outage.succeeded(),
            Err(error) => outage.failed(&error),
        }
        // After a refresh slower than the interval, wait a full interval
        // rather than start the next one at once.
        next = (started + every).max(Instant::now() + every / 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refreshes_slow_down_while_the_relay_catches_up() {
        let every = Duration::from_secs(5);
        assert_eq!(interval(every, false), every);
        assert_eq!(interval(every, true), Duration::from_secs(30));
    }
}
