//! Admin commands: `status`, `quarantine list`, `quarantine release` and
//! `replay`.
//!
//! Human output is aligned text for a terminal; `--json` output is one line
//! of JSON whose shape is part of the contract (docs/operations.md, Admin
//! commands):
//!
//! - `status --json`: `{"unpublished":N,"oldest_unpublished_age_seconds":F,
//!   "quarantined":N,"published_last_hour":N,"stuck_aggregates":N,
//!   "unpublished_exact":B,"quarantined_exact":B,"stuck_aggregates_exact":B}`, and with
//!   destinations in the configuration file `"destinations":{"<name>":N,…},"unrouted":N,
//!   "destinations_exact":B` (counted among the `COUNT_CAP` oldest unpublished rows)
//!   (a count that is not exact is an estimate, or for stuck aggregates a
//!   lower bound: see `store/sql/backlog.sql`)
//! - `quarantine list --json`: `[{"id":"…","event_type":"…","attempt_count":N,
//!   "last_error":"…"|null,"quarantined_at":"RFC 3339, UTC, microseconds"}]`,
//!   one page (`--limit`, `--after`), written element by element as the rows
//!   arrive; the next page is `--after <last quarantined_at>,<last id>`
//!
//! With `[[source]]` tables in the configuration file every command acts on
//! a [`Target`], a source's database and name: `status` of several sources
//! prints `{"sources":[{"source":"<name>",…the keys above…}|{"source":"<name>",
//! "error":"…"},…]}` (one element per source, in the file's order), and each
//! element of `quarantine list --json` carries `"source":"<name>"`.
//!
//! Every database failure exits with status 1 (`CliError::Failed`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::ops::ControlFlow;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use super::CliError;
use crate::config::{Routing, SourceDatabase};
pub use crate::store::QuarantineCursor;
use crate::store::{describe_pg, DatabaseConfig};
use crate::store::{Backlog, QuarantinedRow, Store, StoreError, COUNT_CAP, STUCK_SCAN};

/// The window of the "published last hour" figure of `status`.
const RECENT_WINDOW: Duration = Duration::from_secs(3600);

/// Longest last error `quarantine list` shows in its table: the relay
/// stores up to 1,000 characters, which would drown the other columns;
/// `--json` has them in full.
const ERROR_COLUMN_WIDTH: usize = 200;

/// What an admin command acts on: one source's database and table, with
/// the source's name when the configuration file names its sources.
#[derive(Debug, Clone)]
pub struct Target {
    /// The source's name, `None` for the environment's one database.
    pub name: Option<String>,
    /// Its database and table.
    pub database: DatabaseConfig,
}

impl Target {
    /// The target of `source`; `named` when the file names its sources.
    pub fn new(source: SourceDatabase, named: bool) -> Self {
        Self {
            name: named.then_some(source.name),
            database: source.database,
        }
    }

    /// Where, for messages: the table, and its source when named.
    fn place(&self) -> String {
        match &self.name {
            Some(name) => format!("{} (source {name})", self.database.table),
            None => self.database.table.to_string(),
        }
    }
}

/// `status --json`.
#[derive(Debug, Serialize)]
struct StatusJson {
    /// The source, when the file names its sources.
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    unpublished: i64,
    oldest_unpublished_age_seconds: f64,
    quarantined: i64,
    published_last_hour: i64,
    stuck_aggregates: i64,
    unpublished_exact: bool,
    quarantined_exact: bool,
    stuck_aggregates_exact: bool,
    /// With routes: the unpublished rows of each destination.
    #[serde(skip_serializing_if = "Option::is_none")]
    destinations: Option<BTreeMap<String, i64>>,
    /// With routes: unpublished rows no route matches.
    #[serde(skip_serializing_if = "Option::is_none")]
    unrouted: Option<i64>,
    /// With routes: whether the per-destination counts cover every
    /// unpublished row (else the oldest `COUNT_CAP`).
    #[serde(skip_serializing_if = "Option::is_none")]
    destinations_exact: Option<bool>,
    /// `--watch`, from the second refresh on: rows published per second
    /// since the previous refresh.
    #[serde(skip_serializing_if = "Option::is_none")]
    published_per_second: Option<f64>,
    /// `--watch`: how fast the unpublished count changed since the
    /// previous refresh (negative while the backlog shrinks).
    #[serde(skip_serializing_if = "Option::is_none")]
    unpublished_change_per_second: Option<f64>,
}

