//! What the relay's own work says about its dependencies, for `/readyz`
//! and for the workers' pacing: whether the last claim failed (a database
//! that answers `SELECT 1` but fails every claim is not ready,
//! [`RelayHealth`]), and whether a destination's broker is deferring whole
//! batches ([`DestinationHealth`], one per destination, so one broker's
//! outage paces only the rows routed to it).
//!
//! A batch the broker deferred more of than it published (nacks from a
//! full queue, an authorisation error, a missing queue, a timeout: answers
//! that are not the rows' fault) starts a *deferral outage*. While it
//! lasts the replica's workers publish nothing but one small probe batch
//! at a time, spaced by a capped exponential delay: an answer every row
//! would get is asked for a few times a second at most, not once per claim
//! per worker, and the rows are not charged. The first probe that the
//! broker mostly takes ends it. An outage that starts again soon after one
//! ended (a queue that takes a few messages and refuses the rest) picks
//! its spacing up where the last one left it, so the relay does not swing
//! between full batches and quick probes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::retry::Backoff;
use crate::store::RowKey;

/// Spacing of the probes while the broker defers batches: from 250 ms,
/// doubling, capped at 5 s, jittered. Five seconds bounds both the request
/// rate of a long outage and how late the relay notices its end.
const PROBE_SPACING: Backoff = Backoff {
    base: Duration::from_millis(250),
    max: Duration::from_secs(5),
};

/// Rows a probe batch claims at most: enough to learn whether the broker
/// takes messages again, few enough that a refusal costs one request and a
/// handful of row updates.
pub const PROBE_ROWS: u32 = 10;

/// How often a worker waiting for another worker's probe looks again.
const PROBE_POLL: Duration = Duration::from_millis(100);

/// How long after an outage ended a new one continues its spacing.
const REMEMBER: Duration = Duration::from_secs(30);

/// The relay's view of its database, shared by the workers and `/readyz`.
#[derive(Debug, Default)]
pub struct RelayHealth {
    /// The last claim's error, and since when claims fail.
    claim_failing: Mutex<Option<(Instant, String)>>,
}

/// One destination's broker as the relay's batches found it, shared by
/// the workers and `/readyz`.
#[derive(Debug, Default)]
pub struct DestinationHealth {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    deferring: Option<Deferring>,
    /// When the last outage ended, and how many batches it had deferred.
    last_ended: Option<(Instant, u32)>,
}

#[derive(Debug)]
struct Deferring {
    since: Instant,
    reason: String,
    /// Deferred batches in a row.
    batches: u32,
    /// When the next probe may start.
    next_probe: Instant,
    /// A worker is publishing a probe batch now.
    probing: bool,
}

/// Where one source's probes of each destination read its rows in the
/// fresh index, in windows (see relay/windows.rs), when a claim leaves
/// other destinations' rows out: from the oldest row, each probe would
/// step over every row of another destination that is down, which can be
/// millions, each time. Rows a probe took and the broker deferred are
/// given back where they lie, so the next probe reads from the same
/// place. A source's own: the positions are in its table, while a
/// destination's outage is every source's. Each cursor belongs to one
/// outage, named by when it began, and starts from the oldest row in the
/// next.
#[derive(Debug, Default)]
pub struct ProbeCursors {
    by_destination: Mutex<HashMap<usize, (Instant, ProbeCursor)>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct ProbeCursor {
    /// Where the next probe reads from (`None`: the oldest row).
    from: Option<RowKey>,
    /// Where the probes' current pass towards the newest row started: a
    /// pass from the oldest row that found nothing has read everything.
    pass_from: Option<RowKey>,
}

impl ProbeCursors {
    fn with<T>(&self, destination: usize, outage: Instant, f: impl FnOnce(&mut ProbeCursor) -> T) -> T {
        let mut cursors = lock(&self.by_destination);
        let entry = cursors
            .entry(destination)
            .or_insert((outage, ProbeCursor::default()));
        if entry.0 != outage {
            *entry = (outage, ProbeCursor::default());
        }
        f(&mut entry.1)
    }

    /// Where the next probe of `destination` in `outage` reads from
    /// (`None`: the oldest row).
    pub fn start(&self, destination: usize, outage: Instant) -> Option<RowKey> {
        self.with(destination, outage, |cursor| cursor.from)
    }

    /// The probe's window held rows of the destination: the next probe
    /// reads from the same place, and a pass that finds nothing from
    /// there to the newest row has not read what lies before it.
    pub fn took_rows(&self, destination: usize, outage: Instant) {
        self.with(destination, outage, |cursor| cursor.pass_from = cursor.from);
    }

    /// The probe's window, which ended at `end` short of the newest row,
    /// held no row of the destination: the next probe reads on from there.
    pub fn read_past(&self, destination: usize, outage: Instant, end: RowKey) {
        self.with(destination, outage, |cursor| cursor.from = Some(end));
    }

