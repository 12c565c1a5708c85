//! Where a worker's next claim starts reading the rows that never failed.
//!
//! A published row leaves its entry in the claim's fresh-path index until
//! VACUUM removes it, and those entries sit at the index's start, where a
//! claim from the oldest row begins: while a large backlog drains, every
//! claim stepped over all the rows published since the last VACUUM
//! (hundreds of thousands between two autovacuum runs). The rows the
//! relay's other workers have in flight lie in that index too, leased, and
//! a claim steps over them as well (a heap fetch each, to read the lease).
//!
//! So while the relay is catching up (claims come back full) its workers'
//! claims start at the [`ClaimFrontier`]: the last row in `(created_at,
//! id)` order that any of its full claims took. The index takes a claim
//! there directly, past the published rows and past the batches the
//! other workers are publishing.
//!
//! A row before that point which is due (given back after an outage, left
//! by a relay that died, released, skipped while its destination was
//! down, or committed late by a producer transaction that started
//! earlier) is found by the worker's next claim from the oldest row: one
//! at least every [`FROM_OLDEST_EVERY`], and every claim once the relay
//! has caught up. That is a delay of at most that long for such a row,
//! never a row left behind.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::ClaimStart;

/// How long a worker goes at most without a claim from the oldest row.
pub const FROM_OLDEST_EVERY: Duration = Duration::from_secs(1);

/// A row's place in the claim's `(created_at, id)` order.
pub use crate::store::RowKey;

/// Which rows a claim was allowed to take (its destinations and whether
/// unrouted rows were taken), as far as the frontier is concerned: a
/// frontier reached by claims that left some destination's rows out is no
/// start for a claim that takes them.
pub type ClaimScope = Vec<bool>;

/// Where the relay's claims start while it is catching up, shared by its
/// workers.
#[derive(Debug, Default)]
pub struct ClaimFrontier {
    reached: Mutex<Option<(RowKey, ClaimScope)>>,
}

impl ClaimFrontier {
    fn start_for(&self, scope: &ClaimScope) -> Option<RowKey> {
        let reached = self.reached.lock().unwrap_or_else(|e| e.into_inner());
        reached
            .as_ref()
            .filter(|(_, reached_scope)| reached_scope == scope)
            .map(|(key, _)| *key)
    }

    fn record(&self, scope: &ClaimScope, full: bool, last: Option<RowKey>) {
        let mut reached = self.reached.lock().unwrap_or_else(|e| e.into_inner());
        *reached = match (full, last, reached.take()) {
            // A claim that found fewer rows than it could take has caught
            // up: from now on claims read from the oldest row.
            (false, _, _) | (true, None, _) => None,
            (true, Some(last), Some((key, reached_scope))) if reached_scope == *scope => {
                Some((key.max(last), reached_scope))
            }
            (true, Some(last), _) => Some((last, scope.clone())),
        };
    }
}

/// One worker's claim starts.
#[derive(Debug, Default)]
pub struct ClaimStarts {
    last_from_oldest: Option<Instant>,
    /// The last claim took rows whose last attempt was interrupted: the
    /// relay publishes one of them and gives the rest back where they lie,
    /// before the frontier, so the next claim reads from the oldest row
    /// rather than leave them for a second.
    interrupted: bool,
}

impl ClaimStarts {
    /// Where the claim of `scope` made `now` starts.
    pub fn next(&self, frontier: &ClaimFrontier, scope: &ClaimScope, now: Instant) -> ClaimStart {
        match (frontier.start_for(scope), self.last_from_oldest) {
            (Some((created_at, id)), Some(last))
                if !self.interrupted && now.saturating_duration_since(last) < FROM_OLDEST_EVERY =>
            {
                ClaimStart::From(created_at, id)
            }
            _ => ClaimStart::Oldest,
        }
    }

    /// Records a claim of `scope` made at `at` from `start`: whether it
    /// came back with a full batch, and its last row in `(created_at, id)`
    /// order.
    pub fn claimed(
        &mut self,
        frontier: &ClaimFrontier,
        scope: &ClaimScope,
        start: ClaimStart,
        at: Instant,
        full: bool,
        last: Option<RowKey>,
    ) {
        if start == ClaimStart::Oldest {
            self.last_from_oldest = Some(at);
        }
        frontier.record(scope, full, last);
    }

