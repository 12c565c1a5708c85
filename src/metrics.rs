//! The Prometheus metrics whose names operators' dashboards and alerts rely on. Labels are never per event:
//! the table's gauges are one series per source and replica, the publishing metrics one per source and
//! destination. Both labels take their values from the configuration file only: `source` is a
//! `[[source]]`'s name, `destination` a `[[destination]]`'s. A relay configured by the environment (or a
//! file without those tables) has no such label, as before sources and destinations existed.

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

/// The labels of a series: `source` and `destination`, each present only
/// when the configuration file names sources or destinations. The value of
/// `destination` is empty for rows quarantined before a destination was
/// chosen (no route, a row that cannot be read).
pub type Labels = Vec<(&'static str, String)>;

fn with_label(mut labels: Labels, key: &'static str, value: Option<&str>) -> Labels {
    if let Some(value) = value {
        labels.push((key, value.to_owned()));
    }
    labels
}

/// A histogram family whose members all have the lag buckets.
type LagFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn lag_histogram() -> Histogram {
    Histogram::new(LAG_BUCKETS)
}

/// Every family, registered once; handles share their series.
#[derive(Clone)]
struct Families {
    unpublished: Family<Labels, Gauge>,
    oldest_unpublished_age: Family<Labels, Gauge<f64, AtomicU64>>,
    quarantined: Family<Labels, Gauge>,
    stuck_aggregates: Family<Labels, Gauge>,
    gauges_refreshed: Family<Labels, Gauge<f64, AtomicU64>>,
    published_total: Family<Labels, Counter>,
    publish_failures_total: Family<Labels, Counter>,
    quarantined_total: Family<Labels, Counter>,
    publish_lag: LagFamily,
    destination_ready: Family<Labels, Gauge>,
    source_ready: Family<Labels, Gauge>,
    retention_deleted_total: Family<Labels, Counter>,
    retention_partitions_dropped_total: Family<Labels, Counter>,
    last_progress: Family<Labels, Gauge<f64, AtomicU64>>,
}

/// One destination's publishing metrics for one source, handles into the
/// families.
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
}

/// One source's metrics: its table's gauges, its retention and its
/// workers' progress, and the publishing metrics of its rows per
/// destination ([`SourceMetrics::destination`]).
#[derive(Clone)]
pub struct SourceMetrics {
    labels: Labels,
    families: Families,
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
    /// Rows deleted by retention.
    pub retention_deleted_total: Counter,
    /// Partitions retention dropped whole (their rows are not counted in
    /// `retention_deleted_total`: counting them would read each one).
    pub retention_partitions_dropped_total: Counter,
    /// Unix time by which every relay worker of the source had last made
    /// progress; set from the heartbeat when `/metrics` is scraped.
    pub last_progress: Gauge<f64, AtomicU64>,
    /// 1 while the source's database answers and its claims succeed.
    pub ready: Gauge,
}

impl std::fmt::Debug for SourceMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceMetrics")
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}

impl SourceMetrics {
    /// The publishing metrics of this source's rows sent to one
    /// destination, created at zero so that every pair has its series from
    /// the start: labelled with the destination's `name`, or without a
    /// destination label (`None`) for the one destination of a relay whose
    /// sink the environment configures.
    pub fn destination(&self, name: Option<&str>) -> DestinationMetrics {
        let labels = with_label(self.labels.clone(), "destination", name);
        let families = &self.families;
        DestinationMetrics {
            published: families.published_total.get_or_create(&labels).clone(),
            failures: families.publish_failures_total.get_or_create(&labels).clone(),
            quarantined: families.quarantined_total.get_or_create(&labels).clone(),
            lag: families.publish_lag.get_or_create(&labels).clone(),
        }
    }

    /// The counters of this source's rows quarantined before a destination
    /// was chosen: `destination=""` when destinations are labelled, else
    /// without a destination label.
    pub fn unrouted(&self, labelled: bool) -> (Counter, Counter) {
        let labels = with_label(self.labels.clone(), "destination", labelled.then_some(""));
        (
            self.families
                .publish_failures_total
                .get_or_create(&labels)
                .clone(),
            self.families.quarantined_total.get_or_create(&labels).clone(),
        )
    }
}