    /// The probe's window reached the newest row with no row of the
    /// destination. Returns whether the probes' pass started at the oldest
    /// row, so that no row of the destination is due here; otherwise the
    /// next probe starts over from the oldest row.
    pub fn reached_newest(&self, destination: usize, outage: Instant) -> bool {
        self.with(destination, outage, |cursor| {
            let read_all = cursor.pass_from.is_none();
            *cursor = ProbeCursor::default();
            read_all
        })
    }
}

/// What a worker may do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Claim a full batch.
    Publish,
    /// Claim at most [`PROBE_ROWS`]: the broker has been deferring batches.
    Probe,
    /// Publish nothing for this long.
    Wait(Duration),
}

/// How a published batch went, as far as the broker's health goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchHealth {
    /// Something was published, or refused for a row's own sake.
    Answered,
    /// More rows were deferred than published, the first for this reason.
    Deferred(String),
}

/// Plain data, consistent whatever a holder was doing when it panicked.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RelayHealth {
    /// A claim failed for the database's sake.
    pub fn claim_failed(&self, error: &dyn std::fmt::Display) {
        let mut failing = lock(&self.claim_failing);
        let since = failing.as_ref().map_or_else(Instant::now, |(since, _)| *since);
        *failing = Some((since, error.to_string()));
    }

    /// A claim went through.
    pub fn claim_succeeded(&self) {
        *lock(&self.claim_failing) = None;
    }

    /// Why the database is not ready, in words; `None` when it is.
    pub fn problem(&self) -> Option<String> {
        lock(&self.claim_failing).as_ref().map(|(since, error)| {
            format!(
                "database: claims have failed for {:.0?}: {error}",
                rounded(since.elapsed())
            )
        })
    }
}

impl DestinationHealth {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Whether a worker may publish now, and how much. At most one worker
    /// of the replica probes at a time.
    pub fn turn(&self) -> Turn {
        self.turn_at(Instant::now())
    }

    fn turn_at(&self, now: Instant) -> Turn {
        let mut state = self.state();
        match state.deferring.as_mut() {
            None => Turn::Publish,
            Some(deferring) if deferring.probing => Turn::Wait(PROBE_POLL),
            Some(deferring) if now < deferring.next_probe => Turn::Wait(deferring.next_probe - now),
            Some(deferring) => {
                deferring.probing = true;
                Turn::Probe
            }
        }
    }

    /// Records how a batch claimed at `claimed_at` went (a probe or not).
    pub fn batch_settled(&self, batch: BatchHealth, claimed_at: Instant) {
        self.settle(batch, claimed_at, Instant::now());
    }

    #[cfg(test)]
    fn batch_settled_at(&self, batch: BatchHealth, now: Instant) {
        self.settle(batch, now, now);
    }

    fn settle(&self, batch: BatchHealth, claimed_at: Instant, now: Instant) {
        let mut state = self.state();
        match (batch, state.deferring.as_mut()) {
            (BatchHealth::Answered, None) => {}
            // A batch claimed before the outage began tells nothing of its
            // end: on a queue that had room for part of the first batches
            // (a stream's last 50 slots), the one that got its half in
            // used to settle after its batch-mates were refused, end the
            // outage, and send every worker back to full batches.
            (BatchHealth::Answered, Some(deferring)) if claimed_at < deferring.since => {}
            (BatchHealth::Answered, Some(deferring)) => {
                info!(
                    outage_secs = now.duration_since(deferring.since).as_secs_f64(),
                    deferred_batches = deferring.batches,
                    "the broker takes messages again; publishing at full speed"
                );
                state.last_ended = Some((now, deferring.batches));
                state.deferring = None;
            }
            (BatchHealth::Deferred(reason), None) => {
                let batches = match state.last_ended {
                    Some((ended, batches)) if now.duration_since(ended) < REMEMBER => {
                        batches.saturating_add(1)
                    }
                    _ => {
                        warn!(report = "publishing_deferred", %reason, "the broker deferred most of a batch; publishing one small probe batch at a time, with backoff, until it takes messages again (rows are not charged)");
                        1
                    }
                };
                state.deferring = Some(Deferring {
                    since: now,
                    reason,
                    batches,
                    next_probe: now + PROBE_SPACING.delay(batches),
                    probing: false,
                });
            }
            (BatchHealth::Deferred(reason), Some(deferring)) => {
                deferring.batches = deferring.batches.saturating_add(1);
                deferring.next_probe = now + PROBE_SPACING.delay(deferring.batches);
                deferring.reason = reason;
                deferring.probing = false;
            }
        }
    }

