//! Dependency outages: logged once when they start and once when they end,
//! never on every failed try, and waited out with the one in-process retry
//! policy ([`retry_delays`]).

use std::borrow::Cow;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Whether a dependency's last use failed, and since when.
#[derive(Debug)]
pub struct Outage {
    what: Cow<'static, str>,
    since: Option<Instant>,
}

impl Outage {
    /// Tracks `what` (a dependency or task name used in the log lines).
    pub fn new(what: impl Into<Cow<'static, str>>) -> Self {
        Self {
            what: what.into(),
            since: None,
        }
    }

    /// Records a failure: a warning for the first, debug lines after it.
    pub fn failed(&mut self, error: &dyn std::fmt::Display) {
        if self.since.is_none() {
            warn!(dependency = %self.what, %error, "unavailable; retrying quietly until it is back");
            self.since = Some(Instant::now());
        } else {
            debug!(dependency = %self.what, %error, "still unavailable");
        }
    }

    /// Records a success, logging the end of an outage if one was running.
    pub fn succeeded(&mut self) {
        if let Some(since) = self.since.take() {
            info!(
                dependency = %self.what,
                outage_secs = since.elapsed().as_secs_f64(),
                "available again"
            );
        }
    }
}

/// Delays between tries to reach a dependency that is down: from 100 ms,
/// doubling, capped at 5 s, jittered so replicas do not retry in step.
/// Every in-process retry uses this one policy; a row's own backoff between
/// publish attempts is persisted instead (see [`crate::retry`]).
pub fn retry_delays() -> backon::ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(MAX_RETRY_DELAY)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The longest wait between two tries of the in-process retry policy.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// One task's view of a dependency's outage: the outage itself may be
/// shared by several tasks (the relay's workers), so it is logged once per
/// replica; the retry delays are the task's own.
pub struct Availability<'a> {
    outage: &'a Mutex<Outage>,
    delays: Option<backon::ExponentialBackoff>,
}

impl<'a> Availability<'a> {
    /// Tracks failures of the dependency behind `outage`.
    pub fn new(outage: &'a Mutex<Outage>) -> Self {
        Self { outage, delays: None }
    }

    /// Records a failure and returns how long to wait before trying again.
    pub fn failed(&mut self, error: &dyn std::fmt::Display) -> Duration {
        lock(self.outage).failed(error);
        self.delays
            .get_or_insert_with(retry_delays)
            .next()
            .unwrap_or(MAX_RETRY_DELAY)
    }

    /// Records a success, ending the outage if there was one.
    pub fn succeeded(&mut self) {
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

/// Sleeps for `delay`, or less if `shutdown` comes first.
pub async fn sleep_or_cancel(delay: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.cancelled() => {}
    }
}
