//! One destination of the relay: a named sink with its own readiness, its
//! own deferral outage and its own metrics, so that one broker's trouble
//! holds back only the rows routed to it.
//!
//! Readiness is asked of the sink before every claim, as with a single
//! sink, but never waited for by a worker while other destinations could
//! take rows: an answer that is not at hand at once (a connection being
//! made, a probe request under way) is awaited in a task of its own, and
//! until it comes the destination counts as not ready for that claim,
//! unless its last check found it ready: a sink that checks again now and
//! then (SQS after a few idle seconds) keeps its place in the claims
//! meanwhile. Were it left out for the moment of each check, the set of
//! destinations the claims serve would change and change back, and each
//! change starts their windows over from the oldest row (windows.rs):
//! behind a long backlog of a destination that is down, the rows of those
//! that are up would wait for a first sweep that never ends. A failed
//! check holds the destination down for the in-process retry delay, shared
//! by every worker, so a broker that is down is asked a few times a second
//! at most, not once per claim per worker.

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
    /// Its sink answered that it is ready, the last time it answered.
    Ready,
    /// Its sink failed its check, or a recent failure holds; the next
    /// check is due in `retry_in`.
    Down {
        /// The check's error.
        reason: String,
        /// Until the next check.
        retry_in: Duration,
    },
    /// The answer is on its way, and the last one was not that it is
    /// ready (or there was none).
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
    /// The last check that answered found the sink ready.
    last_ready: bool,
}

impl GateState {
    /// What a check that has not answered yet leaves the destination: as
    /// ready as the last check found it.
    fn while_checking(&self) -> Readiness {
        if self.last_ready {
            Readiness::Ready
        } else {
            Readiness::Checking
        }
    }
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
                None => return state.while_checking(),
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
                    return state.while_checking();
                }
            },
        };
        match answer {
            Ok(()) => {
                state.gate = Gate::Open;
                state.delays = None;
                state.last_ready = true;
                lock(&self.outage).succeeded();
                Readiness::Ready
            }
            Err(error) => {
                state.last_ready = false;
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

#[cfg(test)]
mod tests {
    use futures::future::BoxFuture;
    use tokio::sync::watch;

    use super::*;
    use crate::event::Event;
    use crate::sink::Outcome;

    /// A sink whose check answers what the test says, when it says.
    struct CheckedSink {
        answer: watch::Receiver<Option<bool>>,
    }

    impl Sink for CheckedSink {
        fn publish<'a>(&'a self, _: &'a [Event], _: tokio::time::Instant) -> BoxFuture<'a, Vec<Outcome>> {
            unreachable!("nothing is published here")
        }

        fn max_payload_bytes(&self) -> usize {
            1
        }

        fn ready(&self) -> BoxFuture<'_, Result<(), SinkError>> {
            let mut answer = self.answer.clone();
            Box::pin(async move {
                let ready = *answer
                    .wait_for(Option::is_some)
                    .await
                    .expect("the test keeps the sender");
                if ready == Some(true) {
                    Ok(())
                } else {
                    Err(SinkError("refused".to_owned()))
                }
            })
        }

        fn kind(&self) -> &'static str {
            "checked"
        }

        fn destination_of(&self, _: &Event) -> String {
            String::new()
        }
    }

    /// The readiness once the check under way has answered.
    async fn answered(destination: &Destination) -> Readiness {
        loop {
            match destination.readiness() {
                Readiness::Checking => tokio::task::yield_now().await,
                Readiness::Ready if matches!(lock(&destination.gate).gate, Gate::Checking(_)) => {
                    tokio::task::yield_now().await
                }
                answer => return answer,
            }
        }
    }

    #[tokio::test]
    async fn a_check_under_way_leaves_a_destination_as_ready_as_the_last_one_found_it() {
        let (answer, receiver) = watch::channel(None);
        let destination = Destination::new(
            "checked".to_owned(),
            Arc::new(CheckedSink { answer: receiver }),
            Gauge::default(),
            Duration::from_secs(60),
        );
        // Never answered: not ready until it is.
        assert_eq!(destination.readiness(), Readiness::Checking);
        answer.send_replace(Some(true));
        assert_eq!(answered(&destination).await, Readiness::Ready);

        // Checked again (the answer not at hand): still ready meanwhile.
        answer.send_replace(None);
        assert_eq!(destination.readiness(), Readiness::Ready);
        assert!(matches!(lock(&destination.gate).gate, Gate::Checking(_)));
        assert_eq!(destination.readiness(), Readiness::Ready);

        // The check fails: down, and a check after that is not ready until
        // it answers that it is.
        answer.send_replace(Some(false));
        let Readiness::Down { retry_in, .. } = answered(&destination).await else {
            panic!("a failed check puts the destination down");
        };
        answer.send_replace(None);
        tokio::time::sleep(retry_in).await;
        assert_eq!(destination.readiness(), Readiness::Checking);
        assert_eq!(destination.readiness(), Readiness::Checking);
        answer.send_replace(Some(true));
        assert_eq!(answered(&destination).await, Readiness::Ready);
    }
}