/// `status --json` for several sources: each source's object, or its
/// error.
#[derive(Debug, Serialize)]
struct SourcesJson {
    sources: Vec<serde_json::Value>,
}

/// One source's status, as read.
#[derive(Debug)]
struct SourceStatus {
    backlog: Backlog,
    recent: i64,
    per_destination: Option<PerDestination>,
    /// `--watch`: rates since the previous refresh.
    rates: Option<Rates>,
}

/// What changed between two refreshes of `status --watch`, per second.
#[derive(Debug, Clone, Copy)]
struct Rates {
    published: f64,
    unpublished_change: f64,
}

/// The backlog split by destination, as the routes send it.
#[derive(Debug)]
struct PerDestination {
    counts: BTreeMap<String, i64>,
    unrouted: i64,
    exact: bool,
}

/// One element of `quarantine list --json`.
#[derive(Debug, Serialize)]
struct QuarantinedJson<'a> {
    /// The source, when the file names its sources.
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<&'a str>,
    id: Uuid,
    event_type: &'a str,
    attempt_count: i32,
    last_error: Option<&'a str>,
    quarantined_at: String,
}

/// `outbox-relay status [--json]`: of one source as always, or of every
/// source of the file, each named; `one` when `--source` picked it. A
/// source whose database fails does not hide the others: the command
/// reports it among them and fails at the end.
pub async fn status(
    targets: Vec<Target>,
    json: bool,
    one: bool,
    routes: Option<&Routing>,
) -> Result<(), CliError> {
    if let [target] = targets.as_slice() {
        if target.name.is_none() || one {
            let status = read_status(target, routes).await?;
            let text = if json {
                json_line(&status_json(target, &status))?
            } else {
                render_status(target, &status)
            };
            return emit(&text);
        }
    }
    let statuses = futures::future::join_all(targets.iter().map(|target| read_status(target, routes))).await;
    let mut failed = Vec::new();
    let text = if json {
        let mut sources = Vec::with_capacity(targets.len());
        for (target, status) in targets.iter().zip(&statuses) {
            let name = target.name.clone().unwrap_or_default();
            sources.push(match status {
                Ok(status) => serde_json::to_value(status_json(target, status))
                    .map_err(|e| anyhow::anyhow!("cannot encode JSON: {e}"))?,
                Err(e) => {
                    failed.push(name.clone());
                    serde_json::json!({ "source": name, "error": e.to_string() })
                }
            });
        }
        json_line(&SourcesJson { sources })?
    } else {
        let mut blocks = Vec::with_capacity(targets.len());
        for (target, status) in targets.iter().zip(&statuses) {
            blocks.push(match status {
                Ok(status) => render_status(target, status),
                Err(e) => {
                    let name = target.name.clone().unwrap_or_default();
                    failed.push(name.clone());
                    format!("source  {name}\nerror   {e}\n")
                }
            });
        }
        blocks.join("\n")
    };
    emit(&text)?;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(anyhow::anyhow!(
            "status could not be read for source(s): {}",
            failed.join(", ")
        )))
    }
}

/// Reads one source's status.
async fn read_status(target: &Target, routes: Option<&Routing>) -> Result<SourceStatus, CliError> {
    read_status_from(&Store::new(&target.database, 1), target, routes).await
}

