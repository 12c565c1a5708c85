//! Where the claims of a relay that leaves some destination's rows out
//! read the rows that never failed.
//!
//! While a destination is down its rows wait where they are, unwritten, in
//! the fresh index that the claims walk in `(created_at, id)` order, and
//! the claims for the other destinations filter them out row by row (see
//! store/sql/claim.sql). A claim from the oldest row steps over every one
//! of them: half a second a claim per million waiting rows measured on one
//! machine, far more from disk, and past `statement_timeout` the claims
//! fail and the destinations that are up stall with the one that is down.
//!
//! So such claims read in windows: each first measures how far
//! [`WINDOW_ROWS`] rows of the fresh index reach from where it starts
//! ([`Store::fresh_window`](crate::store::Store::fresh_window)), and reads
//! no further, whatever it finds or filters out. Two positions move
//! forward as the windows come back, shared by the relay's workers:
//!
//! - the **tail**, where claims read: past the last row a claim took, or
//!   past every row a window found nothing to take in, so it stays near
//!   the newest rows. When a window with nothing to take reached the
//!   newest row, the tail stays [`LATE_COMMIT_MARGIN`] behind it, for rows
//!   that commit after newer ones (a producer's transaction that started
//!   earlier); past a row taken, such rows are the sweep's;
//! - a **sweep** from the oldest row to the newest, one window at a time,
//!   that finds what became due behind the tail: rows given back after an
//!   outage or a crash, left by a relay that died, released, replayed, or
//!   committed later than the margin. A sweep starts at most every
//!   [`SWEEP_EVERY`], and no sooner after the last than
//!   [`SWEEP_COST_SHARE`] times what its windows cost, so that sweeping
//!   takes a bounded share of one connection however many rows wait. Such
//!   a row waits for the next sweep to reach it: longer than the second a
//!   claim from the oldest row takes to find it while every destination is
//!   up, never forever.
//!
//! Until a sweep has reached the newest row once for the destinations
//! open now, there is no tail: every worker's claims follow that first
//! sweep, which is then the drain. The positions are kept for the last
//! [`KEPT_SCOPES`] sets of open destinations: when the set changes back
//! (a destination whose broker defers batches now and then, a connection
//! that drops), the claims go on where they got to for it, a first sweep
//! included, instead of from the oldest row; a sweep from there finds what
//! the change gave back behind them.
//!
//! An unordered claim with every destination open has nothing to filter
//! out and does not use windows (see claim_start.rs). Ordered claims
//! always do: behind an aggregate whose head is in flight, every row of
//! it is one they cannot take, which a claim from the oldest row would
//! step over each time, as it would a down destination's.
//!
//! Ordered claims (`OUTBOX_ORDERING=aggregate`) read the same windows. The
//! tail passes over the rows a window could not take, and in an ordered
//! claim those include the successors of rows in flight, which become
//! heads only once their predecessors' publishes are recorded. Rather than
//! leave each to a sweep, the relay hands the aggregates it has just
//! published to its next claims ([`ClaimWindows::published`],
//! [`ClaimWindows::take_published`]), which take their heads behind the
//! window wherever they lie (see store/sql/claim_ordered.sql). A shortcut,
//! not a guarantee: a head it misses (left out by the claim's row or byte
//! budget, not due yet, its predecessor published by another replica or
//! before a restart, its aggregate dropped from a list grown past
//! [`MOST_PUBLISHED_WAITING`], or given to a claim that failed) waits for
//! the next sweep, as any row behind the tail does.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::{ClaimStart, RowKey};

use super::claim_start::ClaimScope;

/// The most rows of the fresh index a windowed claim reads, waiting rows
/// of other destinations included.
pub const WINDOW_ROWS: i64 = 2_000;

/// How far behind the newest row a window reached the tail is left, for
/// rows committed after newer ones.
pub const LATE_COMMIT_MARGIN: chrono::TimeDelta = chrono::TimeDelta::seconds(2);

/// The most aggregates waiting to be looked at by an ordered claim; past
/// it the oldest are dropped and a sweep is asked for instead.
pub const MOST_PUBLISHED_WAITING: usize = 100_000;

/// The shortest time between the starts of two sweeps.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A sweep starts no sooner after the last one started than this many
/// times what the last one's windows cost.
pub const SWEEP_COST_SHARE: u32 = 10;

/// How long a full window's measure serves the claims that start inside
/// it.
pub const MEASURE_REUSE: Duration = Duration::from_secs(1);

