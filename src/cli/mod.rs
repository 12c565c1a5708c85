//! The command line: `run` (the default), `migrate`, `check`, and the admin
//! commands. Exit status: 0 success, 2 invalid configuration or arguments,
//! 1 any other failure.

pub mod admin;

use std::process::ExitCode;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info};
use uuid::Uuid;

use crate::config::{
    describe_pg, Config, ConfigError, DatabaseSettings, LogFormat, RelaySettings, SinkSettings,
};
use crate::http::HttpState;
use crate::metrics::Metrics;
use crate::relay::Relay;
use crate::store::Store;

/// Command-line interface of `outbox-relay`.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Log format: `text` or `json`; the level comes from `RUST_LOG`.
    #[arg(long, env = "OUTBOX_LOG_FORMAT", default_value = "text", global = true)]
    pub log_format: String,

    /// What to do; `run` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Settings of `run`, when no subcommand is given.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Every setting of the relay.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    database: DatabaseSettings,
    #[command(flatten)]
    sink: SinkSettings,
    #[command(flatten)]
    relay: RelaySettings,
}

impl RunArgs {
    /// Validates everything, before anything connects.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        Ok(Config {
            database: self.database.validate()?,
            sink: self.sink.validate()?,
            relay: self.relay.validate()?,
        })
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the relay loop, retention and the HTTP endpoints until SIGTERM/SIGINT.
    Run(RunArgs),
    /// Apply the embedded migrations to the outbox table (idempotent).
    Migrate(MigrateArgs),
    /// Validate the configuration and connect to the database and the sink.
    Check(RunArgs),
    /// Backlog, oldest unpublished age, quarantined rows, recent throughput.
    Status {
        #[command(flatten)]
        database: DatabaseSettings,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Inspect or release quarantined rows.
    Quarantine {
        #[command(subcommand)]
        action: QuarantineAction,
    },
    /// Re-queue rows published in a time window, so they are published again
    /// under the same ids.
    Replay {
        #[command(flatten)]
        database: DatabaseSettings,
        /// Start of the window (RFC 3339), by `published_at`.
        #[arg(long)]
        since: DateTime<Utc>,
        /// End of the window (RFC 3339, exclusive); now when omitted.
        #[arg(long)]
        until: Option<DateTime<Utc>>,
        /// Only rows of this event type.
        #[arg(long)]
        event_type: Option<String>,
    },
}

/// Settings of `migrate`.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    database: DatabaseSettings,

    /// `on` installs the trigger that NOTIFYs relays of new rows (low idle
    /// latency, a cost for concurrent producers); `off` removes it.
    #[arg(long, env = "OUTBOX_NOTIFY_TRIGGER", default_value = "on")]
    notify_trigger: String,
}

/// `quarantine` actions.
#[derive(Debug, Subcommand)]
pub enum QuarantineAction {
    /// List quarantined rows.
    List {
        #[command(flatten)]
        database: DatabaseSettings,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Put rows back in the queue: due now, attempts reset.
    Release {
        #[command(flatten)]
        database: DatabaseSettings,
        /// Ids of the rows to release.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<Uuid>,
        /// Release every quarantined row.
        #[arg(long)]
        all: bool,
    },
}

/// Why a command failed, and so its exit status.
#[derive(Debug, Error)]
pub enum CliError {
    /// Invalid configuration: exit 2.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Invalid arguments: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Anything else: exit 1.
    #[error("{0:#}")]
    Failed(#[from] anyhow::Error),
}

impl CliError {
    fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Config(_) | CliError::Usage(_) => ExitCode::from(2),
            CliError::Failed(_) => ExitCode::from(1),
        }
    }
}

/// Runs the parsed command line and returns the process exit status.
pub fn execute(cli: Cli) -> ExitCode {
    let format = match LogFormat::parse(&cli.log_format) {
        Ok(format) => format,
        Err(e) => {
            eprintln!("outbox-relay: {e}");
            return ExitCode::from(2);
        }
    };
    crate::telemetry::init(format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("outbox-relay: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outbox-relay: {e}");
            e.exit_code()
        }
    }
}