/// Reads one source's status through `store`.
async fn read_status_from(
    store: &Store,
    target: &Target,
    routes: Option<&Routing>,
) -> Result<SourceStatus, CliError> {
    let database = &target.database;
    let backlog = store.backlog().await.map_err(|e| failed(database, e))?;
    let recent = store
        .published_within(RECENT_WINDOW)
        .await
        .map_err(|e| failed(database, e))?;
    let per_destination = match routes {
        Some(routing) => {
            let router = routing.router(target.name.as_deref().unwrap_or(crate::config::DEFAULT_SOURCE));
            let patterns: Vec<String> = router
                .routes()
                .iter()
                .map(|route| route.event_type.like_pattern())
                .collect();
            let (by_route, exact) = store
                .backlog_by_route(&patterns)
                .await
                .map_err(|e| failed(database, e))?;
            let mut counts: BTreeMap<String, i64> = routing
                .destinations
                .iter()
                .map(|destination| (destination.name.clone(), 0))
                .collect();
            for (route, count) in router.routes().iter().zip(&by_route[1..]) {
                *counts
                    .entry(routing.destinations[route.destination].name.clone())
                    .or_default() += count;
            }
            Some(PerDestination {
                counts,
                unrouted: by_route[0],
                exact,
            })
        }
        None => None,
    };
    Ok(SourceStatus {
        backlog,
        recent,
        per_destination,
        rates: None,
    })
}

/// `outbox-relay status --watch [--interval D] [--json]`: the status of
/// every target read again every `every`, with the rates between two
/// refreshes, until Ctrl-C (or SIGTERM), which ends it with status 0.
///
/// On a terminal the view takes the alternate screen, redrawn in place
/// and cut to 80 columns, and gives the terminal back as it was when it
/// ends, however it ends. Elsewhere (a pipe, a file) each refresh is
/// appended. With `--json`, one line per refresh: `status --json`'s object
/// (or `{"sources":[…]}`) with `published_per_second` and
/// `unpublished_change_per_second` from the second refresh on, and `at`.
/// A source that cannot be read shows its error and is read again at the
/// next refresh: a watch outlives a database's blip.
pub async fn status_watch(
    targets: Vec<Target>,
    json: bool,
    one: bool,
    routes: Option<&Routing>,
    every: Duration,
) -> Result<(), CliError> {
    use std::io::IsTerminal as _;
    let stores: Vec<Store> = targets
        .iter()
        .map(|target| Store::new(&target.database, 1))
        .collect();
    let screen = (!json && std::io::stdout().is_terminal()).then(Screen::take);
    let mut previous: Vec<Option<(tokio::time::Instant, i64)>> = vec![None; targets.len()];
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = stop_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = &mut stop => break,
        }
        let read_at = tokio::time::Instant::now();
        let reads =
            futures::future::join_all(targets.iter().zip(&stores).zip(&previous).map(
                |((target, store), previous)| read_with_rates(store, target, routes, *previous, read_at),
            ));
        let statuses = tokio::select! {
            statuses = reads => statuses,
            () = &mut stop => break,
        };
        for (last, status) in previous.iter_mut().zip(&statuses) {
            if let Ok(status) = status {
                *last = Some((read_at, status.backlog.counts.unpublished));
            }
        }
        let at = Utc::now();
        let text = if json {
            watch_json(&targets, &statuses, one, at)?
        } else {
            let header = format!(
                "outbox-relay status  {}  every {}  Ctrl-C stops",
                at.format("%H:%M:%S UTC"),
                human_interval(every)
            );
            let blocks: Vec<String> = targets
                .iter()
                .zip(&statuses)
                .map(|(target, status)| match status {
                    Ok(status) => render_status(target, status),
                    Err(e) => format!(
                        "{}error   {e}\n",
                        target
                            .name
                            .as_ref()
                            .map(|name| format!("source  {name}\n"))
                            .unwrap_or_default()
                    ),
                })
                .collect();
            let view = format!("{header}\n\n{}", blocks.join("\n"));
            match &screen {
                Some(screen) => screen.frame(&view),
                None => format!("{view}\n"),
            }
        };
        emit(&text)?;
    }
    drop(screen);
    Ok(())
}

/// One target's status, and its rates against the `previous` refresh.
async fn read_with_rates(
    store: &Store,
    target: &Target,
    routes: Option<&Routing>,
    previous: Option<(tokio::time::Instant, i64)>,
    read_at: tokio::time::Instant,
) -> Result<SourceStatus, CliError> {
    let mut status = read_status_from(store, target, routes).await?;
    if let Some((then, unpublished)) = previous {
        let elapsed = read_at.duration_since(then);
        let seconds = elapsed.as_secs_f64().max(f64::EPSILON);
        // Rows whose published_at falls since the previous refresh: one
        // read of the published-at index, like "published last hour".
        let published = store
            .published_within(elapsed)
            .await
            .map_err(|e| failed(&target.database, e))?;
        status.rates = Some(Rates {
            published: published as f64 / seconds,
            unpublished_change: (status.backlog.counts.unpublished - unpublished) as f64 / seconds,
        });
    }
    Ok(status)
}

