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