/// How many recent measures are kept: the tail's and a sweep's, at least.
const MEASURES_KEPT: usize = 4;

/// The last full windows measured, which the claims that start inside one
/// of them reuse for [`MEASURE_REUSE`] instead of measuring again.
///
/// Measuring reads [`WINDOW_ROWS`] entries of the fresh index, with a heap
/// fetch each while the relay's own updates keep the pages from being all
/// visible: an ordered drain measured on one machine spent 4 ms and 1,900
/// buffers a claim on it, more than a third of PostgreSQL's time, while a
/// claim moves the window on by a batch of about 100 rows. A window's end
/// still bounds a claim that starts further in, by fewer rows: rows leave
/// the range as they are published, and only a row committed late with an
/// older time can join it.
#[derive(Debug, Default)]
pub struct WindowMeasures {
    recent: Mutex<VecDeque<Measure>>,
}

#[derive(Debug, Clone, Copy)]
struct Measure {
    from: Option<RowKey>,
    end: RowKey,
    at: Instant,
}

impl WindowMeasures {
    /// The measure of a full window taken lately from at most `from` and
    /// ending past it, as [`Store::fresh_window`](crate::store::Store::fresh_window)
    /// gives one.
    pub fn reuse(&self, from: Option<RowKey>, now: Instant) -> Option<(RowKey, i64)> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent
            .iter()
            .find(|measure| {
                now.saturating_duration_since(measure.at) < MEASURE_REUSE
                    && measure.from <= from
                    && from < Some(measure.end)
            })
            .map(|measure| (measure.end, WINDOW_ROWS))
    }

    /// Keeps the measure of the window from `from`, if it is full.
    pub fn measured(&self, from: Option<RowKey>, measured: Option<(RowKey, i64)>, now: Instant) {
        let Some(end) = window_end(measured) else {
            return;
        };
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.push_front(Measure { from, end, at: now });
        recent.truncate(MEASURES_KEPT);
    }
}

/// One claim's window, as [`ClaimWindows::next`] hands it to a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Where it starts: `None` is the oldest row.
    pub from: Option<RowKey>,
    kind: Kind,
    /// Which positions it belongs to: a window handed out before the open
    /// destinations changed tells nothing about the new ones'.
    generation: u64,
    /// Which sweep it belongs to: a window of the first sweep that comes
    /// back after the next sweep has started tells nothing about that one.
    sweep: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// From the tail.
    Tail,
    /// The next window of the sweep, which this worker alone reads.
    Sweep,
    /// The first sweep for these destinations, which every worker follows.
    FirstSweep,
}

impl Window {
    /// The claim's start for a window measured as `measured` (the last row
    /// of the window and how many rows it holds; `None`: none from here):
    /// a window that holds fewer than [`WINDOW_ROWS`] rows reaches the
    /// newest row, and its claim reads to the end.
    pub fn start(&self, measured: Option<(RowKey, i64)>) -> ClaimStart {
        ClaimStart::Window {
            from: self.from,
            to: window_end(measured),
        }
    }
}

/// Where a window measured as `measured` (as for [`Window::start`]) ends:
/// `None` when it reaches the newest row.
pub fn window_end(measured: Option<(RowKey, i64)>) -> Option<RowKey> {
    match measured {
        Some((last, rows)) if rows >= WINDOW_ROWS => Some(last),
        _ => None,
    }
}

/// What a windowed claim took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    Nothing,
    /// Rows up to this one, the last in `(created_at, id)` order.
    UpTo(RowKey),
    /// Only rows it cannot publish, whose place it does not read.
    Unplaced,
}

impl Taken {
    /// What a claim that returned `rows` rows took, `last` the last of
    /// those it can publish that came from its window; `read_to_end`: the
    /// claim had room for more rows, the byte budget left none out and it
    /// leased every row it locked, so its window held nothing else it
    /// could take. Such a claim whose rows all came from elsewhere
    /// (retries, an ordered claim's next rows of aggregates just
    /// published) moves the window on as one that took nothing does;
    /// otherwise a stream of those would hold it where it is. One that
    /// took nothing without reading to the end locked rows that changed
    /// under it: the window stays where it is, for them.
    pub fn of(rows: usize, last: Option<RowKey>, read_to_end: bool) -> Self {
        match (rows, last) {
            (_, Some(last)) => Self::UpTo(last),
            (_, None) if read_to_end => Self::Nothing,
            (_, None) => Self::Unplaced,
        }
    }
}