/// One `--watch --json` line.
fn watch_json(
    targets: &[Target],
    statuses: &[Result<SourceStatus, CliError>],
    one: bool,
    at: DateTime<Utc>,
) -> Result<String, CliError> {
    let encode = |value: &StatusJson| {
        serde_json::to_value(value).map_err(|e| CliError::Failed(anyhow::anyhow!("cannot encode JSON: {e}")))
    };
    let at = at.to_rfc3339_opts(SecondsFormat::Millis, true);
    let objects = targets
        .iter()
        .zip(statuses)
        .map(|(target, status)| match status {
            Ok(status) => encode(&status_json(target, status)),
            Err(e) => Ok(serde_json::json!({
                "source": target.name.clone().unwrap_or_default(),
                "error": e.to_string(),
            })),
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    let mut line = match (targets, one) {
        ([target], _) if target.name.is_none() || one => objects.into_iter().next().unwrap_or_default(),
        _ => serde_json::json!({ "sources": objects }),
    };
    if let Some(object) = line.as_object_mut() {
        object.insert("at".to_owned(), serde_json::Value::String(at));
    }
    json_line(&line)
}

/// `2s`, `500ms`, `1m 30s`.
fn human_interval(every: Duration) -> String {
    let millis = every.as_millis();
    if !millis.is_multiple_of(1000) {
        format!("{millis}ms")
    } else if millis < 60_000 {
        format!("{}s", millis / 1000)
    } else {
        format!("{}m {}s", millis / 60_000, millis % 60_000 / 1000)
    }
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
async fn stop_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// The width `status --watch` draws in: the smallest terminal there is.
const COLUMNS: usize = 80;

/// The terminal of `status --watch`: its alternate screen with the cursor
/// hidden while the view is on, given back as it was when dropped (also
/// on an error or a panic that unwinds).
struct Screen;

impl Screen {
    /// Alternate screen on, cursor hidden.
    fn take() -> Self {
        let _ = emit("\x1b[?1049h\x1b[?25l");
        Screen
    }

    /// `view` drawn from the top left over what was there, each line cut
    /// to [`COLUMNS`] and cleared to its end.
    fn frame(&self, view: &str) -> String {
        let mut frame = String::from("\x1b[H");
        for line in view.lines() {
            let cut: String = line.chars().take(COLUMNS).collect();
            frame.push_str(&cut);
            frame.push_str("\x1b[K\r\n");
        }
        // Whatever the previous frame had below this one.
        frame.push_str("\x1b[J");
        frame
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = emit("\x1b[?25h\x1b[?1049l");
    }
}

fn status_json(target: &Target, status: &SourceStatus) -> StatusJson {
    let counts = &status.backlog.counts;
    let per_destination = status.per_destination.as_ref();
    StatusJson {
        source: target.name.clone(),
        unpublished: counts.unpublished,
        oldest_unpublished_age_seconds: status.backlog.oldest_unpublished_age_seconds,
        quarantined: counts.quarantined,
        published_last_hour: status.recent,
        stuck_aggregates: counts.stuck_aggregates,
        unpublished_exact: counts.unpublished_exact,
        quarantined_exact: counts.quarantined_exact,
        stuck_aggregates_exact: counts.stuck_aggregates_exact,
        destinations: per_destination.map(|per| per.counts.clone()),
        unrouted: per_destination.map(|per| per.unrouted),
        destinations_exact: per_destination.map(|per| per.exact),
        published_per_second: status.rates.map(|rates| rates.published),
        unpublished_change_per_second: status.rates.map(|rates| rates.unpublished_change),
    }
}

/// `outbox-relay quarantine list [--json] [--limit N] [--after QUARANTINED_AT,ID]`.
///
/// In text mode a full page ends with the command for the next one, on
/// stderr so the table on stdout stays clean. In JSON mode the reader
/// continues from the last element's `quarantined_at` and `id`.
pub async fn quarantine_list(
    target: Target,
    json: bool,
    limit: i64,
    after: Option<QuarantineCursor>,
) -> Result<(), CliError> {
    let database = &target.database;
    let store = Store::new(database, 1);
    if json {
        return quarantine_list_json(&store, &target, limit, after).await;
    }
    let mut rows = Vec::new();
    store
        .quarantined_rows(after, limit, |row| {
            rows.push(row);
            ControlFlow::Continue(())
        })
        .await
        .map_err(|e| failed(database, e))?;
    emit(&render_quarantined(&target, &rows, after, limit))?;
    if let Some(last) = rows.last().filter(|_| rows.len() as i64 == limit) {
        let source = target
            .name
            .as_ref()
            .map(|name| format!(" --source {name}"))
            .unwrap_or_default();
        eprintln!(
            "more rows may follow; next page: outbox-relay quarantine list{source} --limit {limit} --after {}",
            QuarantineCursor::after(last)
        );
    }
    Ok(())
}

/// The JSON array, one element per row as the rows arrive: `[`, elements,
/// `]`, so a page of any length is valid JSON without being held in memory.
async fn quarantine_list_json(
    store: &Store,
    target: &Target,
    limit: i64,
    after: Option<QuarantineCursor>,
) -> Result<(), CliError> {
    let mut out = std::io::BufWriter::new(std::io::stdout());
    let mut failure: Option<std::io::Error> = out.write_all(b"[").err();
    let mut first = true;
    let listed = store
        .quarantined_rows(after, limit, |row| {
            if failure.is_some() {
                return ControlFlow::Break(());
            }
            let element = QuarantinedJson {
                source: target.name.as_deref(),
                id: row.id,
                event_type: &row.event_type,
                attempt_count: row.attempt_count,
                last_error: row.last_error.as_deref(),
                quarantined_at: row.quarantined_at.to_rfc3339_opts(SecondsFormat::Micros, true),
            };
            let separator = if first { &b""[..] } else { &b","[..] };
            first = false;
            let written = out
                .write_all(separator)
                .and_then(|()| serde_json::to_writer(&mut out, &element).map_err(std::io::Error::from));
            match written {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    failure = Some(e);
                    ControlFlow::Break(())
                }
            }
        })
        .await;
    listed.map_err(|e| failed(&target.database, e))?;
    let closed = match failure {
        Some(e) => Err(e),
        None => out.write_all(b"]\n").and_then(|()| out.flush()),
    };
    match closed {
        Ok(()) => Ok(()),
        // A closed pipe (`… | head`): the reader has what it wanted.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::Failed(anyhow::anyhow!("cannot write to stdout: {e}"))),
    }
}

/// `outbox-relay quarantine release <ID>... | --all`.
///
/// Ids that are not quarantined (unknown, already released, or published
/// meanwhile) are listed but do not make the command fail: a release can be
/// repeated after an interruption and ends in the same state.
pub async fn quarantine_release(target: Target, ids: Vec<Uuid>, all: bool) -> Result<(), CliError> {
    let database = &target.database;
    let store = Store::new(database, 1);
    if all {
        let released = store
            .release_all_quarantined()
            .await
            .map_err(|e| failed(database, e))?;
        return emit(&format!(
            "released {} from quarantine in {}; due now with attempts reset\n",
            count_rows(released),
            target.place()
        ));
    }
    if ids.is_empty() {
        // clap already requires ids unless --all; kept for callers of the library.
        return Err(CliError::Usage("give the ids to release, or --all".to_owned()));
    }
    // Sorted and without repeats, so the report lists each id once.
    let wanted: Vec<Uuid> = ids.into_iter().collect::<BTreeSet<_>>().into_iter().collect();
    let released: BTreeSet<Uuid> = store
        .release_quarantined(&wanted)
        .await
        .map_err(|e| failed(database, e))?
        .into_iter()
        .collect();
    let mut text = format!(
        "released {} from quarantine in {}; due now with attempts reset\n",
        count_rows(released.len() as u64),
        target.place()
    );
    let missed: Vec<&Uuid> = wanted.iter().filter(|id| !released.contains(id)).collect();
    if !missed.is_empty() {
        let _ = writeln!(
            text,
            "not quarantined (no such id, already released, or published): {}",
            missed.len()
        );
        for id in missed {
            let _ = writeln!(text, "  {id}");
        }
    }
    emit(&text)
}

/// `outbox-relay replay --since … [--until …] [--event-type …]`.
pub async fn replay(
    target: Target,
    since: DateTime<Utc>,
    until: Option<DateTime<Utc>>,
    event_type: Option<String>,
) -> Result<(), CliError> {
    let store = Store::new(&target.database, 1);
    let requeued = store
        .replay(since, until, event_type.as_deref())
        .await
        .map_err(|e| failed(&target.database, e))?;
    let until_text = until.map_or_else(|| "now".to_owned(), rfc3339);
    let type_text = event_type
        .map(|t| format!(" of event type '{t}'"))
        .unwrap_or_default();
    emit(&format!(
        "re-queued {} published in [{}, {}){type_text} in {}; the relay publishes them again under the same ids\n",
        count_rows(requeued),
        rfc3339(since),
        until_text,
        target.place()
    ))
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

fn count_rows(count: u64) -> String {
    if count == 1 {
        "1 row".to_owned()
    } else {
        format!("{count} rows")
    }
}

/// A database failure as the one line the binary prints, naming where it
/// tried, with a hint when the table is not there or not migrated.
fn failed(database: &DatabaseConfig, error: StoreError) -> CliError {
    let hint = match &error {
        StoreError::Query(e)
            if matches!(
                e.code(),
                Some(&SqlState::UNDEFINED_TABLE) | Some(&SqlState::UNDEFINED_COLUMN)
            ) =>
        {
            " (has `outbox-relay migrate` been run for this table?)"
        }
        _ => "",
    };
    CliError::Failed(anyhow::anyhow!(
        "{} table {}: {}{hint}",
        describe_pg(&database.pg),
        database.table,
        error
    ))
}

fn json_line(value: &impl Serialize) -> Result<String, CliError> {
    let mut line = serde_json::to_string(value).map_err(|e| anyhow::anyhow!("cannot encode JSON: {e}"))?;
    line.push('\n');
    Ok(line)
}

/// Writes the command's output. A closed pipe (`… | head`) is not an
/// error: the reader has what it wanted.
fn emit(text: &str) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::Failed(anyhow::anyhow!("cannot write to stdout: {e}"))),
    }
}

