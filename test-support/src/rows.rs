//! A factory of outbox rows in a given state (pending, backing off,
//! published some time ago, quarantined), for tests that prepare a table.

use uuid::Uuid;

use crate::db::TestDb;

/// Rows in one state, with times relative to the database's `now()`.
#[derive(Debug, Clone, Copy)]
pub struct Rows {
    pub count: usize,
    pub event_type: &'static str,
    /// `created_at = now() - created_ago_s`.
    pub created_ago_s: i64,
    /// `published_at = now() - published_ago_s`; unpublished when `None`.
    pub published_ago_s: Option<i64>,
    /// `next_attempt_at = now() + due_in_s` (negative: overdue).
    pub due_in_s: i64,
    pub attempts: i32,
    /// Quarantined (now) with this last error.
    pub quarantined: Option<&'static str>,
}

impl Rows {
    /// Fresh, due, unpublished rows, as a producer leaves them.
    pub fn pending(count: usize) -> Self {
        Self {
            count,
            event_type: "order.created",
            created_ago_s: 0,
            published_ago_s: None,
            due_in_s: 0,
            attempts: 0,
            quarantined: None,
        }
    }

    /// Of another event type.
    pub fn of_type(self, event_type: &'static str) -> Self {
        Self { event_type, ..self }
    }

    pub fn created_ago(self, seconds: i64) -> Self {
        Self {
            created_ago_s: seconds,
            ..self
        }
    }

    pub fn published_ago(self, seconds: i64) -> Self {
        Self {
            published_ago_s: Some(seconds),
            created_ago_s: self.created_ago_s.max(seconds + 1),
            attempts: 1,
            ..self
        }
    }

    /// Backing off: not due for another `seconds`.
    pub fn due_in(self, seconds: i64) -> Self {
        Self {
            due_in_s: seconds,
            attempts: 3,
            ..self
        }
    }

    pub fn quarantined(self, error: &'static str) -> Self {
        Self {
            quarantined: Some(error),
            attempts: 10,
            ..self
        }
    }

    pub async fn insert<R>(self, db: &TestDb<R>) -> Vec<Uuid> {
        let ids: Vec<Uuid> = (0..self.count).map(|_| Uuid::new_v4()).collect();
        db.client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at, published_at,
                                           attempt_count, next_attempt_at, last_error, quarantined_at)
                 SELECT id, $2, 'agg-1', '{\"n\": 1}'::jsonb,
                        now() - $3::bigint * interval '1 second',
                        now() - $4::bigint * interval '1 second',
                        $5, now() + $6::bigint * interval '1 second',
                        $7::text, CASE WHEN $7::text IS NULL THEN NULL ELSE now() END
                 FROM unnest($1::uuid[]) AS u(id)",
                &[
                    &ids,
                    &self.event_type,
                    &self.created_ago_s,
                    &self.published_ago_s,
                    &self.attempts,
                    &self.due_in_s,
                    &self.quarantined,
                ],
            )
            .await
            .expect("insert rows");
        ids
    }
}

/// A row as a test's producer inserted it, with the payload text
/// PostgreSQL returns (its rendering of the JSON), to compare a message
/// with.
#[derive(Debug, Clone)]
pub struct ProducedRow {
    pub id: Uuid,
    pub causation_id: Option<Uuid>,
    pub event_type: String,
    pub aggregate_id: String,
    pub payload: String,
    /// The producer's headers, as name and value; none on a table without
    /// the `headers` column.
    pub headers: Vec<(String, String)>,
}

/// Inserts one row as a producer would. `created_at` increases with each
/// insert, so claim order is insertion order.
pub async fn produce<R>(
    db: &TestDb<R>,
    causation_id: Option<Uuid>,
    event_type: &str,
    aggregate_id: &str,
    payload: &str,
) -> ProducedRow {
    produce_with_headers(db, causation_id, event_type, aggregate_id, payload, &[]).await
}

/// [`produce`] with the producer's `headers`, which need the optional
/// `headers` column when there are any.
pub async fn produce_with_headers<R>(
    db: &TestDb<R>,
    causation_id: Option<Uuid>,
    event_type: &str,
    aggregate_id: &str,
    payload: &str,
    headers: &[(&str, &str)],
) -> ProducedRow {
    let id = Uuid::new_v4();
    let row = if headers.is_empty() {
        db.client
            .query_one(
                "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload, created_at)
                 VALUES ($1, $2, $3, $4, $5::text::jsonb, clock_timestamp())
                 RETURNING payload::text",
                &[&id, &causation_id, &event_type, &aggregate_id, &payload],
            )
            .await
    } else {
        let (names, values): (Vec<&str>, Vec<&str>) = headers.iter().copied().unzip();
        db.client
            .query_one(
                "INSERT INTO outbox_event (id, causation_id, event_type, aggregate_id, payload, created_at, headers)
                 VALUES ($1, $2, $3, $4, $5::text::jsonb, clock_timestamp(), jsonb_object($6::text[], $7::text[]))
                 RETURNING payload::text",
                &[&id, &causation_id, &event_type, &aggregate_id, &payload, &names, &values],
            )
            .await
    };
    ProducedRow {
        id,
        causation_id,
        event_type: event_type.to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        payload: row.expect("insert row").get(0),
        headers: headers
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect(),
    }
}

/// Rows with every kind of field a message maps: a causation id on every
/// other row, two event types, `aggregates` aggregates, non-ASCII text and
/// JSON whose rendering PostgreSQL decides; with `headers`, a traceparent
/// and a non-ASCII header on every fourth row (the table needs the
/// `headers` column).
pub async fn produce_varied<R>(
    db: &TestDb<R>,
    count: usize,
    aggregates: usize,
    headers: bool,
) -> Vec<ProducedRow> {
    let cause = Uuid::new_v4();
    let mut rows = Vec::with_capacity(count);
    for n in 0..count {
        let payload = format!(
            r#"{{"n": {n}, "note": "ünïcödé ✓ 🎉 \"quoted\"\ttab", "nested": {{"b": [1, 2.50, null], "a": true}}}}"#
        );
        let event_type = if n % 3 == 0 { "order.paid" } else { "order.created" };
        let aggregate = format!("order-{}", n % aggregates);
        let row_headers: &[(&str, &str)] = if headers && n % 4 == 0 {
            &[
                (
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                ),
                ("tenant", "ünï 7"),
            ]
        } else {
            &[]
        };
        rows.push(
            produce_with_headers(
                db,
                (n % 2 == 0).then_some(cause),
                event_type,
                &aggregate,
                &payload,
                row_headers,
            )
            .await,
        );
    }
    rows
}