/// How many sets of open destinations the windows keep positions for,
/// the current one included.
pub const KEPT_SCOPES: usize = 8;

/// The windows of a relay's claims for the destinations open now, and
/// for the last few other sets of them.
#[derive(Debug, Default)]
pub struct ClaimWindows {
    /// Positions by set of open destinations, the current set first.
    state: Mutex<Vec<(ClaimScope, Positions)>>,
    generations: std::sync::atomic::AtomicU64,
    /// The aggregates of rows just published, oldest first, whose
    /// successors the next ordered claims look for.
    published: Mutex<VecDeque<String>>,
}

#[derive(Debug)]
struct Positions {
    generation: u64,
    /// Where claims read; `None` until a sweep has reached the newest row.
    tail: Option<Option<RowKey>>,
    sweep: Option<Sweep>,
    /// When the last sweep started, and what its windows cost.
    last_sweep: Option<(Instant, Duration)>,
    /// A sweep is wanted now: rows were given back behind the tail.
    sweep_wanted: bool,
    /// How many sweeps have started, the first included.
    sweeps: u64,
}

#[derive(Debug)]
struct Sweep {
    number: u64,
    position: Option<RowKey>,
    /// A worker is reading its next window.
    busy: bool,
    started: Instant,
    cost: Duration,
}

impl Positions {
    fn first(generation: u64, now: Instant) -> Self {
        Self {
            generation,
            tail: None,
            sweep: Some(Sweep {
                number: 0,
                position: None,
                busy: false,
                started: now,
                cost: Duration::ZERO,
            }),
            last_sweep: None,
            sweep_wanted: false,
            sweeps: 1,
        }
    }

    /// The same positions, for a smaller set of destinations: a window of
    /// the sweep handed out for the larger set is that set's.
    fn carried(&self, generation: u64) -> Self {
        Self {
            generation,
            tail: self.tail,
            sweep: self.sweep.as_ref().map(|sweep| Sweep {
                number: sweep.number,
                position: sweep.position,
                busy: false,
                started: sweep.started,
                cost: sweep.cost,
            }),
            last_sweep: self.last_sweep,
            sweep_wanted: self.sweep_wanted,
            sweeps: self.sweeps,
        }
    }

    fn sweep_due(&self, now: Instant) -> bool {
        self.sweep_wanted
            || self.last_sweep.is_none_or(|(started, cost)| {
                now.saturating_duration_since(started) >= SWEEP_EVERY.max(cost * SWEEP_COST_SHARE)
            })
    }
}

impl ClaimWindows {
    /// The window of the next claim for `scope` made `now`.
    pub fn next(&self, scope: &ClaimScope, now: Instant) -> Window {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let kept = state.iter().position(|(kept, _)| kept == scope);
        if kept != Some(0) {
            let entry = match kept {
                // Back to a set of destinations served before: its
                // positions still hold (rows behind its tail were taken or
                // not its to take; rows given back since, for an outage or
                // behind an interrupted row, asked it for a sweep; rows a
                // dead relay left wait for the next sweep as they would
                // anyway), and a first sweep it had
                // not finished goes on
                // where it got to rather than from the oldest row again,
                // which behind a long backlog it might never finish should
                // the destinations keep changing. A destination open now
                // that was not a moment ago may have had rows given back
                // anywhere behind the tail as it went: a sweep finds them.
                Some(index) => {
                    let mut entry = state.remove(index);
                    let grown = state.first().is_none_or(|(previous, _)| !within(scope, previous));
                    entry.1.sweep_wanted |= grown;
                    entry
                }
                // Fewer destinations than a moment ago, for the first
                // time: every row behind the positions of the larger set
                // was taken or not its to take, so the smaller one's too,
                // and its claims go on from there. One going down must not
                // send the others' claims back to the oldest row, behind
                // whatever backlog waits there.
                None => {
                    let generation = self
                        .generations
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let positions = match state.first() {
                        Some((current, positions)) if within(scope, current) => positions.carried(generation),
                        _ => Positions::first(generation, now),
                    };
                    (scope.clone(), positions)
                }
            };
            state.insert(0, entry);
            state.truncate(KEPT_SCOPES);
        }
        let positions = &mut state[0].1;
        let generation = positions.generation;
        let Some(tail) = positions.tail else {
            let (position, sweep) = positions
                .sweep
                .as_ref()
                .map_or((None, 0), |sweep| (sweep.position, sweep.number));
            return Window {
                from: position,
                kind: Kind::FirstSweep,
                generation,
                sweep,
            };
        };
        if positions.sweep.is_none() && positions.sweep_due(now) {
            positions.sweep_wanted = false;
            let number = positions.sweeps;
            positions.sweeps += 1;
            positions.sweep = Some(Sweep {
                number,
                position: None,
                busy: false,
                started: now,
                cost: Duration::ZERO,
            });
        }
        match positions.sweep.as_mut() {
            Some(sweep) if !sweep.busy => {
                sweep.busy = true;
                Window {
                    from: sweep.position,
                    kind: Kind::Sweep,
                    generation,
                    sweep: sweep.number,
                }
            }
            _ => Window {
                from: tail,
                kind: Kind::Tail,
                generation,
                sweep: 0,
            },
        }
    }

