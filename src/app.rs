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
use tracing::{error, info, Instrument, Span};

use crate::config::{Config, SourceConfig};
use crate::http::{HttpState, SourceState};
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::outage::{sleep_or_cancel, Availability, Outage};
use crate::relay::{is_environment_only, Destination, Destinations, Relay, RelayHealth};
use crate::sink::Sink;
use crate::store::{describe_pg, Severity, Store};

/// Connections a source's pool may open: per worker one for its claim or
/// its outcomes (a batch with failures records up to three statements at
/// once, borrowing what idle workers leave), plus the maintenance tasks.
/// The readiness probe (one) and LISTEN (one) have connections of their
/// own besides: [`connections`].
pub fn pool_size(workers: u32) -> usize {
    workers as usize * 2 + 2
}

/// Every connection a source may hold: its pool and its readiness probe's
/// (2 × workers + 3), plus LISTEN when it listens.
pub fn connections(workers: u32, listens: bool) -> usize {
    pool_size(workers) + 1 + usize::from(listens)
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    serve(config, shutdown).await
}

/// Runs the relay of every source, their maintenance and the HTTP
/// endpoints until `shutdown` is cancelled, then waits for the batches in
/// flight to settle. Fails when one of them stops on its own before that.
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
/// configuration, every event of every source to it.
pub async fn serve_with_sink(
    mut config: Config,
    sink: Arc<dyn Sink>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    config.destinations.truncate(1);
    for source in &mut config.sources {
        source.router = crate::route::Router::everything_to_one();
    }
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
    let labelled = !is_environment_only(
        config
            .destinations
            .iter()
            .map(|destination| destination.name.as_str()),
    );
    // One of each destination for every source: a broker's state is the
    // same whichever database a row comes from.
    let destinations = Destinations::new(
        config
            .destinations
            .iter()
            .zip(sinks)
            .map(|(destination, sink)| {
                Destination::new(
                    destination.name.clone(),
                    sink,
                    metrics.destination_ready(labelled.then_some(destination.name.as_str())),
                    config.publish_timeout,
                )
            })
            .collect(),
    );
    let kinds: Vec<&str> = destinations
        .iter()
        .map(|destination| destination.sink.kind())
        .collect();
    info!(
        sources = config.sources.len(),
        sink = %kinds.join(", "),
        http = %config.http_addr,
        "starting"
    );
    let mut tasks = Tasks::new(shutdown.clone());
    let mut sources = Vec::with_capacity(config.sources.len());
    for source in config.sources {
        // A file's sources are named on every line their tasks log.
        let span = if config.named_sources {
            tracing::info_span!("source", source = %source.name)
        } else {
            Span::none()
        };
        let name = config.named_sources.then(|| source.name.clone());
        sources.push(spawn_source(
            &mut tasks,
            source,
            name,
            &metrics,
            destinations.clone(),
            &shutdown,
            span,
        ));
    }
    // The endpoints stop last, once everything else has: probes and a
    // final scrape are answered while the batches in flight settle.
    let http_stop = CancellationToken::new();
    let http_state = HttpState {
        metrics: metrics.clone(),
        sources: sources.into(),
        destinations,
        readiness_log: Default::default(),
    };
    let http = tasks.spawn("http".to_owned(), Ends::OnShutdown, {
        let http_stop = http_stop.clone();
        async move {
            crate::http::serve(listener, http_state, http_stop)
                .await
                .context("HTTP server failed")
        }
    });
    tasks.wait(http, http_stop).await
}

