//! The chaos: the relays (the real binary, each behind a proxy of its own
//! to the broker), killed, cut off and their database backends terminated
//! at random, or, on private servers, the broker alarmed and the database
//! restarted; what the chaos did and what the relays' logs reported, which
//! together bound the duplicates a run may deliver.

use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::private_postgres::PrivatePostgres;
use crate::common::private_rabbit::PrivateRabbit;
use crate::common::proxy::Proxy;
use crate::common::{eventually, RelayProcess, TestDb};
use crate::producer::UNROUTABLE;
use crate::{BATCH, RELAYS, SETTLE};

/// What the chaos did.
#[derive(Debug, Default)]
pub struct ChaosLog {
    pub kills: usize,
    pub cuts: usize,
    /// Calls that terminated at least one relay backend.
    pub terminations: usize,
    pub backends_terminated: i64,
    /// Memory alarms raised on the broker, and their total length.
    pub alarms: usize,
    pub alarm_time: Duration,
    /// Fast restarts of the database.
    pub restarts: usize,
    /// Rows whose publish the broker or the network failed, as the relays
    /// logged them (deferred: cuts, and publish timeouts on a starved
    /// machine, with or without chaos). Rows the broker refused (returned,
    /// nacked) were not delivered and do not count.
    pub unconfirmed_rows: usize,
    /// Times a relay logged that it could not record outcomes before the
    /// lease ran out (its batch will be published again).
    pub unrecorded_batches: usize,
}

impl ChaosLog {
    /// The most duplicates the run can explain. A row is published again
    /// only if the broker took it and its relay did not record that: the
    /// relay was killed in between (its rows in flight), its broker
    /// connection was cut before the confirms arrived (that relay's rows
    /// in flight), its database backend was terminated or the database
    /// restarted and the mark did not get through before the lease ran out
    /// (every relay's rows in flight, and the relay logs it), the broker
    /// took a batch an alarm held up after the relay gave up on it (every
    /// relay's rows in flight, and the relay logs them), or the publish
    /// failed although the broker had taken some of the batch (a timeout:
    /// the relay logs the rows).
    /// The last one happens without any chaos on a starved machine, which
    /// is why the relays' own reports are part of the bound.
    pub fn duplicate_bound(&self, workers: usize) -> usize {
        let windows = self.kills
            + self.cuts
            + (self.terminations + self.restarts + self.alarms) * RELAYS
            + self.unrecorded_batches;
        windows * BATCH * workers + self.unconfirmed_rows
    }
}

/// Waits for the relays to publish every row once the chaos has stopped,
/// printing the backlog now and then so a stuck run says where it stuck.
pub async fn all_published(db: &TestDb) {
    let next_report = &std::cell::Cell::new(Instant::now() + Duration::from_secs(10));
    let what = "every row published once the chaos stopped";
    eventually(SETTLE, what, || async move {
        let pending = db
            .count(&format!(
                "published_at IS NULL AND quarantined_at IS NULL AND event_type <> '{UNROUTABLE}'"
            ))
            .await;
        if pending > 0 && Instant::now() >= next_report.get() {
            next_report.set(Instant::now() + Duration::from_secs(10));
            report_backlog(db, pending).await;
        }
        pending == 0
    })
    .await;
}

async fn report_backlog(db: &TestDb, pending: i64) {
    let row = db
        .client
        .query_one(
            "SELECT count(*) FILTER (WHERE next_attempt_at > now() OR leased_until > now()), max(attempt_count),
                    count(DISTINCT aggregate_id), left(max(last_error), 200)
             FROM outbox_event WHERE published_at IS NULL AND quarantined_at IS NULL",
            &[],
        )
        .await
        .expect("backlog");
    let (waiting, attempts, aggregates, error): (i64, i32, i64, Option<String>) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    eprintln!(
        "waiting: {pending} rows unpublished ({waiting} leased or backing off) in {aggregates} \
         aggregates, max attempts {attempts}, an error: {error:?}"
    );
}

/// What the relays' logs said, for the duplicate bound.
#[derive(Debug, Default)]
struct RelayReports {
    unconfirmed_rows: AtomicUsize,
    unrecorded_batches: AtomicUsize,
}

