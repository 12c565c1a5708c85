//! Every query the relay runs, one function each. The SQL lives in
//! `sql/*.sql`, one statement per file, with `{table}` standing for the
//! validated, quoted outbox table name and `{read:column}` for a column
//! read through its shared cast (`casts.rs`).

mod admin;
mod backlog;
mod casts;
mod claim;
mod columns;
mod connect;
mod listen;
mod migrate;
mod partitions;
mod pooler;
mod presence;
mod settings;
mod table;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use thiserror::Error;
use tokio_postgres::types::Type;
use uuid::Uuid;

use claim::claimed_event;

pub use admin::{QuarantineCursor, QuarantinedRow, RetentionBatch, ADMIN_TIMEOUT, READ_TIMEOUT};
pub use backlog::{Backlog, BacklogCounts, GaugeReading, COUNT_CAP, STUCK_SCAN};
pub use claim::{ClaimBudget, ClaimStart, Claimed, OnPublish, Ordering, RowKey, Unpublishable};
pub use columns::{
    check_columns, check_table, report as report_table_check, Column, Finding, Severity, UnusableTable,
};
pub use connect::{PgTls, SslMode};
pub use listen::listen;
pub use migrate::{migrate, MIGRATIONS};
pub use partitions::{Granularity, Partition, PartitionPass};
pub use pooler::Pooler;
pub use settings::{DatabaseSettings, ListenSettings, MigrateSettings};
pub use table::{describe_pg, DatabaseConfig, Endpoint, TableName};

/// Renders a statement's `{read:column}` placeholders as the store does,
/// for tests that plan the statements in `sql/` themselves.
#[doc(hidden)]
pub use casts::render as render_column_reads;

use pooler::{execute_in_own_transaction, query_in_own_transaction, Param, Session};
use presence::ColumnPresence;

/// A database failure. The messages come from PostgreSQL or the driver and
/// never include the connection password.
#[derive(Debug, Error)]
pub enum StoreError {
    /// No connection could be had from the pool.
    #[error("database unavailable: {}", with_causes(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A statement failed.
    #[error("database error: {}", with_causes(.0))]
    Query(#[from] tokio_postgres::Error),
    /// The server closed the connection.
    #[error("database connection closed")]
    Closed,
    /// A statement did not finish in time.
    #[error("database query timed out after {0:?}")]
    Timeout(Duration),
    /// A migration cannot be applied as written, or left the table short
    /// of what it should have.
    #[error("{0}")]
    Migration(String),
}

impl StoreError {
    /// Whether the statement failed only because another statement of the
    /// relay held a row it needed: a deadlock PostgreSQL broke, or a lock
    /// wait cut short by the relay's lock timeout. The statement changed
    /// nothing and the database is fine, so this is no outage: the caller
    /// tries again at once.
    pub fn is_contention(&self) -> bool {
        use tokio_postgres::error::SqlState;
        matches!(self, Self::Query(e)
            if e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) || e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE))
    }
}

/// The driver's top-level messages ("db error", "error connecting to
/// server") hide the reason in their sources; logs need the whole chain.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // rustls names a certificate problem by its enum variant
        // (UnknownIssuer); an operator needs the words.
        let cause_text = crate::tls::describe(cause).unwrap_or_else(|| cause.to_string());
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Rendered statements for one table.
#[derive(Debug)]
struct Statements {
    /// The claims, indexed by the kind of table they are written for:
    /// `[plain, partitioned]` (see [`LEASED_BY_ROW_VERSION`]).
    claims: [ClaimStatements; 2],
    /// The claims with the route filter, for relays with several
    /// destinations (see [`RouteFilter`]), indexed as `claims`.
    routed: Option<[ClaimStatements; 2]>,
    mark_published: String,
    delete_published: String,
    reschedule: String,
    quarantine: String,
    defer: String,
    give_back: String,
    fresh_window: String,
}

/// Every claim statement, each twice, indexed by whether the table has
/// the optional `headers` column: `[without, with]`.
#[derive(Debug)]
struct ClaimStatements {
    claim: [String; 2],
    /// The claim that first marks the previous batch's confirmed rows.
    claim_after_mark: [String; 2],
    /// The claim that first deletes the previous batch's confirmed rows.
    claim_after_delete: [String; 2],
    /// The ordered claims.
    claim_ordered: OrderedClaims,
}

/// The ordered claims, each indexed as [`ClaimStatements`]'.
#[derive(Debug)]
struct OrderedClaims {
    /// In `(created_at, id)` order within an aggregate.
    by_time: [String; 2],
    /// In `(sequence_number, created_at, id)` order.
    by_sequence: [String; 2],
}

/// How an ordered claim reads the rows of the heads it found behind its
/// start (see claim_ordered.sql) on a plain table: by primary key, one
/// scan of the keys, so that a generic plan has one path to them.
const HEADS_BY_KEY: &str =
    "FROM {table} AS t\n    WHERE t.id = ANY (ARRAY(SELECT head.id FROM heads AS head))\n      AND";

/// As [`HEADS_BY_KEY`], on a partitioned table: joined on id and
/// created_at, so that each head is read from its own partition alone.
const HEADS_IN_THEIR_PARTITIONS: &str =
    "FROM heads AS head\n    JOIN {table} AS t ON t.id = head.id AND t.created_at = head.created_at\n    WHERE";

/// How a claim's lease (claim_lease.sql) finds the rows its candidates
/// locked, on a plain table: by the addresses of the locked row versions,
/// a TID scan that reads no index (a primary-key probe a row cost about
/// 1.6 µs of PostgreSQL time per event; docs/performance.md, "A lease by
/// row address").
///
/// An address names exactly the row version that was locked: this
/// statement holds the row lock until its transaction ends, so no other
/// transaction can update or delete that version, and VACUUM cannot
/// remove it, in between. A candidate that another transaction changed
/// after this statement's snapshot was taken is locked in its newer
/// version, which the lease, under that same snapshot, does not see at
/// its address: the row is not leased, its lock ends with the claim, and
/// a later claim takes it (an ordered or windowed one possibly only at
/// its next sweep). (By key, the lease would have followed the row to its
/// newer version.)
///
/// An address names a row only within one relation, so a table whose
/// rows are also in others (partitions, or tables that inherit from it)
/// is claimed by key. The `tableoid` test makes a claim written for a
/// plain table that runs on a table converted to a partitioned one since
/// lease nothing, never the rows of other partitions that happen to have
/// the same addresses: the rows of a partitioned table are in its
/// partitions, never in the parent that the name resolves to. Such a
/// claim returns its candidates as not leased, and the relay looks at the
/// table's kind at once (see [`Store::converted_under`]).
const LEASED_BY_ROW_VERSION: &str =
    "t.ctid = ANY (ARRAY(SELECT ctid FROM budgeted))\n      AND t.tableoid = '{table}'::regclass";

/// As [`LEASED_BY_ROW_VERSION`], on a partitioned or inherited-from
/// table: by primary key.
const LEASED_BY_KEY: &str = "t.id = ANY (ARRAY(SELECT id FROM budgeted))";