async fn dispatch(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        None => run(cli.run.validate()?).await,
        Some(Command::Run(args)) => run(args.validate()?).await,
        Some(Command::Migrate(args)) => migrate(args).await,
        Some(Command::Check(args)) => check(args.validate()?).await,
        Some(Command::Status { database, json }) => admin::status(database.validate()?, json).await,
        Some(Command::Quarantine { action }) => match action {
            QuarantineAction::List { database, json } => {
                admin::quarantine_list(database.validate()?, json).await
            }
            QuarantineAction::Release { database, ids, all } => {
                admin::quarantine_release(database.validate()?, ids, all).await
            }
        },
        Some(Command::Replay {
            database,
            since,
            until,
            event_type,
        }) => {
            if until.is_some_and(|until| until <= since) {
                return Err(CliError::Usage("--until must be later than --since".to_owned()));
            }
            admin::replay(database.validate()?, since, until, event_type).await
        }
    }
}

async fn migrate(args: MigrateArgs) -> Result<(), CliError> {
    let database = args.database.validate()?;
    let notify_trigger = match args.notify_trigger.trim() {
        "on" | "true" => true,
        "off" | "false" => false,
        other => {
            return Err(ConfigError {
                variable: "OUTBOX_NOTIFY_TRIGGER",
                problem: format!("'{other}' is not one of on, off"),
            }
            .into())
        }
    };
    let store = Store::new(&database, 1);
    let mut client = store
        .client()
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", describe_pg(&database.pg)))?;
    let applied = crate::store::migrate(&mut client, &database.table, notify_trigger)
        .await
        .map_err(|e| anyhow::anyhow!("migration failed: {e}"))?;
    if applied.is_empty() {
        info!(table = %database.table, "schema is up to date");
    } else {
        info!(table = %database.table, applied = ?applied, "migrations applied");
    }
    Ok(())
}

async fn check(config: Config) -> Result<(), CliError> {
    let store = Store::new(&config.database, 1);
    store
        .ping()
        .await
        .map_err(|e| anyhow::anyhow!("database {}: {e}", describe_pg(&config.database.pg)))?;
    let sink = crate::sink::build(&config.sink)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    sink.ready()
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", sink.kind()))?;
    println!(
        "ok: database {} and {} sink reachable",
        describe_pg(&config.database.pg),
        sink.kind()
    );
    Ok(())
}

/// Connections a replica needs: per worker one for its claim or its
/// outcomes (a batch with failures records up to three statements at once,
/// borrowing what idle workers leave), plus readiness probes and the
/// maintenance tasks.
fn pool_size(workers: u32) -> usize {
    workers as usize * 2 + 3
}

async fn run(config: Config) -> Result<(), CliError> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    serve(config, shutdown).await
}

/// Runs the relay, retention and the HTTP endpoints until `shutdown` is
/// cancelled; tests call this directly.
pub async fn serve(config: Config, shutdown: CancellationToken) -> Result<(), CliError> {
    let listener = tokio::net::TcpListener::bind(config.relay.http_addr)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on OUTBOX_HTTP_ADDR {}: {e}",
                config.relay.http_addr
            )
        })?;
    let metrics = Arc::new(Metrics::new());
    let store = Arc::new(Store::new(&config.database, pool_size(config.relay.workers)));
    let sink: Arc<dyn crate::sink::Sink> = crate::sink::build(&config.sink)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .into();
    info!(
        database = %describe_pg(&config.database.pg),
        table = %config.database.table,
        sink = sink.kind(),
        http = %config.relay.http_addr,
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
        config.relay.retention,
        metrics.clone(),
        shutdown.clone(),
    ));
    let relay = Relay::new(store.clone(), sink.clone(), config.relay.clone(), metrics.clone());
    tasks.spawn(crate::store::listen(
        config.database.clone(),
        relay.waker(),
        shutdown.clone(),
    ));
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
