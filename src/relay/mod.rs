//! The relay loop: claim due rows → publish them → record each outcome.
//!
//! Claims are committed leases (see `store/sql/claim.sql`): no transaction
//! is open while the broker works, and a relay that dies leaves rows that
//! come due again when their lease runs out. Outcomes are recorded with one
//! set-based statement per kind (published, retry, quarantine) per batch;
//! with unordered claims the published rows go with the worker's next
//! claim, in the same statement.

mod catch_up;
mod decide;
mod health;
mod settings;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use uuid::Uuid;

pub use catch_up::{CatchUp, CATCHING_UP_FOR};
pub use decide::{decide, split_exhausted, ClaimedRow, Decisions, Quarantine, Retry};
pub use health::{BatchHealth, RelayHealth, Turn, PROBE_ROWS};
pub use settings::RelaySettings;

use crate::headers::batch_trace_ids;
use crate::liveness::{stall_limit, Liveness, LoopBounds};
use crate::metrics::Metrics;
use crate::outage::{sleep_or_cancel, Availability, Outage};
use crate::retry::Backoff;
use crate::sink::{Outcome, Sink, SinkError};
pub use crate::store::OnPublish;
use crate::store::{ClaimBudget, Claimed, Ordering, Store, StoreError};

/// Validated relay-loop settings.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows claimed per batch.
    pub batch_size: u32,
    /// Longest idle sleep.
    pub poll_interval: Duration,
    /// Failed attempts before quarantine.
    pub max_attempts: u32,
    /// Bound on one batch's publish.
    pub publish_timeout: Duration,
    /// First backoff delay.
    pub backoff_base: Duration,
    /// Backoff cap.
    pub backoff_max: Duration,
    /// Mark or delete confirmed rows.
    pub on_publish: OnPublish,
    /// Ordering guarantee.
    pub ordering: Ordering,
    /// Batches in flight at once.
    pub workers: u32,
    /// What one claim may load of payloads, in bytes (at least one row).
    pub max_batch_bytes: usize,
}

impl RelayConfig {
    /// How long a claim keeps other replicas off a row. A relay that dies
    /// mid-batch delays its rows by this much; a live relay always records
    /// an outcome well before it runs out (the publish is bounded by
    /// `publish_timeout`, recording by the rest).
    pub fn lease(&self) -> Duration {
        self.publish_timeout * 2 + Duration::from_secs(5)
    }
}

/// How long past the publish deadline a sink may take to return the
/// outcomes it has; sinks stop waiting at the deadline itself.
const SINK_GRACE: Duration = Duration::from_secs(2);

/// The relay: a store, a sink and the loop between them.
pub struct Relay {
    store: Arc<Store>,
    sink: Arc<dyn Sink>,
    config: RelayConfig,
    metrics: Arc<Metrics>,
    wake: Arc<Notify>,
    liveness: Arc<Liveness>,
    catch_up: Arc<CatchUp>,
    sink_outage: Mutex<Outage>,
    database_outage: Mutex<Outage>,
    health: Arc<RelayHealth>,
}