/// The condition that keeps the rows a claim records out of what it
/// claims (see claim.sql). The ids come through a sub-select so that the
/// planner sees no constant array: it expands a constant one of up to
/// 100 elements into as many clauses when it tries to prove partial
/// index predicates and partition constraints, which cost 34–50 ms of
/// planning a claim on a partitioned table of five partitions (2.6 ms
/// this way) and 0.2 ms on a plain one.
///
/// Only a leased row can be among the recorded ones. Each carries the
/// lease of the claim that took it, which only that claim's own outcome
/// clears (every outcome matches the attempt), and the recording matches
/// that same attempt. `quarantine release` and `replay` clear a lease
/// only with the attempt count reset, which no recording matches. So the
/// comparison with every recorded id runs only for rows whose lease ran
/// out, not for each fresh row a claim reads (100 comparisons a row,
/// under a generic plan a linear search: 2–3% of the claim's PostgreSQL
/// CPU in a profile, too little to show in the benchmark's pairs; see
/// docs/performance.md).
const NOT_FINISHED: &str =
    "\n      AND (leased_until IS NULL OR id <> ALL (ARRAY(SELECT unnest($7::uuid[]))))";

impl ClaimStatements {
    /// The claims for a plain or a `partitioned` table, with the route
    /// filter of `routes` routes when there are any.
    fn for_table(table: &TableName, routes: usize, partitioned: bool) -> Self {
        let quoted = table.quoted();
        let render = |sql: &str| casts::render(&sql.replace("{table}", &quoted));
        let (leased_rows, heads_read) = if partitioned {
            (LEASED_BY_KEY, HEADS_IN_THEIR_PARTITIONS)
        } else {
            (LEASED_BY_ROW_VERSION, HEADS_BY_KEY)
        };
        // Both claims select their candidates their own way and budget and
        // lease them the same way.
        let claim = |candidates: &str| {
            let sql = format!("{candidates},\n{}", include_str!("sql/claim_lease.sql"))
                .replace("{leased_rows}", leased_rows);
            HEADERS_COLUMN.map(|headers| render(&sql.replace("{headers}", headers)))
        };
        // The filter's parameters follow all the others of its statement.
        let filter = |column: &str, first_parameter: usize| route_filter(column, first_parameter, routes);
        // A routed claim's window ends after its filter's parameters.
        let window_end = |first_parameter: usize| window_end(first_parameter, routes);
        // The unordered claims' fifth and sixth parameters are where their
        // fresh path starts (see claim.sql).
        let plain_claim = include_str!("sql/claim.sql")
            .replace("{finish}", "")
            .replace("{not_finished}", "")
            .replace("{route_filter}", &filter("event_type", 7))
            .replace("{window_end}", &window_end(9));
        // The recording statement, its pairs moved to $7 and $8 after the
        // claim's six parameters.
        let claim_after = |record: &str| {
            let record = record
                .replace("$1::uuid[]", "$7::uuid[]")
                .replace("$2::int[]", "$8::int[]");
            let finish = include_str!("sql/claim_finish.sql").replace("{record}", &record);
            claim(
                &include_str!("sql/claim.sql")
                    .replace("{finish}", &finish)
                    .replace("{not_finished}", NOT_FINISHED)
                    .replace("{route_filter}", &filter("event_type", 9))
                    .replace("{window_end}", &window_end(11)),
            )
        };
        // The ordered claims' fifth to seventh parameters are where their
        // fresh path starts and the aggregates just published, then come
        // the filter's, if any, and where the fresh path stops: every
        // ordered claim reads in windows (see claim_ordered.sql).
        let ordered = include_str!("sql/claim_ordered.sql")
            .replace("{route_filter}", &filter("t.event_type", 8))
            .replace(
                "{window_end}",
                &window_end_condition(if routes == 0 { 8 } else { 10 }),
            )
            .replace("{heads_read}", heads_read);
        let claim_ordered = OrderedClaims {
            by_time: claim(&ordered).map(|sql| {
                sql.replace("{predecessor_key}", "(p.created_at, p.id)")
                    .replace("{row_key}", "(t.created_at, t.id)")
                    .replace("{head_order}", "first.created_at, first.id")
            }),
            // A row without a sequence number sorts first in its aggregate.
            by_sequence: claim(&ordered).map(|sql| {
                sql.replace(
                    "{predecessor_key}",
                    "(COALESCE(p.sequence_number, -9223372036854775808), p.created_at, p.id)",
                )
                .replace(
                    "{row_key}",
                    "(COALESCE(t.sequence_number, -9223372036854775808), t.created_at, t.id)",
                )
                .replace(
                    "{head_order}",
                    "COALESCE(first.sequence_number, -9223372036854775808), first.created_at, first.id",
                )
            }),
        };
        Self {
            claim: claim(&plain_claim),
            claim_after_mark: claim_after(include_str!("sql/mark_published.sql")),
            claim_after_delete: claim_after(include_str!("sql/delete_published.sql")),
            claim_ordered,
        }
    }
}

/// Appends a route filter's parameters, which follow all the others of a
/// claim (see [`route_filter`]).
fn push_filter<'a>(params: &mut Vec<Param<'a>>, filter: Option<&'a RouteFilter>) {
    if let Some(filter) = filter {
        params.push((&filter.patterns, Type::TEXT_ARRAY));
        params.push((&filter.take, Type::BOOL_ARRAY));
    }
}

/// The route filter's parameters and, after them, where a routed claim's
/// window ends (see [`ClaimStart::Window`]).
fn push_filter_and_end<'a>(
    params: &mut Vec<Param<'a>>,
    filter: Option<&'a RouteFilter>,
    end: &'a (Option<chrono::DateTime<chrono::Utc>>, Option<Uuid>),
) {
    push_filter(params, filter);
    if filter.is_some() {
        params.push((&end.0, Type::TIMESTAMPTZ));
        params.push((&end.1, Type::UUID));
    }
}

/// Where a routed claim's fresh path stops (`$first` timestamptz and
/// `$first+1` uuid, inclusive; NULL reads to the newest row); nothing for
/// a claim without routes.
fn window_end(first: usize, routes: usize) -> String {
    if routes == 0 {
        return String::new();
    }
    window_end_condition(first)
}

/// Where a claim's fresh path stops: `$first` timestamptz and `$first+1`
/// uuid, inclusive; NULL reads to the newest row.
fn window_end_condition(first: usize) -> String {
    let (created_at, id) = (first, first + 1);
    format!(
        "\n      AND (created_at, id) <= (COALESCE(${created_at}::timestamptz, 'infinity'),\n                               COALESCE(${id}::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))"
    )
}

