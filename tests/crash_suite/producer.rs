//! The producer: the scenario's events, inserted at a steady pace while the
//! relays run under chaos.

use tokio_postgres::NoTls;

use crate::common::TestDb;
use crate::Scenario;

/// The event type of the rows the broker cannot route (the suite's queue
/// is bound to `chaos.#`).
pub const UNROUTABLE: &str = "unrouted.event";

/// Inserts the scenario's events at a steady pace, as producers would:
/// aggregate `agg-(n % aggregates)`, and `created_at` strictly increasing
/// with `n` (1 ms apart), so the order within an aggregate is well defined
/// and rows are never inserted behind rows already published.
pub fn start_producer(db: &TestDb, scenario: &Scenario) -> tokio::task::JoinHandle<()> {
    let url = db.url.clone();
    let (events, aggregates, unroutable_every) =
        (scenario.events, scenario.aggregates, scenario.unroutable_every);
    let chunks = 100_i64;
    let pause = scenario.produce_for / chunks as u32;
    tokio::spawn(async move {
        let (client, connection) = tokio_postgres::connect(&url, NoTls)
            .await
            .expect("producer connects");
        tokio::spawn(connection);
        let base: chrono::DateTime<chrono::Utc> = client
            .query_one("SELECT now() - interval '1 hour'", &[])
            .await
            .expect("base time")
            .get(0);
        let per_chunk = (events + chunks - 1) / chunks;
        let mut from = 0;
        while from < events {
            let to = (from + per_chunk).min(events) - 1;
            client
                .execute(
                    "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
                     SELECT gen_random_uuid(),
                            CASE WHEN $5::bigint > 0 AND n % $5::bigint = 0 THEN $6 ELSE 'chaos.test' END,
                            'agg-' || (n % $3),
                            jsonb_build_object('n', n), $4::timestamptz + n * interval '1 millisecond'
                     FROM generate_series($1::bigint, $2::bigint) AS n",
                    &[&from, &to, &aggregates, &base, &unroutable_every, &UNROUTABLE],
                )
                .await
                .expect("produce events");
            from = to + 1;
            tokio::time::sleep(pause).await;
        }
    })
}