fn render_status(target: &Target, status: &SourceStatus) -> String {
    let (backlog, recent) = (&status.backlog, status.recent);
    let per_destination = status.per_destination.as_ref();
    let table = target.database.table.to_string();
    let counts = &backlog.counts;
    let source = target.name.iter().map(|name| ("source", name.clone()));
    let lines = [
        ("table", table),
        (
            "unpublished",
            estimated(counts.unpublished, counts.unpublished_exact),
        ),
        (
            "oldest unpublished age",
            human_age(backlog.oldest_unpublished_age_seconds),
        ),
        (
            "quarantined",
            estimated(counts.quarantined, counts.quarantined_exact),
        ),
        ("published last hour", recent.to_string()),
        (
            "stuck aggregates",
            if counts.stuck_aggregates_exact {
                counts.stuck_aggregates.to_string()
            } else {
                format!(
                    "at least {} (among the {STUCK_SCAN} oldest pending and quarantined rows)",
                    counts.stuck_aggregates
                )
            },
        ),
    ];
    let mut lines: Vec<(String, String)> = source
        .chain(lines)
        .map(|(label, value)| (label.to_owned(), value))
        .collect();
    if let Some(rates) = status.rates {
        lines.push((
            "published per second".to_owned(),
            format!("{:.1}", rates.published),
        ));
        lines.push((
            "unpublished change/s".to_owned(),
            format!("{:+.1}", rates.unpublished_change),
        ));
    }
    if let Some(per) = per_destination {
        let among = if per.exact {
            String::new()
        } else {
            format!(" (among the {COUNT_CAP} oldest)")
        };
        for (name, count) in &per.counts {
            lines.push((format!("unpublished for {name}"), format!("{count}{among}")));
        }
        lines.push((
            "unpublished, no route".to_owned(),
            format!("{}{among}", per.unrouted),
        ));
    }
    let width = lines.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
    let mut text = String::new();
    for (label, value) in lines {
        let _ = writeln!(text, "{label:<width$}  {value}");
    }
    text
}