/// The condition that keeps a claim to the rows of the destinations it may
/// publish to: with `routes` routes, the route of a row is the first whose
/// `LIKE` pattern (`$first` text[], in route order) its event type matches,
/// and the row is taken when that route's flag (`$first+1` bool[]) is set;
/// the flag after the last route is for rows no route matches. A `CASE`,
/// so that PostgreSQL stops at the first match as the relay does. The
/// event type is compared as text: a producer's enum column has no `LIKE`
/// of its own, and without the cast every filtered claim would fail.
fn route_filter(column: &str, first: usize, routes: usize) -> String {
    if routes == 0 {
        return String::new();
    }
    let (patterns, takes) = (first, first + 1);
    let arms: String = (1..=routes)
        .map(|route| {
            format!(
                " WHEN {column}::text LIKE (${patterns}::text[])[{route}] THEN (${takes}::bool[])[{route}]"
            )
        })
        .collect();
    format!(
        "\n      AND CASE{arms} ELSE (${takes}::bool[])[{unrouted}] END",
        unrouted = routes + 1
    )
}

impl Statements {
    fn for_table(table: &TableName, routes: usize) -> Self {
        let quoted = table.quoted();
        let render = |sql: &str| casts::render(&sql.replace("{table}", &quoted));
        Self {
            claims: [false, true].map(|partitioned| ClaimStatements::for_table(table, 0, partitioned)),
            routed: (routes > 0).then(|| {
                [false, true].map(|partitioned| ClaimStatements::for_table(table, routes, partitioned))
            }),
            mark_published: render(include_str!("sql/mark_published.sql")),
            delete_published: render(include_str!("sql/delete_published.sql")),
            reschedule: render(&with_last_error_room(include_str!("sql/reschedule.sql"))),
            quarantine: render(&with_last_error_room(include_str!("sql/quarantine.sql"))),
            defer: render(include_str!("sql/defer.sql")),
            give_back: render(include_str!("sql/give_back.sql")),
            fresh_window: render(include_str!("sql/fresh_window.sql")),
        }
    }
}

/// Which rows a claim takes, by route: the `LIKE` patterns of the routes in
/// order, and for each route (and, last, for rows no route matches)
/// whether its rows are taken. A relay with several destinations leaves
/// out the rows of those that are down, or takes only one's rows to probe
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteFilter {
    /// One `LIKE` pattern per route.
    pub patterns: Vec<String>,
    /// One flag per route, then one for unrouted rows.
    pub take: Vec<bool>,
}

/// What a claim returns for the headers: `NULL` on a table without the
/// optional column, the column's JSON text on one with it.
const HEADERS_COLUMN: [&str; 2] = ["NULL::text", "{read:t.headers}"];

/// Default bound on one statement; a hung database must not hang the relay.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The server's own bound on the relay's statements, shorter than
/// [`QUERY_TIMEOUT`]: a claim the relay gave up waiting for must not commit
/// later and lease rows that nobody publishes. Statements that may take
/// longer (migrations, admin commands) set their own with `SET LOCAL`.
const SERVER_STATEMENT_TIMEOUT: &str = "25s";

/// The longest any relay statement waits for a row lock. Claims skip
/// locked rows, and the rows an outcome records are the worker's own
/// leased ones, so a wait is two workers' statements in each other's way:
/// a claim that follows an index entry to a row version another claim is
/// updating waits for it even under `SKIP LOCKED` ("while locking updated
/// version of tuple"), and two such claims that also record their previous
/// batches can wait for each other. Unbounded, that is a deadlock that
/// PostgreSQL breaks only after `deadlock_timeout` (1 s by default) of both
/// workers idle; bounded, one statement gives up after this long, changes
/// nothing, and its worker tries again at once (see
/// [`StoreError::is_contention`]).
const LOCK_WAIT_TIMEOUT: &str = "200ms";

const RELAY_SETTINGS: &str = include_str!("sql/relay_settings.sql");

/// Opens the transaction that a claim (an ordered one only on a plain
/// table), or a recording of a batch's confirmed rows on its own, runs in
/// on a direct connection,
/// with the settings that give it a generic plan (see the file).
const GENERIC_PLAN_BEGIN: &str = include_str!("sql/claim_generic_begin.sql");

/// A statement under a generic plan slower than this has its plan made
/// again (see `query_in_own_transaction`). A claim of a batch takes a few
/// milliseconds; one whose plan reads a table it was not made for takes
/// hundreds (417 ms for 200,000 rows). A long lock wait (up to
/// [`LOCK_WAIT_TIMEOUT`]) trips it too, which costs one planning.
const SLOW_GENERIC_STATEMENT: Duration = Duration::from_millis(100);

/// How a claim statement is planned on a direct connection.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// Once per connection, in the claim's own transaction (see
    /// sql/claim_generic_begin.sql).
    Generic,
    /// For its parameters every time, as the session's statements are.
    Custom,
}

/// Opens the pool's connections with the URL's TLS settings and libpq's
/// `sslmode` fallbacks.
struct TlsConnect(PgTls);

impl deadpool_postgres::Connect for TlsConnect {
    fn connect(
        &self,
        pg: &tokio_postgres::Config,
    ) -> futures::future::BoxFuture<
        '_,
        Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        let pg = pg.clone();
        Box::pin(async move {
            let (client, connection) = self.0.connect(&pg).await?;
            // In the span of whoever opened it (its source's, with several),
            // so the log says whose database failed.
            let task = tokio::spawn(tracing::Instrument::in_current_span(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(error = %with_causes(&e), "database connection failed");
                }
            }));
            Ok((client, task))
        })
    }
}

/// When the relay last saw its database refuse a write as read-only.
///
/// A session opened on a read-only database (a standby a failover left the
/// URL pointing at, or a database set `default_transaction_read_only`)
/// stays read-only when the server becomes writable again: its
/// `transaction_read_only` was settled when it began. So once a write is
/// refused, every connection opened before that moment leaves the pool at
/// its next checkout and is replaced by a new session. A connection opened
/// while the database is still read-only is refused again and replaced
/// again: the relay converges without a restart.
#[derive(Debug, Default)]
struct ReadOnlySeen(std::sync::Mutex<Option<std::time::Instant>>);

impl ReadOnlySeen {
    fn note<T>(&self, result: &Result<T, StoreError>) {
        if let Err(StoreError::Query(e)) = result {
            if e.code() == Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION) {
                *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some(std::time::Instant::now());
            }
        }
    }

    fn outdates(&self, created: std::time::Instant) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_some_and(|seen| created <= seen)
    }
}

/// The outbox table, through a connection pool.
pub struct Store {
    pool: Pool,
    read_only_seen: Arc<ReadOnlySeen>,
    pooler: Pooler,
    table: TableName,
    sql: Statements,
    /// Whether the table has a `sequence_number` column, looked up at the
    /// first ordered claim (the database may be down at start-up).
    has_sequence_column: ColumnPresence,
    /// Whether the table has the producer's `headers` column.
    has_headers_column: ColumnPresence,
    /// Whether the table is partitioned (or inherited from), which decides
    /// how claims lease their rows, how ordered claims read it and whether
    /// they run under a generic plan. A table is converted while relays run
    /// (docs/operations.md), so a plain one is looked up again as an
    /// absent column is, and at once when a claim for a plain table leased
    /// none of the rows it locked. A claim written for a partitioned table
    /// is right on a plain one, only slower; one written for a plain table
    /// leases nothing on a partitioned one (see [`LEASED_BY_ROW_VERSION`]).
    table_partitioned: ColumnPresence,
    /// The `aggregate_id` column's type, looked up at the first ordered
    /// claim that is given aggregates, and again after any ordered claim
    /// failed (a producer may change it).
    aggregate_type: std::sync::Mutex<Option<String>>,
    /// `synchronous_commit` for this store's transactions; `None` keeps
    /// the server's.
    synchronous_commit: Option<&'static str>,
}

