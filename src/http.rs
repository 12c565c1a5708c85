//! `/metrics`, `/healthz` and `/readyz`, and the server behind them.
//!
//! The server is hyper's HTTP/1 connection driver rather than
//! `axum::serve`, for three bounds `axum::serve` does not offer: a client
//! must send its request headers within [`HEADER_READ_TIMEOUT`], at most
//! [`MAX_CONNECTIONS`] are served at once, and on shutdown each connection
//! gets [`SHUTDOWN_GRACE`] to finish its request, then is dropped. So no
//! client, however slow or idle, keeps the process up after SIGTERM.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use clap::Args;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

use crate::liveness::Liveness;
use crate::metrics::{Metrics, SourceMetrics};
use crate::outage::{sleep_or_cancel, Availability, Outage};
use crate::relay::{Destination, Destinations, RelayHealth, DEFAULT_DESTINATION, DEFAULT_SOURCE};
use crate::settings::{var, ConfigError};
use crate::store::Store;

/// How long a readiness probe waits for each dependency.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Connections served at once. The clients are a kubelet's probes and a
/// Prometheus or two; further connections wait in the listen backlog until
/// a slot frees, which [`HEADER_READ_TIMEOUT`] guarantees soon.
pub const MAX_CONNECTIONS: usize = 32;

/// How long a client has to send a request's headers, counted from when
/// the server starts reading them (also while a kept-alive connection sits
/// idle before its next request). Probes and scrapes send theirs at once;
/// a client that sends half a request is disconnected instead of holding
/// a slot.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// On shutdown, how long a request in progress has to finish before its
/// connection is dropped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Settings of the HTTP endpoints.
#[derive(Debug, Clone, Args)]
pub struct HttpSettings {
    /// Listen address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = var::HTTP_ADDR, default_value = "0.0.0.0:9090")]
    pub http_addr: String,
}

impl HttpSettings {
    /// Validated HTTP listen address.
    pub fn validate(&self) -> Result<SocketAddr, ConfigError> {
        self.http_addr.trim().parse().map_err(|_| {
            ConfigError::new(
                var::HTTP_ADDR,
                format!("'{}' is not an address like 0.0.0.0:9090", self.http_addr),
            )
        })
    }
}

/// What the endpoints read.
#[derive(Clone)]
pub struct HttpState {
    /// Metrics to render.
    pub metrics: Arc<Metrics>,
    /// The sources, for readiness and liveness.
    pub sources: Arc<[SourceState]>,
    /// The destinations, for readiness.
    pub destinations: Destinations,
    /// What `/readyz` last found wrong, so the log tells each change once.
    pub readiness_log: Arc<ReadinessLog>,
}

/// The problems `/readyz` last found, in full: the log gets them, with
/// hosts, users and queue URLs, once each time they change, while the
/// body, which anyone who reaches the port can read, names the dependency
/// and the problem only (see [`redact`]).
#[derive(Debug, Default)]
pub struct ReadinessLog(std::sync::Mutex<Vec<String>>);

impl ReadinessLog {
    fn report(&self, problems: Vec<String>) {
        let mut last = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *last == problems {
            return;
        }
        if problems.is_empty() {
            tracing::info!(
                report = "readiness_changed",
                "/readyz: every dependency ready again"
            );
        } else {
            tracing::warn!(
                report = "readiness_changed",
                problems = %problems.join("; "),
                "/readyz: not every dependency is ready"
            );
        }
        *last = problems;
    }
}

/// What the endpoints read of one source.
pub struct SourceState {
    /// Its name when the configuration file names it; `None` for the one
    /// source of the environment, which `/readyz` and `/healthz` report as
    /// they always have.
    pub name: Option<String>,
    /// Its database, for readiness: a pool of one connection of its own,
    /// so that however many probes come at once they never wait for, or
    /// take, a connection the relay's workers need.
    pub probe: Arc<Store>,
    /// Its relay workers' heartbeat, for liveness.
    pub liveness: Arc<Liveness>,
    /// What its relay's own claims say, for readiness.
    pub health: Arc<RelayHealth>,
    /// Its metrics (the heartbeat is copied there on each scrape).
    pub metrics: SourceMetrics,
}

/// The endpoints' routes.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves the endpoints on `listener` until `shutdown`, then gives each
/// open connection [`SHUTDOWN_GRACE`] to finish and returns.
pub async fn serve(
    listener: TcpListener,
    state: HttpState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = router(state);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let connections = TaskTracker::new();
    let accept_outage = Mutex::new(Outage::new("HTTP listener"));
    let mut accepting = Availability::new(&accept_outage);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                // The semaphore is never closed.
                Err(_) => break,
            },
            _ = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.cancelled() => break,
        };
        match stream {
            Ok((stream, _)) => {
                accepting.succeeded();
                connections.spawn(serve_connection(stream, app.clone(), slot, shutdown.clone()));
            }
            // Out of file descriptors, typically: retrying at once would
            // spin; the connections being served close by themselves.
            Err(e) => sleep_or_cancel(accepting.failed(&e), &shutdown).await,
        }
    }
    // Clients still in the backlog are refused rather than left waiting.
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

