//! The pure half of recording a batch: what becomes of each row, decided
//! from the sink's outcomes. Kept apart from the loop so it can be tested
//! without a database or a broker.

use std::time::Duration;

use uuid::Uuid;

use crate::event::Event;
use crate::retry::Backoff;
use crate::route::Router;
use crate::sink::Outcome;

/// A claimed row: its id, and the attempt the claim counted, which
/// identifies the claim when its outcome is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimedRow {
    /// The row.
    pub id: Uuid,
    /// The claim's attempt (`attempt_count` after the claim).
    pub attempt: i32,
}

impl ClaimedRow {
    fn of(event: &Event) -> Self {
        Self {
            id: event.id,
            attempt: event.attempt_count,
        }
    }
}

/// A row to publish again later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// The row.
    pub row: ClaimedRow,
    /// Why the attempt failed (stored as `last_error`).
    pub reason: String,
    /// How long until the row is due again.
    pub delay: Duration,
}

/// A row to stop claiming until an operator releases it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    /// The row.
    pub row: ClaimedRow,
    /// Why (stored as `last_error`).
    pub reason: String,
}

/// What the relay will do with each row of a batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decisions {
    /// Confirmed by the broker, in the order of the events [`decide`] was
    /// given (the relay pairs them with their events in one walk).
    pub published: Vec<ClaimedRow>,
    /// Failed; try again after the delay.
    pub retry: Vec<Retry>,
    /// Out of attempts or rejected: stop claiming.
    pub quarantine: Vec<Quarantine>,
    /// Failed by the broker or the network, not by the row: the attempt is
    /// given back.
    pub deferred: Vec<ClaimedRow>,
    /// Why the first deferred row was deferred, for the log.
    pub deferred_because: Option<String>,
}

impl Decisions {
    /// Adds another part's decisions to these.
    pub fn append(&mut self, mut other: Decisions) {
        self.published.append(&mut other.published);
        self.retry.append(&mut other.retry);
        self.quarantine.append(&mut other.quarantine);
        self.deferred.append(&mut other.deferred);
        if self.deferred_because.is_none() {
            self.deferred_because = other.deferred_because;
        }
    }
}

/// A claimed batch split by destination.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Routed {
    /// Each destination's rows (its index, its rows in claim order), for
    /// destinations that have any.
    pub batches: Vec<(usize, Vec<Event>)>,
    /// Rows no route matches: quarantined on their first attempt.
    pub unrouted: Vec<Quarantine>,
    /// Rows whose destination the claim was not for: given back.
    pub parked: Vec<ClaimedRow>,
    /// Rows larger than their destination takes (another destination of
    /// the claim takes larger ones, so the claim loaded them), by
    /// destination: quarantined.
    pub oversized: Vec<(usize, Quarantine)>,
}

/// Splits a claimed batch by destination: `open[d]` says whether
/// destination `d` may be given rows now, `max_payload[d]` the largest
/// payload it takes.
pub fn route_batch(events: Vec<Event>, router: &Router, open: &[bool], max_payload: &[usize]) -> Routed {
    let mut routed = Routed::default();
    let mut batches: Vec<Vec<Event>> = (0..open.len()).map(|_| Vec::new()).collect();
    for event in events {
        match router.route(&event.event_type) {
            None => routed.unrouted.push(Quarantine {
                row: ClaimedRow::of(&event),
                reason: format!("no route for event type \"{}\"", event.event_type),
            }),
            Some(destination) if !open.get(destination).copied().unwrap_or(false) => {
                routed.parked.push(ClaimedRow::of(&event))
            }
            Some(destination) if event.payload.len() > max_payload[destination] => routed.oversized.push((
                destination,
                Quarantine {
                    row: ClaimedRow::of(&event),
                    reason: format!(
                        "cannot be published: payload of {} bytes exceeds the largest message the sink accepts ({} bytes)",
                        event.payload.len(),
                        max_payload[destination]
                    ),
                },
            )),
            Some(destination) => batches[destination].push(event),
        }
    }
    routed.batches = batches
        .into_iter()
        .enumerate()
        .filter(|(_, events)| !events.is_empty())
        .collect();
    routed
}

