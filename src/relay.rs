//! The relay loop: claim due rows → publish them → record each outcome.
//!
//! Claims are committed leases (see `store/sql/claim.sql`): no transaction
//! is open while the broker works, and a relay that dies leaves rows that
//! come due again when their lease runs out. Outcomes are recorded with one
//! set-based statement per kind (published, retry, quarantine) per batch.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use chrono::Utc;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::config::{OnPublish, RelayConfig};
use crate::metrics::Metrics;
use crate::outage::Outage;
use crate::retry::Backoff;
use crate::sink::{truncate_reason, Outcome, Sink};
use crate::store::{Event, Store, StoreError};

/// What the relay will do with each row of a batch, decided from the
/// sink's outcomes: the pure half of recording, kept apart for testing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decisions {
    /// Confirmed by the broker.
    pub published: Vec<Uuid>,
    /// Failed; try again after the delay.
    pub retry: Vec<(Uuid, String, Duration)>,
    /// Out of attempts or rejected: stop claiming.
    pub quarantine: Vec<(Uuid, String)>,
}

/// Maps outcomes to decisions. `attempt_count` on each event already
/// counts the current attempt (the claim incremented it).
pub fn decide(events: &[Event], outcomes: Vec<Outcome>, max_attempts: u32, backoff: &Backoff) -> Decisions {
    let mut decisions = Decisions::default();
    for (event, outcome) in events.iter().zip(outcomes) {
        let attempt = u32::try_from(event.attempt_count).unwrap_or(0);
        match outcome {
            Outcome::Published => decisions.published.push(event.id),
            Outcome::Reject(reason) => decisions
                .quarantine
                .push((event.id, truncate_reason(&format!("rejected by sink: {reason}")))),
            Outcome::Retry(reason) if attempt >= max_attempts => decisions.quarantine.push((
                event.id,
                truncate_reason(&format!("gave up after {attempt} attempts: {reason}")),
            )),
            Outcome::Retry(reason) => {
                decisions
                    .retry
                    .push((event.id, truncate_reason(&reason), backoff.delay(attempt)))
            }
        }
    }
    decisions
}

/// Splits off rows whose earlier attempts all ended without an outcome
/// being recorded (the relay died or was killed while publishing them):
/// they are past their last attempt, so they are quarantined unpublished
/// instead of crashing the relay once more.
pub fn split_exhausted(events: Vec<Event>, max_attempts: u32) -> (Vec<Event>, Vec<(Uuid, String)>) {
    let limit = i64::from(max_attempts);
    let (exhausted, due): (Vec<Event>, Vec<Event>) = events
        .into_iter()
        .partition(|e| i64::from(e.attempt_count) > limit);
    let quarantine = exhausted
        .into_iter()
        .map(|e| {
            (
                e.id,
                format!(
                    "{max_attempts} attempts began without an outcome being recorded (the relay stopped while publishing this row)"
                ),
            )
        })
        .collect();
    (due, quarantine)
}

/// One worker's view of a dependency's outage: the outage itself is shared
/// by all workers, so it is logged once per replica (see [`Outage`]); the
/// retry delays (capped, jittered backoff) are the worker's own.
struct Availability<'a> {
    outage: &'a Mutex<Outage>,
    delays: Option<backon::ExponentialBackoff>,
}

impl<'a> Availability<'a> {
    fn new(outage: &'a Mutex<Outage>) -> Self {
        Self { outage, delays: None }
    }

    /// Records a failure and returns how long to wait before trying again.
    fn failed(&mut self, error: &dyn std::fmt::Display) -> Duration {
        lock(self.outage).failed(error);
        self.delays
            .get_or_insert_with(|| {
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(100))
                    .with_max_delay(Duration::from_secs(5))
                    .with_jitter()
                    .without_max_times()
                    .build()
            })
            .next()
            .unwrap_or(Duration::from_secs(5))
    }

    fn succeeded(&mut self) {
        if self.delays.take().is_some() {
            lock(self.outage).succeeded();
        }
    }
}

/// The outage state is plain data; a panic elsewhere cannot leave it
/// inconsistent, so a poisoned lock is still usable.
fn lock(outage: &Mutex<Outage>) -> std::sync::MutexGuard<'_, Outage> {
    outage.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The relay: a store, a sink and the loop between them.