impl Relay {
    /// Assembles a relay; nothing connects until [`Relay::run`].
    pub fn new(store: Arc<Store>, sink: Arc<dyn Sink>, config: RelayConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            store,
            sink: sink.clone(),
            liveness: Arc::new(Liveness::new(
                config.workers as usize,
                stall_limit(LoopBounds {
                    lease: config.lease(),
                    publish_timeout: config.publish_timeout,
                    poll_interval: config.poll_interval,
                }),
            )),
            config,
            metrics,
            catch_up: Arc::default(),
            wake: Arc::new(Notify::new()),
            database_outage: Mutex::new(Outage::new("database")),
            sink_outage: Mutex::new(Outage::new(sink.kind())),
            health: Arc::default(),
        }
    }

    /// A handle that cuts an idle sleep short (new rows were announced).
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// The workers' heartbeat, which `/healthz` reads.
    pub fn liveness(&self) -> Arc<Liveness> {
        self.liveness.clone()
    }

    /// What the relay's own work says about the database and the broker,
    /// which `/readyz` reports.
    pub fn health(&self) -> Arc<RelayHealth> {
        self.health.clone()
    }

    /// Whether the relay is catching up with a backlog, which retention
    /// reads to give way.
    pub fn catch_up(&self) -> Arc<CatchUp> {
        self.catch_up.clone()
    }

    fn backoff(&self) -> Backoff {
        Backoff {
            base: self.config.backoff_base,
            max: self.config.backoff_max,
        }
    }

    /// Runs until `shutdown` is cancelled. On shutdown it stops claiming,
    /// settles the batches in flight (publish bounded by the publish
    /// timeout, recording bounded too) and returns.
    ///
    /// `OUTBOX_WORKERS` batches are in flight at once: while one batch waits
    /// for the broker's confirms, another is being claimed or recorded, so
    /// neither PostgreSQL nor the broker sits idle between round trips.
    pub async fn run(&self, shutdown: CancellationToken) {
        info!(
            sink = self.sink.kind(),
            table = %self.store.table(),
            batch_size = self.config.batch_size,
            workers = self.config.workers,
            ordering = ?self.config.ordering,
            "relay started"
        );
        futures::future::join_all(
            (0..self.config.workers as usize).map(|worker| self.work(worker, &shutdown)),
        )
        .await;
        info!("relay stopped");
    }

    async fn work(&self, worker: usize, shutdown: &CancellationToken) {
        let mut sink_state = Availability::new(&self.sink_outage);
        let mut db_state = Availability::new(&self.database_outage);
        // What the broker confirmed of this worker's last batch, recorded
        // with its next claim whenever there is one at once (see
        // Store::record_and_claim), on its own before any wait.
        let mut confirmed = Confirmed::default();
        while !shutdown.is_cancelled() {
            self.liveness.beat(worker);
            // While the broker defers whole batches, one worker of the
            // replica at a time publishes a small probe batch, spaced by a
            // capped backoff (see health.rs).
            let turn = self.health.turn();
            let rows = match turn {
                Turn::Publish => self.config.batch_size,
                Turn::Probe => self.config.batch_size.min(PROBE_ROWS),
                Turn::Wait(delay) => {
                    self.record_confirmed(&mut confirmed, shutdown).await;
                    sleep_or_cancel(delay, shutdown).await;
                    continue;
                }
            };
            let probing = turn == Turn::Probe;
            // Checking the sink first keeps a broker outage from burning
            // every row's attempts towards quarantine.
            if let Err(e) = self.sink_ready(&mut confirmed, shutdown).await {
                if probing {
                    self.health.probe_abandoned();
                }
                let delay = sink_state.failed(&e);
                self.record_confirmed(&mut confirmed, shutdown).await;
                sleep_or_cancel(delay, shutdown).await;
                continue;
            }
            sink_state.succeeded();
            let budget = ClaimBudget {
                rows,
                bytes: self.config.max_batch_bytes,
                max_payload: self.sink.max_payload_bytes(),
            };
            let claim = if confirmed.rows.is_empty() {
                self.store
                    .claim(budget, self.config.lease(), self.config.ordering)
                    .await
            } else {
                let (ids, attempts): (Vec<Uuid>, Vec<i32>) =
                    confirmed.rows.iter().map(|row| (row.id, row.attempt)).unzip();
                self.store
                    .record_and_claim(
                        self.config.on_publish,
                        &ids,
                        &attempts,
                        budget,
                        self.config.lease(),
                    )
                    .await
            };
            let batch = match claim {
                Ok(batch) => {
                    confirmed.rows.clear();
                    db_state.succeeded();
                    self.health.claim_succeeded();
                    batch
                }
                Err(e) => {
                    self.health.claim_failed(&e);
                    if probing {
                        self.health.probe_abandoned();
                    }
                    let delay = db_state.failed(&e);
                    self.record_confirmed(&mut confirmed, shutdown).await;
                    sleep_or_cancel(delay, shutdown).await;
                    continue;
                }
            };
            let claimed_rows = batch.events.len() + batch.unpublishable.len();
            if claimed_rows >= self.config.batch_size as usize {
                self.catch_up.full_claim();
            }
            if claimed_rows == 0 {
                if probing {
                    self.health.probe_found_nothing();
                }
                // New rows announced by the NOTIFY trigger end the sleep
                // early; without the trigger, polling alone finds them.
                tokio::select! {
                    _ = tokio::time::sleep(self.config.poll_interval) => {}
                    _ = self.wake.notified() => {}
                    _ = shutdown.cancelled() => {}
                }
                continue;
            }
            let health;
            (health, confirmed) = self.process(batch, shutdown).await;
            self.health.batch_settled(health);
        }
        self.record_confirmed(&mut confirmed, shutdown).await;
    }

    /// Whether the sink is ready, bounded, so that a connection attempt
    /// into a black hole is an outage, not a hang. When the answer is not
    /// at hand (a connection or a probe request is under way), the rows
    /// confirmed in the last batch are recorded first: their lease runs
    /// while the check waits.
    async fn sink_ready(
        &self,
        confirmed: &mut Confirmed,
        shutdown: &CancellationToken,
    ) -> Result<(), SinkError> {
        let check = self.sink.ready();
        tokio::pin!(check);
        if let std::task::Poll::Ready(answer) = futures::poll!(&mut check) {
            return answer;
        }
        self.record_confirmed(confirmed, shutdown).await;
        tokio::time::timeout(self.config.publish_timeout, check)
            .await
            .unwrap_or_else(|_| Err(SinkError("no answer within OUTBOX_PUBLISH_TIMEOUT".to_owned())))
    }

    /// Records confirmed rows left for a claim that is not coming now.
    async fn record_confirmed(&self, confirmed: &mut Confirmed, shutdown: &CancellationToken) {
        if confirmed.rows.is_empty() {
            return;
        }
        let decisions = Decisions {
            published: std::mem::take(&mut confirmed.rows),
            ..Decisions::default()
        };
        self.record(&decisions, confirmed.deadline, shutdown).await;
    }

    /// Publishes one claimed batch and records its outcomes, except the
    /// confirmed rows that an unordered claim records next (returned).
    async fn process(&self, claimed: Claimed, shutdown: &CancellationToken) -> (BatchHealth, Confirmed) {
        let claimed_at = Instant::now();
        // The trace each row continues (its valid W3C traceparent), so that
        // every line about a row or the batch names it.
        let traces: HashMap<Uuid, String> = claimed
            .events
            .iter()
            .filter_map(|event| Some((event.id, event.headers.trace_id()?.to_owned())))
            .collect();
        let trace_of = |id: &Uuid| traces.get(id).map(String::as_str);
        let traces_of = |ids: &mut dyn Iterator<Item = &Uuid>| batch_trace_ids(ids.filter_map(trace_of));
        let (batch, mut exhausted) = split_exhausted(claimed.events, self.config.max_attempts);
        let outcomes = if batch.is_empty() {
            Vec::new()
        } else {
            let deadline = tokio::time::Instant::now() + self.config.publish_timeout;
            let publish = self.sink.publish(&batch, deadline);
            match tokio::time::timeout_at(deadline + SINK_GRACE, publish).await {
                Ok(outcomes) => outcomes,
                Err(_) => {
                    let reason = format!(
                        "not confirmed within OUTBOX_PUBLISH_TIMEOUT ({:?})",
                        self.config.publish_timeout
                    );
                    vec![Outcome::Deferred(reason); batch.len()]
                }
            }
        };
        let confirmed_at = Utc::now();
        let mut decisions = decide(&batch, outcomes, self.config.max_attempts, &self.backoff());
        decisions.quarantine.append(&mut exhausted);
        // A row the relay cannot even read or load never will be: no
        // attempt on it can succeed, so it is quarantined at once.
        decisions
            .quarantine
            .extend(claimed.unpublishable.into_iter().map(|row| Quarantine {
                row: ClaimedRow {
                    id: row.id,
                    attempt: row.attempt_count,
                },
                reason: format!("cannot be published: {}", row.reason),
            }));

        let published: HashSet<Uuid> = decisions.published.iter().map(|row| row.id).collect();
        for event in &batch {
            if published.contains(&event.id) {
                let lag = (confirmed_at - event.created_at).to_std().unwrap_or_default();
                self.metrics.publish_lag.observe(lag.as_secs_f64());
            }
        }
        // One line per batch at warn: a broker refusing everything must not
        // turn into a line per row. Each row is at debug. The `report` field
        // is for machines (log pipelines, the crash suite): stable, unlike
        // the message text.
        if let Some(first) = decisions.retry.first() {
            let trace_id = traces_of(&mut decisions.retry.iter().map(|retry| &retry.row.id));
            warn!(report = "publish_failed", rows = decisions.retry.len(), first_reason = %first.reason, trace_id, "publish failed; rows will be retried with backoff");
        }
        if let Some(reason) = &decisions.deferred_because {
            let trace_id = traces_of(&mut decisions.deferred.iter().map(|row| &row.id));
            warn!(report = "publish_deferred", rows = decisions.deferred.len(), %reason, trace_id, "the broker or the network failed the batch; rows will be published again, not charged an attempt");
        }
        for retry in &decisions.retry {
            debug!(event_id = %retry.row.id, reason = %retry.reason, retry_in_ms = retry.delay.as_millis() as u64, trace_id = trace_of(&retry.row.id), "publish failed; will retry");
        }
        for quarantine in &decisions.quarantine {
            warn!(event_id = %quarantine.row.id, reason = %quarantine.reason, trace_id = trace_of(&quarantine.row.id), "row quarantined");
        }
        self.metrics
            .published_total
            .inc_by(decisions.published.len() as u64);
        // Failed attempts are the rows' own; a deferral is the broker's.
        let failures = decisions.retry.len() + decisions.quarantine.len();
        self.metrics.publish_failures_total.inc_by(failures as u64);
        self.metrics
            .quarantined_total
            .inc_by(decisions.quarantine.len() as u64);

        // The lease bounds how long recording may take: past it another
        // replica may republish the rows anyway, so there is no point in
        // holding on. On shutdown, give up sooner: an unrecorded row is
        // republished after its lease, never lost.
        let deadline = claimed_at + self.config.lease();
        let published = decisions.published.len();
        let confirmed = Confirmed {
            rows: if self.config.ordering == Ordering::None && !shutdown.is_cancelled() {
                std::mem::take(&mut decisions.published)
            } else {
                Vec::new()
            },
            deadline,
        };
        self.record(&decisions, deadline, shutdown).await;
        // A batch the broker deferred more of than it published is an
        // answer every row would have got (a full queue, a refusal of every
        // request): the broker's state, not theirs. One row deferred among
        // published batch-mates is not, so a row the broker keeps failing
        // for an unknowable reason of its own never slows the others.
        let health = match &decisions.deferred_because {
            Some(reason) if decisions.deferred.len() > published => BatchHealth::Deferred(reason.clone()),
            _ => BatchHealth::Answered,
        };
        debug!(
            report = "batch_recorded",
            published,
            retried = decisions.retry.len(),
            quarantined = decisions.quarantine.len(),
            deferred = decisions.deferred.len(),
            trace_id = traces_of(&mut batch.iter().map(|event| &event.id)),
            "batch recorded"
        );
        (health, confirmed)
    }

    async fn record_step(&self, step: Step, decisions: &Decisions) -> Result<u64, StoreError> {
        fn columns<'a, T: 'a>(
            rows: impl Iterator<Item = &'a T>,
            row: impl Fn(&T) -> ClaimedRow,
        ) -> (Vec<Uuid>, Vec<i32>) {
            rows.map(|item| {
                let claimed = row(item);
                (claimed.id, claimed.attempt)
            })
            .unzip()
        }
        match step {
            Step::Published if decisions.published.is_empty() => Ok(0),
            Step::Published => {
                let (ids, attempts) = columns(decisions.published.iter(), |row| *row);
                match self.config.on_publish {
                    OnPublish::Mark => self.store.mark_published(&ids, &attempts).await,
                    OnPublish::Delete => self.store.delete_published(&ids, &attempts).await,
                }
            }
            Step::Retry if decisions.retry.is_empty() => Ok(0),
            Step::Retry => {
                let (ids, attempts) = columns(decisions.retry.iter(), |retry| retry.row);
                let reasons: Vec<&str> = decisions
                    .retry
                    .iter()
                    .map(|retry| retry.reason.as_str())
                    .collect();
                let delays: Vec<Duration> = decisions.retry.iter().map(|retry| retry.delay).collect();
                self.store.reschedule(&ids, &attempts, &reasons, &delays).await
            }
            Step::Quarantine if decisions.quarantine.is_empty() => Ok(0),
            Step::Quarantine => {
                let (ids, attempts) = columns(decisions.quarantine.iter(), |row| row.row);
                let reasons: Vec<&str> = decisions
                    .quarantine
                    .iter()
                    .map(|row| row.reason.as_str())
                    .collect();
                self.store.quarantine(&ids, &attempts, &reasons).await
            }
            Step::Defer if decisions.deferred.is_empty() => Ok(0),
            Step::Defer => {
                let (ids, attempts) = columns(decisions.deferred.iter(), |row| *row);
                self.store.defer(&ids, &attempts).await
            }
        }
    }

    async fn record(&self, decisions: &Decisions, deadline: Instant, shutdown: &CancellationToken) {
        // The statements touch disjoint rows, so they run at once.
        let steps = [Step::Published, Step::Retry, Step::Quarantine, Step::Defer];
        let results = futures::future::join_all(
            steps.map(|step| async move { (step, self.record_step(step, decisions).await) }),
        )
        .await;
        for (step, result) in results {
            if let Err(error) = result {
                self.retry_record(step, decisions, error, deadline, shutdown)
                    .await;
            }
        }
    }

    /// Retries one recording statement through a database outage, until the
    /// rows' lease runs out (or, on shutdown, a short grace period ends).
    async fn retry_record(
        &self,
        step: Step,
        decisions: &Decisions,
        first_error: StoreError,
        deadline: Instant,
        shutdown: &CancellationToken,
    ) {
        let mut state = Availability::new(&self.database_outage);
        let mut error = first_error;
        let shutdown_grace = Instant::now() + Duration::from_secs(10);
        loop {
            let delay = state.failed(&error);
            let give_up_at = if shutdown.is_cancelled() {
                deadline.min(shutdown_grace)
            } else {
                deadline
            };
            if Instant::now() + delay >= give_up_at {
                warn!(report = "outcomes_unrecorded", outcome = ?step, %error, "could not record outcomes before the lease ran out; those rows will be published again");
                return;
            }
            tokio::time::sleep(delay).await;
            match self.record_step(step, decisions).await {
                Ok(_) => {
                    state.succeeded();
                    return;
                }
                Err(e) => error = e,
            }
        }
    }
}

/// Rows the broker confirmed whose outcome is not recorded yet.
#[derive(Debug)]
struct Confirmed {
    rows: Vec<ClaimedRow>,
    /// When their lease runs out: recording is pointless after that.
    deadline: Instant,
}

impl Default for Confirmed {
    fn default() -> Self {
        Self {
            rows: Vec::new(),
            deadline: Instant::now(),
        }
    }
}

/// The recording statements of a batch.
#[derive(Debug, Clone, Copy)]
enum Step {
    Published,
    Retry,
    Quarantine,
    Defer,
}