/// Maps outcomes to decisions. `attempt_count` on each event already
/// counts the current attempt (the claim incremented it).
///
/// Outcomes pair with events by position, which the [`crate::sink::Sink`]
/// contract guarantees; a sink that broke it would have every row of the
/// batch retried, never one marked published on another's confirmation.
pub fn decide(events: &[Event], outcomes: Vec<Outcome>, max_attempts: u32, backoff: &Backoff) -> Decisions {
    let outcomes = if outcomes.len() == events.len() {
        outcomes
    } else {
        let reason = format!(
            "the sink returned {} outcomes for a batch of {} (a bug): every row is retried",
            outcomes.len(),
            events.len()
        );
        tracing::error!(%reason, "sink broke its contract");
        vec![Outcome::Retry(reason); events.len()]
    };
    let mut decisions = Decisions::default();
    for (event, outcome) in events.iter().zip(outcomes) {
        let attempt = u32::try_from(event.attempt_count).unwrap_or(0);
        let row = ClaimedRow::of(event);
        match outcome {
            Outcome::Published => decisions.published.push(row),
            Outcome::Reject(reason) => decisions.quarantine.push(Quarantine {
                row,
                reason: format!("rejected by sink: {reason}"),
            }),
            Outcome::Retry(reason) if attempt >= max_attempts => decisions.quarantine.push(Quarantine {
                row,
                reason: format!("gave up after {attempt} attempts: {reason}"),
            }),
            Outcome::Retry(reason) => decisions.retry.push(Retry {
                row,
                reason,
                delay: backoff.delay(attempt),
            }),
            Outcome::Deferred(reason) => {
                decisions.deferred.push(row);
                decisions.deferred_because.get_or_insert(reason);
            }
        }
    }
    decisions
}

/// Splits off rows whose earlier attempts all ended without an outcome
/// being recorded (the relay died or was killed while publishing them):
/// they are past their last attempt, so they are quarantined unpublished
/// instead of crashing the relay once more.
pub fn split_exhausted(events: Vec<Event>, max_attempts: u32) -> (Vec<Event>, Vec<Quarantine>) {
    let limit = i64::from(max_attempts);
    let (exhausted, due): (Vec<Event>, Vec<Event>) = events
        .into_iter()
        .partition(|e| i64::from(e.attempt_count) > limit);
    let quarantine = exhausted
        .into_iter()
        .map(|e| Quarantine {
            row: ClaimedRow::of(&e),
            reason: format!(
                "{max_attempts} attempts began without an outcome being recorded (the relay stopped while publishing this row)"
            ),
        })
        .collect();
    (due, quarantine)
}

