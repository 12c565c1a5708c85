//! What a claim may take and what it returns: the budget, the claimed
//! events, and rows that can never be published as they are, read from the
//! claim's rows without a panic whatever their columns hold.

use uuid::Uuid;

use crate::event::Event;
use crate::headers::Headers;

/// How much one claim may take.
#[derive(Debug, Clone, Copy)]
pub struct ClaimBudget {
    /// Rows at most (`OUTBOX_BATCH_SIZE`).
    pub rows: u32,
    /// Payload bytes at most, past the first row (`OUTBOX_MAX_BATCH_BYTES`).
    pub bytes: usize,
    /// The largest payload the sink can publish: a larger one is not loaded.
    pub max_payload: usize,
}

/// What a claim took.
#[derive(Debug, Default)]
pub struct Claimed {
    /// Rows to publish, in `(created_at, id)` order.
    pub events: Vec<Event>,
    /// Rows that can never be published as they are.
    pub unpublishable: Vec<Unpublishable>,
    /// Claimed rows whose last attempt ended without an outcome (a relay
    /// died or stalled while publishing them), which the relay publishes
    /// one at a time.
    pub interrupted: Vec<Uuid>,
    /// Whether the byte budget left out rows the claim could have taken.
    pub cut_by_bytes: bool,
    /// Candidates the claim locked but did not lease, so did not take: rows
    /// changed after its snapshot was taken, every row of a table
    /// converted to a partitioned one under a claim written for a plain
    /// one, or the rows of tables that began to inherit from a plain one
    /// (see claim_lease.sql). They are still due, for a later claim.
    pub unleased: usize,
}

/// A claimed row the relay cannot publish as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpublishable {
    /// The row.
    pub id: Uuid,
    /// The attempt the claim counted (see [`Event::attempt_count`]).
    pub attempt_count: i32,
    /// Why, naming the column.
    pub reason: String,
}

/// Reads one claimed row. Every column is fetched as optional, so an
/// unexpected NULL names its column instead of panicking.
pub(super) fn claimed_event(row: &tokio_postgres::Row, max_payload: usize) -> Result<Event, Unpublishable> {
    // id and attempt_count identify the claim; the claim statement cannot
    // return a row without them (the primary key, and a counter it just
    // incremented), so a failure here is reported on a nil id and never
    // matches a row when recorded.
    let id: Uuid = row.try_get(0).unwrap_or_default();
    let attempt_count: i32 = row.try_get::<_, Option<i32>>(7).ok().flatten().unwrap_or(0);
    let unpublishable = |reason: String| Unpublishable {
        id,
        attempt_count,
        reason,
    };
    let required = |index: usize, column: &str| -> Result<String, Unpublishable> {
        match row.try_get::<_, Option<String>>(index) {
            Ok(Some(value)) => Ok(value),
            Ok(None) => Err(unpublishable(format!("column {column} is NULL"))),
            Err(e) => Err(unpublishable(format!("column {column} cannot be read: {e}"))),
        }
    };
    let payload_bytes: Option<i64> = row.try_get(5).unwrap_or(None);
    let event_type = required(2, "event_type")?;
    let aggregate_id = required(3, "aggregate_id")?;
    let payload = match (row.try_get::<_, Option<String>>(4), payload_bytes) {
        (Ok(Some(payload)), _) => payload,
        (Ok(None), Some(bytes)) => {
            return Err(unpublishable(format!(
                "payload of {bytes} bytes exceeds the largest message the sink accepts ({max_payload} bytes)"
            )))
        }
        (Ok(None), None) => return Err(unpublishable("column payload is NULL".to_owned())),
        (Err(e), _) => return Err(unpublishable(format!("column payload cannot be read: {e}"))),
    };
    let created_at = match row.try_get::<_, Option<chrono::DateTime<chrono::Utc>>>(6) {
        Ok(Some(created_at)) => created_at,
        Ok(None) => return Err(unpublishable("column created_at is NULL".to_owned())),
        Err(e) => return Err(unpublishable(format!("column created_at cannot be read: {e}"))),
    };
    let causation_id = row
        .try_get::<_, Option<Uuid>>(1)
        .map_err(|e| unpublishable(format!("column causation_id cannot be read: {e}")))?;
    // Parsed once here, so that a row whose headers no sink could carry (not
    // an object of strings, a name the relay sets) is quarantined before it
    // reaches one; each sink checks the rest (names, counts, sizes).
    let headers = match row.try_get::<_, Option<String>>(8) {
        Ok(None) => Headers::default(),
        Ok(Some(json)) => {
            Headers::parse(&json).map_err(|why| unpublishable(format!("column headers {why}")))?
        }
        Err(e) => return Err(unpublishable(format!("column headers cannot be read: {e}"))),
    };
    Ok(Event {
        id,
        causation_id,
        event_type,
        aggregate_id,
        payload,
        created_at,
        attempt_count,
        headers,
    })
}

/// Which rows a claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// Any due row; maximum throughput.
    None,
    /// Per `aggregate_id`, in `(created_at, id)` order: only a row whose
    /// predecessors in its aggregate are all published.
    Aggregate,
}

/// What happens to a row once the broker confirmed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPublish {
    /// Set `published_at` (retention deletes it later).
    Mark,
    /// Delete the row at once.
    Delete,
}

/// Where a claim starts reading the rows that never failed, in
/// `(created_at, id)` order (see `sql/claim.sql`; an ordered claim honours
/// only a [`ClaimStart::Window`]). Retries are always read from the first
/// that is due.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClaimStart {
    /// From the oldest row: finds every due row.
    #[default]
    Oldest,
    /// From this row on, in `(created_at, id)` order: skips the index
    /// entries that published rows leave before it until VACUUM removes
    /// them, and misses any due row before it.
    From(chrono::DateTime<chrono::Utc>, Uuid),
    /// From `from` (`None`: the oldest row) up to `to` inclusive (`None`:
    /// no end), as [`Store::fresh_window`](super::Store::fresh_window)
    /// measures one. Only a routed claim honours the end: it is how a claim
    /// that leaves a destination's rows out is kept from stepping over all
    /// of them (see relay/windows.rs); an unrouted claim reads on past it.
    Window {
        from: Option<RowKey>,
        to: Option<RowKey>,
    },
}

/// A row's place in the claim's `(created_at, id)` order.
pub type RowKey = (chrono::DateTime<chrono::Utc>, Uuid);

impl ClaimStart {
    /// The claim's parameters: NULL reads from the oldest row.
    pub(super) fn position(self) -> (Option<chrono::DateTime<chrono::Utc>>, Option<Uuid>) {
        match self {
            Self::Oldest | Self::Window { from: None, .. } => (None, None),
            Self::From(created_at, id)
            | Self::Window {
                from: Some((created_at, id)),
                ..
            } => (Some(created_at), Some(id)),
        }
    }

    /// Where a routed claim stops reading: NULL reads to the newest row.
    pub(super) fn end(self) -> (Option<chrono::DateTime<chrono::Utc>>, Option<Uuid>) {
        match self {
            Self::Window {
                to: Some((created_at, id)),
                ..
            } => (Some(created_at), Some(id)),
            _ => (None, None),
        }
    }
}
