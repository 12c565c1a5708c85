//! One destination of the relay: a named sink with its own readiness, its
//! own deferral outage and its own metrics, so that one broker's trouble
//! holds back only the rows routed to it.
//!
//! Readiness is asked of the sink before every claim, as with a single
//! sink, but never waited for by a worker while other destinations could
//! take rows: an answer that is not at hand at once (a connection being
//! made, a probe request under way) is awaited in a task of its own, and
//! until it comes the destination counts as not ready for that claim. A
//! failed check holds the destination down for the in-process retry
//! delay, shared by every worker, so a broker that is down is asked a few
//! times a second at most, not once per claim per worker.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::ExponentialBackoff;
use futures::FutureExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use prometheus_client::metrics::gauge::Gauge;

use super::health::DestinationHealth;
use crate::outage::{retry_delays, Outage, MAX_RETRY_DELAY};
use crate::sink::{Sink, SinkError};

/// A destination as the relay's workers use it.
pub struct Destination {
    /// Its name, from the configuration file (`default` without one).
    pub name: String,
    /// The sink that publishes its rows.
    pub sink: Arc<dyn Sink>,
    /// What its batches said of its broker.
    pub health: DestinationHealth,
    /// `outbox_destination_ready` of this destination.
    pub ready: Gauge,
    gate: Mutex<GateState>,
    outage: Mutex<Outage>,
    check_timeout: Duration,
    /// Woken when a check that did not answer at once has its answer, so
    /// that workers waiting for one go on at once.
    checked: Arc<Notify>,
}

/// Whether a destination may be given rows now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Its sink answered that it is ready.
    Ready,
    /// Its sink failed its check, or a recent failure holds; the next
    /// check is due in `retry_in`.
    Down {
        /// The check's error.
        reason: String,
        /// Until the next check.
        retry_in: Duration,
    },
    /// The answer is on its way.
    Checking,
}

#[derive(Default)]
enum Gate {
    /// No check under way and none failed lately.
    #[default]
    Open,
    /// A check that did not answer at once, running on its own.
    Checking(JoinHandle<Result<(), SinkError>>),
    /// The last check failed; the next one waits until `until`.
    Down { until: Instant, reason: String },
}

/// The gate and the spacing of failed checks, which lasts until one
/// succeeds.
#[derive(Default)]
struct GateState {
    gate: Gate,
    delays: Option<ExponentialBackoff>,
}

impl Destination {
    /// A destination publishing through `sink`, its readiness shown by
    /// `ready`; a check that takes longer than `check_timeout` counts as
    /// failed.
    pub fn new(name: String, sink: Arc<dyn Sink>, ready: Gauge, check_timeout: Duration) -> Self {
        Self {
            outage: Mutex::new(Outage::new(format!("destination {name} ({})", sink.kind()))),
            name,
            sink,
            health: DestinationHealth::default(),
            ready,
            gate: Mutex::default(),
            check_timeout,
            checked: Arc::default(),
        }
    }

    /// Asks the sink whether it is ready, without waiting for an answer
    /// that is not at hand.
    pub fn readiness(&self) -> Readiness {
        let mut state = lock(&self.gate);
        let answer = match &mut state.gate {
            Gate::Down { until, reason } if Instant::now() < *until => {
                return Readiness::Down {
                    reason: reason.clone(),
                    retry_in: *until - Instant::now(),
                }
            }
            Gate::Checking(handle) => match handle.now_or_never() {
                Some(Ok(answer)) => answer,
                Some(Err(join)) => Err(SinkError(format!("the readiness check failed: {join}"))),
                None => return Readiness::Checking,
            },
            Gate::Open | Gate::Down { .. } => match self.sink.ready().now_or_never() {
                Some(answer) => answer,
                None => {
                    let sink = self.sink.clone();
                    let timeout = self.check_timeout;
                    let checked = self.checked.clone();
                    state.gate = Gate::Checking(tokio::spawn(async move {
                        let answer = tokio::time::timeout(timeout, sink.ready())
                            .await
                            .unwrap_or_else(|_| {
                                Err(SinkError("no answer within OUTBOX_PUBLISH_TIMEOUT".to_owned()))
                            });
                        // Workers with nothing else to claim look again
                        // now rather than at their next poll (the handle
                        // may be a moment from finished: they poll then).
                        checked.notify_waiters();
                        answer
                    }));
                    return Readiness::Checking;
                }
            },
        };
        match answer {
            Ok(()) => {
                state.gate = Gate::Open;
                state.delays = None;
                lock(&self.outage).succeeded();
                Readiness::Ready
            }
            Err(error) => {
                lock(&self.outage).failed(&error);
                let delay = state
                    .delays
                    .get_or_insert_with(retry_delays)
                    .next()
                    .unwrap_or(MAX_RETRY_DELAY);
                let reason = error.to_string();
                state.gate = Gate::Down {
                    until: Instant::now() + delay,
                    reason: reason.clone(),
                };
                Readiness::Down {
                    reason,
                    retry_in: delay,
                }
            }
        }
    }
}

/// The destinations of a relay process, shared by the relays of all its
/// sources: a broker's state (reachable, deferring batches) is the same
/// whichever database a row comes from, so it is checked and probed once
/// for all of them.
#[derive(Clone)]
pub struct Destinations {
    list: Arc<[Destination]>,
    checked: Arc<Notify>,
}

impl Destinations {
    /// The destinations, in configuration order (routes index into it).
    pub fn new(mut list: Vec<Destination>) -> Self {
        let checked = Arc::new(Notify::new());
        for destination in &mut list {
            destination.checked = checked.clone();
        }
        Self {
            list: list.into(),
            checked,
        }
    }

    /// Woken whenever a readiness check that was under way ends.
    pub fn checked(&self) -> &Notify {
        &self.checked
    }
}

impl std::ops::Deref for Destinations {
    type Target = [Destination];

    fn deref(&self) -> &[Destination] {
        &self.list
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain data: a panic elsewhere cannot leave it inconsistent.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
