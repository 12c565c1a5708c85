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
use crate::metrics::Metrics;
use crate::outage::{sleep_or_cancel, Availability, Outage};
use crate::relay::{Destination, RelayHealth, DEFAULT_DESTINATION};
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
    /// Database, for readiness.
    pub store: Arc<Store>,
    /// The destinations, for readiness.
    pub destinations: Arc<[Destination]>,
    /// The relay workers' heartbeat, for liveness.
    pub liveness: Arc<Liveness>,
    /// What the relay's own claims and batches say, for readiness.
    pub health: Arc<RelayHealth>,
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

async fn healthz(State(state): State<HttpState>) -> impl IntoResponse {
    match state.liveness.check() {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(stall) => (StatusCode::SERVICE_UNAVAILABLE, format!("{stall}\n")),
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let last_progress = state
        .liveness
        .last_progress()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    state.metrics.last_progress.set(last_progress.as_secs_f64());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// `/readyz`: 200 while the database works and at least one destination
/// takes messages, 503 otherwise; the body says what is wrong. One
/// destination down among several does not take the replica out of
/// rotation: its rows wait while the others flow, and its own alert
/// (`outbox_destination_ready`) says so.
async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    // Every dependency at once: the probe's time is the slowest one's.
    let database = tokio::time::timeout(PROBE_TIMEOUT, state.store.ping());
    let sinks = futures::future::join_all(
        state
            .destinations
            .iter()
            .map(|destination| tokio::time::timeout(PROBE_TIMEOUT, destination.sink.ready())),
    );
    let (database, sinks) = tokio::join!(database, sinks);
    let mut problems = Vec::new();
    match database {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("database: {e}")),
        Err(_) => problems.push(format!("database: no answer within {PROBE_TIMEOUT:?}")),
    }
    // A database that answers SELECT 1 while every claim fails is not ready.
    problems.extend(state.health.problem());
    // A broker that answers its probe while deferring every batch is not
    // ready either.
    // Each destination's problems: its sink's check, and whether its
    // broker defers batches (both, when both hold).
    let states: Vec<(&Destination, Vec<String>)> = state
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
    let any_ready = states.iter().any(|(_, problems)| problems.is_empty());
    // A relay configured by the environment answers as it always has.
    if let [(only, own)] = states.as_slice() {
        if only.name == DEFAULT_DESTINATION {
            problems.extend(own.iter().cloned());
            return if problems.is_empty() {
                (StatusCode::OK, "ready\n".to_owned())
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, problems.join("\n") + "\n")
            };
        }
    }
    let lines = states.iter().map(|(destination, own)| {
        if own.is_empty() {
            format!(
                "destination {} ({}): ready",
                destination.name,
                destination.sink.kind()
            )
        } else {
            format!(
                "destination {} ({}): not ready: {}",
                destination.name,
                destination.sink.kind(),
                own.join("; ")
            )
        }
    });
    if problems.is_empty() && any_ready {
        let body: Vec<String> = std::iter::once("ready".to_owned()).chain(lines).collect();
        (StatusCode::OK, body.join("\n") + "\n")
    } else {
        problems.extend(lines);
        (StatusCode::SERVICE_UNAVAILABLE, problems.join("\n") + "\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
