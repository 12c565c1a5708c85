//! The relay loop: claim due rows → publish them → record each outcome.
//!
//! Claims are committed leases (see `store/sql/claim.sql`): no transaction
//! is open while the broker works, and a relay that dies leaves rows that
//! come due again when their lease runs out. Outcomes are recorded with one
//! set-based statement per kind (published, retry, quarantine) per batch;
//! with unordered claims the published rows go with the worker's next
//! claim, in the same statement.
//!
//! A relay publishes to one or more destinations (see `destination.rs`),
//! each event to the one its route names. A batch is split by route and
//! every destination's part published at once; a destination that is not
//! ready or whose broker defers batches is left out of the claims (the
//! store's route filter), so its outage holds back only its own rows.

mod catch_up;
mod claim_start;
mod decide;
mod destination;
mod health;
mod settings;
mod windows;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use uuid::Uuid;

pub use catch_up::{CatchUp, CATCHING_UP_FOR};
pub use decide::{
    decide, isolate_interrupted, route_batch, split_exhausted, ClaimedRow, Decisions, Quarantine, Retry,
    Routed,
};
pub use destination::{Destination, Destinations, Readiness};
use health::ProbeCursors;
pub use health::{BatchHealth, DestinationHealth, RelayHealth, Turn, PROBE_ROWS};
pub use settings::RelaySettings;

use crate::headers::batch_trace_ids;
use crate::liveness::{stall_limit, Liveness, LoopBounds};
use crate::metrics::{DestinationMetrics, SourceMetrics};
use crate::otel::{PublishSpans, SpanDestination, SpanOutcome};
use crate::outage::{sleep_or_cancel, Availability, Outage, MAX_RETRY_DELAY};
use crate::retry::Backoff;
use crate::route::Router;
use crate::sink::Outcome;
pub use crate::store::OnPublish;
use crate::store::{ClaimBudget, ClaimStart, Claimed, Ordering, RouteFilter, Store, StoreError};
use claim_start::{ClaimFrontier, ClaimScope, ClaimStarts};
use windows::{window_end, ClaimWindows, Taken, WindowMeasures, WINDOW_ROWS};

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
    /// `synchronous_commit` for the relay's own transactions (see
    /// `Store::for_relay`).
    pub synchronous_commit: &'static str,
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

/// How often a worker with no destination to publish to looks again while
/// a destination's readiness check is under way.
const CHECK_POLL: Duration = Duration::from_millis(100);

/// The name of the one destination of a relay configured by the
/// environment; a file's destination may not take it.
pub const DEFAULT_DESTINATION: &str = "default";

/// The name of the one source of a relay whose database the environment
/// configures (no `[[source]]` tables): never shown as a label.
pub const DEFAULT_SOURCE: &str = "default";

/// Whether these destination names are the environment's one destination:
/// a relay that answers (metrics, `/readyz`, `check`) as before routes.
pub fn is_environment_only<'a>(mut names: impl Iterator<Item = &'a str>) -> bool {
    matches!((names.next(), names.next()), (Some(DEFAULT_DESTINATION), None))
}

/// The relay: a store, its destinations, the routes between them and the
/// loop that moves rows along.
pub struct Relay {
    store: Arc<Store>,
    destinations: Destinations,
    /// This source's publishing metrics for each destination, by index.
    destination_metrics: Vec<DestinationMetrics>,
    /// This source's own metrics (readiness of its database).
    metrics: SourceMetrics,
    router: Router,
    /// The routes' globs as `LIKE` patterns, for the claims' route filter.
    route_patterns: Vec<String>,
    config: RelayConfig,
    wake: Arc<Notify>,
    liveness: Arc<Liveness>,
    catch_up: Arc<CatchUp>,
    /// Where the workers' claims start while catching up.
    frontier: ClaimFrontier,
    /// Where claims read while some destination's rows are left out.
    windows: ClaimWindows,
    /// Where this source's probes read each destination's rows.
    probe_cursors: ProbeCursors,
    /// The windows measured lately.
    measures: WindowMeasures,
    /// Held by an ordered relay's worker from where its claim starts until
    /// it has moved the window on (see [`CLAIM_TURN_WAIT`]).
    claim_turn: tokio::sync::Mutex<()>,
    database_outage: Mutex<Outage>,
    health: Arc<RelayHealth>,
    /// Failures and quarantines of rows no destination was chosen for.
    unrouted: (Counter, Counter),
}