/// Starts `outbox-relay run`, reading its log for failed publishes.
fn start_relay(
    db: &TestDb,
    env: &[(&'static str, String)],
    reports: Arc<RelayReports>,
) -> (RelayProcess, std::thread::JoinHandle<()>) {
    RelayProcess::start_reading_log(db, env, move |line| {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        // Fields are at the top level (flattened) or under "fields".
        let fields = entry.get("fields").unwrap_or(&entry);
        // The relay's `report` field, not its wording, says what a line is.
        let report = fields["report"].as_str().unwrap_or_default();
        if report == "publish_deferred" {
            let rows = fields["rows"].as_u64().unwrap_or(BATCH as u64);
            reports
                .unconfirmed_rows
                .fetch_add(usize::try_from(rows).unwrap_or(BATCH), AtomicOrdering::SeqCst);
        } else if report == "outcomes_unrecorded" {
            reports.unrecorded_batches.fetch_add(1, AtomicOrdering::SeqCst);
        }
    })
}

/// The relays and what stands between them and their servers.
pub struct Relays {
    processes: Vec<RelayProcess>,
    /// Readers of the relays' logs, past and present.
    readers: Vec<std::thread::JoinHandle<()>>,
    reports: Arc<RelayReports>,
    settings: Vec<Vec<(&'static str, String)>>,
    /// Each relay's own proxy to its broker, so a cut hits one relay.
    proxies: Vec<Proxy>,
}

impl Relays {
    pub fn start(db: &TestDb, settings: Vec<Vec<(&'static str, String)>>, proxies: Vec<Proxy>) -> Self {
        let reports = Arc::new(RelayReports::default());
        let mut readers = Vec::new();
        let processes = settings
            .iter()
            .map(|env| {
                let (process, reader) = start_relay(db, env, reports.clone());
                readers.push(reader);
                process
            })
            .collect();
        Self {
            processes,
            readers,
            reports,
            settings,
            proxies,
        }
    }

    /// Kills, cuts and terminates at random every 1–3 s until `until`
    /// has passed and `producer` is done; only cuts when `cuts_only`.
    pub async fn chaos(
        &mut self,
        db: &TestDb,
        rng: &mut StdRng,
        until: Instant,
        producer: &tokio::task::JoinHandle<()>,
        cuts_only: bool,
    ) -> ChaosLog {
        let mut log = ChaosLog::default();
        while Instant::now() < until || !producer.is_finished() {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..=3_000))).await;
            if cuts_only {
                self.proxies[rng.random_range(0..self.proxies.len())].cut();
                log.cuts += 1;
                continue;
            }
            let victim = rng.random_range(0..self.processes.len());
            self.processes[victim].signal("KILL");
            self.processes[victim]
                .wait(Duration::from_secs(30))
                .await
                .expect("a SIGKILLed relay exits");
            let (process, reader) = start_relay(db, &self.settings[victim], self.reports.clone());
            self.processes[victim] = process;
            self.readers.push(reader);
            log.kills += 1;
            if rng.random_bool(0.5) {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
                self.proxies[rng.random_range(0..self.proxies.len())].cut();
                log.cuts += 1;
            }
            if rng.random_bool(0.3) {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
                let terminated = db.terminate_relay_backends().await;
                if terminated > 0 {
                    log.terminations += 1;
                    log.backends_terminated += terminated;
                }
            }
        }
        log
    }

    /// Kills every relay and adds what their logs reported to `log`.
    pub fn stop(self, log: &mut ChaosLog) {
        // Dropping a RelayProcess kills it and waits for it; its log pipe
        // then closes and its reader finishes.
        drop(self.processes);
        for reader in self.readers {
            reader.join().expect("log reader");
        }
        log.unconfirmed_rows = self.reports.unconfirmed_rows.load(AtomicOrdering::SeqCst);
        log.unrecorded_batches = self.reports.unrecorded_batches.load(AtomicOrdering::SeqCst);
    }
}

/// Raises the broker's memory alarm for 1–5 s at a time, 1–5 s apart, and
/// restarts the database every 3–8 s, until `until` has passed and
/// `producer` is done.
pub async fn outages(
    rabbit: &PrivateRabbit,
    postgres: &PrivatePostgres,
    seed: u64,
    until: Instant,
    producer: &tokio::task::JoinHandle<()>,
) -> ChaosLog {
    let going_on = || Instant::now() < until || !producer.is_finished();
    let alarms = async {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xa1a2);
        let (mut count, mut time) = (0, Duration::ZERO);
        loop {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..=5_000))).await;
            if !going_on() {
                break;
            }
            // rabbitmqctl takes a second or so itself; the alarm lasts from
            // the raising command's end to the clearing one's end.
            rabbit
                .rabbitmqctl(&["set_vm_memory_high_watermark", "0.0000001"])
                .await;
            let raised = Instant::now();
            tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..=5_000))).await;
            rabbit.rabbitmqctl(&["set_vm_memory_high_watermark", "0.4"]).await;
            count += 1;
            time += raised.elapsed();
        }
        (count, time)
    };
    let restarts = async {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7e57);
        let mut count = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(rng.random_range(3_000..=8_000))).await;
            if !going_on() {
                break;
            }
            postgres.restart_fast().await;
            count += 1;
        }
        count
    };
    let ((alarms, alarm_time), restarts) = tokio::join!(alarms, restarts);
    ChaosLog {
        alarms,
        alarm_time,
        restarts,
        ..ChaosLog::default()
    }
}