/// Keeps only the oldest row whose last attempt was interrupted (see
/// `Claimed::interrupted`) when a batch holds any, and gives the others
/// their attempts back (returned), to be claimed again at once. A row
/// that kills the relay (its payload, a client's bug) takes its whole
/// batch down with it, and every row in flight is charged the attempt:
/// retried together, the batch-mates would share each of its attempts
/// until all of them were quarantined. Alone, a row that kills the relay
/// again is charged alone, and each batch-mate is published on a turn of
/// its own. Such rows are at most the batches in flight at the crash, so
/// the relay is back to full batches after as many claims.
pub fn isolate_interrupted(events: Vec<Event>, interrupted: &[Uuid]) -> (Vec<Event>, Vec<ClaimedRow>) {
    if interrupted.is_empty() || events.len() < 2 {
        return (events, Vec::new());
    }
    let Some(alone) = events.iter().position(|e| interrupted.contains(&e.id)) else {
        return (events, Vec::new());
    };
    let mut kept = Vec::with_capacity(1);
    let mut given_back = Vec::with_capacity(events.len() - 1);
    for (position, event) in events.into_iter().enumerate() {
        if position == alone {
            kept.push(event);
        } else {
            given_back.push(ClaimedRow::of(&event));
        }
    }
    (kept, given_back)
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    fn event(attempt_count: i32) -> Event {
        Event {
            id: Uuid::new_v4(),
            causation_id: None,
            event_type: "t".into(),
            aggregate_id: "a".into(),
            payload: "{}".into(),
            created_at: Utc::now(),
            attempt_count,
            headers: Default::default(),
        }
    }

    const BACKOFF: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(60),
    };

    #[test]
    fn outcomes_map_to_mark_backoff_and_quarantine() {
        let events = vec![event(1), event(2), event(3), event(10), event(10)];
        let outcomes = vec![
            Outcome::Published,
            Outcome::Retry("nack".into()),
            Outcome::Reject("too large".into()),
            Outcome::Retry("unroutable".into()),
            Outcome::Deferred("connection lost".into()),
        ];
        let decisions = decide(&events, outcomes, 10, &BACKOFF);
        assert_eq!(decisions.published, vec![ClaimedRow::of(&events[0])]);
        assert_eq!(decisions.retry.len(), 1);
        assert_eq!(decisions.retry[0].row, ClaimedRow::of(&events[1]));
        // An outage never counts towards quarantine, even on the last attempt.
        assert_eq!(decisions.deferred, vec![ClaimedRow::of(&events[4])]);
        let delay = decisions.retry[0].delay;
        assert!(delay >= Duration::from_secs(1) && delay <= Duration::from_secs(2));
        let quarantined: Vec<Uuid> = decisions.quarantine.iter().map(|q| q.row.id).collect();
        assert_eq!(quarantined, vec![events[2].id, events[3].id]);
        assert!(decisions.quarantine[1]
            .reason
            .contains("gave up after 10 attempts"));
    }

    #[test]
    fn published_rows_keep_their_events_order() {
        let events: Vec<Event> = (0..5).map(|_| event(1)).collect();
        let outcomes = vec![
            Outcome::Published,
            Outcome::Retry("nack".into()),
            Outcome::Published,
            Outcome::Deferred("connection lost".into()),
            Outcome::Published,
        ];
        let decisions = decide(&events, outcomes, 10, &BACKOFF);
        let published: Vec<Uuid> = decisions.published.iter().map(|row| row.id).collect();
        assert_eq!(published, vec![events[0].id, events[2].id, events[4].id]);
    }

    #[test]
    fn a_wrong_number_of_outcomes_retries_the_whole_batch() {
        let events = vec![event(1), event(1)];
        let decisions = decide(&events, vec![Outcome::Published], 10, &BACKOFF);
        assert!(decisions.published.is_empty());
        assert_eq!(decisions.retry.len(), 2);
    }

    fn typed(event_type: &str, payload: &str) -> Event {
        Event {
            event_type: event_type.into(),
            payload: payload.into(),
            ..event(1)
        }
    }

    #[test]
    fn a_batch_splits_by_route_and_what_cannot_go_is_set_aside() {
        use crate::route::{Glob, Route};
        let router = Router::new(vec![
            Route {
                event_type: Glob::parse("order.*").expect("glob"),
                destination: 0,
            },
            Route {
                event_type: Glob::parse("payment.*").expect("glob"),
                destination: 1,
            },
            Route {
                event_type: Glob::parse("refund.*").expect("glob"),
                destination: 2,
            },
        ]);
        let events = vec![
            typed("order.created", "{}"),
            typed("payment.settled", "{}"),
            typed("order.paid", "{\"big\":true}"),
            typed("refund.issued", "{}"),
            typed("shipment.sent", "{}"),
            typed("payment.failed", "{}"),
        ];
        let routed = route_batch(events.clone(), &router, &[true, true, false], &[1000, 1000, 1000]);
        let ids = |batch: &[Event]| batch.iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(routed.batches.len(), 2);
        assert_eq!(routed.batches[0].0, 0);
        assert_eq!(ids(&routed.batches[0].1), vec![events[0].id, events[2].id]);
        assert_eq!(routed.batches[1].0, 1);
        assert_eq!(ids(&routed.batches[1].1), vec![events[1].id, events[5].id]);
        assert_eq!(routed.parked, vec![ClaimedRow::of(&events[3])]);
        assert_eq!(routed.unrouted.len(), 1);
        assert_eq!(
            routed.unrouted[0].reason,
            "no route for event type \"shipment.sent\""
        );

        let small = route_batch(events.clone(), &router, &[true, true, true], &[2, 1000, 1000]);
        assert_eq!(small.oversized.len(), 1);
        assert_eq!(small.oversized[0].0, 0);
        assert_eq!(small.oversized[0].1.row.id, events[2].id);
    }

    #[test]
    fn rows_whose_attempts_all_crashed_are_quarantined_unpublished() {
        let fresh = event(10);
        let crashed = event(11);
        let (due, quarantine) = split_exhausted(vec![fresh.clone(), crashed.clone()], 10);
        assert_eq!(due, vec![fresh]);
        assert_eq!(quarantine.len(), 1);
        assert_eq!(quarantine[0].row.id, crashed.id);
    }

    #[test]
    fn the_oldest_interrupted_row_goes_alone_and_the_rest_get_their_attempts_back() {
        let batch: Vec<Event> = (0..5).map(|n| event(1 + n % 2)).collect();
        let interrupted = vec![batch[3].id, batch[1].id];
        let (alone, given_back) = isolate_interrupted(batch.clone(), &interrupted);
        assert_eq!(alone, vec![batch[1].clone()], "the first in claim order");
        let expected: Vec<ClaimedRow> = [0, 2, 3, 4].iter().map(|&n| ClaimedRow::of(&batch[n])).collect();
        assert_eq!(given_back, expected, "each with the attempt the claim counted");

        let (whole, none) = isolate_interrupted(batch.clone(), &[]);
        assert_eq!((whole, none), (batch.clone(), Vec::new()), "no interrupted row");
        let (whole, none) = isolate_interrupted(batch.clone(), &[Uuid::new_v4()]);
        assert_eq!(
            (whole, none),
            (batch.clone(), Vec::new()),
            "an interrupted row not in the batch (quarantined)"
        );
        let single = vec![batch[3].clone()];
        assert_eq!(
            isolate_interrupted(single.clone(), &interrupted),
            (single, Vec::new())
        );
    }
}
