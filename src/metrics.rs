//! The Prometheus metrics whose names operators' dashboards and alerts rely on. Labels are never per event: the
//! table's gauges are one series per replica, the publishing metrics one per destination, labelled with the
//! destination's name from the configuration file, never from rows; without destinations in a file they have
//! no label, as before destinations existed.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Lag buckets in seconds: from a few milliseconds (a healthy relay) to
/// hours (an outage), so both the p99 of normal operation and the depth of
/// an incident are readable from one histogram.
const LAG_BUCKETS: [f64; 20] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
    3600.0, 7200.0, 21600.0,
];

/// The labels of the publishing metrics: `destination`, the
/// destination's name from the configuration file (empty for rows
/// quarantined before a destination was chosen: no route, a row that
/// cannot be read), or none for a relay configured by the environment.
pub type DestinationLabel = Vec<(&'static str, String)>;

fn destination_label(name: Option<&str>) -> DestinationLabel {
    name.map(|name| vec![("destination", name.to_owned())])
        .unwrap_or_default()
}

/// A histogram family whose members all have the lag buckets.
type LagFamily = Family<DestinationLabel, Histogram, fn() -> Histogram>;

fn lag_histogram() -> Histogram {
    Histogram::new(LAG_BUCKETS)
}

/// One destination's publishing metrics, the handles into the families.
#[derive(Debug, Clone)]
pub struct DestinationMetrics {
    /// Confirmed publishes.
    pub published: Counter,
    /// Failed attempts.
    pub failures: Counter,
    /// Rows quarantined.
    pub quarantined: Counter,
    /// `created_at` to confirmed publish.
    pub lag: Histogram,
    /// 1 while the destination is ready, 0 while not.
    pub ready: Gauge,
}

/// Every metric the relay exposes, registered once.
pub struct Metrics {
    registry: Registry,
    /// Rows not yet published and not quarantined.
    pub unpublished: Gauge,
    /// Age of the oldest such row, 0 when none.
    pub oldest_unpublished_age: Gauge<f64, AtomicU64>,
    /// Quarantined rows.
    pub quarantined: Gauge,
    /// Aggregates whose oldest unpublished row has failed or is quarantined.
    pub stuck_aggregates: Gauge,
    /// Unix time (database clock) at which the counts shown were computed.
    pub gauges_refreshed: Gauge<f64, AtomicU64>,
    /// Confirmed publishes, per destination.
    pub published_total: Family<DestinationLabel, Counter>,
    /// Failed attempts, per destination.
    pub publish_failures_total: Family<DestinationLabel, Counter>,
    /// Rows this replica quarantined, per destination.
    pub quarantined_total: Family<DestinationLabel, Counter>,
    /// `created_at` to confirmed publish, per destination.
    pub publish_lag: LagFamily,
    /// Whether each destination is ready.
    pub destination_ready: Family<DestinationLabel, Gauge>,
    /// Rows deleted by retention.
    pub retention_deleted_total: Counter,
    /// Unix time by which every relay worker had last made progress; set
    /// from the heartbeat when `/metrics` is scraped.
    pub last_progress: Gauge<f64, AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let metrics = Self {
            unpublished: Gauge::default(),
            oldest_unpublished_age: Gauge::default(),
            quarantined: Gauge::default(),
            stuck_aggregates: Gauge::default(),
            gauges_refreshed: Gauge::default(),
            published_total: Family::default(),
            publish_failures_total: Family::default(),
            quarantined_total: Family::default(),
            publish_lag: Family::new_with_constructor(lag_histogram),
            destination_ready: Family::default(),
            retention_deleted_total: Counter::default(),
            last_progress: Gauge::default(),
            registry: Registry::default(),
        };
        // prometheus-client appends `_total` to counters and the unit to
        // names registered with one, so the names below are the documented
        // ones without those suffixes.
        registry.register(
            "outbox_unpublished_events",
            "Rows not yet published and not quarantined: exact up to 100000; above that PostgreSQL's estimate \
             (the pending index's entries at its last VACUUM or ANALYZE), never below 100000",
            metrics.unpublished.clone(),
        );
        registry.register(
            "outbox_oldest_unpublished_age_seconds",
            "Now minus the created_at of the oldest unpublished, unquarantined row; 0 when none. Exact, \
             computed by this replica on every refresh",
            metrics.oldest_unpublished_age.clone(),
        );
        registry.register(
            "outbox_quarantined_events",
            "Quarantined rows waiting for an operator: exact up to 100000; above that PostgreSQL's estimate, \
             never below 100000",
            metrics.quarantined.clone(),
        );
        registry.register(
            "outbox_stuck_aggregates",
            "Aggregates whose oldest unpublished row has failed or is quarantined (held back with \
             OUTBOX_ORDERING=aggregate), counted among the 10000 oldest pending and the 10000 oldest quarantined \
             rows: at least this many, exact while there are fewer rows",
            metrics.stuck_aggregates.clone(),
        );
        registry.register(
            "outbox_gauges_refreshed_timestamp_seconds",
            "Unix time (database clock) at which the table gauges this replica shows were computed, by it or \
             by the replica whose stored values it read; stops advancing while refreshes fail",
            metrics.gauges_refreshed.clone(),
        );
        registry.register(
            "outbox_events_published",
            "Events confirmed by the broker",
            metrics.published_total.clone(),
        );
        registry.register(
            "outbox_publish_failures",
            "Failed publish attempts",
            metrics.publish_failures_total.clone(),
        );
        registry.register(
            "outbox_events_quarantined",
            "Rows this replica quarantined",
            metrics.quarantined_total.clone(),
        );
        registry.register(
            "outbox_publish_lag_seconds",
            "Time from created_at to the broker's confirm",
            metrics.publish_lag.clone(),
        );
        registry.register(
            "outbox_destination_ready",
            "1 while the destination takes messages (its broker is reachable and not deferring batches), 0 while \
             its rows wait",
            metrics.destination_ready.clone(),
        );
        registry.register(
            "outbox_retention_deleted",
            "Published rows deleted by retention",
            metrics.retention_deleted_total.clone(),
        );
        registry.register(
            "outbox_relay_last_progress_timestamp_seconds",
            "Unix time by which every relay worker had last gone round its loop; /healthz answers 503 once it is too old",
            metrics.last_progress.clone(),
        );
        Self { registry, ..metrics }
    }

    /// The publishing metrics of one destination, created at zero so that
    /// every destination has its series from the start: labelled with
    /// `name`, or without a label (`None`) for the one destination of a
    /// relay configured by the environment.
    pub fn destination(&self, name: Option<&str>) -> DestinationMetrics {
        let label = destination_label(name);
        DestinationMetrics {
            published: self.published_total.get_or_create(&label).clone(),
            failures: self.publish_failures_total.get_or_create(&label).clone(),
            quarantined: self.quarantined_total.get_or_create(&label).clone(),
            lag: self.publish_lag.get_or_create(&label).clone(),
            ready: self.destination_ready.get_or_create(&label).clone(),
        }
    }

    /// The counters of rows quarantined before a destination was chosen:
    /// `destination=""` when destinations are labelled, else the one
    /// unlabelled series.
    pub fn unrouted(&self, labelled: bool) -> (Counter, Counter) {
        let label = destination_label(labelled.then_some(""));
        (
            self.publish_failures_total.get_or_create(&label).clone(),
            self.quarantined_total.get_or_create(&label).clone(),
        )
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        encode(&mut out, &self.registry).expect("encoding into a String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_the_spec_names() {
        let metrics = Metrics::new();
        let orders = metrics.destination(Some("orders"));
        orders.published.inc();
        orders.lag.observe(0.02);
        orders.ready.set(1);
        let text = metrics.render();
        for name in [
            "outbox_unpublished_events ",
            "outbox_oldest_unpublished_age_seconds ",
            "outbox_quarantined_events ",
            "outbox_events_published_total{destination=\"orders\"} 1",
            "outbox_publish_failures_total{destination=\"orders\"} 0",
            "outbox_events_quarantined_total{destination=\"orders\"} 0",
            "outbox_destination_ready{destination=\"orders\"} 1",
            "outbox_publish_lag_seconds_bucket",
            "outbox_retention_deleted_total ",
            "outbox_gauges_refreshed_timestamp_seconds ",
            "outbox_relay_last_progress_timestamp_seconds ",
            "# TYPE outbox_publish_lag_seconds histogram",
            "# TYPE outbox_events_published counter",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    #[test]
    fn a_relay_configured_by_the_environment_has_no_destination_label() {
        let metrics = Metrics::new();
        metrics.destination(None).published.inc();
        metrics.unrouted(false).1.inc();
        let text = metrics.render();
        assert!(text.contains("outbox_events_published_total 1\n"), "{text}");
        assert!(text.contains("outbox_events_quarantined_total 1\n"), "{text}");
        assert!(!text.contains("destination="), "{text}");
    }

    #[test]
    fn the_help_states_the_bounds_in_force() {
        let text = Metrics::new().render();
        let help = |name: &str| {
            text.lines()
                .find(|line| line.starts_with(&format!("# HELP {name} ")))
                .unwrap_or_else(|| panic!("no help for {name}"))
                .to_owned()
        };
        let cap = crate::store::COUNT_CAP.to_string();
        assert!(help("outbox_unpublished_events").contains(&cap));
        assert!(help("outbox_quarantined_events").contains(&cap));
        let scan = crate::store::STUCK_SCAN.to_string();
        assert!(help("outbox_stuck_aggregates").contains(&scan));
    }
}
