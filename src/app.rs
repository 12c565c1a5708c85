//! Wiring of `outbox-relay run`: the relay loop, the LISTEN wake-ups, the
//! maintenance tasks and the HTTP endpoints, on one shutdown token.

use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info};

use crate::config::Config;
use crate::http::HttpState;
use crate::metrics::Metrics;
use crate::relay::Relay;
use crate::sink::Sink;
use crate::store::{describe_pg, Store};

/// Connections a replica needs: per worker one for its claim or its
/// outcomes (a batch with failures records up to three statements at once,
/// borrowing what idle workers leave), plus readiness probes and the
/// maintenance tasks.
fn pool_size(workers: u32) -> usize {
    workers as usize * 2 + 3
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    serve(config, shutdown).await
}

/// Runs the relay, retention and the HTTP endpoints until `shutdown` is
/// cancelled, then waits for the batches in flight to settle.
pub async fn serve(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot listen on OUTBOX_HTTP_ADDR {}", config.http_addr))?;
    let metrics = Arc::new(Metrics::new());
    let store = Arc::new(Store::new(&config.database, pool_size(config.relay.workers)));
    let sink: Arc<dyn Sink> = crate::sink::build(&config.sink).await?.into();
    info!(
        database = %describe_pg(&config.database.pg),
        table = %config.database.table,
        sslmode = config.database.tls.mode().name(),
        pooler = ?config.database.pooler,
        sink = sink.kind(),
        http = %config.http_addr,
        "starting"
    );
    let tasks = TaskTracker::new();
    let http_state = HttpState {
        metrics: metrics.clone(),
        store: store.clone(),
        sink: sink.clone(),
    };
    let http_shutdown = shutdown.clone();
    tasks.spawn(async move {
        if let Err(e) = crate::http::serve(listener, http_state, http_shutdown).await {
            error!(error = %e, "HTTP server failed");
        }
    });
    tasks.spawn(crate::maintenance::gauges::run(
        store.clone(),
        metrics.clone(),
        crate::maintenance::gauges::REFRESH_INTERVAL,
        shutdown.clone(),
    ));
    tasks.spawn(crate::maintenance::retention::run(
        store.clone(),
        config.retention,
        metrics.clone(),
        shutdown.clone(),
    ));
    let relay = Relay::new(store.clone(), sink.clone(), config.relay.clone(), metrics.clone());
    match config.listen.clone() {
        Some(endpoint) => {
            tasks.spawn(crate::store::listen(
                endpoint,
                config.database.table.clone(),
                relay.waker(),
                shutdown.clone(),
            ));
        }
        None => info!(
            report = "polling_without_listen",
            poll_interval_ms = config.relay.poll_interval.as_millis() as u64,
            "no LISTEN behind a transaction pooler without OUTBOX_LISTEN_DATABASE_URL: \
             new rows are found by polling every OUTBOX_POLL_INTERVAL"
        ),
    }
    let relay_shutdown = shutdown.clone();
    tasks.spawn(async move { relay.run(relay_shutdown).await });
    tasks.close();
    tasks.wait().await;
    Ok(())
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(e) => {
                    error!(error = %e, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = terminate => info!("SIGTERM received; finishing the batch in flight"),
            _ = tokio::signal::ctrl_c() => info!("SIGINT received; finishing the batch in flight"),
        }
        shutdown.cancel();
    });
}
