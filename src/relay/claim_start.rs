//! Where a worker's next claim starts reading the rows that never failed.
//!
//! A published row leaves its entry in the claim's fresh-path index until
//! VACUUM removes it, and those entries sit at the index's start, where a
//! claim from the oldest row begins: while a large backlog drains, every
//! claim stepped over all the rows published since the last VACUUM
//! (hundreds of thousands between two autovacuum runs). So while a worker
//! is catching up (its last claim came back full) its next claim starts at
//! the first row of that claim, and the index takes it there directly.
//! A row before that point which is due (given back after an outage, left
//! by a relay that died, released, or committed late by a producer
//! transaction that started earlier) is found by the next claim from the
//! oldest row: one at least every [`FROM_OLDEST_EVERY`], and every claim
//! once the worker has caught up. That is a delay of at most that long
//! for such a row, never a row left behind.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::store::ClaimStart;

/// How long a worker goes at most without a claim from the oldest row.
pub const FROM_OLDEST_EVERY: Duration = Duration::from_secs(1);

/// One worker's claim starts.
#[derive(Debug, Default)]
pub struct ClaimStarts {
    /// Where the next claim may start, while catching up.
    from: Option<(DateTime<Utc>, Uuid)>,
    last_from_oldest: Option<Instant>,
}

impl ClaimStarts {
    /// Where the claim made `now` starts.
    pub fn next(&self, now: Instant) -> ClaimStart {
        match (self.from, self.last_from_oldest) {
            (Some((created_at, id)), Some(last))
                if now.saturating_duration_since(last) < FROM_OLDEST_EVERY =>
            {
                ClaimStart::From(created_at, id)
            }
            _ => ClaimStart::Oldest,
        }
    }

    /// Records a claim made at `at` from `start`: whether it came back with
    /// a full batch, and its first row in `(created_at, id)` order.
    pub fn claimed(
        &mut self,
        start: ClaimStart,
        at: Instant,
        full: bool,
        first: Option<(DateTime<Utc>, Uuid)>,
    ) {
        if start == ClaimStart::Oldest {
            self.last_from_oldest = Some(at);
        }
        self.from = first.filter(|_| full);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> (DateTime<Utc>, Uuid) {
        (
            DateTime::from_timestamp(1_700_000_000 + seconds, 0).unwrap(),
            Uuid::from_u128(seconds as u128),
        )
    }

    fn from((created_at, id): (DateTime<Utc>, Uuid)) -> ClaimStart {
        ClaimStart::From(created_at, id)
    }

    #[test]
    fn a_worker_starts_from_the_oldest_row_until_it_is_catching_up() {
        let mut starts = ClaimStarts::default();
        let now = Instant::now();
        assert_eq!(starts.next(now), ClaimStart::Oldest);
        starts.claimed(ClaimStart::Oldest, now, false, Some(at(10)));
        assert_eq!(starts.next(now), ClaimStart::Oldest, "a claim that was not full");
        starts.claimed(ClaimStart::Oldest, now, true, Some(at(10)));
        assert_eq!(
            starts.next(now + Duration::from_millis(10)),
            from(at(10)),
            "the first row of the full claim"
        );
    }

    #[test]
    fn a_catching_up_worker_claims_from_the_oldest_row_at_least_once_a_second() {
        let mut starts = ClaimStarts::default();
        let begin = Instant::now();
        starts.claimed(ClaimStart::Oldest, begin, true, Some(at(10)));
        let mut now = begin;
        let mut from_oldest = 0;
        // 300 full claims, 10 ms apart: three seconds of draining.
        for n in 0..300 {
            now = begin + Duration::from_millis(10 * (n + 1));
            let start = starts.next(now);
            if start == ClaimStart::Oldest {
                from_oldest += 1;
            }
            starts.claimed(start, now, true, Some(at(10 + n as i64)));
        }
        assert!(
            (3..=4).contains(&from_oldest),
            "{from_oldest} claims from the oldest row in 3 s"
        );
        assert_ne!(starts.next(now), ClaimStart::Oldest);
    }

    #[test]
    fn an_empty_or_partial_claim_ends_the_catching_up() {
        let mut starts = ClaimStarts::default();
        let now = Instant::now();
        starts.claimed(ClaimStart::Oldest, now, true, Some(at(10)));
        starts.claimed(from(at(10)), now, true, None);
        assert_eq!(
            starts.next(now),
            ClaimStart::Oldest,
            "a full claim of unpublishable rows only"
        );
        starts.claimed(ClaimStart::Oldest, now, true, Some(at(10)));
        starts.claimed(from(at(10)), now, false, Some(at(11)));
        assert_eq!(starts.next(now), ClaimStart::Oldest);
    }
}