    /// A worker given [`Turn::Probe`] did not get as far as publishing (the
    /// sink's check or the claim failed): the next worker may probe.
    pub fn probe_abandoned(&self) {
        if let Some(deferring) = self.state().deferring.as_mut() {
            deferring.probing = false;
        }
    }

    /// A probe found nothing to publish (another replica took the rows):
    /// with nothing to tell, the outage is over as far as this replica
    /// knows; the next batch says otherwise if it is not.
    pub fn probe_found_nothing(&self) {
        let mut state = self.state();
        if let Some(deferring) = state.deferring.take() {
            state.last_ended = Some((Instant::now(), deferring.batches));
        }
    }

    /// When the outage under way began, if one is: it names the outage.
    pub fn outage(&self) -> Option<Instant> {
        self.state().deferring.as_ref().map(|deferring| deferring.since)
    }

    /// The probe of `outage` read a window with no row of the destination
    /// and reads on: the turn goes back with its time already come, for
    /// the next window at once.
    pub fn probe_goes_on(&self, outage: Instant) {
        if let Some(deferring) = self
            .state()
            .deferring
            .as_mut()
            .filter(|deferring| deferring.since == outage)
        {
            deferring.probing = false;
        }
    }

    /// Why the destination's broker is not taking messages, in words;
    /// `None` while it is.
    pub fn problem(&self) -> Option<String> {
        self.state().deferring.as_ref().map(|deferring| {
            format!(
                "{} batch(es) in a row deferred over {:.0?}, the last because {}; probing with backoff",
                deferring.batches,
                rounded(deferring.since.elapsed()),
                deferring.reason
            )
        })
    }

    /// Whether the broker is deferring batches: rows routed to it wait.
    pub fn is_deferring(&self) -> bool {
        self.state().deferring.is_some()
    }
}