async fn serve_connection(
    stream: TcpStream,
    app: Router,
    _slot: OwnedSemaphorePermit,
    shutdown: CancellationToken,
) {
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(connection);
    let finished = tokio::select! {
        result = connection.as_mut() => Some(result),
        _ = shutdown.cancelled() => None,
    };
    let result = match finished {
        Some(result) => result,
        None => {
            // Finishes the request in progress, if any, then closes; a
            // client that never completes its request is cut off.
            connection.as_mut().graceful_shutdown();
            match tokio::time::timeout(SHUTDOWN_GRACE, connection).await {
                Ok(result) => result,
                Err(_) => return,
            }
        }
    };
    if let Err(e) = result {
        // Clients hanging up and header timeouts are routine.
        debug!(error = %e, "HTTP connection ended with an error");
    }
}

/// `/healthz`: 503 once a relay worker of any source has made no progress
/// for longer than its loop can legitimately take.
async fn healthz(State(state): State<HttpState>) -> impl IntoResponse {
    let stalls: Vec<String> = state
        .sources
        .iter()
        .filter_map(|source| {
            let stall = source.liveness.check().err()?;
            Some(match &source.name {
                Some(name) => format!("source {name}: {stall}"),
                None => stall.to_string(),
            })
        })
        .collect();
    if stalls.is_empty() {
        (StatusCode::OK, "ok\n".to_owned())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, stalls.join("\n") + "\n")
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    for source in state.sources.iter() {
        let last_progress = source
            .liveness
            .last_progress()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        source.metrics.last_progress.set(last_progress.as_secs_f64());
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// `/readyz`: 200 while at least one source's database works and at
/// least one destination takes messages, 503 otherwise; the body says what
/// is wrong, a line per source and destination when the file names them.
/// One destination or one source down among several does not take the
/// replica out of rotation: its rows wait while the others flow, and its
/// own alert (`outbox_destination_ready`, `outbox_source_ready`) says so.
/// A relay configured by the environment (one source) answers as it
/// always has.
async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    // Every dependency at once: the probe's time is the slowest one's.
    let databases = futures::future::join_all(
        state
            .sources
            .iter()
            .map(|source| tokio::time::timeout(PROBE_TIMEOUT, source.probe.ping())),
    );
    let sinks = futures::future::join_all(
        state
            .destinations
            .iter()
            .map(|destination| tokio::time::timeout(PROBE_TIMEOUT, destination.sink.ready())),
    );
    let (databases, sinks) = tokio::join!(databases, sinks);
    // Each source's problems: its database's answer, and whether its
    // claims fail (a database that answers SELECT 1 while every claim
    // fails is not ready).
    let sources: Vec<(&SourceState, Vec<String>)> = state
        .sources
        .iter()
        .zip(databases)
        .map(|(source, ping)| {
            let mut problems = Vec::new();
            match ping {
                Ok(Ok(())) => {}
                Ok(Err(e)) => problems.push(format!("database: {e}")),
                Err(_) => problems.push(format!("database: no answer within {PROBE_TIMEOUT:?}")),
            }
            problems.extend(source.health.problem());
            (source, problems)
        })
        .collect();
    // Each destination's problems: its sink's check, and whether its
    // broker defers batches (both, when both hold). A broker that answers
    // its probe while deferring every batch is not ready either.
    let destinations: Vec<(&Destination, Vec<String>)> = state
        .destinations
        .iter()
        .zip(sinks)
        .map(|(destination, check)| {
            let mut problems = Vec::new();
            match check {
                Ok(Ok(())) => {}
                Ok(Err(e)) => problems.push(format!("{}: {e}", destination.sink.kind())),
                Err(_) => problems.push(format!(
                    "{}: no answer within {PROBE_TIMEOUT:?}",
                    destination.sink.kind()
                )),
            }
            problems.extend(
                destination
                    .health
                    .problem()
                    .map(|deferring| format!("broker: {deferring}")),
            );
            (destination, problems)
        })
        .collect();
    let destination_lines = destinations.iter().map(|(destination, own)| {
        line(
            &format!("destination {} ({})", destination.name, destination.sink.kind()),
            own,
        )
    });
    let any_destination_ready = destinations.iter().any(|(_, problems)| problems.is_empty());
    let (lines, ready): (Vec<String>, bool) = match sources.as_slice() {
        [(only, own)] if only.name.is_none() => {
            let mut problems = own.clone();
            match destinations.as_slice() {
                // The environment's sink too: the answer of the first
                // releases, the problems one per line.
                [(destination, own)] if destination.name == DEFAULT_DESTINATION => {
                    problems.extend(own.iter().cloned());
                    let ready = problems.is_empty();
                    (problems, ready)
                }
                _ => {
                    let ready = problems.is_empty() && any_destination_ready;
                    problems.extend(destination_lines);
                    (problems, ready)
                }
            }
        }
        _ => {
            let any_source_ready = sources.iter().any(|(_, problems)| problems.is_empty());
            let lines = sources
                .iter()
                .map(|(source, own)| {
                    line(
                        &format!("source {}", source.name.as_deref().unwrap_or(DEFAULT_SOURCE)),
                        own,
                    )
                })
                .chain(destination_lines)
                .collect();
            (lines, any_source_ready && any_destination_ready)
        }
    };
    state.readiness_log.report(
        lines
            .iter()
            .filter(|line| !line.ends_with(": ready"))
            .cloned()
            .collect(),
    );
    let lines = lines.iter().map(|line| redact(line));
    if ready {
        let body: Vec<String> = std::iter::once("ready".to_owned()).chain(lines).collect();
        (StatusCode::OK, body.join("\n") + "\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            lines.collect::<Vec<_>>().join("\n") + "\n",
        )
    }
}

/// A `/readyz` line without what would tell a stranger where the relay's
/// dependencies are or who the relay is there: URLs (`amqps://relay@mq…`,
/// an SQS queue URL), `host:port` addresses, AWS ARNs (they carry the
/// account and the role), and the user or role name in a database's
/// authentication error. What failed and why stays; the log has the rest.
pub fn redact(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut after_user_word = false;
    for (index, token) in line.split(' ').enumerate() {
        if index > 0 {
            out.push(' ');
        }
        // Punctuation around a token stays: `(amqp://…)`, `url,`.
        let start = token
            .find(|c: char| c.is_alphanumeric() || c == '"')
            .unwrap_or(token.len());
        let end = token
            .rfind(|c: char| c.is_alphanumeric() || c == '"' || c == '/')
            .map_or(start, |i| i + 1)
            .max(start);
        let (before, word, after) = (&token[..start], &token[start..end], &token[end..]);
        let replacement = if word.contains("://") {
            Some("<address>")
        } else if word.starts_with("arn:") {
            Some("<arn>")
        } else if is_address(word) {
            Some("<address>")
        } else if after_user_word && word.starts_with('"') {
            Some("\"<name>\"")
        } else {
            None
        };
        after_user_word = matches!(word, "user" | "role");
        out.push_str(before);
        out.push_str(replacement.unwrap_or(word));
        out.push_str(after);
    }
    out
}

/// `host:port`, optionally followed by a path (`db:5432/orders`): a name
/// or IP address, a colon, and a port number.
fn is_address(word: &str) -> bool {
    let Some((host, rest)) = word.split_once(':') else {
        return false;
    };
    let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let tail = &rest[port.len()..];
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        && host.chars().any(|c| c.is_ascii_alphabetic() || c == '.')
        && (2..=5).contains(&port.len())
        && (tail.is_empty() || tail.starts_with('/'))
}

/// One line of `/readyz`: `what: ready`, or `what: not ready: problems`.
fn line(what: &str, problems: &[String]) -> String {
    if problems.is_empty() {
        format!("{what}: ready")
    } else {
        format!("{what}: not ready: {}", problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readiness_body_keeps_the_problem_and_drops_where_and_who() {
        for (line, expected) in [
            (
                "destination default (rabbitmq): not ready: RabbitMQ at amqp://relay:****@mq.internal:5672/%2f unreachable: Connection refused (os error 111)",
                "destination default (rabbitmq): not ready: RabbitMQ at <address> unreachable: Connection refused (os error 111)",
            ),
            (
                "sqs: queue https://sqs.eu-west-1.amazonaws.com/123456789012/orders does not exist",
                "sqs: queue <address> does not exist",
            ),
            (
                "broker: AccessDenied: User: arn:aws:sts::123456789012:assumed-role/relay/i-0abc is not authorized",
                "broker: AccessDenied: User: <arn> is not authorized",
            ),
            (
                "database: database 10.0.3.7:5432/orders unreachable",
                "database: database <address> unreachable",
            ),
            (
                "database: db error: FATAL: password authentication failed for user \"relay\"",
                "database: db error: FATAL: password authentication failed for user \"<name>\"",
            ),
            (
                "database: claims have failed for 12s: relation \"outbox_event\" does not exist",
                "database: claims have failed for 12s: relation \"outbox_event\" does not exist",
            ),
            ("source orders: ready", "source orders: ready"),
            (
                "rabbitmq: exchange 'outbox-test-missing-1' not found: NOT_FOUND at 12:30",
                "rabbitmq: exchange 'outbox-test-missing-1' not found: NOT_FOUND at 12:30",
            ),
        ] {
            assert_eq!(redact(line), expected);
        }
    }

    #[test]
    fn the_default_address_is_valid_and_a_bad_one_names_its_variable() {
        let default = HttpSettings {
            http_addr: "0.0.0.0:9090".into(),
        };
        assert_eq!(default.validate(), Ok(SocketAddr::from(([0, 0, 0, 0], 9090))));
        let http = HttpSettings {
            http_addr: "nowhere".into(),
        };
        assert_eq!(http.validate().unwrap_err().variable, "OUTBOX_HTTP_ADDR");
    }
}
