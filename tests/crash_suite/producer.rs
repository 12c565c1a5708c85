//! The producer: the scenario's events, inserted at a steady pace while the
//! relays run under chaos.

use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};

use crate::common::TestDb;
use crate::{Scenario, SETTLE};

/// The event type of the rows the broker cannot route (the suite's queue
/// is bound to `chaos.#`).
pub const UNROUTABLE: &str = "unrouted.event";

/// The event type of every other row, but in the run with routes (see
/// [`Scenario::event_types`]).
pub const EVENT_TYPE: &str = "chaos.test";

/// Inserts the scenario's events at a steady pace, as producers would:
/// the scenario's event types in turn, aggregate `agg-(n % aggregates)`,
/// and `created_at` strictly increasing with `n` (1 ms apart), so the
/// order within an aggregate is well defined and rows are never inserted
/// behind rows already published. Event `n` has an id derived from `n`,
/// so a chunk whose commit the producer did not see (the database
/// restarted) is inserted again, on a new connection, without doubling
/// any event. `ON CONFLICT` names no columns: on a partitioned table the
/// key is `(id, created_at)`, which a re-insert repeats.
///
/// Each row carries a W3C `traceparent` derived from its id (see
/// [`traceparent`]), as a producer writes its current trace context.
pub fn start_producer(db: &TestDb, scenario: &Scenario) -> tokio::task::JoinHandle<()> {
    start_producer_of(db, scenario, ID_PREFIX)
}

/// What [`start_producer`] derives its ids from: `md5('chaos-' || n)`.
pub const ID_PREFIX: &str = "chaos-";

/// [`start_producer`] with ids derived from `id_prefix` instead, so that
/// producers of several databases write distinct events.
pub fn start_producer_of(
    db: &TestDb,
    scenario: &Scenario,
    id_prefix: &'static str,
) -> tokio::task::JoinHandle<()> {
    let url = db.url.clone();
    let (events, aggregates, unroutable_every) =
        (scenario.events, scenario.aggregates, scenario.unroutable_every);
    let event_types = scenario.event_types();
    let chunks = 100_i64;
    let pause = scenario.produce_for / chunks as u32;
    tokio::spawn(async move {
        let mut client = producer_connection(&url).await;
        let base: chrono::DateTime<chrono::Utc> = client
            .query_one("SELECT now() - interval '1 hour'", &[])
            .await
            .expect("base time")
            .get(0);
        let per_chunk = (events + chunks - 1) / chunks;
        let mut from = 0;
        let give_up_at = Instant::now() + SETTLE;
        while from < events {
            let to = (from + per_chunk).min(events) - 1;
            let inserted = client
                .execute(
                    "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at, headers)
                     SELECT md5($8::text || n)::uuid,
                            CASE WHEN $5::bigint > 0 AND n % $5::bigint = 0 THEN $6
                                 ELSE ($7::text[])[1 + n % cardinality($7::text[])] END,
                            'agg-' || (n % $3),
                            jsonb_build_object('n', n), $4::timestamptz + n * interval '1 millisecond',
                            jsonb_build_object('traceparent',
                                '00-' || md5($8::text || n) || '-' || left(md5($8::text || n), 16) || '-01')
                     FROM generate_series($1::bigint, $2::bigint) AS n
                     ON CONFLICT DO NOTHING",
                    &[
                        &from,
                        &to,
                        &aggregates,
                        &base,
                        &unroutable_every,
                        &UNROUTABLE,
                        &event_types,
                        &id_prefix,
                    ],
                )
                .await;
            match inserted {
                Ok(_) => {
                    from = to + 1;
                    tokio::time::sleep(pause).await;
                }
                Err(e) => {
                    assert!(Instant::now() < give_up_at, "the producer cannot insert: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    client = producer_connection(&url).await;
                }
            }
        }
    })
}

/// A connection for the producer, tried again while the database restarts.
async fn producer_connection(url: &str) -> Client {
    let give_up_at = Instant::now() + SETTLE;
    loop {
        match tokio_postgres::connect(url, NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                return client;
            }
            Err(e) => {
                assert!(Instant::now() < give_up_at, "the producer cannot connect: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The `traceparent` the producer writes into the row `id`: the id's hex as
/// the trace id, its first 16 hex digits as the parent span id.
pub fn traceparent(id: &uuid::Uuid) -> String {
    let hex = id.simple().to_string();
    format!("00-{hex}-{}-01", &hex[..16])
}
