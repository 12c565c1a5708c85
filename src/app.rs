//! Wiring of `outbox-relay run`: the relay loop, the LISTEN wake-ups, the
//! maintenance tasks and the HTTP endpoints, on one shutdown token.
//!
//! Each of them is essential: one that ends before shutdown was requested,
//! fails or panics (a panicking relay worker takes the relay task with it)
//! stops the others and makes the process exit non-zero, so that the
//! orchestrator restarts it, rather than leaving a process that answers
//! its probes while nothing is relayed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tokio::task::{Id, JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::config::Config;
use crate::http::HttpState;
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::outage::{sleep_or_cancel, Availability, Outage};
use crate::relay::{is_environment_only, Destination, Relay};
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
/// cancelled, then waits for the batches in flight to settle. Fails when
/// one of them stops on its own before that.
pub async fn serve(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut sinks: Vec<Arc<dyn Sink>> = Vec::with_capacity(config.destinations.len());
    for destination in &config.destinations {
        let sink = crate::sink::build(&destination.sink, &destination.format)
            .await
            .with_context(|| format!("destination {}", destination.name))?;
        sinks.push(sink.into());
    }
    serve_with_sinks(config, sinks, shutdown).await
}

/// [`serve`] with one sink built by the caller instead of from the
/// configuration, every event to it.
pub async fn serve_with_sink(
    mut config: Config,
    sink: Arc<dyn Sink>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    config.destinations.truncate(1);
    config.router = crate::route::Router::everything_to_one();
    serve_with_sinks(config, vec![sink], shutdown).await
}

/// [`serve`] with the destinations' sinks built by the caller, one per
/// destination of the configuration, in its order.
async fn serve_with_sinks(
    config: Config,
    sinks: Vec<Arc<dyn Sink>>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot listen on OUTBOX_HTTP_ADDR {}", config.http_addr))?;
    let metrics = Arc::new(Metrics::new());
    let mut store = Store::new(&config.database, pool_size(config.relay.workers));
    // One destination takes every row: its claims need no route filter.
    if sinks.len() > 1 {
        store = store.with_routes(config.router.routes().len());
    }
    let store = Arc::new(store);
    let kinds: Vec<&str> = sinks.iter().map(|sink| sink.kind()).collect();
    info!(
        database = %describe_pg(&config.database.pg),
        table = %config.database.table,
        sslmode = config.database.tls.mode().name(),
        pooler = ?config.database.pooler,
        sink = %kinds.join(", "),
        http = %config.http_addr,
        "starting"
    );
    let labelled = !is_environment_only(
        config
            .destinations
            .iter()
            .map(|destination| destination.name.as_str()),
    );
    let destinations = config
        .destinations
        .iter()
        .zip(sinks)
        .map(|(destination, sink)| {
            Destination::new(
                destination.name.clone(),
                sink,
                metrics.destination(labelled.then_some(destination.name.as_str())),
                config.relay.publish_timeout,
            )
        })
        .collect();
    let relay = Relay::routed(
        store.clone(),
        destinations,
        config.router.clone(),
        config.relay.clone(),
        metrics.clone(),
    );
    let liveness = relay.liveness();
    let mut tasks = Tasks::new(shutdown.clone());
    // The endpoints stop last, once everything else has: probes and a
    // final scrape are answered while the batches in flight settle.
    let http_stop = CancellationToken::new();
    let http_state = HttpState {
        metrics: metrics.clone(),
        store: store.clone(),
        destinations: relay.destinations(),
        liveness: liveness.clone(),
        health: relay.health(),
    };
    let http = tasks.spawn("http", Ends::OnShutdown, {
        let http_stop = http_stop.clone();
        async move {
            crate::http::serve(listener, http_state, http_stop)
                .await
                .context("HTTP server failed")
        }
    });
    tasks.spawn("gauges", Ends::OnShutdown, {
        let task = crate::maintenance::gauges::run(
            store.clone(),
            metrics.clone(),
            crate::maintenance::gauges::REFRESH_INTERVAL,
            shutdown.clone(),
        );
        async move {
            task.await;
            Ok(())
        }
    });
    // Disabled retention returns at once, which is not a failure.
    let retention_ends = match config.retention {
        Some(_) => Ends::OnShutdown,
        None => Ends::WhenDone,
    };
    tasks.spawn("retention", retention_ends, {
        let task = crate::maintenance::retention::run(
            store.clone(),
            config.retention,
            metrics.clone(),
            relay.catch_up(),
            shutdown.clone(),
        );
        async move {
            task.await;
            Ok(())
        }
    });
    match config.listen.clone() {
        Some(endpoint) => {
            tasks.spawn("listen", Ends::OnShutdown, {
                let task = crate::store::listen(
                    endpoint,
                    config.database.table.clone(),
                    relay.waker(),
                    shutdown.clone(),
                );
                async move {
                    task.await;
                    Ok(())
                }
            });
        }
        None => info!(
            report = "polling_without_listen",
            poll_interval_ms = config.relay.poll_interval.as_millis() as u64,
            "no LISTEN behind a transaction pooler without OUTBOX_LISTEN_DATABASE_URL: \
             new rows are found by polling every OUTBOX_POLL_INTERVAL"
        ),
    }
    tasks.spawn("relay", Ends::OnShutdown, {
        let shutdown = shutdown.clone();
        async move {
            check_table(&store, &liveness, &shutdown).await?;
            relay.run(shutdown).await;
            Ok(())
        }
    });
    tasks.wait(http, http_stop).await
}