impl Store {
    /// Builds the pool; it connects lazily, so this never fails on an
    /// unreachable database. Its transactions commit as the server says:
    /// an operator's command (`replay`, `quarantine release`) is durable
    /// once it returns.
    pub fn new(config: &DatabaseConfig, pool_size: usize) -> Self {
        Self::build(config, pool_size, None)
    }

    /// The relay loop's store: its transactions commit at
    /// `synchronous_commit` (OUTBOX_SYNCHRONOUS_COMMIT, `off` by default).
    /// Everything the relay itself writes may be lost with a crash of
    /// PostgreSQL without losing an event: a lost lease or mark, a lost
    /// reschedule or quarantine, a lost retention delete each leave a row
    /// as it was before, to be published (or deleted) again. And every
    /// commit that waits for the WAL flush, a producer's included, flushes
    /// all the WAL before it: no producer's row is ever acknowledged while
    /// a partition it went into could still be lost.
    pub fn for_relay(config: &DatabaseConfig, pool_size: usize, synchronous_commit: &'static str) -> Self {
        Self::build(config, pool_size, Some(synchronous_commit))
    }

    fn build(config: &DatabaseConfig, pool_size: usize, synchronous_commit: Option<&'static str>) -> Self {
        let mut pg = config.pg.clone();
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(5));
        }
        if pg.get_application_name().is_none() {
            pg.application_name("outbox-relay");
        }
        let manager = Manager::from_connect(
            pg,
            TlsConnect(config.tls.clone()),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let builder = Pool::builder(manager)
            .max_size(pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(10)))
            .recycle_timeout(Some(Duration::from_secs(5)));
        // The relay's settings for its own connections (sql/relay_settings.sql):
        //
        // - plan_cache_mode: plan every statement for its parameters and
        //   the table as it is now. A prepared statement otherwise
        //   settles on a generic plan after five runs, costed for the
        //   table as it was: a relay started beside an empty outbox kept
        //   a mark plan that walked every unpublished row.
        // - enable_bitmapscan: an outbox swings from almost nothing
        //   unpublished (when ANALYZE usually samples it) to a large
        //   backlog (when speed matters). On such stale estimates the
        //   claim chose a bitmap scan of the whole backlog and a sort,
        //   136 ms a batch at 50,000 rows behind, instead of walking the
        //   pending index in order and stopping after a batch. Every
        //   statement here is written for a plain index scan.
        //   (Both found under load in the benchmark.)
        // - statement_timeout: see SERVER_STATEMENT_TIMEOUT.
        // - lock_timeout: see LOCK_WAIT_TIMEOUT.
        // - synchronous_commit: see `for_relay`; the server's when None.
        //   A batch's commit then does not wait for the WAL to reach the
        //   disk (or a synchronous standby) before its rows are published.
        //
        // set_config, not startup options, so poolers that refuse startup
        // options still connect. Behind a transaction pooler they are set
        // in the claim's own transaction instead (see `claim`): the
        // statements that record outcomes then have the client's bound
        // only, which is harmless, as a late one matches its claim's
        // attempt or changes nothing.
        let read_only_seen = Arc::new(ReadOnlySeen::default());
        let builder = builder.pre_recycle(Hook::sync_fn({
            let read_only_seen = read_only_seen.clone();
            move |_, metrics| {
                if read_only_seen.outdates(metrics.created) {
                    return Err(HookError::message("opened before the database refused a write"));
                }
                Ok(())
            }
        }));
        let builder = match config.pooler {
            Pooler::None => builder.post_create(Hook::async_fn(move |client, _| {
                Box::pin(async move {
                    client
                        .query_typed(
                            RELAY_SETTINGS,
                            &[
                                (&false, Type::BOOL),
                                (&SERVER_STATEMENT_TIMEOUT, Type::TEXT),
                                (&LOCK_WAIT_TIMEOUT, Type::TEXT),
                                (&synchronous_commit, Type::TEXT),
                            ],
                        )
                        .await
                        .map_err(HookError::Backend)?;
                    Ok(())
                })
            })),
            Pooler::Transaction => builder,
        };
        let pool = builder
            .build()
            // Building only fails without a runtime for the timeouts, and
            // one is set just above.
            .expect("pool has a runtime for its timeouts");
        Self {
            pool,
            read_only_seen,
            pooler: config.pooler,
            table: config.table.clone(),
            sql: Statements::for_table(&config.table, 0),
            has_sequence_column: ColumnPresence::default(),
            aggregate_type: std::sync::Mutex::default(),
            has_headers_column: ColumnPresence::default(),
            table_partitioned: ColumnPresence::default(),
            synchronous_commit,
        }
    }

    /// Prepares the claims to take a [`RouteFilter`] of `routes` routes.
    pub fn with_routes(mut self, routes: usize) -> Self {
        self.sql = Statements::for_table(&self.table, routes);
        self
    }

    /// The claims to run on a plain or a `partitioned` table: filtered
    /// when a filter is given and the store was prepared for one (without,
    /// the relay leaves out the rows of a destination that is down itself).
    fn claims<'a>(
        &'a self,
        filter: Option<&'a RouteFilter>,
        partitioned: bool,
    ) -> (&'a ClaimStatements, Option<&'a RouteFilter>) {
        let kind = usize::from(partitioned);
        match (&self.sql.routed, filter) {
            (Some(routed), Some(filter)) if filter.take.len() == filter.patterns.len() + 1 => {
                (&routed[kind], Some(filter))
            }
            _ => (&self.sql.claims[kind], None),
        }
    }

    /// The outbox table this store works on.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// A pooled connection, for callers with queries of their own.
    pub async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let client = self.connection().await?;
        bounded(async {
            client.simple_query("SELECT 1").await?;
            Ok(())
        })
        .await
    }

    /// A pooled connection. Waiting for one is bounded by the pool's own
    /// timeouts (a free slot, a new connection, a recycle check), and apart
    /// from the bound of the statements run on it: a statement's client
    /// bound must not shrink by the time spent waiting for a connection,
    /// or the client could give up on a claim that the server still
    /// commits within its `statement_timeout`, leaving rows leased with an
    /// attempt counted and nobody publishing them.
    async fn connection(&self) -> Result<deadpool_postgres::Object, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// Claims due rows and leases them for `lease`: at most `budget.rows`
    /// rows and, past the first, no more than `budget.bytes` of payload.
    /// Returns them in `(created_at, id)` order. With
    /// [`Ordering::Aggregate`] only rows whose predecessors in their
    /// aggregate are all published qualify.
    ///
    /// A row the relay cannot publish as it is (a NULL where a value is
    /// needed, a payload larger than `budget.max_payload`) comes back as an
    /// [`Unpublishable`] row instead of an event; its payload is never
    /// loaded.
    pub async fn claim(
        &self,
        budget: ClaimBudget,
        lease: Duration,
        ordering: Ordering,
    ) -> Result<Claimed, StoreError> {
        self.claim_routed(budget, lease, ordering, None).await
    }

    /// [`Store::claim`]; with a `filter`, only the rows of the routes it
    /// takes qualify.
    pub async fn claim_routed(
        &self,
        budget: ClaimBudget,
        lease: Duration,
        ordering: Ordering,
        filter: Option<&RouteFilter>,
    ) -> Result<Claimed, StoreError> {
        self.claim_from(budget, lease, ordering, filter, ClaimStart::Oldest)
            .await
    }

    /// [`Store::claim_routed`], whose unordered claim reads rows that never
    /// failed from `start` (see [`ClaimStart`]); an ordered claim honours
    /// only a [`ClaimStart::Window`], and reads from the oldest row
    /// otherwise.
    pub async fn claim_from(
        &self,
        budget: ClaimBudget,
        lease: Duration,
        ordering: Ordering,
        filter: Option<&RouteFilter>,
        start: ClaimStart,
    ) -> Result<Claimed, StoreError> {
        self.claim_following(budget, lease, ordering, filter, start, &[])
            .await
    }

    /// [`Store::claim_from`]; an ordered claim with a window also takes the
    /// heads behind the window's start among the aggregates in
    /// `published` (their `aggregate_id`s as text), whose rows the relay
    /// has just published (see claim_ordered.sql). An unordered claim
    /// ignores them.
    pub async fn claim_following(
        &self,
        budget: ClaimBudget,
        lease: Duration,
        ordering: Ordering,
        filter: Option<&RouteFilter>,
        start: ClaimStart,
        published: &[String],
    ) -> Result<Claimed, StoreError> {
        let claimed = self
            .claim_following_once(budget, lease, ordering, filter, start, published)
            .await?;
        if self.converted_under(&claimed).await? {
            return self
                .claim_following_once(budget, lease, ordering, filter, start, published)
                .await;
        }
        Ok(claimed)
    }

    /// [`Store::claim_following`] with the claims for the table's kind as
    /// last looked up.
    async fn claim_following_once(
        &self,
        budget: ClaimBudget,
        lease: Duration,
        ordering: Ordering,
        filter: Option<&RouteFilter>,
        start: ClaimStart,
        published: &[String],
    ) -> Result<Claimed, StoreError> {
        // Only a window bounds what an ordered claim passes over behind
        // its start: the following path finds the successors there, and
        // the sweeps the rest (see relay/windows.rs).
        let start = match (ordering, start) {
            (Ordering::Aggregate, ClaimStart::Window { .. }) | (Ordering::None, _) => start,
            (Ordering::Aggregate, _) => ClaimStart::Oldest,
        };
        let (from, from_id) = start.position();
        let end = start.end();
        let claimed = self
            .with_current_columns(|| async {
                let partitioned = self.claims_a_partitioned_table().await?;
                let (claims, filter) = self.claims(filter, partitioned);
                let sql = &match ordering {
                    Ordering::None => &claims.claim,
                    Ordering::Aggregate if self.orders_by_sequence().await? => {
                        &claims.claim_ordered.by_sequence
                    }
                    Ordering::Aggregate => &claims.claim_ordered.by_time,
                }[usize::from(self.has_headers().await?)];
                let mut params: Vec<Param<'_>> = vec![(&from, Type::TIMESTAMPTZ), (&from_id, Type::UUID)];
                let ordered_sql;
                let sql = match ordering {
                    Ordering::None => {
                        push_filter_and_end(&mut params, filter, &end);
                        sql
                    }
                    Ordering::Aggregate => {
                        // Every ordered claim has a window end, routed or
                        // not (see claim_ordered.sql).
                        params.push((&published, Type::TEXT_ARRAY));
                        push_filter(&mut params, filter);
                        params.push((&end.0, Type::TIMESTAMPTZ));
                        params.push((&end.1, Type::UUID));
                        ordered_sql = sql.replace("{aggregate_type}", &self.aggregate_type().await?);
                        &ordered_sql
                    }
                };
                // A partitioned table's ordered claim joins the table, which
                // a generic plan could do any way (see claim_ordered.sql).
                let plan = if partitioned && ordering == Ordering::Aggregate {
                    Plan::Custom
                } else {
                    Plan::Generic
                };
                self.run_claim(sql, plan, budget, lease, &params).await
            })
            .await;
        if claimed.is_err() && ordering == Ordering::Aggregate {
            // Looked up again by the next ordered claim, in case the
            // column's type is what failed.
            *self.aggregate_type.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        claimed
    }

    /// The type ordered claims cast the aggregates they are given to: the
    /// `aggregate_id` column's, looked up once (see claim_ordered.sql).
    async fn aggregate_type(&self) -> Result<String, StoreError> {
        if let Some(known) = self
            .aggregate_type
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Ok(known);
        }
        let client = self.connection().await?;
        let looked_up: Option<String> = bounded(async {
            let rows = Session::client(self.pooler, &client)
                .query(
                    include_str!("sql/aggregate_type.sql"),
                    &[(&self.table.quoted(), Type::TEXT)],
                )
                .await?;
            Ok(rows.first().map(|row| row.get(0)))
        })
        .await?;
        // Without the column every claim fails anyway, and says why.
        let looked_up = looked_up.unwrap_or_else(|| "text".to_owned());
        *self.aggregate_type.lock().unwrap_or_else(|e| e.into_inner()) = Some(looked_up.clone());
        Ok(looked_up)
    }

    /// Runs a claim, and once more if it failed because an optional column
    /// it names is gone (a producer dropped `headers` or `sequence_number`
    /// while relays run, say by rolling back a migration): the columns are
    /// looked up again first. Any claim statement is all or nothing, so a
    /// failed one recorded and leased nothing.
    async fn with_current_columns<F, Fut>(&self, claim: F) -> Result<Claimed, StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Claimed, StoreError>>,
    {
        match claim().await {
            Err(e) if names_a_missing_column(&e) => {
                tracing::warn!(error = %e, "a column the claim reads is gone; looking up the table's optional columns again");
                self.has_headers_column.forget();
                self.has_sequence_column.forget();
                claim().await
            }
            other => other,
        }
    }

    /// Records the rows the broker confirmed in a worker's previous batch
    /// (pairs as in [`Store::mark_published`]; marked or deleted as
    /// `on_publish` says) and claims the next batch as
    /// [`Store::claim`] with [`Ordering::None`] does, in one statement:
    /// both happen or neither does. Ordered claims cannot see what the
    /// same statement recorded, so they record on their own. A statement
    /// that finds its table converted to a partitioned one (see
    /// [`Store::converted_under`]) stands, and only its claim is made
    /// again: should that fail, the rows are recorded all the same, and
    /// recording them again matches none of them.
    pub async fn record_and_claim(
        &self,
        on_publish: OnPublish,
        ids: &[Uuid],
        attempts: &[i32],
        budget: ClaimBudget,
        lease: Duration,
    ) -> Result<Claimed, StoreError> {
        self.record_and_claim_routed(on_publish, ids, attempts, budget, lease, None)
            .await
    }

    /// [`Store::record_and_claim`] with the route filter of
    /// [`Store::claim_routed`].
    pub async fn record_and_claim_routed(
        &self,
        on_publish: OnPublish,
        ids: &[Uuid],
        attempts: &[i32],
        budget: ClaimBudget,
        lease: Duration,
        filter: Option<&RouteFilter>,
    ) -> Result<Claimed, StoreError> {
        self.record_and_claim_from(
            on_publish,
            ids,
            attempts,
            budget,
            lease,
            filter,
            ClaimStart::Oldest,
        )
        .await
    }

    /// [`Store::record_and_claim_routed`], the claim reading rows that
    /// never failed from `start` (see [`ClaimStart`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn record_and_claim_from(
        &self,
        on_publish: OnPublish,
        ids: &[Uuid],
        attempts: &[i32],
        budget: ClaimBudget,
        lease: Duration,
        filter: Option<&RouteFilter>,
        start: ClaimStart,
    ) -> Result<Claimed, StoreError> {
        let (from, from_id) = start.position();
        let end = start.end();
        let claimed = self
            .with_current_columns(|| async {
                let (claims, filter) = self.claims(filter, self.claims_a_partitioned_table().await?);
                let sql = &match on_publish {
                    OnPublish::Mark => &claims.claim_after_mark,
                    OnPublish::Delete => &claims.claim_after_delete,
                }[usize::from(self.has_headers().await?)];
                let mut params: Vec<Param<'_>> = vec![
                    (&from, Type::TIMESTAMPTZ),
                    (&from_id, Type::UUID),
                    (&ids, Type::UUID_ARRAY),
                    (&attempts, Type::INT4_ARRAY),
                ];
                push_filter_and_end(&mut params, filter, &end);
                self.run_claim(sql, Plan::Generic, budget, lease, &params).await
            })
            .await?;
        if self.converted_under(&claimed).await? {
            // What the statement recorded is committed; only its claim is
            // made again.
            return self
                .claim_following_once(budget, lease, Ordering::None, filter, start, &[])
                .await;
        }
        Ok(claimed)
    }

    /// Whether the caller should claim again because the table has just
    /// been found partitioned (or inherited from) after `claimed`: a claim
    /// written for a plain table that locked rows it could not lease, as it
    /// does on rows that are in other relations now (see
    /// [`LEASED_BY_ROW_VERSION`]). The table is looked at again at once,
    /// rather than at the next periodic look, which would hold those rows
    /// up until then. Only a claim that took nothing is made again; one
    /// that took some rows (the parent's own, of a table that others have
    /// begun to inherit from) returns them, and the next claim leases by
    /// key. If the table is still plain, the rows changed under the claim,
    /// which a later claim takes.
    async fn converted_under(&self, claimed: &Claimed) -> Result<bool, StoreError> {
        if claimed.unleased == 0 {
            return Ok(false);
        }
        // A claim for a partitioned table leases by key, which follows a
        // changed row: its rows changed under it some other way.
        if self.claims_a_partitioned_table().await? {
            return Ok(false);
        }
        self.table_partitioned.forget();
        let converted = self.claims_a_partitioned_table().await?;
        if converted {
            tracing::info!(table = %self.table, "the table's rows are in partitions (or tables inheriting from it) now: claims lease them by key");
        }
        Ok(converted && claimed.events.is_empty() && claimed.unpublishable.is_empty())
    }

    /// Runs one of the claim statements: the budget and lease are its first
    /// four parameters, `more` follow.
    async fn run_claim(
        &self,
        sql: &str,
        plan: Plan,
        budget: ClaimBudget,
        lease: Duration,
        more: &[Param<'_>],
    ) -> Result<Claimed, StoreError> {
        let mut client = self.connection().await?;
        let claimed = bounded(async {
            let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
            let bytes = i64::try_from(budget.bytes).unwrap_or(i64::MAX);
            let max_payload = i64::try_from(budget.max_payload).unwrap_or(i64::MAX);
            let rows = i64::from(budget.rows);
            let mut params: Vec<Param<'_>> = vec![
                (&rows, Type::INT8),
                (&lease_ms, Type::INT8),
                (&bytes, Type::INT8),
                (&max_payload, Type::INT8),
            ];
            params.extend_from_slice(more);
            let rows = match (self.pooler, plan) {
                (Pooler::None, Plan::Generic) => {
                    query_in_own_transaction(
                        &client,
                        GENERIC_PLAN_BEGIN,
                        sql,
                        &params,
                        SLOW_GENERIC_STATEMENT,
                    )
                    .await?
                }
                (Pooler::None, Plan::Custom) => {
                    Session::client(self.pooler, &client).query(sql, &params).await?
                }
                // The settings hold for this transaction only, so the claim
                // gets a transaction of its own to carry them. Unnamed
                // statements are planned every time: there is no plan to
                // keep.
                (Pooler::Transaction, _) => {
                    let tx = client.transaction().await?;
                    let session = Session::transaction(self.pooler, &tx);
                    session
                        .query(
                            RELAY_SETTINGS,
                            &[
                                (&true, Type::BOOL),
                                (&SERVER_STATEMENT_TIMEOUT, Type::TEXT),
                                (&LOCK_WAIT_TIMEOUT, Type::TEXT),
                                (&self.synchronous_commit, Type::TEXT),
                            ],
                        )
                        .await?;
                    let rows = session.query(sql, &params).await?;
                    tx.commit().await?;
                    rows
                }
            };
            let mut claimed = Claimed::default();
            for row in &rows {
                // Unreadable, it counts as not leased: a row is published
                // only under the lease this claim counted.
                if !matches!(row.try_get::<_, Option<bool>>(11), Ok(Some(true))) {
                    claimed.unleased += 1;
                    continue;
                }
                if let (Ok(id), Ok(Some(true))) =
                    (row.try_get::<_, Uuid>(0), row.try_get::<_, Option<bool>>(9))
                {
                    claimed.interrupted.push(id);
                }
                match claimed_event(row, budget.max_payload) {
                    Ok(event) => claimed.events.push(event),
                    Err(unpublishable) => claimed.unpublishable.push(unpublishable),
                }
            }
            // Unreadable, it counts as a cut: the caller then assumes rows
            // may be left, which only costs a window read again.
            claimed.cut_by_bytes = rows
                .first()
                .is_some_and(|row| match row.try_get::<_, Option<i64>>(10) {
                    Ok(left_out) => left_out.unwrap_or(0) > 0,
                    Err(_) => true,
                });
            // Neither UPDATE … RETURNING nor the join of its rows to the
            // candidates gives an order.
            claimed.events.sort_by_key(|e| (e.created_at, e.id));
            Ok(claimed)
        })
        .await;
        self.read_only_seen.note(&claimed);
        claimed
    }

    /// Notes a write refused by a read-only database (see [`ReadOnlySeen`]).
    pub(crate) fn note_write_result<T>(&self, result: &Result<T, StoreError>) {
        self.read_only_seen.note(result);
    }

    /// Whether rows are ordered within an aggregate by the producer's
    /// `sequence_number` column (present on the table) before `created_at`.
    pub async fn orders_by_sequence(&self) -> Result<bool, StoreError> {
        self.has_sequence_column
            .get_or_look_up(|| self.table_has(include_str!("sql/has_sequence_column.sql")))
            .await
    }

    /// Whether the table is partitioned, as claims remember it (see its
    /// field, `table_partitioned`). A plain table that other tables
    /// inherit from counts as partitioned here: its rows are in several
    /// relations too, and only the key names them across all of them.
    async fn claims_a_partitioned_table(&self) -> Result<bool, StoreError> {
        self.table_partitioned
            .get_or_look_up(|| self.table_has(include_str!("sql/rows_in_other_relations.sql")))
            .await
    }

    /// Whether the table has the producer's optional `headers` column,
    /// whose values the sinks carry as message headers.
    pub async fn has_headers(&self) -> Result<bool, StoreError> {
        self.has_headers_column
            .get_or_look_up(|| self.table_has(include_str!("sql/has_headers_column.sql")))
            .await
    }

    /// Runs one of the lookups of what the table has: a column
    /// (`has_*_column.sql`), or rows in other relations
    /// (`rows_in_other_relations.sql`).
    async fn table_has(&self, sql: &str) -> Result<bool, StoreError> {
        let client = self.connection().await?;
        bounded(async {
            let row = Session::client(self.pooler, &client)
                .query_one(sql, &[(&self.table.quoted(), Type::TEXT)])
                .await?;
            Ok(row.get(0))
        })
        .await
    }

    /// Marks confirmed rows published. Rows are given as `(id, attempt)`
    /// pairs, the attempt their claim counted: a row another claim has
    /// taken since is left to that claim.
    pub async fn mark_published(&self, ids: &[Uuid], attempts: &[i32]) -> Result<u64, StoreError> {
        self.record_confirmed(
            &self.sql.mark_published,
            &[(&ids, Type::UUID_ARRAY), (&attempts, Type::INT4_ARRAY)],
        )
        .await
    }

    /// Deletes confirmed rows (`OUTBOX_ON_PUBLISH=delete`); pairs as in
    /// [`Store::mark_published`].
    pub async fn delete_published(&self, ids: &[Uuid], attempts: &[i32]) -> Result<u64, StoreError> {
        self.record_confirmed(
            &self.sql.delete_published,
            &[(&ids, Type::UUID_ARRAY), (&attempts, Type::INT4_ARRAY)],
        )
        .await
    }

    /// Records failed attempts: each row's error and its delay before the
    /// next attempt (the slices are columns of the same rows; attempts as in
    /// [`Store::mark_published`]).
    pub async fn reschedule(
        &self,
        ids: &[Uuid],
        attempts: &[i32],
        errors: &[&str],
        delays: &[Duration],
    ) -> Result<u64, StoreError> {
        let errors = last_errors(errors);
        let delays = millis(delays);
        self.execute(
            &self.sql.reschedule,
            &[
                (&ids, Type::UUID_ARRAY),
                (&attempts, Type::INT4_ARRAY),
                (&errors, Type::TEXT_ARRAY),
                (&delays, Type::INT8_ARRAY),
            ],
        )
        .await
    }

    /// Quarantines rows with their reasons (columns of the same rows).
    pub async fn quarantine(
        &self,
        ids: &[Uuid],
        attempts: &[i32],
        errors: &[&str],
    ) -> Result<u64, StoreError> {
        let errors = last_errors(errors);
        self.execute(
            &self.sql.quarantine,
            &[
                (&ids, Type::UUID_ARRAY),
                (&attempts, Type::INT4_ARRAY),
                (&errors, Type::TEXT_ARRAY),
            ],
        )
        .await
    }

    /// Gives back the attempts of rows the broker or the network failed;
    /// they are due again at once (pairs as in [`Store::mark_published`]).
    pub async fn defer(&self, ids: &[Uuid], attempts: &[i32]) -> Result<u64, StoreError> {
        self.execute(
            &self.sql.defer,
            &[(&ids, Type::UUID_ARRAY), (&attempts, Type::INT4_ARRAY)],
        )
        .await
    }

    /// Gives back rows a claim took, before publishing any of them, with
    /// the claim's attempt (pairs as in [`Store::mark_published`]); each
    /// row whose last attempt was `interrupted` stays known as such to the
    /// next claim.
    pub async fn give_back(
        &self,
        ids: &[Uuid],
        attempts: &[i32],
        interrupted: &[bool],
    ) -> Result<u64, StoreError> {
        self.execute(
            &self.sql.give_back,
            &[
                (&ids, Type::UUID_ARRAY),
                (&attempts, Type::INT4_ARRAY),
                (&interrupted, Type::BOOL_ARRAY),
            ],
        )
        .await
    }

    /// Measures the window of a routed claim from `from` (`None`: the
    /// oldest row; see [`ClaimStart::Window`]): the key of the `rows`-th
    /// row waiting in the fresh index from there, or of its newest row when
    /// fewer remain, and how many rows that is. `None` when none is there.
    pub async fn fresh_window(
        &self,
        from: Option<RowKey>,
        rows: i64,
    ) -> Result<Option<(RowKey, i64)>, StoreError> {
        let (created_at, id) = (from.map(|key| key.0), from.map(|key| key.1));
        let client = self.connection().await?;
        let found = bounded(async {
            Ok(Session::client(self.pooler, &client)
                .query(
                    &self.sql.fresh_window,
                    &[
                        (&created_at, Type::TIMESTAMPTZ),
                        (&id, Type::UUID),
                        (&rows, Type::INT8),
                    ],
                )
                .await?)
        })
        .await;
        Ok(match found?.first() {
            Some(row) => Some(((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?)),
            None => None,
        })
    }

    /// Records confirmed rows on their own (mark_published.sql or
    /// delete_published.sql) under a generic plan, with the settings that
    /// the unordered claims use, which run a copy of the same statement
    /// inside them: on a direct connection it is planned once per
    /// connection, not for every batch, which an ordered relay records on
    /// its own (0.14 ms of planning a batch; see docs/performance.md,
    /// "Ordered claims"). Both statements are written so that a plan made
    /// on an empty table probes the primary key.
    async fn record_confirmed(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        if self.pooler != Pooler::None {
            return self.execute(sql, params).await;
        }
        let client = self.connection().await?;
        let done = bounded(async {
            Ok(
                execute_in_own_transaction(&client, GENERIC_PLAN_BEGIN, sql, params, SLOW_GENERIC_STATEMENT)
                    .await?,
            )
        })
        .await;
        self.read_only_seen.note(&done);
        done
    }

    async fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        let client = self.connection().await?;
        let done =
            bounded(async { Ok(Session::client(self.pooler, &client).execute(sql, params).await?) }).await;
        self.read_only_seen.note(&done);
        done
    }
}

