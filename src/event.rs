//! The event: one outbox row as the relay reads it, and what every sink
//! turns into a message.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::headers::Headers;

/// One outbox row, as claimed for publishing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Stable id: the message id on every broker.
    pub id: Uuid,
    /// The event that caused this one, if any.
    pub causation_id: Option<Uuid>,
    /// Event type, e.g. `order.created`.
    pub event_type: String,
    /// Aggregate the event belongs to (text, whatever the column type).
    pub aggregate_id: String,
    /// The payload exactly as PostgreSQL renders the JSONB as text.
    pub payload: String,
    /// The producer's `created_at`.
    pub created_at: DateTime<Utc>,
    /// Attempts begun so far, including the current one.
    pub attempt_count: i32,
    /// The producer's headers (the optional `headers` column); empty
    /// without the column or with NULL there.
    pub headers: Headers,
}
