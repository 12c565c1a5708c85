//! Liveness: whether every relay worker is still going round its loop.
//!
//! Each worker beats once per iteration of its loop (claim attempt, idle
//! sleep, outage back-off, batch recorded: each ends in the next
//! iteration). `/healthz` answers 503 once some worker has been silent for
//! longer than one iteration can legitimately take ([`stall_limit`]): such a
//! worker is stuck on something unbounded, and only a restart frees it. A
//! worker that panics does not go silent: it takes the relay task, and so
//! the process, down with it (see `app`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::outage::MAX_RETRY_DELAY;
use crate::store::QUERY_TIMEOUT;

/// The last beat of each relay worker.
#[derive(Debug)]
pub struct Liveness {
    origin: Instant,
    origin_wall: SystemTime,
    /// Milliseconds after `origin` of each worker's last beat.
    beats: Box<[AtomicU64]>,
    limit: Duration,
}

/// A worker that has made no progress for longer than `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// Index of the silent worker (the most silent, when several are).
    pub worker: usize,
    /// Time since its last beat.
    pub silent_for: Duration,
    /// The longest a loop iteration can legitimately take.
    pub limit: Duration,
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "relay worker {} has made no progress for {}s; an iteration of its loop takes at most {}s",
            self.worker,
            self.silent_for.as_secs(),
            self.limit.as_secs()
        )
    }
}

impl Liveness {
    /// Tracks `workers` workers, each counted as having beaten just now,
    /// stalled after `limit` of silence.
    pub fn new(workers: usize, limit: Duration) -> Self {
        Self {
            origin: Instant::now(),
            origin_wall: SystemTime::now(),
            beats: (0..workers.max(1)).map(|_| AtomicU64::new(0)).collect(),
            limit,
        }
    }

    /// Records progress of worker `worker` (an index below the count given
    /// to [`Liveness::new`]; others are ignored).
    pub fn beat(&self, worker: usize) {
        self.beat_at(worker, Instant::now());
    }

    fn beat_at(&self, worker: usize, now: Instant) {
        if let Some(slot) = self.beats.get(worker) {
            slot.fetch_max(self.millis_since_origin(now), Ordering::Relaxed);
        }
    }

    /// Records progress on behalf of every worker, for work done before
    /// the workers start (waiting for the database at start-up).
    pub fn beat_all(&self) {
        for worker in 0..self.beats.len() {
            self.beat(worker);
        }
    }

    /// `Ok` while every worker has beaten within the limit.
    pub fn check(&self) -> Result<(), Stall> {
        self.check_at(Instant::now())
    }

    /// The staleness rule, at a given time: a worker is stalled once its
    /// silence is strictly longer than the limit.
    fn check_at(&self, now: Instant) -> Result<(), Stall> {
        let (worker, last) = self.oldest_beat();
        let silent_for = Duration::from_millis(self.millis_since_origin(now).saturating_sub(last));
        if silent_for > self.limit {
            Err(Stall {
                worker,
                silent_for,
                limit: self.limit,
            })
        } else {
            Ok(())
        }
    }

    /// Wall-clock time by which every worker had made progress (the
    /// oldest worker's last beat), for `outbox_relay_last_progress_timestamp_seconds`.
    pub fn last_progress(&self) -> SystemTime {
        self.origin_wall + Duration::from_millis(self.oldest_beat().1)
    }

    /// How long a worker may stay silent.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    fn oldest_beat(&self) -> (usize, u64) {
        self.beats
            .iter()
            .map(|slot| slot.load(Ordering::Relaxed))
            .enumerate()
            .min_by_key(|(_, beat)| *beat)
            .unwrap_or((0, 0))
    }

    fn millis_since_origin(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX)
    }
}