fn millis(delays: &[Duration]) -> Vec<i64> {
    delays
        .iter()
        .map(|delay| i64::try_from(delay.as_millis()).unwrap_or(i64::MAX))
        .collect()
}

/// `last_error` is for a person reading `quarantine list`: one line, and
/// bounded, whatever a broker or driver put in its error text.
fn last_errors(reasons: &[&str]) -> Vec<String> {
    const MAX: usize = 1000;
    reasons
        .iter()
        .map(|reason| {
            let one_line = reason.replace(['\n', '\r'], " ");
            if one_line.len() <= MAX {
                return one_line;
            }
            // The ellipsis within the bound, so that a `varchar(1000)`
            // column takes the text.
            let mut end = MAX - '…'.len_utf8();
            while !one_line.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…", &one_line[..end])
        })
        .collect()
}

/// `sql` with its `{last_error_room}` replaced by the expression (and its
/// comment) that reads how many characters `last_error` takes, shared by
/// the statements that write it.
fn with_last_error_room(sql: &str) -> String {
    sql.replace(
        "{last_error_room}",
        include_str!("sql/last_error_room.sql").trim_end(),
    )
}

/// Whether a statement failed because a column it names does not exist.
fn names_a_missing_column(error: &StoreError) -> bool {
    matches!(error, StoreError::Query(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_COLUMN))
}