/// Starts one source's relay, LISTEN, gauges and retention, each in
/// `span`; returns what the endpoints read of it. `name` is the source's
/// name when the file names its sources.
fn spawn_source(
    tasks: &mut Tasks,
    source: SourceConfig,
    name: Option<String>,
    metrics: &Metrics,
    destinations: Destinations,
    shutdown: &CancellationToken,
    span: Span,
) -> SourceState {
    let source_metrics = metrics.source(name.as_deref());
    let mut store = Store::for_relay(
        &source.database,
        pool_size(source.relay.workers),
        source.relay.synchronous_commit,
    );
    // One destination takes every row: its claims need no route filter.
    if destinations.len() > 1 {
        store = store.with_routes(source.router.routes().len());
    }
    let store = Arc::new(store);
    span.in_scope(|| {
        info!(
            database = %describe_pg(&source.database.pg),
            table = %source.database.table,
            sslmode = source.database.tls.mode().name(),
            pooler = ?source.database.pooler,
            connections = connections(source.relay.workers, source.listen.is_some()),
            "source configured"
        )
    });
    let relay = Relay::routed(
        store.clone(),
        destinations,
        source.router.clone(),
        source.relay.clone(),
        source_metrics.clone(),
    );
    let state = SourceState {
        name: name.clone(),
        probe: Arc::new(Store::new(&source.database, 1)),
        liveness: relay.liveness(),
        health: relay.health(),
        metrics: source_metrics.clone(),
    };
    // Task names carry the source's, so a failure says whose it was.
    let task_name = |task: &str| match &name {
        Some(name) => format!("{task} of source {name}"),
        None => task.to_owned(),
    };
    tasks.spawn(task_name("gauges"), Ends::OnShutdown, {
        let task = crate::maintenance::gauges::run(
            store.clone(),
            source_metrics.clone(),
            crate::maintenance::gauges::REFRESH_INTERVAL,
            shutdown.clone(),
        );
        async move {
            task.await;
            Ok(())
        }
        .instrument(span.clone())
    });
    // Disabled retention returns at once, which is not a failure.
    let retention_ends = match source.retention {
        Some(_) => Ends::OnShutdown,
        None => Ends::WhenDone,
    };
    tasks.spawn(task_name("retention"), retention_ends, {
        let task = crate::maintenance::retention::run(
            store.clone(),
            source.retention,
            source_metrics.clone(),
            relay.catch_up(),
            shutdown.clone(),
        );
        async move {
            task.await;
            Ok(())
        }
        .instrument(span.clone())
    });
    match source.listen.clone() {
        Some(endpoint) => {
            tasks.spawn(task_name("listen"), Ends::OnShutdown, {
                let task = crate::store::listen(
                    endpoint,
                    source.database.table.clone(),
                    relay.waker(),
                    shutdown.clone(),
                );
                async move {
                    task.await;
                    Ok(())
                }
                .instrument(span.clone())
            });
        }
        None => span.in_scope(|| {
            info!(
                report = "polling_without_listen",
                poll_interval_ms = source.relay.poll_interval.as_millis() as u64,
                "no LISTEN behind a transaction pooler without OUTBOX_LISTEN_DATABASE_URL: \
                 new rows are found by polling every OUTBOX_POLL_INTERVAL"
            )
        }),
    }
    let tolerate_unusable_table = name.is_some();
    tasks.spawn(task_name("relay"), Ends::OnShutdown, {
        let shutdown = shutdown.clone();
        let liveness = relay.liveness();
        let health = relay.health();
        async move {
            let ready = check_table(&store, &liveness, &health, tolerate_unusable_table, &shutdown).await?;
            if ready {
                relay.run(shutdown).await;
            }
            Ok(())
        }
        .instrument(span)
    });
    state
}

/// Checks the table before the first claim, waiting for the database if it
/// is not there yet; `false` when shutdown came first. What the claim copes
/// with is reported and tolerated (see `store/columns.rs`). A table no row
/// can be relayed from is an error for the one source of the environment
/// (the relay would fail on, or quarantine, every row: better to stop and
/// say so), but one of several sources must not stop the others: it waits,
/// not ready, until its table is fixed (`outbox-relay migrate`).
async fn check_table(
    store: &Store,
    liveness: &Liveness,
    health: &RelayHealth,
    tolerate_unusable_table: bool,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    let outage = Mutex::new(Outage::new("database"));
    let table_outage = Mutex::new(Outage::new(format!("table {}", store.table())));
    let mut database = Availability::new(&outage);
    let mut table = Availability::new(&table_outage);
    loop {
        // Waiting for the database is the loop's progress at this stage.
        liveness.beat_all();
        match store.check_table().await {
            Ok(findings) => {
                database.succeeded();
                let unusable: Vec<&str> = findings
                    .iter()
                    .filter(|finding| finding.severity == Severity::Unusable)
                    .map(|finding| finding.message.as_str())
                    .collect();
                if unusable.is_empty() || !tolerate_unusable_table {
                    table.succeeded();
                    crate::store::report_table_check(&findings)?;
                    return Ok(true);
                }
                let problem = format!(
                    "table {} cannot be relayed from: {}",
                    store.table(),
                    unusable.join("; ")
                );
                health.claim_failed(&problem);
                sleep_or_cancel(table.failed(&problem), shutdown).await;
            }
            Err(e) => {
                health.claim_failed(&e);
                sleep_or_cancel(database.failed(&e), shutdown).await;
            }
        }
        if shutdown.is_cancelled() {
            return Ok(false);
        }
    }
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
    names: HashMap<Id, (String, Ends)>,
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
        name: String,
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
            let (name, ends) = self
                .names
                .remove(&id)
                .unwrap_or_else(|| ("unknown".to_owned(), Ends::OnShutdown));
            let problem = match result {
                Err(e) => Some(format!("{e:#}")),
                Ok(()) if ends == Ends::OnShutdown && !self.shutdown.is_cancelled() => {
                    Some("it ended although no shutdown was requested".to_owned())
                }
                Ok(()) => None,
            };
            if let Some(problem) = problem {
                error!(report = "task_stopped", task = %name, %problem, "a task of the relay stopped; shutting down");
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