/// The longest one iteration of a worker's loop can legitimately take:
/// the silence `/healthz` tolerates. An iteration is
///
/// 1. the sink's readiness check, bounded by `OUTBOX_PUBLISH_TIMEOUT`,
///    after recording the last batch's confirmed rows if the check has to
///    wait (retried through a database outage until their lease runs out);
/// 2. the claim, one statement bounded by the query timeout, plus at most
///    two more: the first time an ordered claim looks up the sequence
///    column, or, when a claim finds its table converted to a partitioned
///    one, a look at the table's kind and the claim again;
/// 3. then the longest of: the idle sleep (`OUTBOX_POLL_INTERVAL`), an
///    outage back-off or a wait for the next probe of a broker deferring
///    batches (both capped at the in-process retry cap), or a batch. A batch's publish and recording end by its
///    lease, except the last recording statement, which may start just
///    before the lease runs out and take the query timeout.
///
/// With the defaults: (65 s + 30 s) + 3 × 30 s + (65 s + 30 s + 5 s) = 285 s.
pub fn stall_limit(bounds: LoopBounds) -> Duration {
    let ready = bounds.lease + bounds.publish_timeout;
    let claim = QUERY_TIMEOUT * 3;
    let batch = bounds.lease + QUERY_TIMEOUT + MAX_RETRY_DELAY;
    ready + claim + batch.max(bounds.poll_interval).max(MAX_RETRY_DELAY)
}

/// The relay settings one iteration of a worker's loop is bounded by,
/// handed over by the relay: liveness knows the loop's shape, not its
/// configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopBounds {
    /// How long a claimed batch is leased to its worker.
    pub lease: Duration,
    /// `OUTBOX_PUBLISH_TIMEOUT`.
    pub publish_timeout: Duration,
    /// `OUTBOX_POLL_INTERVAL`.
    pub poll_interval: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(liveness: &Liveness, millis: u64) -> Instant {
        liveness.origin + Duration::from_millis(millis)
    }

    #[test]
    fn a_worker_is_stalled_only_once_its_silence_exceeds_the_limit() {
        let liveness = Liveness::new(1, Duration::from_secs(10));
        assert_eq!(liveness.check_at(at(&liveness, 10_000)), Ok(()));
        assert_eq!(
            liveness.check_at(at(&liveness, 10_001)),
            Err(Stall {
                worker: 0,
                silent_for: Duration::from_millis(10_001),
                limit: Duration::from_secs(10),
            })
        );
    }

    #[test]
    fn one_silent_worker_is_enough_to_be_stalled() {
        let liveness = Liveness::new(3, Duration::from_secs(10));
        liveness.beat_at(0, at(&liveness, 5_000));
        liveness.beat_at(2, at(&liveness, 5_000));
        let stall = liveness.check_at(at(&liveness, 11_000)).unwrap_err();
        assert_eq!(stall.worker, 1, "the worker that never beat");
        assert!(stall.to_string().contains("no progress for 11s"), "{stall}");
    }

    #[test]
    fn a_beat_resets_the_silence() {
        let liveness = Liveness::new(2, Duration::from_secs(10));
        liveness.beat_at(0, at(&liveness, 5_000));
        liveness.beat_at(1, at(&liveness, 6_000));
        assert_eq!(liveness.check_at(at(&liveness, 15_000)), Ok(()));
        assert_eq!(liveness.check_at(at(&liveness, 15_001)).unwrap_err().worker, 0);
        assert_eq!(
            liveness.last_progress(),
            liveness.origin_wall + Duration::from_secs(5),
            "every worker had made progress 5 s after the start"
        );
        // A beat from an earlier time (a slow worker racing) never moves
        // a worker's progress back.
        liveness.beat_at(1, at(&liveness, 1_000));
        assert_eq!(liveness.check_at(at(&liveness, 15_500)).unwrap_err().worker, 0);
        // An index beyond the workers is ignored rather than a panic.
        liveness.beat(7);
    }

    #[test]
    fn the_limit_covers_the_longest_iteration_of_the_defaults() {
        // The defaults: a 30 s publish timeout, so a 65 s lease, and 500 ms
        // between polls.
        let defaults = LoopBounds {
            lease: Duration::from_secs(65),
            publish_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
        };
        assert_eq!(stall_limit(defaults), Duration::from_secs(285));
        let slow_poll = LoopBounds {
            poll_interval: Duration::from_secs(600),
            ..defaults
        };
        assert_eq!(stall_limit(slow_poll), Duration::from_secs(65 + 30 + 90 + 600));
    }
}