/// Bounds the statements run on a connection already taken from the pool,
/// a little above the server's own `statement_timeout`.
async fn bounded<T>(work: impl std::future::Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    tokio::time::timeout(QUERY_TIMEOUT, work)
        .await
        .unwrap_or(Err(StoreError::Timeout(QUERY_TIMEOUT)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_errors_are_single_line_and_bounded() {
        assert_eq!(last_errors(&["a\nb"]), vec!["a b"]);
        let long = "é".repeat(2000);
        let cut = &last_errors(&[&long])[0];
        assert!(cut.len() <= 1000);
        assert!(last_errors(&[&"a".repeat(5000)])[0].chars().count() <= 1000);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn every_claim_statement_is_fully_rendered() {
        let table = TableName::parse("outbox_event").expect("valid name");
        let statements = Statements::for_table(&table, 2);
        let kinds = statements
            .claims
            .iter()
            .chain(statements.routed.as_ref().expect("routed claims"))
            .zip([false, true, false, true]);
        for (sql, partitioned) in kinds {
            let all = [
                &sql.claim,
                &sql.claim_after_mark,
                &sql.claim_after_delete,
                &sql.claim_ordered.by_time,
                &sql.claim_ordered.by_sequence,
            ];
            for statement in all.iter().flat_map(|variants| variants.iter()) {
                // The aggregate_id column's type is filled in at the claim.
                let statement = statement.replace("{aggregate_type}", "text");
                assert!(!statement.contains('{'), "a placeholder is left in:\n{statement}");
                // A plain table's rows are leased where they were locked,
                // a partitioned one's by key.
                assert_eq!(
                    statement.contains(
                        "WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM budgeted))\n      AND t.tableoid = '\"outbox_event\"'::regclass"
                    ),
                    !partitioned
                );
                assert_eq!(
                    statement.contains("WHERE t.id = ANY (ARRAY(SELECT id FROM budgeted))"),
                    partitioned
                );
            }
            for statement in sql.claim_after_mark.iter().chain(&sql.claim_after_delete) {
                // The recorded pairs follow the claim's six parameters.
                assert!(statement.contains("($8::int[])[array_position($7::uuid[], t.id)]"));
                assert!(statement
                    .contains("AND (leased_until IS NULL OR id <> ALL (ARRAY(SELECT unnest($7::uuid[]))))"));
                assert!(!statement.contains("$1::uuid[]"));
            }
            // The unordered claims' fifth and sixth are where they start.
            for statement in sql.claim.iter().chain(&sql.claim_after_mark) {
                assert!(statement.contains("(created_at, id) >= (COALESCE($5::timestamptz, '-infinity'),"));
                assert!(statement.contains("COALESCE($6::uuid, '00000000-0000-0000-0000-000000000000'))"));
            }
            // The ordered ones' too: the fresh path from it, and behind
            // it the heads of the aggregates just published, tested on
            // their index entries; then those aggregates. A plain table's
            // heads are read by key, a partitioned one's in their
            // partitions.
            let ordered = &sql.claim_ordered;
            for statement in ordered.by_time.iter().chain(&ordered.by_sequence) {
                assert_eq!(
                    statement
                        .matches("COALESCE($5::timestamptz, '-infinity')")
                        .count(),
                    2
                );
                assert!(statement.contains("given::{aggregate_type} AS aggregate_id"));
                assert!(statement.contains("FROM unnest($7::text[]) AS given"));
                assert_eq!(
                    statement.contains("WHERE t.id = ANY (ARRAY(SELECT head.id FROM heads AS head))"),
                    !partitioned
                );
                assert_eq!(
                    statement.contains("ON t.id = head.id AND t.created_at = head.created_at"),
                    partitioned
                );
            }
        }
        let [claims, _] = &statements.claims;
        assert!(!claims.claim[0].contains("$7"));
        let [routed, _] = statements.routed.as_ref().expect("routed claims");
        // Both claim paths filter, with the filter's parameters after the others.
        assert_eq!(
            routed.claim[0]
                .matches("event_type::text LIKE ($7::text[])[2] THEN ($8::bool[])[2]")
                .count(),
            2
        );
        assert_eq!(routed.claim[0].matches("ELSE ($8::bool[])[3] END").count(), 2);
        assert_eq!(
            routed.claim_after_mark[1]
                .matches("event_type::text LIKE ($9::text[])[1] THEN ($10::bool[])[1]")
                .count(),
            2
        );
        assert_eq!(
            routed.claim_ordered.by_time[0]
                .matches("t.event_type::text LIKE ($8::text[])[1]")
                .count(),
            3
        );
        assert_eq!(
            routed.claim_ordered.by_time[0]
                .matches("COALESCE($10::timestamptz, 'infinity')")
                .count(),
            1
        );
        // Every ordered claim reads in windows: the end follows the
        // aggregates just published, or the filter's parameters.
        assert!(claims.claim_ordered.by_time[0].contains("COALESCE($8::timestamptz, 'infinity')"));
        assert!(!claims.claim_ordered.by_time[0].contains("$10"));
    }
}
