//! `/metrics`, `/healthz` and `/readyz`.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::sink::Sink;
use crate::store::Store;

/// How long a readiness probe waits for each dependency.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What the endpoints read.
#[derive(Clone)]
pub struct HttpState {
    /// Metrics to render.
    pub metrics: Arc<Metrics>,
    /// Database, for readiness.
    pub store: Arc<Store>,
    /// Sink, for readiness.
    pub sink: Arc<dyn Sink>,
    /// The relay workers' heartbeat, for liveness.
    pub liveness: Arc<Liveness>,
}

/// The endpoints' routes.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves the endpoints on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    state: HttpState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
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

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    let database = tokio::time::timeout(PROBE_TIMEOUT, state.store.ping()).await;
    let sink = tokio::time::timeout(PROBE_TIMEOUT, state.sink.ready()).await;
    let mut problems = Vec::new();
    match database {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("database: {e}")),
        Err(_) => problems.push(format!("database: no answer within {PROBE_TIMEOUT:?}")),
    }
    match sink {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("{}: {e}", state.sink.kind())),
        Err(_) => problems.push(format!(
            "{}: no answer within {PROBE_TIMEOUT:?}",
            state.sink.kind()
        )),
    }
    if problems.is_empty() {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, problems.join("\n") + "\n")
    }
}