fn rounded(elapsed: Duration) -> Duration {
    Duration::from_secs(elapsed.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deferred() -> BatchHealth {
        BatchHealth::Deferred("nacked".to_owned())
    }

    #[test]
    fn publishing_is_free_until_a_batch_is_deferred_whole() {
        let health = DestinationHealth::default();
        assert_eq!(health.turn(), Turn::Publish);
        health.batch_settled(BatchHealth::Answered, Instant::now());
        assert_eq!(health.turn(), Turn::Publish);
        assert!(health.problem().is_none());
    }

    #[test]
    fn a_batch_claimed_before_the_outage_does_not_end_it() {
        let health = DestinationHealth::default();
        let claimed = Instant::now();
        let refused = claimed + Duration::from_millis(5);
        health.settle(deferred(), claimed, refused);
        // Claimed with the refused one, answered after it: stale news.
        health.settle(BatchHealth::Answered, claimed, refused + Duration::from_millis(5));
        assert!(health.problem().is_some(), "the outage goes on");
        assert!(matches!(health.turn_at(refused), Turn::Wait(_)));
        // A probe claimed since ends it.
        let later = refused + Duration::from_secs(1);
        assert_eq!(health.turn_at(later), Turn::Probe);
        health.settle(BatchHealth::Answered, later, later);
        assert_eq!(health.turn_at(later), Turn::Publish);
    }

    #[test]
    fn a_deferred_batch_spaces_probes_one_worker_at_a_time() {
        let health = DestinationHealth::default();
        let start = Instant::now();
        health.batch_settled_at(deferred(), start);
        assert!(matches!(health.turn_at(start), Turn::Wait(wait) if wait <= Duration::from_millis(250)));
        assert!(
            health.problem().unwrap().contains("nacked"),
            "{:?}",
            health.problem()
        );
        let later = start + Duration::from_millis(250);
        assert_eq!(health.turn_at(later), Turn::Probe);
        // Every other worker waits for the probe.
        assert_eq!(health.turn_at(later), Turn::Wait(PROBE_POLL));
        health.batch_settled_at(deferred(), later);
        match health.turn_at(later) {
            Turn::Wait(wait) => {
                assert!(wait >= Duration::from_millis(250) && wait <= Duration::from_millis(500))
            }
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    #[test]
    fn probes_are_never_further_apart_than_the_cap_nor_closer_after_many_refusals() {
        let health = DestinationHealth::default();
        let mut now = Instant::now();
        for _ in 0..50 {
            health.batch_settled_at(deferred(), now);
            match health.turn_at(now) {
                Turn::Wait(wait) => {
                    assert!(wait <= PROBE_SPACING.max);
                    now += wait;
                }
                other => panic!("expected a wait, got {other:?}"),
            }
            assert_eq!(health.turn_at(now), Turn::Probe);
        }
        // After a long outage, a probe every 2.5 to 5 seconds.
        health.batch_settled_at(deferred(), now);
        assert!(matches!(health.turn_at(now), Turn::Wait(wait) if wait >= PROBE_SPACING.max / 2));
    }

    #[test]
    fn an_answered_probe_ends_the_outage() {
        let health = DestinationHealth::default();
        let now = Instant::now();
        health.batch_settled_at(deferred(), now);
        let later = now + Duration::from_secs(1);
        assert_eq!(health.turn_at(later), Turn::Probe);
        health.batch_settled_at(BatchHealth::Answered, later);
        assert_eq!(health.turn_at(later), Turn::Publish);
        assert!(health.problem().is_none());
    }

    #[test]
    fn an_outage_soon_after_the_last_one_keeps_its_spacing() {
        let health = DestinationHealth::default();
        let mut now = Instant::now();
        for _ in 0..10 {
            health.batch_settled_at(deferred(), now);
        }
        now += PROBE_SPACING.max;
        assert_eq!(health.turn_at(now), Turn::Probe);
        health.batch_settled_at(BatchHealth::Answered, now);
        // A full batch is refused again at once: no quick probes this time.
        health.batch_settled_at(deferred(), now);
        assert!(matches!(health.turn_at(now), Turn::Wait(wait) if wait >= PROBE_SPACING.max / 2));
        // Long after, a new outage starts from the quick probes again.
        now += REMEMBER * 2;
        health.batch_settled_at(BatchHealth::Answered, now);
        let later = now + REMEMBER * 2;
        health.batch_settled_at(deferred(), later);
        assert!(matches!(health.turn_at(later), Turn::Wait(wait) if wait <= Duration::from_millis(250)));
    }

    #[test]
    fn a_probe_that_found_nothing_ends_the_outage() {
        let health = DestinationHealth::default();
        let now = Instant::now();
        health.batch_settled_at(deferred(), now);
        let later = now + Duration::from_secs(1);
        assert_eq!(health.turn_at(later), Turn::Probe);
        health.probe_found_nothing();
        assert_eq!(health.turn_at(later), Turn::Publish);
        assert!(health.problem().is_none());
    }

    fn key(second: i64) -> RowKey {
        (
            chrono::DateTime::from_timestamp(second, 0).expect("a time"),
            uuid::Uuid::nil(),
        )
    }

    #[test]
    fn probes_read_on_from_where_the_last_one_found_rows() {
        let cursors = ProbeCursors::default();
        let outage = Instant::now();
        assert_eq!(
            cursors.start(0, outage),
            None,
            "the first probe reads from the oldest row"
        );
        cursors.read_past(0, outage, key(10));
        assert_eq!(cursors.start(0, outage), Some(key(10)));
        cursors.read_past(0, outage, key(20));
        cursors.took_rows(0, outage);
        assert_eq!(
            cursors.start(0, outage),
            Some(key(20)),
            "where the last found rows"
        );
        assert_eq!(cursors.start(1, outage), None, "each destination its own");
        // Nothing from there to the newest row: what lies before is not
        // read yet, so the probes start over.
        assert!(!cursors.reached_newest(0, outage));
        assert_eq!(cursors.start(0, outage), None);
        cursors.read_past(0, outage, key(10));
        // A pass from the oldest row that found nothing read everything.
        assert!(cursors.reached_newest(0, outage));
    }

    #[test]
    fn a_new_outage_probes_from_the_oldest_row() {
        let cursors = ProbeCursors::default();
        let outage = Instant::now();
        cursors.read_past(0, outage, key(10));
        cursors.took_rows(0, outage);
        let next = outage + Duration::from_secs(1);
        assert_eq!(cursors.start(0, next), None);
        // What a probe of the last one reports comes too late to count.
        cursors.read_past(0, outage, key(30));
        assert_eq!(cursors.start(0, next), None);
    }

    #[test]
    fn a_probe_that_reads_on_hands_the_turn_back_at_once_in_its_own_outage_only() {
        let health = DestinationHealth::default();
        let now = Instant::now();
        health.batch_settled_at(deferred(), now);
        let outage = health.outage().expect("an outage");
        let later = now + Duration::from_secs(1);
        assert_eq!(health.turn_at(later), Turn::Probe);
        assert_eq!(health.turn_at(later), Turn::Wait(PROBE_POLL));
        health.probe_goes_on(outage);
        assert_eq!(health.turn_at(later), Turn::Probe);
        health.probe_goes_on(later);
        assert_eq!(health.turn_at(later), Turn::Wait(PROBE_POLL), "not this outage's");
    }

    #[test]
    fn failing_claims_are_a_readiness_problem_until_one_succeeds() {
        let health = RelayHealth::default();
        health.claim_failed(&"column \"headers\" does not exist");
        assert!(health.problem().unwrap().contains("does not exist"));
        health.claim_succeeded();
        assert!(health.problem().is_none());
    }
}