    /// Records whether the last claim, of any scope, took rows whose last
    /// attempt was interrupted.
    pub fn took_interrupted(&mut self, interrupted: bool) {
        self.interrupted = interrupted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;
    use uuid::Uuid;

    fn at(seconds: i64) -> RowKey {
        (
            DateTime::from_timestamp(1_700_000_000 + seconds, 0).unwrap(),
            Uuid::from_u128(seconds as u128),
        )
    }

    fn from((created_at, id): RowKey) -> ClaimStart {
        ClaimStart::From(created_at, id)
    }

    fn all() -> ClaimScope {
        vec![true, true]
    }

    #[test]
    fn a_worker_starts_from_the_oldest_row_until_the_relay_is_catching_up() {
        let frontier = ClaimFrontier::default();
        let mut starts = ClaimStarts::default();
        let now = Instant::now();
        assert_eq!(starts.next(&frontier, &all(), now), ClaimStart::Oldest);
        starts.claimed(&frontier, &all(), ClaimStart::Oldest, now, false, Some(at(10)));
        assert_eq!(
            starts.next(&frontier, &all(), now),
            ClaimStart::Oldest,
            "a claim that was not full"
        );
        starts.claimed(&frontier, &all(), ClaimStart::Oldest, now, true, Some(at(10)));
        assert_eq!(
            starts.next(&frontier, &all(), now + Duration::from_millis(10)),
            from(at(10)),
            "the last row of the full claim"
        );
    }

    #[test]
    fn workers_start_past_every_full_claim_of_the_relay() {
        let frontier = ClaimFrontier::default();
        let (mut one, mut two) = (ClaimStarts::default(), ClaimStarts::default());
        let now = Instant::now();
        one.claimed(&frontier, &all(), ClaimStart::Oldest, now, true, Some(at(10)));
        two.claimed(&frontier, &all(), ClaimStart::Oldest, now, true, Some(at(20)));
        // A claim that finished later but took earlier rows moves nothing back.
        one.claimed(&frontier, &all(), from(at(10)), now, true, Some(at(15)));
        assert_eq!(one.next(&frontier, &all(), now), from(at(20)));
        assert_eq!(two.next(&frontier, &all(), now), from(at(20)));
    }

    #[test]
    fn a_frontier_reached_with_rows_left_out_is_no_start_for_other_claims() {
        let frontier = ClaimFrontier::default();
        let mut starts = ClaimStarts::default();
        let now = Instant::now();
        let without_second = vec![true, false];
        starts.claimed(
            &frontier,
            &without_second,
            ClaimStart::Oldest,
            now,
            true,
            Some(at(10)),
        );
        assert_eq!(starts.next(&frontier, &without_second, now), from(at(10)));
        assert_eq!(
            starts.next(&frontier, &all(), now),
            ClaimStart::Oldest,
            "the second destination's rows before it"
        );
        starts.claimed(&frontier, &all(), ClaimStart::Oldest, now, true, Some(at(5)));
        assert_eq!(
            starts.next(&frontier, &all(), now),
            from(at(5)),
            "replaced, not merged"
        );
    }

    #[test]
    fn a_catching_up_worker_claims_from_the_oldest_row_at_least_once_a_second() {
        let frontier = ClaimFrontier::default();
        let mut starts = ClaimStarts::default();
        let begin = Instant::now();
        starts.claimed(&frontier, &all(), ClaimStart::Oldest, begin, true, Some(at(10)));
        let mut now = begin;
        let mut from_oldest = 0;
        // 300 full claims, 10 ms apart: three seconds of draining.
        for n in 0..300 {
            now = begin + Duration::from_millis(10 * (n + 1));
            let start = starts.next(&frontier, &all(), now);
            if start == ClaimStart::Oldest {
                from_oldest += 1;
            }
            starts.claimed(&frontier, &all(), start, now, true, Some(at(10 + n as i64)));
        }
        assert!(
            (3..=4).contains(&from_oldest),
            "{from_oldest} claims from the oldest row in 3 s"
        );
        assert_ne!(starts.next(&frontier, &all(), now), ClaimStart::Oldest);
    }

    #[test]
    fn an_empty_or_partial_claim_of_any_worker_ends_the_catching_up() {
        let frontier = ClaimFrontier::default();
        let (mut one, mut two) = (ClaimStarts::default(), ClaimStarts::default());
        let now = Instant::now();
        one.claimed(&frontier, &all(), ClaimStart::Oldest, now, true, Some(at(10)));
        two.claimed(&frontier, &all(), from(at(10)), now, true, None);
        assert_eq!(
            one.next(&frontier, &all(), now),
            ClaimStart::Oldest,
            "a full claim of unpublishable rows only"
        );
        one.claimed(&frontier, &all(), ClaimStart::Oldest, now, true, Some(at(10)));
        two.claimed(&frontier, &all(), from(at(10)), now, false, Some(at(11)));
        assert_eq!(one.next(&frontier, &all(), now), ClaimStart::Oldest);
    }

    #[test]
    fn after_a_claim_with_interrupted_rows_the_next_claim_reads_from_the_oldest_row() {
        let frontier = ClaimFrontier::default();
        let mut starts = ClaimStarts::default();
        let now = Instant::now();
        starts.claimed(&frontier, &all(), ClaimStart::Oldest, now, true, Some(at(10)));
        assert_eq!(starts.next(&frontier, &all(), now), from(at(10)));
        starts.took_interrupted(true);
        assert_eq!(starts.next(&frontier, &all(), now), ClaimStart::Oldest);
        starts.took_interrupted(false);
        assert_eq!(starts.next(&frontier, &all(), now), from(at(10)));
    }
}