pub struct Relay {
    store: Arc<Store>,
    sink: Arc<dyn Sink>,
    config: RelayConfig,
    metrics: Arc<Metrics>,
    wake: Arc<Notify>,
    sink_outage: Mutex<Outage>,
    confirm_outage: Mutex<Outage>,
    database_outage: Mutex<Outage>,
}

impl Relay {
    /// Assembles a relay; nothing connects until [`Relay::run`].
    pub fn new(store: Arc<Store>, sink: Arc<dyn Sink>, config: RelayConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            store,
            sink: sink.clone(),
            config,
            metrics,
            wake: Arc::new(Notify::new()),
            database_outage: Mutex::new(Outage::new("database")),
            sink_outage: Mutex::new(Outage::new(sink.kind())),
            confirm_outage: Mutex::new(Outage::new("broker confirms")),
        }
    }

    /// A handle that cuts an idle sleep short (new rows were announced).
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
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
        futures::future::join_all((0..self.config.workers).map(|_| self.work(&shutdown))).await;
        info!("relay stopped");
    }

    async fn work(&self, shutdown: &CancellationToken) {
        let mut sink_state = Availability::new(&self.sink_outage);
        let mut db_state = Availability::new(&self.database_outage);
        let mut congestion = Availability::new(&self.confirm_outage);
        while !shutdown.is_cancelled() {
            // Checking the sink first keeps a broker outage from burning
            // every row's attempts towards quarantine.
            if let Err(e) = self.sink.ready().await {
                let delay = sink_state.failed(&e);
                sleep_or_cancel(delay, shutdown).await;
                continue;
            }
            sink_state.succeeded();
            let batch = match self
                .store
                .claim(self.config.batch_size, self.config.lease(), self.config.ordering)
                .await
            {
                Ok(batch) => {
                    db_state.succeeded();
                    batch
                }
                Err(e) => {
                    let delay = db_state.failed(&e);
                    sleep_or_cancel(delay, shutdown).await;
                    continue;
                }
            };
            if batch.is_empty() {
                // New rows announced by the NOTIFY trigger end the sleep
                // early; without the trigger, polling alone finds them.
                tokio::select! {
                    _ = tokio::time::sleep(self.config.poll_interval) => {}
                    _ = self.wake.notified() => {}
                    _ = shutdown.cancelled() => {}
                }
                continue;
            }
            // A batch that timed out means the broker is not keeping up:
            // claiming again at once would only add to its load and burn
            // more attempts, so this worker backs off first.
            if self.process(batch, shutdown).await {
                let delay = congestion.failed(&format_args!(
                    "a batch was not confirmed within OUTBOX_PUBLISH_TIMEOUT ({:?})",
                    self.config.publish_timeout
                ));
                sleep_or_cancel(delay, shutdown).await;
            } else {
                congestion.succeeded();
            }
        }
    }

    /// Publishes one claimed batch and records its outcomes. Returns
    /// whether the publish timed out.
    pub async fn process(&self, batch: Vec<Event>, shutdown: &CancellationToken) -> bool {
        let claimed_at = Instant::now();
        let (batch, mut exhausted) = split_exhausted(batch, self.config.max_attempts);
        let mut timed_out = false;
        let outcomes = if batch.is_empty() {
            Vec::new()
        } else {
            match tokio::time::timeout(self.config.publish_timeout, self.sink.publish(&batch)).await {
                Ok(outcomes) => outcomes,
                Err(_) => {
                    timed_out = true;
                    let reason = format!(
                        "not confirmed within OUTBOX_PUBLISH_TIMEOUT ({:?})",
                        self.config.publish_timeout
                    );
                    vec![Outcome::Retry(reason); batch.len()]
                }
            }
        };
        let confirmed_at = Utc::now();
        let mut decisions = decide(&batch, outcomes, self.config.max_attempts, &self.backoff());
        decisions.quarantine.append(&mut exhausted);

        for event in &batch {
            if decisions.published.contains(&event.id) {
                let lag = (confirmed_at - event.created_at).to_std().unwrap_or_default();
                self.metrics.publish_lag.observe(lag.as_secs_f64());
            }
        }
        // One line per batch at warn: a broker refusing everything must not
        // turn into a line per row. Each row is at debug. The `report` field
        // is for machines (log pipelines, the crash suite): stable, unlike
        // the message text.
        if let Some((_, reason, _)) = decisions.retry.first() {
            warn!(report = "publish_failed", rows = decisions.retry.len(), first_reason = %reason, "publish failed; rows will be retried with backoff");
        }
        for (id, reason, delay) in &decisions.retry {
            debug!(event_id = %id, %reason, retry_in_ms = delay.as_millis() as u64, "publish failed; will retry");
        }
        for (id, reason) in &decisions.quarantine {
            warn!(event_id = %id, %reason, "row quarantined");
        }
        self.metrics
            .published_total
            .inc_by(decisions.published.len() as u64);
        let failures = batch.len() - decisions.published.len();
        self.metrics.publish_failures_total.inc_by(failures as u64);
        self.metrics
            .quarantined_total
            .inc_by(decisions.quarantine.len() as u64);

        // The lease bounds how long recording may take: past it another
        // replica may republish the rows anyway, so there is no point in
        // holding on. On shutdown, give up sooner: an unrecorded row is
        // republished after its lease, never lost.
        let deadline = claimed_at + self.config.lease();
        self.record(&decisions, deadline, shutdown).await;
        debug!(
            published = decisions.published.len(),
            retried = decisions.retry.len(),
            quarantined = decisions.quarantine.len(),
            "batch recorded"
        );
        timed_out
    }

    async fn record_step(&self, step: Step, decisions: &Decisions) -> Result<u64, StoreError> {
        match step {
            Step::Published if decisions.published.is_empty() => Ok(0),
            Step::Published => match self.config.on_publish {
                OnPublish::Mark => self.store.mark_published(&decisions.published).await,
                OnPublish::Delete => self.store.delete_published(&decisions.published).await,
            },
            Step::Retry if decisions.retry.is_empty() => Ok(0),
            Step::Retry => self.store.reschedule(&decisions.retry).await,
            Step::Quarantine if decisions.quarantine.is_empty() => Ok(0),
            Step::Quarantine => self.store.quarantine(&decisions.quarantine).await,
        }
    }

    async fn record(&self, decisions: &Decisions, deadline: Instant, shutdown: &CancellationToken) {
        // The three statements touch disjoint rows, so they run at once.
        let steps = [Step::Published, Step::Retry, Step::Quarantine];
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

/// The recording statements of a batch.
#[derive(Debug, Clone, Copy)]
enum Step {
    Published,
    Retry,
    Quarantine,
}

async fn sleep_or_cancel(delay: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(attempt_count: i32) -> Event {
        Event {
            id: Uuid::new_v4(),
            causation_id: None,
            event_type: "t".into(),
            aggregate_id: "a".into(),
            payload: "{}".into(),
            created_at: Utc::now(),
            attempt_count,
        }
    }

    const BACKOFF: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(60),
    };

    #[test]
    fn outcomes_map_to_mark_backoff_and_quarantine() {
        let events = vec![event(1), event(2), event(3), event(10)];
        let outcomes = vec![
            Outcome::Published,
            Outcome::Retry("nack".into()),
            Outcome::Reject("too large".into()),
            Outcome::Retry("unroutable".into()),
        ];
        let decisions = decide(&events, outcomes, 10, &BACKOFF);
        assert_eq!(decisions.published, vec![events[0].id]);
        assert_eq!(decisions.retry.len(), 1);
        assert_eq!(decisions.retry[0].0, events[1].id);
        let delay = decisions.retry[0].2;
        assert!(delay >= Duration::from_secs(1) && delay <= Duration::from_secs(2));
        let quarantined: Vec<Uuid> = decisions.quarantine.iter().map(|q| q.0).collect();
        assert_eq!(quarantined, vec![events[2].id, events[3].id]);
        assert!(decisions.quarantine[1].1.contains("gave up after 10 attempts"));
    }

    #[test]
    fn rows_whose_attempts_all_crashed_are_quarantined_unpublished() {
        let fresh = event(10);
        let crashed = event(11);
        let (due, quarantine) = split_exhausted(vec![fresh.clone(), crashed.clone()], 10);
        assert_eq!(due, vec![fresh]);
        assert_eq!(quarantine.len(), 1);
        assert_eq!(quarantine[0].0, crashed.id);
    }
}
