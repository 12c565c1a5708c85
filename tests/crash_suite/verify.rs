//! The end-of-run checks: the outbox table, the consumer's ledger and its
//! database against each other and against what the chaos explains.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use crate::chaos::ChaosLog;
use crate::consumers::Ledger;
use crate::producer::UNROUTABLE;
use crate::{routed_key, Run, ROUTES};

/// One outbox row as the suite checks it.
struct Row {
    id: Uuid,
    event_type: String,
    aggregate_id: String,
    attempt_count: i32,
}

/// The end-of-run checks, and the summary line.
pub async fn verify(run: &Run, ledger: &Ledger, chaos: &ChaosLog, one_publish_per_attempt: bool) {
    let (scenario, seed, started, phases) = (&run.scenario, run.seed, run.started, &run.phases);
    let (db, consumer_db) = (&run.db, &run.consumer_db);
    assert_eq!(
        db.count("true").await,
        scenario.events,
        "the producer inserted every event"
    );
    // First: a quarantined row is also an unpublished one, and the more
    // telling of the two.
    let quarantined = db
        .client
        .query_one(
            "SELECT count(*), max(attempt_count)::bigint, left(max(last_error), 300)
             FROM outbox_event WHERE quarantined_at IS NOT NULL",
            &[],
        )
        .await
        .expect("count quarantined rows");
    let (count, attempts, error): (i64, Option<i64>, Option<String>) =
        (quarantined.get(0), quarantined.get(1), quarantined.get(2));
    assert_eq!(
        count, 0,
        "chaos quarantined {count} rows (attempts up to {attempts:?}), e.g. because: {error:?}"
    );
    let unroutable_rows = db.ids_where(&format!("event_type = '{UNROUTABLE}'")).await;
    let routable = scenario.events - i64::try_from(unroutable_rows.len()).unwrap();
    let events = usize::try_from(routable).unwrap();
    assert_eq!(
        db.count(&format!("published_at IS NULL AND event_type <> '{UNROUTABLE}'"))
            .await,
        0,
        "every routable row published"
    );
    assert_eq!(
        db.count(&format!(
            "published_at IS NOT NULL AND event_type = '{UNROUTABLE}'"
        ))
        .await,
        0,
        "no unroutable row marked published"
    );
    assert_eq!(
        db.count(&format!(
            "event_type = '{UNROUTABLE}' AND (attempt_count = 0 OR last_error NOT LIKE '%NO_ROUTE%')"
        ))
        .await,
        0,
        "every unroutable row was tried, and failed as unroutable"
    );
    let rows: Vec<Row> = db
        .client
        .query(
            "SELECT id, event_type, aggregate_id, attempt_count FROM outbox_event
             WHERE event_type <> $1 ORDER BY created_at, id",
            &[&UNROUTABLE],
        )
        .await
        .expect("read the table")
        .iter()
        .map(|row| Row {
            id: row.get(0),
            event_type: row.get(1),
            aggregate_id: row.get(2),
            attempt_count: row.get(3),
        })
        .collect();
    let by_id: HashMap<Uuid, &Row> = rows.iter().map(|row| (row.id, row)).collect();
    // Without kills, a row's only attempt is the one that delivered it: an
    // outage gives its attempt back. A batch whose outcome could not be
    // recorded before its lease ran out keeps its attempt, and the relays
    // report it.
    if scenario.outages && chaos.unrecorded_batches == 0 {
        let charged: Vec<&Row> = rows.iter().filter(|row| row.attempt_count > 1).collect();
        let examples: Vec<(Uuid, i32)> = charged
            .iter()
            .take(5)
            .map(|row| (row.id, row.attempt_count))
            .collect();
        assert!(
            charged.is_empty(),
            "{} rows were charged attempts for outages (id, attempts): {examples:?}",
            charged.len()
        );
    }

    // Everything arrived, and nothing else.
    assert!(
        ledger.malformed.is_empty(),
        "messages without an event id: {:?}",
        ledger.malformed
    );
    assert!(
        ledger.wrong_trace.is_empty(),
        "{} of {} deliveries did not carry their row's traceparent unchanged, e.g. {:?}",
        ledger.wrong_trace.len(),
        ledger.deliveries.len(),
        ledger.wrong_trace.iter().take(3).collect::<Vec<_>>()
    );
    let received: HashSet<Uuid> = ledger.deliveries.iter().map(|(id, _)| *id).collect();
    let undeliverable: Vec<&Uuid> = received.intersection(&unroutable_rows).collect();
    assert!(
        undeliverable.is_empty(),
        "{} unroutable rows reached the consumer",
        undeliverable.len()
    );
    let unknown: Vec<&Uuid> = received.iter().filter(|id| !by_id.contains_key(id)).collect();
    assert!(
        unknown.is_empty(),
        "{} unknown ids, e.g. {:?}",
        unknown.len(),
        unknown.first()
    );
    let missing = rows.iter().filter(|row| !received.contains(&row.id)).count();
    assert_eq!(missing, 0, "{missing} events never reached the consumer");
    if scenario.routes {
        // Each destination gives its messages a routing key of its own:
        // a delivery with another key came through a destination its
        // event's route does not name (or through none of the file's).
        for (event_type, destination) in ROUTES {
            assert!(
                rows.iter().any(|row| row.event_type == event_type),
                "no event of type {event_type}: destination {destination} was not put to the test"
            );
        }
        let misrouted: Vec<(Uuid, &str, &str)> = ledger
            .routing_keys
            .iter()
            .filter(|(id, key)| routed_key(&by_id[id].event_type).as_deref() != Some(key.as_str()))
            .map(|(id, key)| (*id, by_id[id].event_type.as_str(), key.as_str()))
            .collect();
        assert!(
            misrouted.is_empty(),
            "{} of {} deliveries came with a routing key that is not their route's destination's \
             (id, event type, routing key), e.g. {:?}",
            misrouted.len(),
            ledger.routing_keys.len(),
            misrouted.iter().take(3).collect::<Vec<_>>()
        );
    }

    // Duplicates: what the relays sent more than once, apart from what the
    // consumer handed back itself.
    let mut from_relays: HashMap<Uuid, i32> = HashMap::new();
    let mut handed_back = 0;
    for (id, redelivered) in &ledger.deliveries {
        if *redelivered {
            handed_back += 1;
        } else {
            *from_relays.entry(*id).or_default() += 1;
        }
    }
    let duplicates = from_relays.values().map(|n| (*n - 1) as usize).sum::<usize>();
    assert_eq!(
        handed_back,
        ledger.crashed_before_commit + ledger.crashed_after_commit,
        "every message the consumer handed back came back once"
    );
    if one_publish_per_attempt {
        // A message reaches the broker once per claim at most: a duplicate
        // needs a second claim, which the table counts, except for claims
        // whose attempt was given back because the broker or the network
        // failed the batch. Those the relays logged, so every delivery
        // beyond a row's attempts must be one of them.
        let beyond_attempts: usize = from_relays
            .iter()
            .map(|(id, n)| usize::try_from(*n - by_id[id].attempt_count).unwrap_or(0))
            .sum();
        let example: Vec<(Uuid, i32, i32)> = from_relays
            .iter()
            .filter(|(id, n)| **n > by_id[*id].attempt_count)
            .map(|(id, n)| (*id, *n, by_id[id].attempt_count))
            .take(5)
            .collect();
        assert!(
            beyond_attempts <= chaos.unconfirmed_rows,
            "{beyond_attempts} deliveries beyond the rows' attempts, but only {} rows had an attempt given back \
             (id, deliveries, attempts): {example:?}",
            chaos.unconfirmed_rows
        );
    }

    // The consumer applied each event once.
    let (effects, distinct_effects): (i64, i64) = consumer_db
        .client
        .query_one("SELECT count(*), count(DISTINCT message_id) FROM effect", &[])
        .await
        .map(|row| (row.get(0), row.get(1)))
        .expect("count effects");
    let duplicate_effects = effects - distinct_effects;
    let marks: i64 = consumer_db
        .client
        .query_one(
            "SELECT count(*) FROM processed_message WHERE consumer_name = 'crash-suite'",
            &[],
        )
        .await
        .expect("count marks")
        .get(0);

    // First deliveries, per aggregate, against the table's order.
    let mut expected: HashMap<&str, Vec<Uuid>> = HashMap::new();
    for row in &rows {
        expected.entry(&row.aggregate_id).or_default().push(row.id);
    }
    let mut first_seen: HashMap<&str, Vec<Uuid>> = HashMap::new();
    let mut seen = HashSet::new();
    for (id, _) in &ledger.deliveries {
        if seen.insert(*id) {
            first_seen.entry(&by_id[id].aggregate_id).or_default().push(*id);
        }
    }
    let mut out_of_order: Vec<(&str, usize)> = expected
        .iter()
        .filter_map(|(aggregate, order)| {
            let got = &first_seen[aggregate];
            order
                .iter()
                .zip(got)
                .position(|(want, got)| want != got)
                .map(|at| (*aggregate, at))
        })
        .collect();
    out_of_order.sort();

    let bound = chaos.duplicate_bound(scenario.workers);
    let timeline: Vec<String> = phases
        .iter()
        .map(|(phase, at)| format!("{phase} at {:.1}s", (*at - started).as_secs_f64()))
        .collect();
    eprintln!(
        "crash suite [{}, ordering={}, seed={seed}]: events={events} unroutable={} kills={} cuts={} \
         terminations={} (backends {}) alarms={} ({:.1}s) restarts={} unconfirmed_rows={} duplicates_delivered={duplicates} (bound {bound}) \
         consumer_crashes={} (before commit {}, after commit {}) duplicates_skipped={} \
         duplicate_effects={duplicate_effects} aggregates_out_of_order={} max_attempts={} runtime={:.1}s ({})",
        scenario.name,
        if scenario.ordering { "aggregate" } else { "none" },
        unroutable_rows.len(),
        chaos.kills,
        chaos.cuts,
        chaos.terminations,
        chaos.backends_terminated,
        chaos.alarms,
        chaos.alarm_time.as_secs_f64(),
        chaos.restarts,
        chaos.unconfirmed_rows,
        handed_back,
        ledger.crashed_before_commit,
        ledger.crashed_after_commit,
        ledger.skipped,
        out_of_order.len(),
        rows.iter().map(|row| row.attempt_count).max().unwrap_or(0),
        started.elapsed().as_secs_f64(),
        timeline.join(", "),
    );

    assert_eq!(duplicate_effects, 0, "an event's effect was applied twice");
    assert_eq!(effects, routable, "every event applied");
    assert_eq!(marks, routable, "one processed_message mark per event");
    assert_eq!(ledger.applied, events, "one committed First claim per event");
    assert_eq!(
        ledger.applied + ledger.rolled_back + ledger.skipped,
        ledger.deliveries.len(),
        "every delivery was claimed"
    );
    assert!(
        duplicates <= bound,
        "{duplicates} duplicates delivered, more than the chaos explains ({bound})"
    );
    if scenario.ordering {
        assert!(
            out_of_order.is_empty(),
            "{} aggregates had a first delivery out of (created_at, id) order, e.g. {} at position {}",
            out_of_order.len(),
            out_of_order[0].0,
            out_of_order[0].1
        );
    }
}
