//! The kit every sink's fault cases use: a relay against a database of its
//! own and a [`Broker`] of the sink's, and one set of assertions per class
//! of broker answer.
//!
//! - [`Bench::assert_outage`]: an answer every row would get (backpressure,
//!   authorisation, a missing destination, a 5xx, a lost connection, a
//!   timeout). `/readyz` answers 503 with the reason, nothing is
//!   quarantined or charged, the relay asks the broker a few times a second
//!   at most and touches a few rows a second at most, `/healthz` stays 200.
//! - [`Bench::assert_delivered`]: once the fault ends, every row arrives,
//!   each published on its first counted attempt, and `/readyz` is 200.
//! - [`Bench::assert_row_fault`]: an answer about one message (a refusal,
//!   or a message that can never fit): that row is retried until out of
//!   attempts ([`RowFault::Retry`]) or quarantined at once
//!   ([`RowFault::Reject`]), with the reason; every other row arrives and
//!   the relay stays ready.
//!
//! A sink's cases live in its own file and only say how to cause the fault
//! and how to end it; adding a sink means writing its [`Broker`] and its
//! cases, never copying these assertions.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use uuid::Uuid;

use crate::common::system::free_port;
use crate::common::{eventually, http_get, quick_settings, RelayProcess, TestDb};

/// Deadline of every wait; a passing case never waits this long.
pub const WAIT: Duration = Duration::from_secs(120);

/// Attempts before quarantine in every case: low, so that an outage charged
/// to rows would quarantine them within a few seconds.
pub const MAX_ATTEMPTS: u32 = 2;

/// How long request and row-update rates are measured during an outage.
const RATE_WINDOW: Duration = Duration::from_secs(6);

/// The most broker requests a second a replica may make while the broker
/// gives an answer every row would get ("a few a second").
pub const MAX_REQUESTS_PER_SECOND: f64 = 5.0;

/// The most outbox rows a second a replica may update (claim and give back)
/// during such an outage: a probe batch is at most 10 rows, claimed and
/// given back, a few times a second at first and every 2.5–5 s after.
pub const MAX_ROW_UPDATES_PER_SECOND: f64 = 40.0;

/// A sink's broker side for one case: where the relay publishes, and what
/// arrived there.
pub trait Broker: Send + Sync {
    /// The relay settings that publish to this broker.
    fn env(&self) -> Vec<(&'static str, String)>;

    /// Ids of every message received so far (consuming them from the
    /// broker; each call adds to what earlier calls returned).
    fn received(&self) -> BoxFuture<'_, HashSet<Uuid>>;

    /// Requests the relay has sent the broker so far, where the case can
    /// count them (an HTTP proxy in front of it); `None` otherwise.
    fn requests(&self) -> Option<u64> {
        None
    }
}

/// Whose fault a refusal of one row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowFault {
    /// Refused this time: charged an attempt, quarantined once out of them.
    Retry,
    /// Can never succeed: quarantined on its first attempt.
    Reject,
}

/// A relay, its database and its broker.
pub struct Bench<B: Broker> {
    pub db: TestDb,
    pub broker: B,
    pub http: u16,
    relay: Option<RelayProcess>,
    /// Every id ever received, accumulated across [`Broker::received`] calls.
    arrived: std::sync::Mutex<HashSet<Uuid>>,
}

impl<B: Broker> Bench<B> {
    /// A migrated database and `broker`; the relay is not started yet.
    pub async fn new(broker: B) -> Self {
        let db = TestDb::migrated().await;
        // Counts every row the relay updates or deletes, as it happens: a
        // sequence is not transactional, so nothing waits on it, and unlike
        // the statistics views it does not lag.
        db.client
            .batch_execute(
                "CREATE SEQUENCE conformance_row_writes;
                 CREATE FUNCTION conformance_count_write() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM nextval('conformance_row_writes'); RETURN NULL; END $$;
                 CREATE TRIGGER conformance_count_writes AFTER UPDATE OR DELETE ON outbox_event
                 FOR EACH ROW EXECUTE FUNCTION conformance_count_write();",
            )
            .await
            .expect("count the relay's row writes");
        Self {
            db,
            broker,
            http: free_port(),
            relay: None,
            arrived: Default::default(),
        }
    }