/// Every metric the relay exposes, registered once.
pub struct Metrics {
    registry: Registry,
    families: Families,
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
        let families = Families {
            unpublished: Family::default(),
            oldest_unpublished_age: Family::default(),
            quarantined: Family::default(),
            stuck_aggregates: Family::default(),
            gauges_refreshed: Family::default(),
            published_total: Family::default(),
            publish_failures_total: Family::default(),
            quarantined_total: Family::default(),
            publish_lag: Family::new_with_constructor(lag_histogram),
            destination_ready: Family::default(),
            source_ready: Family::default(),
            retention_deleted_total: Family::default(),
            retention_partitions_dropped_total: Family::default(),
            last_progress: Family::default(),
        };
        // prometheus-client appends `_total` to counters and the unit to
        // names registered with one, so the names below are the documented
        // ones without those suffixes.
        registry.register(
            "outbox_unpublished_events",
            "Rows not yet published and not quarantined: exact up to 100000; above that PostgreSQL's estimate \
             (the pending index's entries at its last VACUUM or ANALYZE), never below 100000",
            families.unpublished.clone(),
        );
        registry.register(
            "outbox_oldest_unpublished_age_seconds",
            "Now minus the created_at of the oldest unpublished, unquarantined row; 0 when none. Exact, \
             computed by this replica on every refresh",
            families.oldest_unpublished_age.clone(),
        );
        registry.register(
            "outbox_quarantined_events",
            "Quarantined rows waiting for an operator: exact up to 100000; above that PostgreSQL's estimate, \
             never below 100000",
            families.quarantined.clone(),
        );
        registry.register(
            "outbox_stuck_aggregates",
            "Aggregates whose oldest unpublished row has failed or is quarantined (held back with \
             OUTBOX_ORDERING=aggregate), counted among the 10000 oldest pending and the 10000 oldest quarantined \
             rows: at least this many, exact while there are fewer rows",
            families.stuck_aggregates.clone(),
        );
        registry.register(
            "outbox_gauges_refreshed_timestamp_seconds",
            "Unix time (database clock) at which the table gauges this replica shows were computed, by it or \
             by the replica whose stored values it read; stops advancing while refreshes fail",
            families.gauges_refreshed.clone(),
        );
        registry.register(
            "outbox_events_published",
            "Events confirmed by the broker",
            families.published_total.clone(),
        );
        registry.register(
            "outbox_publish_failures",
            "Failed publish attempts",
            families.publish_failures_total.clone(),
        );
        registry.register(
            "outbox_events_quarantined",
            "Rows this replica quarantined",
            families.quarantined_total.clone(),
        );
        registry.register(
            "outbox_publish_lag_seconds",
            "Time from created_at to the broker's confirm",
            families.publish_lag.clone(),
        );
        registry.register(
            "outbox_destination_ready",
            "1 while the destination takes messages (its broker is reachable and not deferring batches), 0 while \
             its rows wait",
            families.destination_ready.clone(),
        );
        registry.register(
            "outbox_source_ready",
            "1 while the source's database answers and its claims succeed (its table is there and writable), 0 \
             while its rows wait",
            families.source_ready.clone(),
        );
        registry.register(
            "outbox_retention_deleted",
            "Published rows deleted by retention",
            families.retention_deleted_total.clone(),
        );
        registry.register(
            "outbox_retention_partitions_dropped",
            "Partitions of a partitioned outbox table that retention dropped whole, every row in them published \
             (their rows are not counted in outbox_retention_deleted_total)",
            families.retention_partitions_dropped_total.clone(),
        );
        registry.register(
            "outbox_relay_last_progress_timestamp_seconds",
            "Unix time by which every relay worker had last gone round its loop; /healthz answers 503 once it is too old",
            families.last_progress.clone(),
        );
        registry.register_collector(Box::new(ProcessCollector));
        Self { registry, families }
    }

    /// One source's metrics, created at zero so that every source has its
    /// series from the start: labelled with `name`, or without a source
    /// label (`None`) for the one source of a relay whose database the
    /// environment configures.
    pub fn source(&self, name: Option<&str>) -> SourceMetrics {
        let labels = with_label(Labels::new(), "source", name);
        let families = &self.families;
        SourceMetrics {
            unpublished: families.unpublished.get_or_create(&labels).clone(),
            oldest_unpublished_age: families.oldest_unpublished_age.get_or_create(&labels).clone(),
            quarantined: families.quarantined.get_or_create(&labels).clone(),
            stuck_aggregates: families.stuck_aggregates.get_or_create(&labels).clone(),
            gauges_refreshed: families.gauges_refreshed.get_or_create(&labels).clone(),
            retention_deleted_total: families.retention_deleted_total.get_or_create(&labels).clone(),
            retention_partitions_dropped_total: families
                .retention_partitions_dropped_total
                .get_or_create(&labels)
                .clone(),
            last_progress: families.last_progress.get_or_create(&labels).clone(),
            ready: families.source_ready.get_or_create(&labels).clone(),
            families: families.clone(),
            labels,
        }
    }

    /// Whether a destination is ready, one series per destination whatever
    /// the sources (the broker's state is the same for each): labelled with
    /// `name`, or unlabelled (`None`) for a sink the environment configures.
    pub fn destination_ready(&self, name: Option<&str>) -> Gauge {
        let labels = with_label(Labels::new(), "destination", name);
        self.families.destination_ready.get_or_create(&labels).clone()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        encode(&mut out, &self.registry).expect("encoding into a String");
        out
    }
}

/// The process's own CPU time, resident memory and open file descriptors,
/// read from `/proc/self` on each scrape under the names Prometheus's
/// client libraries use, so that the usual dashboards and the relay's own
/// show them without a node or cAdvisor exporter. Where there is no
/// `/proc` (not Linux), nothing is written.
#[derive(Debug)]
struct ProcessCollector;