/// A count past the cap is PostgreSQL's estimate, and says so.
fn estimated(count: i64, exact: bool) -> String {
    if exact {
        count.to_string()
    } else {
        format!("about {count} (estimated: more than {COUNT_CAP})")
    }
}

/// `3723.4` → `1h 2m 3s`; under a minute with one decimal, so a healthy
/// relay's sub-second age does not read as zero.
fn human_age(seconds: f64) -> String {
    if !seconds.is_finite() || seconds <= 0.0 {
        return "0s (no unpublished rows)".to_owned();
    }
    if seconds < 60.0 {
        return format!("{seconds:.1}s");
    }
    // Saturating float-to-int conversion; ages are far below u64::MAX.
    let total = seconds as u64;
    let (days, hours, minutes, secs) = (
        total / 86_400,
        total % 86_400 / 3_600,
        total % 3_600 / 60,
        total % 60,
    );
    let mut parts = Vec::new();
    if days > 0 {
        parts.push(format!("{days}d"));
    }
    if days > 0 || hours > 0 {
        parts.push(format!("{hours}h"));
    }
    parts.push(format!("{minutes}m"));
    parts.push(format!("{secs}s"));
    format!("{} ({total} s)", parts.join(" "))
}

fn render_quarantined(
    target: &Target,
    rows: &[QuarantinedRow],
    after: Option<QuarantineCursor>,
    limit: i64,
) -> String {
    if rows.is_empty() {
        return match after {
            Some(cursor) => format!("no quarantined rows in {} after {cursor}\n", target.place()),
            None => format!("no quarantined rows in {}\n", target.place()),
        };
    }
    let header = ["ID", "EVENT TYPE", "ATTEMPTS", "QUARANTINED AT", "LAST ERROR"];
    let body: Vec<[String; 5]> = rows
        .iter()
        .map(|row| {
            [
                row.id.to_string(),
                row.event_type.clone(),
                row.attempt_count.to_string(),
                row.quarantined_at.to_rfc3339_opts(SecondsFormat::Secs, true),
                one_line(row.last_error.as_deref().unwrap_or("-"), ERROR_COLUMN_WIDTH),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for cells in &body {
        for (width, cell) in widths.iter_mut().zip(cells) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let header = header.map(str::to_owned);
    for cells in std::iter::once(&header).chain(&body) {
        let mut line = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                // No padding after the last column.
                line.push_str(cell);
            } else {
                let pad = width - cell.chars().count();
                let _ = write!(line, "{cell}{:pad$}  ", "");
            }
        }
        text.push_str(&line);
        text.push('\n');
    }
    // Only a first page that is not full is the whole list.
    let whole = after.is_none() && (rows.len() as i64) < limit;
    let _ = writeln!(
        text,
        "{} quarantined in {}{}",
        count_rows(rows.len() as u64),
        target.place(),
        if whole { "" } else { " on this page" }
    );
    text
}

/// An error message on one line of at most `max` characters: newlines and
/// other control characters would break the table.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut cut: String = flat.chars().take(max - 1).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_naturally() {
        assert_eq!(human_age(0.0), "0s (no unpublished rows)");
        assert_eq!(human_age(0.34), "0.3s");
        assert_eq!(human_age(59.94), "59.9s");
        assert_eq!(human_age(3723.4), "1h 2m 3s (3723 s)");
        assert_eq!(human_age(90_061.0), "1d 1h 1m 1s (90061 s)");
        assert_eq!(human_age(600.0), "10m 0s (600 s)");
    }

    #[test]
    fn errors_are_flattened_and_cut() {
        assert_eq!(one_line("a\nb\tc", 10), "a b c");
        assert_eq!(one_line("abcdefghijk", 5), "abcd…");
        assert_eq!(one_line("abcde", 5), "abcde");
    }
}
