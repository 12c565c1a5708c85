//! Whether the relay is catching up with a backlog, for background work
//! that should give way to it.
//!
//! Retention deleting millions of old rows competes with the drain for the
//! same database: measured on the development machine, a drain ran at 0.60×
//! its speed while a retention pass deleted as fast as it could. Retention
//! is measured in days and can wait; the oldest unpublished row cannot.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long after the last full claim the relay still counts as catching
/// up: longer than a batch takes, so a drain does not look idle between
/// two claims.
pub const CATCHING_UP_FOR: Duration = Duration::from_secs(2);

/// The last time a claim came back full.
#[derive(Debug, Default)]
pub struct CatchUp {
    last_full_claim: Mutex<Option<Instant>>,
}

impl CatchUp {
    /// Records a claim that took as many rows as it could: more are due.
    pub fn full_claim(&self) {
        *self.last_full_claim.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Whether a claim came back full in the last [`CATCHING_UP_FOR`].
    pub fn catching_up(&self) -> bool {
        self.last_full_claim
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() < CATCHING_UP_FOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_claim_counts_for_a_while() {
        let catch_up = CatchUp::default();
        assert!(!catch_up.catching_up(), "nothing claimed yet");
        catch_up.full_claim();
        assert!(catch_up.catching_up());
        *catch_up.last_full_claim.lock().unwrap() = Some(Instant::now() - CATCHING_UP_FOR);
        assert!(!catch_up.catching_up(), "long enough ago");
    }
}