/// `/proc/<pid>/stat` counts CPU time in clock ticks of `USER_HZ`, which
/// Linux fixes at 100 for everything it shows userspace.
const USER_HZ: f64 = 100.0;

impl ProcessCollector {
    fn cpu_seconds() -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The fields after the command name, which is in parentheses and
        // may itself hold spaces: utime and stime are the 12th and 13th.
        let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
        let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(ticks / USER_HZ)
    }

    fn resident_bytes() -> Option<i64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let kib: i64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    }

    fn open_fds() -> Option<i64> {
        Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as i64)
    }
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        if let Some(seconds) = Self::cpu_seconds() {
            let counter = ConstCounter::new(seconds);
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time of the relay process",
                None,
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        if let Some(bytes) = Self::resident_bytes() {
            let gauge = ConstGauge::new(bytes);
            let metric = encoder.encode_descriptor(
                "process_resident_memory_bytes",
                "Resident memory of the relay process",
                None,
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        if let Some(fds) = Self::open_fds() {
            let gauge = ConstGauge::new(fds);
            let metric = encoder.encode_descriptor(
                "process_open_fds",
                "Open file descriptors of the relay process (connections included)",
                None,
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_the_spec_names() {
        let metrics = Metrics::new();
        let source = metrics.source(None);
        let orders = source.destination(Some("orders"));
        orders.published.inc();
        orders.lag.observe(0.02);
        metrics.destination_ready(Some("orders")).set(1);
        let text = metrics.render();
        for name in [
            "outbox_unpublished_events ",
            "outbox_oldest_unpublished_age_seconds ",
            "outbox_quarantined_events ",
            "outbox_events_published_total{destination=\"orders\"} 1",
            "outbox_publish_failures_total{destination=\"orders\"} 0",
            "outbox_events_quarantined_total{destination=\"orders\"} 0",
            "outbox_destination_ready{destination=\"orders\"} 1",
            "outbox_source_ready ",
            "outbox_publish_lag_seconds_bucket",
            "outbox_retention_deleted_total ",
            "outbox_retention_partitions_dropped_total ",
            "outbox_gauges_refreshed_timestamp_seconds ",
            "outbox_relay_last_progress_timestamp_seconds ",
            "# TYPE outbox_publish_lag_seconds histogram",
            "# TYPE outbox_events_published counter",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    #[test]
    fn a_relay_configured_by_the_environment_has_no_source_or_destination_label() {
        let metrics = Metrics::new();
        let source = metrics.source(None);
        source.destination(None).published.inc();
        source.unrouted(false).1.inc();
        metrics.destination_ready(None).set(1);
        let text = metrics.render();
        assert!(text.contains("outbox_events_published_total 1\n"), "{text}");
        assert!(text.contains("outbox_events_quarantined_total 1\n"), "{text}");
        assert!(!text.contains("destination="), "{text}");
        assert!(!text.contains("source="), "{text}");
    }

    #[test]
    fn the_process_reports_its_cpu_memory_and_descriptors() {
        let text = Metrics::new().render();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        };
        assert!(text.contains("# TYPE process_cpu_seconds counter"), "{text}");
        assert!(value("process_cpu_seconds_total") >= 0.0);
        // A test binary holds a few MiB at least, and stdin/out/err.
        assert!(value("process_resident_memory_bytes") > 1_000_000.0);
        assert!(value("process_open_fds") >= 3.0);
    }

    #[test]
    fn every_series_of_a_source_carries_its_name() {
        let metrics = Metrics::new();
        let orders = metrics.source(Some("orders"));
        let billing = metrics.source(Some("billing"));
        orders.unpublished.set(3);
        billing.unpublished.set(5);
        orders.destination(Some("events")).published.inc_by(2);
        billing.unrouted(true).1.inc();
        metrics.destination_ready(Some("events")).set(1);
        let text = metrics.render();
        for line in [
            "outbox_unpublished_events{source=\"orders\"} 3",
            "outbox_unpublished_events{source=\"billing\"} 5",
            "outbox_events_published_total{source=\"orders\",destination=\"events\"} 2",
            "outbox_events_quarantined_total{source=\"billing\",destination=\"\"} 1",
            "outbox_source_ready{source=\"orders\"} 0",
            "outbox_retention_deleted_total{source=\"billing\"} 0",
            "outbox_relay_last_progress_timestamp_seconds{source=\"orders\"} 0",
            "outbox_destination_ready{destination=\"events\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        // One series per source: nothing without the label.
        assert!(
            !text
                .lines()
                .any(|line| line.starts_with("outbox_unpublished_events ")),
            "{text}"
        );
    }

    #[test]
    fn the_help_states_the_bounds_in_force() {
        let metrics = Metrics::new();
        // A family without series has no help line: make one series.
        metrics.source(None);
        let text = metrics.render();
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
