//! Logging a dependency outage once when it starts and once when it ends,
//! never on every failed try.

use std::time::Instant;

use tracing::{debug, info, warn};

/// Whether a dependency's last use failed, and since when.
#[derive(Debug)]
pub struct Outage {
    what: &'static str,
    since: Option<Instant>,
}

impl Outage {
    /// Tracks `what` (a dependency or task name used in the log lines).
    pub fn new(what: &'static str) -> Self {
        Self { what, since: None }
    }

    /// Records a failure: a warning for the first, debug lines after it.
    pub fn failed(&mut self, error: &dyn std::fmt::Display) {
        if self.since.is_none() {
            warn!(dependency = self.what, %error, "unavailable; retrying quietly until it is back");
            self.since = Some(Instant::now());
        } else {
            debug!(dependency = self.what, %error, "still unavailable");
        }
    }

    /// Records a success, logging the end of an outage if one was running.
    pub fn succeeded(&mut self) {
        if let Some(since) = self.since.take() {
            info!(
                dependency = self.what,
                outage_secs = since.elapsed().as_secs_f64(),
                "available again"
            );
        }
    }
}