/// What a worker claims next.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    /// Rows at most.
    rows: u32,
    /// Which destinations may be given rows of this claim.
    open: Vec<bool>,
    /// The destination this claim probes, alone.
    probe: Option<usize>,
    /// The outage the probe is for, named by when it began.
    probe_outage: Option<Instant>,
    /// Whether rows no route matches are taken (to be quarantined).
    unrouted: bool,
}

impl Relay {
    /// Assembles the relay of one source: rows of `store` published to
    /// `destinations` as `router` says; nothing connects until
    /// [`Relay::run`].
    pub fn routed(
        store: Arc<Store>,
        destinations: Destinations,
        router: Router,
        config: RelayConfig,
        metrics: SourceMetrics,
    ) -> Self {
        // Only destinations from a file are named in the metrics.
        let labelled = !is_environment_only(destinations.iter().map(|destination| destination.name.as_str()));
        let destination_metrics = destinations
            .iter()
            .map(|destination| metrics.destination(labelled.then_some(destination.name.as_str())))
            .collect();
        let route_patterns = router
            .routes()
            .iter()
            .map(|route| route.event_type.like_pattern())
            .collect();
        Self {
            store,
            destinations,
            destination_metrics,
            router,
            route_patterns,
            liveness: Arc::new(Liveness::new(
                config.workers as usize,
                stall_limit(LoopBounds {
                    lease: config.lease(),
                    publish_timeout: config.publish_timeout,
                    poll_interval: config.poll_interval,
                }),
            )),
            config,
            catch_up: Arc::default(),
            frontier: ClaimFrontier::default(),
            windows: ClaimWindows::default(),
            probe_cursors: ProbeCursors::default(),
            measures: WindowMeasures::default(),
            claim_turn: tokio::sync::Mutex::new(()),
            wake: Arc::new(Notify::new()),
            database_outage: Mutex::new(Outage::new("database")),
            health: Arc::default(),
            unrouted: metrics.unrouted(labelled),
            metrics,
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

    /// What the relay's own claims say about the database, which `/readyz`
    /// reports.
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
        let destinations: Vec<String> = self
            .destinations
            .iter()
            .map(|destination| format!("{} ({})", destination.name, destination.sink.kind()))
            .collect();
        info!(
            destinations = %destinations.join(", "),
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
        let mut db_state = Availability::new(&self.database_outage);
        // What the broker confirmed of this worker's last batch, recorded
        // with its next claim whenever there is one at once (see
        // Store::record_and_claim), on its own before any wait.
        let mut confirmed = Confirmed::default();
        let mut starts = ClaimStarts::default();
        while !shutdown.is_cancelled() {
            self.liveness.beat(worker);
            // Listening before the plan looks, so that a check ending in
            // between still wakes this worker.
            let checked = self.destinations.checked().notified();
            tokio::pin!(checked);
            checked.as_mut().enable();
            let plan = match self.plan() {
                Ok(plan) => plan,
                Err(delay) => {
                    self.record_confirmed(&mut confirmed, shutdown).await;
                    tokio::select! {
                        _ = sleep_or_cancel(delay, shutdown) => {}
                        _ = checked => {}
                    }
                    continue;
                }
            };
            let filter = self.filter(&plan);
            let budget = ClaimBudget {
                rows: plan.rows,
                bytes: self.config.max_batch_bytes,
                // The largest any destination of the claim takes: a larger
                // row is not even loaded; a destination that takes less
                // refuses the rest itself.
                max_payload: self
                    .destinations
                    .iter()
                    .zip(&plan.open)
                    .filter(|(_, open)| **open)
                    .map(|(destination, _)| destination.sink.max_payload_bytes())
                    .max()
                    .unwrap_or(0),
            };
            // A probe takes one destination's rows only: where it got to
            // says nothing about the others', so it moves no frontier nor
            // window. Where a claim leaves other destinations' rows out,
            // it reads windows of its own (see health.rs, ProbeCursors);
            // otherwise its destination's rows are the oldest.
            let scope: Option<ClaimScope> = plan.probe.is_none().then(|| {
                let mut scope = plan.open.clone();
                scope.push(plan.unrouted);
                scope
            });
            // An ordered claim starts at the window's tail, where the
            // workers' last claims got to: one started while another is
            // running starts where that one did, and steps over its
            // locked rows. So a worker waits for the claim before it, a
            // little (see CLAIM_TURN_WAIT). A probe has a start of its own.
            let mut turn = match &scope {
                Some(_) if self.config.ordering == Ordering::Aggregate => {
                    tokio::time::timeout(CLAIM_TURN_WAIT, self.claim_turn.lock())
                        .await
                        .ok()
                }
                _ => None,
            };
            // Taken before the claim, after any wait for the turn: the
            // batch's outcome can end a broker outage only if the batch
            // was claimed after the outage began, and a sweep's cost is
            // its claims' own time.
            let claimed_at = Instant::now();
            // A claim that leaves some destination's rows out reads one
            // window of the fresh index (see windows.rs), and so does every
            // ordered claim: behind an aggregate whose head is in flight,
            // every other row of it is one it cannot take, and a claim from
            // the oldest row would step over all of them. A probe reads
            // only its destination's rows, the oldest of which come first.
            let window = match &scope {
                Some(scope) if filter.is_some() || self.config.ordering == Ordering::Aggregate => {
                    Some(self.windows.next(scope, claimed_at))
                }
                _ => None,
            };
            // An ordered claim also looks for the next rows of the
            // aggregates just published (see windows.rs); a window from the
            // oldest row has nothing behind it.
            let published = match (self.config.ordering, window) {
                (Ordering::Aggregate, Some(window)) if window.from.is_some() => {
                    self.windows.take_published(plan.rows as usize)
                }
                _ => Vec::new(),
            };
            let probe_from = match (plan.probe, plan.probe_outage) {
                (Some(probed), Some(outage)) if !self.route_patterns.is_empty() => {
                    Some(self.probe_cursors.start(probed, outage))
                }
                _ => None,
            };
            let (measured, unmeasured) = match window.map(|window| window.from).or(probe_from) {
                Some(from) => match self.measures.reuse(from, claimed_at) {
                    Some(measured) => (Some(measured), None),
                    None => match self.store.fresh_window(from, WINDOW_ROWS).await {
                        Ok(measured) => {
                            self.measures.measured(from, measured, claimed_at);
                            (measured, None)
                        }
                        Err(e) => (None, Some(e)),
                    },
                },
                None => (None, None),
            };
            let start = match (&scope, window, probe_from) {
                (_, Some(window), _) => window.start(measured),
                (_, None, Some(from)) => ClaimStart::Window {
                    from,
                    to: window_end(measured),
                },
                (Some(scope), None, None) => starts.next(&self.frontier, scope, claimed_at),
                (None, None, None) => ClaimStart::Oldest,
            };
            let claim = if let Some(e) = unmeasured {
                Err(e)
            } else if confirmed.rows.is_empty() {
                self.store
                    .claim_following(
                        budget,
                        self.config.lease(),
                        self.config.ordering,
                        filter.as_ref(),
                        start,
                        &published,
                    )
                    .await
            } else {
                let (ids, attempts): (Vec<Uuid>, Vec<i32>) =
                    confirmed.rows.iter().map(|row| (row.id, row.attempt)).unzip();
                self.store
                    .record_and_claim_from(
                        self.config.on_publish,
                        &ids,
                        &attempts,
                        budget,
                        self.config.lease(),
                        filter.as_ref(),
                        start,
                    )
                    .await
            };
            let mut claim_again = false;
            let batch = match claim {
                Ok(batch) => {
                    let claimed_rows = batch.events.len() + batch.unpublishable.len();
                    if let (Some(scope), Some(window)) = (&scope, window) {
                        // Only a row on its first attempt from the window's
                        // start on surely came from the window (a retried
                        // row comes from the retry path, and an ordered
                        // claim's successors from behind the start, wherever
                        // their place): the window is read up to the last
                        // of those, and no further.
                        let last_in_window = batch
                            .events
                            .iter()
                            .filter(|event| event.attempt_count == 1)
                            .map(|event| (event.created_at, event.id))
                            .filter(|key| window.from.is_none_or(|from| *key >= from))
                            .max();
                        claim_again = self.windows.claimed(
                            scope,
                            window,
                            measured,
                            Taken::of(
                                claimed_rows,
                                last_in_window,
                                claimed_rows < plan.rows as usize
                                    && !batch.cut_by_bytes
                                    && batch.unleased == 0,
                            ),
                            claimed_at.elapsed(),
                        );
                    } else if let Some(scope) = &scope {
                        starts.claimed(
                            &self.frontier,
                            scope,
                            start,
                            claimed_at,
                            claimed_rows >= plan.rows as usize,
                            batch
                                .events
                                .iter()
                                .map(|event| (event.created_at, event.id))
                                .max(),
                        );
                    }
                    starts.took_interrupted(!batch.interrupted.is_empty());
                    confirmed.rows.clear();
                    db_state.succeeded();
                    self.health.claim_succeeded();
                    self.metrics.ready.set(1);
                    batch
                }
                Err(e) if e.is_contention() => {
                    if let (Some(scope), Some(window)) = (&scope, window) {
                        self.windows.failed(scope, window);
                    }
                    drop(turn.take());
                    self.windows.put_back(published);
                    // Another worker's statement was in the way; nothing
                    // was claimed, and the database is fine. (What was to be
                    // recorded is recorded again, which matches nothing
                    // where a statement before did record it.)
                    debug!(worker, error = %e, "claim gave way to another worker's statement; trying again");
                    if let Some(probed) = plan.probe {
                        self.destinations[probed].health.probe_abandoned();
                    }
                    sleep_or_cancel(contention_pause(), shutdown).await;
                    continue;
                }
                Err(e) => {
                    if let (Some(scope), Some(window)) = (&scope, window) {
                        self.windows.failed(scope, window);
                    }
                    drop(turn.take());
                    // Only a shortcut: should anything about them be
                    // what fails, trying them again would fail every claim.
                    // The next sweep finds their rows.
                    if !published.is_empty() {
                        self.windows.sweep_soon();
                    }
                    self.health.claim_failed(&e);
                    self.metrics.ready.set(0);
                    if let Some(probed) = plan.probe {
                        self.destinations[probed].health.probe_abandoned();
                    }
                    let delay = db_state.failed(&e);
                    self.record_confirmed(&mut confirmed, shutdown).await;
                    sleep_or_cancel(delay, shutdown).await;
                    continue;
                }
            };
            drop(turn);
            let claimed_rows = batch.events.len() + batch.unpublishable.len();
            if claimed_rows >= self.config.batch_size as usize {
                self.catch_up.full_claim();
            }
            if claimed_rows == 0 && claim_again {
                // The next window, at once.
                continue;
            }
            if let (Some(probed), Some(outage), Some(_)) = (plan.probe, plan.probe_outage, probe_from) {
                let health = &self.destinations[probed].health;
                match (claimed_rows, window_end(measured)) {
                    (0, Some(end)) => {
                        self.probe_cursors.read_past(probed, outage, end);
                        health.probe_goes_on(outage);
                        continue;
                    }
                    // A pass from the oldest row that found nothing ends
                    // the outage below, as any probe that finds nothing
                    // does; any other pass starts over from there.
                    (0, None) => {
                        if !self.probe_cursors.reached_newest(probed, outage) {
                            health.probe_goes_on(outage);
                            continue;
                        }
                    }
                    _ => self.probe_cursors.took_rows(probed, outage),
                }
            }
            if claimed_rows == 0 {
                if let Some(probed) = plan.probe {
                    self.destinations[probed].health.probe_found_nothing();
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
            let settled;
            (settled, confirmed) = self.process(batch, &plan, shutdown).await;
            for (index, health) in settled {
                self.destinations[index].health.batch_settled(health, claimed_at);
            }
            // A probe that found no row of its destination tells nothing.
            if let Some(probed) = plan.probe {
                self.destinations[probed].health.probe_abandoned();
            }
        }
        self.record_confirmed(&mut confirmed, shutdown).await;
    }

    /// Which destinations the next claim is for, or how long to wait when
    /// none may be given rows. A destination whose broker defers batches
    /// gets one small probe batch at a time from one worker of the replica,
    /// spaced by a capped backoff (see health.rs); one whose sink is not
    /// ready gets none: checking first keeps a broker outage from burning
    /// rows' attempts towards quarantine. A worker given a probe claims
    /// for that destination alone.
    fn plan(&self) -> Result<Plan, Duration> {
        let count = self.destinations.len();
        let mut open = vec![false; count];
        let mut probe = None;
        let mut wait = MAX_RETRY_DELAY;
        for (index, destination) in self.destinations.iter().enumerate() {
            let ready = match destination.health.turn() {
                Turn::Publish => match destination.readiness() {
                    Readiness::Ready => {
                        open[index] = true;
                        true
                    }
                    Readiness::Down { retry_in, .. } => {
                        wait = wait.min(retry_in);
                        false
                    }
                    Readiness::Checking => {
                        wait = wait.min(CHECK_POLL);
                        false
                    }
                },
                Turn::Probe if probe.is_none() => match destination.readiness() {
                    Readiness::Ready => {
                        probe = Some(index);
                        false
                    }
                    other => {
                        destination.health.probe_abandoned();
                        wait = wait.min(match other {
                            Readiness::Down { retry_in, .. } => retry_in,
                            _ => CHECK_POLL,
                        });
                        false
                    }
                },
                // Another probe is this worker's already: the turn goes
                // back for the next worker.
                Turn::Probe => {
                    destination.health.probe_abandoned();
                    wait = wait.min(CHECK_POLL);
                    false
                }
                Turn::Wait(delay) => {
                    wait = wait.min(delay);
                    false
                }
            };
            destination.ready.set(i64::from(ready));
        }
        if let Some(probed) = probe {
            let mut only = vec![false; count];
            only[probed] = true;
            return Ok(Plan {
                rows: self.config.batch_size.min(PROBE_ROWS),
                open: only,
                probe,
                probe_outage: self.destinations[probed].health.outage(),
                unrouted: false,
            });
        }
        if open.iter().any(|open| *open) {
            return Ok(Plan {
                rows: self.config.batch_size,
                open,
                probe: None,
                probe_outage: None,
                unrouted: true,
            });
        }
        Err(wait.max(Duration::from_millis(10)))
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

    /// The claim's route filter: none when every destination is open.
    fn filter(&self, plan: &Plan) -> Option<RouteFilter> {
        if plan.unrouted && plan.open.iter().all(|open| *open) {
            return None;
        }
        let mut take: Vec<bool> = self
            .router
            .routes()
            .iter()
            .map(|route| plan.open[route.destination])
            .collect();
        take.push(plan.unrouted);
        Some(RouteFilter {
            patterns: self.route_patterns.clone(),
            take,
        })
    }

    /// Publishes one claimed batch, each destination's rows to it at once,
    /// and records its outcomes, except the confirmed rows that an
    /// unordered claim records next (returned). Returns how each
    /// destination's part went.
    async fn process(
        &self,
        claimed: Claimed,
        plan: &Plan,
        shutdown: &CancellationToken,
    ) -> (Vec<(usize, BatchHealth)>, Confirmed) {
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
        let all_ids: Vec<Uuid> = claimed.events.iter().map(|event| event.id).collect();
        // An ordered relay's next claims look for the rows that follow the
        // ones it publishes (see windows.rs).
        let aggregates: HashMap<Uuid, String> = match self.config.ordering {
            Ordering::Aggregate => claimed
                .events
                .iter()
                .map(|event| (event.id, event.aggregate_id.clone()))
                .collect(),
            Ordering::None => HashMap::new(),
        };
        let (due, exhausted) = split_exhausted(claimed.events, self.config.max_attempts);
        let (due, mut given_back) = isolate_interrupted(due, &claimed.interrupted);
        if !given_back.is_empty() {
            // Given back before the publish, so that they are not in flight
            // (charged) should this row kill the relay again.
            let (ids, attempts): (Vec<Uuid>, Vec<i32>) =
                given_back.iter().map(|row| (row.id, row.attempt)).unzip();
            let interrupted: Vec<bool> = ids.iter().map(|id| claimed.interrupted.contains(id)).collect();
            let early = self.store.give_back(&ids, &attempts, &interrupted).await;
            if early.is_ok() {
                // Back where they were, behind where the claims read while
                // some destination's rows are left out.
                self.windows.sweep_soon();
            }
            debug!(
                report = "interrupted_alone",
                event_id = %due.first().map(|event| event.id).unwrap_or_default(),
                given_back = given_back.len(),
                given_back_before_publishing = early.is_ok(),
                "a row whose last attempt was interrupted is published alone; its batch-mates are given back"
            );
            // Recorded with the batch's outcomes instead when that failed.
            if early.is_ok() {
                given_back.clear();
            }
        }
        let max_payloads: Vec<usize> = self
            .destinations
            .iter()
            .map(|destination| destination.sink.max_payload_bytes())
            .collect();
        let routed = route_batch(due, &self.router, &plan.open, &max_payloads);

        // Every destination's part at once, each to its own deadline.
        let deadline = tokio::time::Instant::now() + self.config.publish_timeout;
        let parts =
            futures::future::join_all(routed.batches.into_iter().map(|(index, mut events)| async move {
                let destination = &self.destinations[index];
                let sink = destination.sink.as_ref();
                let place = SpanDestination {
                    sink_kind: sink.kind(),
                    name: &destination.name,
                };
                let spans = PublishSpans::start(&mut events, place, |event| sink.destination_of(event));
                let publish = destination.sink.publish(&events, deadline);
                let outcomes = match tokio::time::timeout_at(deadline + SINK_GRACE, publish).await {
                    Ok(outcomes) => outcomes,
                    Err(_) => {
                        let reason = format!(
                            "not confirmed within OUTBOX_PUBLISH_TIMEOUT ({:?})",
                            self.config.publish_timeout
                        );
                        vec![Outcome::Deferred(reason); events.len()]
                    }
                };
                (index, events, outcomes, spans)
            }))
            .await;
        let confirmed_at = Utc::now();

        let mut decisions = Decisions::default();
        let mut settled = Vec::with_capacity(parts.len());
        for (index, events, outcomes, mut spans) in parts {
            let destination = &self.destinations[index];
            let metrics = &self.destination_metrics[index];
            let mut part = decide(&events, outcomes, self.config.max_attempts, &self.backoff());
            if !spans.is_empty() {
                end_spans(&mut spans, &part);
            }
            part.quarantine.extend(
                routed
                    .oversized
                    .iter()
                    .filter(|(of, _)| *of == index)
                    .map(|(_, quarantine)| quarantine.clone()),
            );
            // `decide` lists the published rows in the part's order, so one
            // walk pairs them with their events, without hashing every id.
            let mut published = part.published.iter().peekable();
            for event in &events {
                if published.next_if(|row| row.id == event.id).is_some() {
                    let lag = (confirmed_at - event.created_at).to_std().unwrap_or_default();
                    metrics.lag.observe(lag.as_secs_f64());
                }
            }
            // One line per destination and batch at warn: a broker refusing
            // everything must not turn into a line per row. Each row is at
            // debug. The `report` field is for machines (log pipelines, the
            // crash suite): stable, unlike the message text.
            if let Some(first) = part.retry.first() {
                let trace_id = traces_of(&mut part.retry.iter().map(|retry| &retry.row.id));
                warn!(report = "publish_failed", destination = %destination.name, rows = part.retry.len(), first_reason = %first.reason, trace_id, "publish failed; rows will be retried with backoff");
            }
            if let Some(reason) = &part.deferred_because {
                let trace_id = traces_of(&mut part.deferred.iter().map(|row| &row.id));
                warn!(report = "publish_deferred", destination = %destination.name, rows = part.deferred.len(), %reason, trace_id, "the broker or the network failed the batch; rows will be published again, not charged an attempt");
            }
            metrics.published.inc_by(part.published.len() as u64);
            // Failed attempts are the rows' own; a deferral is the broker's.
            let failures = part.retry.len() + part.quarantine.len();
            metrics.failures.inc_by(failures as u64);
            metrics.quarantined.inc_by(part.quarantine.len() as u64);
            // A part the broker deferred more of than it published is an
            // answer every row would have got (a full queue, a refusal of
            // every request): the broker's state, not theirs. One row
            // deferred among published batch-mates is not, so a row the
            // broker keeps failing for an unknowable reason of its own
            // never slows the others.
            let health = match &part.deferred_because {
                Some(reason) if part.deferred.len() > part.published.len() => {
                    BatchHealth::Deferred(reason.clone())
                }
                _ => BatchHealth::Answered,
            };
            settled.push((index, health));
            decisions.append(part);
        }
        // Rows given back for an outage lie where they were, behind where
        // the claims of every set of destinations that includes theirs
        // have read (see windows.rs): a sweep finds them once such a set
        // is served again. A probe's rows were found where they lie.
        let outage_began = settled
            .iter()
            .any(|(_, health)| matches!(health, BatchHealth::Deferred(_)));
        if plan.probe.is_none() && (outage_began || !routed.parked.is_empty()) {
            self.windows.sweep_soon();
        }
        // A row routed to a destination that this claim was not for (it
        // went down between the plan and the claim's filter) is given back
        // as an outage would: no attempt charged.
        decisions.deferred.extend(routed.parked);
        decisions.deferred.extend(given_back);
        // Rows no destination was chosen for: past their attempts, no
        // route, or unreadable. None can ever be published as it is.
        let mut unrouted = exhausted;
        unrouted.extend(routed.unrouted);
        unrouted.extend(claimed.unpublishable.into_iter().map(|row| Quarantine {
            row: ClaimedRow {
                id: row.id,
                attempt: row.attempt_count,
            },
            reason: format!("cannot be published: {}", row.reason),
        }));
        self.unrouted.0.inc_by(unrouted.len() as u64);
        self.unrouted.1.inc_by(unrouted.len() as u64);
        decisions.quarantine.extend(unrouted);

        for retry in &decisions.retry {
            debug!(event_id = %retry.row.id, reason = %retry.reason, retry_in_ms = retry.delay.as_millis() as u64, trace_id = trace_of(&retry.row.id), "publish failed; will retry");
        }
        for quarantine in &decisions.quarantine {
            warn!(event_id = %quarantine.row.id, reason = %quarantine.reason, trace_id = trace_of(&quarantine.row.id), "row quarantined");
        }

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
        if !aggregates.is_empty() {
            self.windows.published(
                decisions
                    .published
                    .iter()
                    .filter_map(|row| aggregates.get(&row.id).cloned()),
            );
        }
        debug!(
            report = "batch_recorded",
            published,
            retried = decisions.retry.len(),
            quarantined = decisions.quarantine.len(),
            deferred = decisions.deferred.len(),
            trace_id = traces_of(&mut all_ids.iter()),
            "batch recorded"
        );
        (settled, confirmed)
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
            let delay = if error.is_contention() {
                contention_pause()
            } else {
                state.failed(&error)
            };
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

/// How long an ordered relay's worker waits for another worker's claim to
/// come back before it claims anyway. A claim of a batch takes one to
/// three milliseconds on a nearby database (about 4 ms more when it first
/// measures its window, which it does about once a second); a second
/// claim from the same window meanwhile reads past every row the first
/// has locked, with a heap fetch and a predecessor probe each: 83 of the
/// 180 rows an ordered claim read (docs/performance.md, "Ordered claims").
/// Bounded, so that a slow claim (a lock wait, a far database) costs the
/// others at most this much each, never a stall. Unordered claims read 41
/// locked rows of 193 without a probe each, and taking turns measured no
/// difference for them ("Claims that take turns"): they do not wait.
const CLAIM_TURN_WAIT: Duration = Duration::from_millis(5);

/// How long a worker waits after its statement gave way to another
/// worker's (see [`StoreError::is_contention`]): a few milliseconds,
/// jittered, so that the two do not meet again in step.
fn contention_pause() -> Duration {
    Duration::from_millis(5 + rand::random::<u64>() % 20)
}

/// Ends the publish spans of a destination's part with each row's outcome.
fn end_spans(spans: &mut PublishSpans, part: &Decisions) {
    for row in &part.published {
        spans.end(&row.id, SpanOutcome::Published);
    }
    for retry in &part.retry {
        spans.end(&retry.row.id, SpanOutcome::Retried(&retry.reason));
    }
    for quarantine in &part.quarantine {
        spans.end(&quarantine.row.id, SpanOutcome::Quarantined(&quarantine.reason));
    }
    let reason = part.deferred_because.as_deref().unwrap_or("deferred");
    for row in &part.deferred {
        spans.end(&row.id, SpanOutcome::Deferred(reason));
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