    /// Records the claim of `window` for `scope`: how it was `measured`
    /// (as for [`Window::start`]), what it took (`Taken`), and what
    /// measuring and claiming cost. Returns whether the worker should claim
    /// again at once, even if it took nothing: a sweep has more windows to
    /// read, or the tail is still behind a full window of rows it cannot
    /// take.
    pub fn claimed(
        &self,
        scope: &ClaimScope,
        window: Window,
        measured: Option<(RowKey, i64)>,
        taken: Taken,
        cost: Duration,
    ) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(positions) = positions_of(&mut state, scope, window) else {
            return false;
        };
        let newest_reached = measured.is_none_or(|(_, rows)| rows < WINDOW_ROWS);
        // Every row before the last one taken was taken or had nothing to
        // take; past it, rows a full claim left are still there. A window
        // with nothing taken had nothing to take up to its end.
        let reached = match (taken, measured) {
            (Taken::UpTo(last), _) => Some(last),
            // Rows it cannot publish carry no place: it got no further.
            (Taken::Unplaced, _) => window.from,
            (Taken::Nothing, Some((end, _))) if newest_reached => {
                Some((end.0 - LATE_COMMIT_MARGIN, uuid::Uuid::nil()))
            }
            (Taken::Nothing, Some((end, _))) => Some(end),
            (Taken::Nothing, None) => window.from,
        };
        match window.kind {
            Kind::Tail => {
                if let Some(tail) = positions.tail.as_mut() {
                    *tail = (*tail).max(reached);
                }
                // A full window it had nothing to take in: the next one
                // at once, rather than after a poll's sleep.
                !newest_reached && taken == Taken::Nothing
            }
            Kind::Sweep | Kind::FirstSweep => {
                let Some(sweep) = positions
                    .sweep
                    .as_mut()
                    .filter(|sweep| sweep.number == window.sweep)
                else {
                    return false;
                };
                sweep.position = sweep.position.max(reached);
                if window.kind == Kind::Sweep {
                    // The first sweep's claims are every worker's drain,
                    // not the price of sweeping.
                    sweep.cost += cost;
                    sweep.busy = false;
                }
                if !newest_reached {
                    return true;
                }
                let reached = sweep.position;
                positions.last_sweep = Some((sweep.started, sweep.cost));
                positions.sweep = None;
                positions.tail = Some(positions.tail.map_or(reached, |tail| tail.max(reached)));
                false
            }
        }
    }

    /// Records that the claim of `window` failed: its sweep window is
    /// read again by the next claim.
    pub fn failed(&self, scope: &ClaimScope, window: Window) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(positions) = positions_of(&mut state, scope, window) {
            if window.kind == Kind::Sweep {
                if let Some(sweep) = positions
                    .sweep
                    .as_mut()
                    .filter(|sweep| sweep.number == window.sweep)
                {
                    sweep.busy = false;
                }
            }
        }
    }

    /// Records the aggregates of rows whose publish has just been
    /// recorded: their next rows are heads now, wherever they lie.
    pub fn published(&self, aggregates: impl IntoIterator<Item = String>) {
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        published.extend(aggregates);
        if published.len() > MOST_PUBLISHED_WAITING {
            let excess = published.len() - MOST_PUBLISHED_WAITING;
            published.drain(..excess);
            drop(published);
            // The sweep finds what those would have.
            self.sweep_soon();
        }
    }

    /// Up to `most` of the aggregates [`ClaimWindows::published`] recorded,
    /// oldest first, for one claim; the claim puts them back
    /// ([`ClaimWindows::put_back`]) if it fails.
    pub fn take_published(&self, most: usize) -> Vec<String> {
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        let count = most.min(published.len());
        published.drain(..count).collect()
    }

    /// Returns the aggregates of a claim that failed, first in line.
    pub fn put_back(&self, aggregates: Vec<String>) {
        if aggregates.is_empty() {
            return;
        }
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        for aggregate in aggregates.into_iter().rev() {
            published.push_front(aggregate);
        }
    }

    /// Asks for a sweep as soon as none is running: rows were given back
    /// behind the tail.
    pub fn sweep_soon(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for (_, positions) in state.iter_mut() {
            positions.sweep_wanted = true;
        }
    }
}