    /// Starts the relay with quick settings, [`MAX_ATTEMPTS`], the broker's
    /// settings and `extra` (which win).
    pub fn start(&mut self, extra: &[(&'static str, &str)]) {
        let mut env = quick_settings();
        env.push(("OUTBOX_MAX_ATTEMPTS", MAX_ATTEMPTS.to_string()));
        env.push(("OUTBOX_HTTP_ADDR", format!("127.0.0.1:{}", self.http)));
        env.extend(self.broker.env());
        for (key, value) in extra {
            env.retain(|(k, _)| k != key);
            env.push((key, (*value).to_owned()));
        }
        self.relay = Some(RelayProcess::start(&self.db, &env));
    }

    /// Starts the relay as [`Bench::start`] does and waits until it has
    /// delivered a first few rows: the fault a case causes next meets a
    /// relay that is connected and publishing.
    pub async fn start_delivering(&mut self, extra: &[(&'static str, &str)]) {
        let first = self.insert(20, "conformance.before").await;
        self.start(extra);
        self.assert_delivered(&first).await;
    }

    /// Inserts 30 rows of `event_type`, then the row `insert_faulty`
    /// inserts, then 30 more, so that the faulty row shares its batch;
    /// returns the faulty row and the others.
    pub async fn among_good_rows(
        &self,
        event_type: &str,
        insert_faulty: impl std::future::Future<Output = Uuid>,
    ) -> (Uuid, Vec<Uuid>) {
        let mut good = self.insert(30, event_type).await;
        let faulty = insert_faulty.await;
        good.extend(self.insert(30, event_type).await);
        (faulty, good)
    }

    /// Inserts `count` rows of `event_type`.
    pub async fn insert(&self, count: usize, event_type: &str) -> Vec<Uuid> {
        self.db.insert_events(count, event_type).await
    }

    /// Inserts one row with the given fields, as a producer would.
    pub async fn insert_row(&self, event_type: &str, aggregate_id: &str, payload: &str) -> Uuid {
        let id = Uuid::new_v4();
        self.db
            .client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
                 VALUES ($1, $2, $3, $4::text::jsonb, clock_timestamp())",
                &[
                    &id as &(dyn tokio_postgres::types::ToSql + Sync),
                    &event_type,
                    &aggregate_id,
                    &payload,
                ],
            )
            .await
            .expect("insert row");
        id
    }

    /// `GET` one of the relay's endpoints: status and body, `None` while
    /// nothing answers.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http, path).await
    }

    /// Every id received so far.
    pub async fn arrived(&self) -> HashSet<Uuid> {
        let new = self.broker.received().await;
        let mut arrived = self.arrived.lock().expect("arrived ids");
        arrived.extend(new);
        arrived.clone()
    }

    /// Rows updated or deleted in the outbox table so far (the relay is the
    /// only one to update or delete them).
    async fn row_writes(&self) -> i64 {
        self.db
            .client
            .query_one(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM conformance_row_writes",
                &[],
            )
            .await
            .expect("read the row write count")
            .get(0)
    }

    async fn quarantined(&self) -> Vec<(Uuid, i32, String)> {
        self.db
            .client
            .query(
                "SELECT id, attempt_count::int4, coalesce(last_error, '') FROM outbox_event
                 WHERE quarantined_at IS NOT NULL ORDER BY id",
                &[],
            )
            .await
            .expect("read quarantined rows")
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect()
    }

    async fn charged(&self) -> Vec<(Uuid, i32, String)> {
        self.db
            .client
            .query(
                "SELECT id, attempt_count::int4, last_error FROM outbox_event
                 WHERE last_error IS NOT NULL ORDER BY id",
                &[],
            )
            .await
            .expect("read failed rows")
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect()
    }

    /// An answer every row would get: `/readyz` names it (`reason` is part
    /// of the body), and while it lasts nothing is quarantined or charged,
    /// the relay stays live, and it asks the broker and updates rows at a
    /// bounded rate.
    pub async fn assert_outage(&self, reason: &str) {
        let last = std::sync::Mutex::new(None);
        eventually(
            WAIT,
            &format!("/readyz answers 503 naming \"{reason}\""),
            || async {
                let answer = self.get("/readyz").await;
                let hit = matches!(&answer, Some((503, body)) if body.contains(reason));
                // Each different answer once, for a failure's story.
                let mut last = last.lock().expect("last answer");
                if !hit && *last != answer {
                    eprintln!("/readyz: {answer:?}");
                    *last = answer;
                }
                hit
            },
        )
        .await;
        // Past the first few probes, which come quickly.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (writes_before, requests_before, started) =
            (self.row_writes().await, self.broker.requests(), Instant::now());
        tokio::time::sleep(RATE_WINDOW).await;
        let (writes_after, requests_after) = (self.row_writes().await, self.broker.requests());
        let seconds = started.elapsed().as_secs_f64();
        let writes_per_second = (writes_after - writes_before) as f64 / seconds;
        eprintln!(
            "outage \"{reason}\": {writes_per_second:.1} row updates/s, {} broker requests/s",
            match (requests_before, requests_after) {
                (Some(before), Some(after)) => format!("{:.1}", (after - before) as f64 / seconds),
                _ => "(not counted)".to_owned(),
            }
        );
        assert!(
            writes_per_second <= MAX_ROW_UPDATES_PER_SECOND,
            "the relay updated {writes_per_second:.1} rows a second during an outage (at most {MAX_ROW_UPDATES_PER_SECOND})"
        );
        if let (Some(before), Some(after)) = (requests_before, requests_after) {
            let per_second = (after - before) as f64 / seconds;
            assert!(
                per_second <= MAX_REQUESTS_PER_SECOND,
                "the relay sent {per_second:.1} requests a second to a broker giving every row the same answer \
                 (at most {MAX_REQUESTS_PER_SECOND})"
            );
        }
        let quarantined = self.quarantined().await;
        assert!(
            quarantined.is_empty(),
            "{} rows quarantined by an outage; first (id, attempts, reason): {:?}",
            quarantined.len(),
            quarantined.first()
        );
        let charged = self.charged().await;
        assert!(
            charged.is_empty(),
            "{} rows charged an attempt for an outage; first (id, attempts, reason): {:?}",
            charged.len(),
            charged.first()
        );
        let (status, body) = self.get("/readyz").await.expect("/readyz answers");
        assert_eq!(status, 503, "still not ready while the fault lasts: {body}");
        assert!(body.contains(reason), "/readyz names the reason: {body}");
        let (status, body) = self.get("/healthz").await.expect("/healthz answers");
        assert_eq!(status, 200, "an outage leaves the relay live: {body}");
    }

    /// Every row of `ids` arrives and is published, on its first counted
    /// attempt, with no error recorded; `/readyz` is 200 again.
    pub async fn assert_delivered(&self, ids: &[Uuid]) {
        let expected: HashSet<Uuid> = ids.iter().copied().collect();
        eventually(WAIT, &format!("all {} rows arrive", ids.len()), || async {
            expected.is_subset(&self.arrived().await)
        })
        .await;
        eventually(WAIT, "every row is recorded as published", || async {
            self.unpublished(ids).await == 0
        })
        .await;
        let wrongly_charged: Vec<(Uuid, i32, Option<String>)> = self
            .db
            .client
            .query(
                "SELECT id, attempt_count::int4, last_error FROM outbox_event
                 WHERE id = ANY($1) AND (attempt_count <> 1 OR last_error IS NOT NULL)",
                &[&ids],
            )
            .await
            .expect("read attempts")
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        assert!(
            wrongly_charged.is_empty(),
            "{} rows were charged for a fault not their own; first (id, attempts, last_error): {:?}",
            wrongly_charged.len(),
            wrongly_charged.first()
        );
        eventually(WAIT, "/readyz answers 200 once the fault is over", || async {
            matches!(self.get("/readyz").await, Some((200, _)))
        })
        .await;
    }

    async fn unpublished(&self, ids: &[Uuid]) -> i64 {
        self.db
            .client
            .query_one(
                "SELECT count(*) FROM outbox_event WHERE id = ANY($1) AND published_at IS NULL",
                &[&ids],
            )
            .await
            .expect("count unpublished")
            .get(0)
    }

    /// `bad` is refused for its own sake: quarantined with a reason that
    /// contains `reason`, after one attempt ([`RowFault::Reject`]) or all
    /// of them ([`RowFault::Retry`]); never published. Every row of `good`
    /// is delivered as [`Bench::assert_delivered`] says.
    pub async fn assert_row_fault(&self, bad: Uuid, fault: RowFault, reason: &str, good: &[Uuid]) {
        eventually(WAIT, "the faulty row is quarantined", || async {
            self.quarantined().await.iter().any(|(id, _, _)| *id == bad)
        })
        .await;
        let quarantined = self.quarantined().await;
        assert_eq!(
            quarantined.len(),
            1,
            "only the faulty row is quarantined: {quarantined:?}"
        );
        let (_, attempts, last_error) = &quarantined[0];
        let expected_attempts = match fault {
            RowFault::Reject => 1,
            RowFault::Retry => MAX_ATTEMPTS as i32,
        };
        assert_eq!(
            *attempts, expected_attempts,
            "a {fault:?} is quarantined after {expected_attempts} attempt(s): {last_error}"
        );
        assert!(
            last_error.contains(reason),
            "the reason names the fault (\"{reason}\"): {last_error}"
        );
        self.assert_delivered(good).await;
        assert!(
            !self.arrived().await.contains(&bad),
            "the faulty row was never delivered"
        );
    }
}

impl<B: Broker> Drop for Bench<B> {
    fn drop(&mut self) {
        // Stops the relay before the broker's resources go.
        self.relay.take();
    }
}