/// Checks the table before the first claim, waiting for the database if it
/// is not there yet. A table no row can be relayed from is an error (the
/// relay would fail on, or quarantine, every row); what the claim copes
/// with is reported and tolerated (see `store/columns.rs`).
async fn check_table(store: &Store, liveness: &Liveness, shutdown: &CancellationToken) -> anyhow::Result<()> {
    let outage = Mutex::new(Outage::new("database"));
    let mut database = Availability::new(&outage);
    let findings = loop {
        // Waiting for the database is the loop's progress at this stage.
        liveness.beat_all();
        match store.check_table().await {
            Ok(findings) => {
                database.succeeded();
                break findings;
            }
            Err(e) => sleep_or_cancel(database.failed(&e), shutdown).await,
        }
        if shutdown.is_cancelled() {
            return Ok(());
        }
    };
    crate::store::report_table_check(&findings)?;
    Ok(())
}

/// When a task's end is expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ends {
    /// Only once shutdown was requested; earlier is a failure.
    OnShutdown,
    /// Whenever its work is done.
    WhenDone,
}

/// The service's tasks, watched: the first one to fail, panic or end
/// before its time cancels the shutdown token for the others.
struct Tasks {
    set: JoinSet<anyhow::Result<()>>,
    names: HashMap<Id, (&'static str, Ends)>,
    shutdown: CancellationToken,
}

impl Tasks {
    fn new(shutdown: CancellationToken) -> Self {
        Self {
            set: JoinSet::new(),
            names: HashMap::new(),
            shutdown,
        }
    }

    fn spawn(
        &mut self,
        name: &'static str,
        ends: Ends,
        task: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> Id {
        let id = self.set.spawn(task).id();
        self.names.insert(id, (name, ends));
        id
    }

    /// Waits for every task; cancels `last_stop`, which task `last` stops
    /// on, once it is the only one left. The error is the first failure.
    async fn wait(mut self, last: Id, last_stop: CancellationToken) -> anyhow::Result<()> {
        let mut failure: Option<anyhow::Error> = None;
        while let Some(joined) = self.set.join_next_with_id().await {
            let (id, result) = match joined {
                Ok((id, result)) => (id, result),
                Err(e) => (e.id(), Err(anyhow::anyhow!(panic_message(e)))),
            };
            let (name, ends) = self.names.remove(&id).unwrap_or(("unknown", Ends::OnShutdown));
            let problem = match result {
                Err(e) => Some(format!("{e:#}")),
                Ok(()) if ends == Ends::OnShutdown && !self.shutdown.is_cancelled() => {
                    Some("it ended although no shutdown was requested".to_owned())
                }
                Ok(()) => None,
            };
            if let Some(problem) = problem {
                error!(report = "task_stopped", task = name, %problem, "a task of the relay stopped; shutting down");
                failure.get_or_insert_with(|| anyhow::anyhow!("the {name} task stopped: {problem}"));
                self.shutdown.cancel();
            }
            if self.names.keys().all(|remaining| *remaining == last) {
                last_stop.cancel();
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

fn panic_message(error: JoinError) -> String {
    if !error.is_panic() {
        return error.to_string();
    }
    let payload = error.into_panic();
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    format!("panicked: {text}")
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