/// Whether every destination open in `scope` is open in `other`.
fn within(scope: &ClaimScope, other: &ClaimScope) -> bool {
    scope.len() == other.len()
        && scope
            .iter()
            .zip(other)
            .all(|(open, open_there)| !*open || *open_there)
}

/// The positions `window` was handed out from, if they are still kept: a
/// window of a set of destinations that is not current still tells where
/// its claims got to.
fn positions_of<'a>(
    state: &'a mut [(ClaimScope, Positions)],
    scope: &ClaimScope,
    window: Window,
) -> Option<&'a mut Positions> {
    state
        .iter_mut()
        .find(|(kept, positions)| kept == scope && positions.generation == window.generation)
        .map(|(_, positions)| positions)
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

    /// `at(seconds)` less the margin left for late commits.
    fn behind(seconds: i64) -> Option<RowKey> {
        Some((at(seconds).0 - LATE_COMMIT_MARGIN, Uuid::nil()))
    }

    fn one_down() -> ClaimScope {
        vec![true, false, true]
    }

    const FULL: i64 = WINDOW_ROWS;
    const MS: Duration = Duration::from_millis(1);

    /// Windows whose first sweep has reached the newest row at `at(100)`.
    fn swept(now: Instant) -> ClaimWindows {
        let windows = ClaimWindows::default();
        let window = windows.next(&one_down(), now);
        windows.claimed(&one_down(), window, Some((at(100), 5)), Taken::Nothing, MS);
        windows
    }

    #[test]
    fn a_window_that_holds_fewer_rows_than_it_could_reads_to_the_newest_row() {
        let window = ClaimWindows::default().next(&one_down(), Instant::now());
        assert_eq!(
            window.start(Some((at(10), FULL))),
            ClaimStart::Window {
                from: None,
                to: Some(at(10))
            }
        );
        assert_eq!(
            window.start(Some((at(10), FULL - 1))),
            ClaimStart::Window { from: None, to: None }
        );
        assert_eq!(window.start(None), ClaimStart::Window { from: None, to: None });
    }

    #[test]
    fn every_worker_follows_the_first_sweep_until_it_reaches_the_newest_row() {
        let windows = ClaimWindows::default();
        let now = Instant::now();
        let (one, two) = (windows.next(&one_down(), now), windows.next(&one_down(), now));
        assert_eq!((one.from, two.from), (None, None));
        // Nothing to take in a full window of waiting rows: on at once.
        assert!(windows.claimed(&one_down(), one, Some((at(10), FULL)), Taken::Nothing, MS));
        // A full claim took rows up to at(5) in the same window.
        assert!(windows.claimed(&one_down(), two, Some((at(10), FULL)), Taken::UpTo(at(5)), MS));
        let three = windows.next(&one_down(), now);
        assert_eq!(three.from, Some(at(10)), "the furthest either reached");
        assert!(!windows.claimed(&one_down(), three, Some((at(20), 7)), Taken::Nothing, MS));
        let tail = windows.next(&one_down(), now);
        assert_eq!(
            tail.from,
            behind(20),
            "the tail, behind the newest row by the margin"
        );
        assert!(!windows.claimed(&one_down(), tail, Some((at(30), 3)), Taken::UpTo(at(25)), MS));
        assert_eq!(
            windows.next(&one_down(), now).from,
            Some(at(25)),
            "past the last row taken"
        );
    }

    #[test]
    fn a_claim_of_unpublishable_rows_only_moves_nothing() {
        let now = Instant::now();
        let windows = swept(now);
        let tail = windows.next(&one_down(), now);
        windows.claimed(
            &one_down(),
            tail,
            Some((at(200), 5)),
            Taken::of(3, None, false),
            MS,
        );
        assert_eq!(windows.next(&one_down(), now).from, behind(100));
    }

    #[test]
    fn the_tail_never_moves_back() {
        let now = Instant::now();
        let windows = swept(now);
        let (one, two) = (windows.next(&one_down(), now), windows.next(&one_down(), now));
        windows.claimed(&one_down(), one, Some((at(200), 5)), Taken::UpTo(at(150)), MS);
        windows.claimed(&one_down(), two, Some((at(120), 5)), Taken::UpTo(at(110)), MS);
        assert_eq!(windows.next(&one_down(), now).from, Some(at(150)));
    }

    #[test]
    fn one_worker_at_a_time_sweeps_from_the_oldest_row_while_the_others_read_the_tail() {
        let now = Instant::now();
        let windows = swept(now);
        let later = now + SWEEP_EVERY;
        let sweeping = windows.next(&one_down(), later);
        assert_eq!(sweeping.from, None, "a new sweep from the oldest row");
        let other = windows.next(&one_down(), later);
        assert_eq!(
            other.from,
            behind(100),
            "the tail while a window of the sweep is read"
        );
        assert!(windows.claimed(&one_down(), sweeping, Some((at(50), FULL)), Taken::Nothing, MS));
        let sweeping = windows.next(&one_down(), later);
        assert_eq!(sweeping.from, Some(at(50)), "the sweep's next window");
        assert!(!windows.claimed(&one_down(), sweeping, Some((at(300), 9)), Taken::Nothing, MS));
        assert_eq!(
            windows.next(&one_down(), later).from,
            behind(300),
            "the sweep reached the newest row: the tail with it"
        );
    }

    #[test]
    fn a_failed_sweep_window_is_read_again_by_the_next_claim() {
        let now = Instant::now();
        let windows = swept(now);
        let later = now + SWEEP_EVERY;
        let sweeping = windows.next(&one_down(), later);
        windows.failed(&one_down(), sweeping);
        assert_eq!(windows.next(&one_down(), later).from, None);
    }

    #[test]
    fn sweeps_take_a_bounded_share_of_the_time() {
        let now = Instant::now();
        let windows = swept(now);
        let started = now + SWEEP_EVERY;
        let sweeping = windows.next(&one_down(), started);
        assert_eq!(sweeping.from, None);
        // A sweep whose windows cost half a second.
        windows.claimed(
            &one_down(),
            sweeping,
            Some((at(100), 5)),
            Taken::Nothing,
            Duration::from_millis(500),
        );
        let tail = behind(100);
        assert_eq!(
            windows.next(&one_down(), started + Duration::from_secs(4)).from,
            tail
        );
        assert_eq!(
            windows.next(&one_down(), started + Duration::from_secs(5)).from,
            None
        );
    }

    #[test]
    fn the_first_sweep_is_the_drain_and_does_not_delay_the_next() {
        let windows = ClaimWindows::default();
        let now = Instant::now();
        let window = windows.next(&one_down(), now);
        // Every worker's claims of a long drain.
        windows.claimed(
            &one_down(),
            window,
            Some((at(100), 5)),
            Taken::Nothing,
            Duration::from_secs(60),
        );
        assert_eq!(windows.next(&one_down(), now + SWEEP_EVERY).from, None);
    }

    #[test]
    fn a_first_sweep_window_that_comes_back_late_leaves_the_next_sweep_alone() {
        let windows = ClaimWindows::default();
        let now = Instant::now();
        let (one, late) = (windows.next(&one_down(), now), windows.next(&one_down(), now));
        windows.claimed(&one_down(), one, Some((at(100), 5)), Taken::Nothing, MS);
        let later = now + SWEEP_EVERY;
        let sweeping = windows.next(&one_down(), later);
        assert_eq!(sweeping.from, None, "the next sweep");
        assert!(!windows.claimed(&one_down(), late, Some((at(200), 5)), Taken::UpTo(at(150)), MS));
        assert_eq!(
            windows.next(&one_down(), later).from,
            behind(100),
            "the sweep is still being read"
        );
        assert!(windows.claimed(&one_down(), sweeping, Some((at(50), FULL)), Taken::Nothing, MS));
        assert_eq!(
            windows.next(&one_down(), later).from,
            Some(at(50)),
            "from where its own window got to"
        );
    }

    #[test]
    fn the_tail_steps_over_a_full_window_it_cannot_take_from_at_once() {
        let now = Instant::now();
        let windows = swept(now);
        let tail = windows.next(&one_down(), now);
        assert!(windows.claimed(&one_down(), tail, Some((at(300), FULL)), Taken::Nothing, MS));
        let tail = windows.next(&one_down(), now);
        assert_eq!(tail.from, Some(at(300)));
        assert!(!windows.claimed(&one_down(), tail, Some((at(400), 5)), Taken::Nothing, MS));
    }

    #[test]
    fn rows_given_back_behind_the_tail_start_a_sweep_at_once() {
        let now = Instant::now();
        let windows = swept(now);
        assert_eq!(windows.next(&one_down(), now).from, behind(100));
        windows.sweep_soon();
        assert_eq!(windows.next(&one_down(), now).from, None);
    }

    #[test]
    fn other_destinations_open_have_positions_of_their_own() {
        let now = Instant::now();
        let windows = swept(now);
        let tail = windows.next(&one_down(), now);
        let other = vec![false, true, true];
        let first = windows.next(&other, now);
        assert_eq!(first.from, None, "a first sweep of its own");
        // A window handed out for the first set still counts for it.
        assert!(!windows.claimed(&one_down(), tail, Some((at(500), 1)), Taken::UpTo(at(400)), MS));
        windows.claimed(&other, first, Some((at(50), FULL)), Taken::Nothing, MS);
        assert_eq!(
            windows.next(&other, now).from,
            Some(at(50)),
            "its first sweep goes on"
        );
        // Back to the first set: a destination open now was not a moment
        // ago, so one sweep from the oldest row, then its tail.
        assert_eq!(windows.next(&one_down(), now).from, None, "a sweep");
        assert_eq!(windows.next(&one_down(), now).from, Some(at(400)), "its tail");
    }

    #[test]
    fn a_first_sweep_goes_on_where_it_got_to_however_often_the_destinations_change() {
        let now = Instant::now();
        let windows = ClaimWindows::default();
        let other = vec![false, true, true];
        for end in 1..=5 {
            let window = windows.next(&one_down(), now);
            assert_eq!(window.from, (end > 1).then(|| at(end - 1)));
            assert!(windows.claimed(&one_down(), window, Some((at(end), FULL)), Taken::Nothing, MS));
            windows.next(&other, now);
        }
        let window = windows.next(&one_down(), now);
        assert_eq!(window.from, Some(at(5)));
        assert!(!windows.claimed(&one_down(), window, Some((at(6), 3)), Taken::Nothing, MS));
        // Reached the newest row: the tail, after the sweep that the
        // change back asked for.
        assert_eq!(windows.next(&one_down(), now).from, None);
        assert_eq!(windows.next(&one_down(), now).from, Some(at(5)));
    }

    #[test]
    fn back_to_fewer_destinations_the_tail_goes_on_without_a_sweep() {
        let now = Instant::now();
        let windows = swept(now);
        let every = vec![true, true, true];
        let window = windows.next(&every, now);
        windows.claimed(&every, window, Some((at(300), 5)), Taken::Nothing, MS);
        assert_eq!(windows.next(&one_down(), now).from, behind(100));
    }

    #[test]
    fn rows_given_back_ask_every_kept_set_of_destinations_for_a_sweep() {
        let now = Instant::now();
        let windows = swept(now);
        let every = vec![true, true, true];
        let window = windows.next(&every, now);
        windows.claimed(&every, window, Some((at(300), 5)), Taken::Nothing, MS);
        windows.sweep_soon();
        assert_eq!(windows.next(&one_down(), now).from, None);
        assert_eq!(windows.next(&every, now).from, None);
    }

    #[test]
    fn a_destination_closing_leaves_the_others_claims_where_they_were() {
        let now = Instant::now();
        let every = vec![true, true, true];
        let windows = ClaimWindows::default();
        let window = windows.next(&every, now);
        windows.claimed(&every, window, Some((at(50), FULL)), Taken::Nothing, MS);
        // Half-way through the first sweep: the smaller set goes on from
        // there, and the larger one's window still counts for it alone.
        let larger = windows.next(&every, now);
        let smaller = windows.next(&one_down(), now);
        assert_eq!(smaller.from, Some(at(50)));
        windows.claimed(&every, larger, Some((at(100), 5)), Taken::Nothing, MS);
        assert_eq!(windows.next(&one_down(), now).from, Some(at(50)));
        windows.claimed(&one_down(), smaller, Some((at(90), 5)), Taken::UpTo(at(80)), MS);
        assert_eq!(windows.next(&one_down(), now).from, Some(at(80)), "the tail");
    }

    #[test]
    fn a_full_window_measured_lately_serves_the_claims_that_start_inside_it() {
        let measures = WindowMeasures::default();
        let now = Instant::now();
        measures.measured(Some(at(10)), Some((at(50), FULL)), now);
        // Not full: reaches the newest row, which moves on.
        measures.measured(Some(at(60)), Some((at(70), FULL - 1)), now);
        assert_eq!(measures.reuse(Some(at(10)), now), Some((at(50), FULL)));
        assert_eq!(measures.reuse(Some(at(30)), now), Some((at(50), FULL)));
        assert_eq!(
            measures.reuse(Some(at(50)), now),
            None,
            "at its end: the next window"
        );
        assert_eq!(measures.reuse(Some(at(5)), now), None, "before its start");
        assert_eq!(measures.reuse(Some(at(60)), now), None);
        assert_eq!(measures.reuse(Some(at(30)), now + MEASURE_REUSE), None, "too old");
        // From the oldest row: a sweep's window, kept beside the tail's.
        measures.measured(None, Some((at(5), FULL)), now);
        assert_eq!(measures.reuse(None, now), Some((at(5), FULL)));
        assert_eq!(measures.reuse(Some(at(30)), now), Some((at(50), FULL)));
    }

    #[test]
    fn positions_are_kept_for_the_last_few_sets_of_destinations() {
        let now = Instant::now();
        let windows = swept(now);
        for closed in 0..KEPT_SCOPES {
            let mut scope = vec![true; KEPT_SCOPES + 1];
            scope[closed] = false;
            windows.next(&scope, now);
        }
        assert_eq!(
            windows.next(&one_down(), now).from,
            None,
            "forgotten: a first sweep again"
        );
        let window = windows.next(&one_down(), now);
        assert_eq!(window.from, None, "every worker follows it");
    }

    #[test]
    fn aggregates_published_go_to_the_next_claims_in_order_and_a_failed_claim_puts_them_back_first() {
        let windows = ClaimWindows::default();
        windows.published(["a", "b", "c"].map(str::to_owned));
        let first = windows.take_published(2);
        assert_eq!(first, ["a", "b"]);
        windows.published(["d".to_owned()]);
        windows.put_back(first);
        assert_eq!(windows.take_published(10), ["a", "b", "c", "d"]);
        assert!(windows.take_published(10).is_empty());
    }

    #[test]
    fn too_many_aggregates_waiting_drop_the_oldest_and_ask_for_a_sweep() {
        let now = Instant::now();
        let windows = swept(now);
        windows.published((0..MOST_PUBLISHED_WAITING).map(|n| n.to_string()));
        assert_eq!(windows.next(&one_down(), now).from, behind(100), "no sweep yet");
        windows.published(["newest".to_owned()]);
        assert_eq!(windows.next(&one_down(), now).from, None, "a sweep at once");
        let waiting = windows.take_published(usize::MAX);
        assert_eq!(waiting.len(), MOST_PUBLISHED_WAITING);
        assert_eq!(waiting.first().map(String::as_str), Some("1"));
        assert_eq!(waiting.last().map(String::as_str), Some("newest"));
    }

    #[test]
    fn a_claim_whose_rows_all_came_from_elsewhere_moves_the_window_on_only_if_it_read_it_all() {
        let now = Instant::now();
        let windows = swept(now);
        let tail = windows.next(&one_down(), now);
        // Full, or cut by the byte budget: rows of the window may be left.
        windows.claimed(
            &one_down(),
            tail,
            Some((at(200), FULL)),
            Taken::of(100, None, false),
            MS,
        );
        assert_eq!(windows.next(&one_down(), now).from, behind(100));
        let tail = windows.next(&one_down(), now);
        windows.claimed(
            &one_down(),
            tail,
            Some((at(200), FULL)),
            Taken::of(7, None, true),
            MS,
        );
        assert_eq!(windows.next(&one_down(), now).from, Some(at(200)));
    }

    #[test]
    fn a_claim_that_took_nothing_but_left_rows_unleased_keeps_its_window() {
        assert_eq!(Taken::of(0, None, true), Taken::Nothing);
        let now = Instant::now();
        let windows = swept(now);
        let tail = windows.next(&one_down(), now);
        let from = tail.from;
        // Every row it locked changed under it, so none was leased: they
        // are still due, in this window.
        windows.claimed(
            &one_down(),
            tail,
            Some((at(200), 5)),
            Taken::of(0, None, false),
            MS,
        );
        assert_eq!(windows.next(&one_down(), now).from, from);
    }
}
