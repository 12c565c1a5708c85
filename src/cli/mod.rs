//! The command line: `run` (the default), `migrate`, `check`, and the admin
//! commands. Exit status: 0 success, 2 invalid configuration or arguments,
//! 1 any other failure.

pub mod admin;

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use thiserror::Error;
use tracing::info;
use uuid::Uuid;

use crate::config::Config;
use crate::http::HttpSettings;
use crate::maintenance::retention::RetentionSettings;
use crate::relay::RelaySettings;
use crate::settings::{var, ConfigError};
use crate::sink::SinkSettings;
use crate::store::{describe_pg, DatabaseSettings, ListenSettings, MigrateSettings, Store};
use crate::telemetry::parse_log_format;

/// Command-line interface of `outbox-relay`.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Log format: `text` or `json`; the level comes from `RUST_LOG`.
    #[arg(long, env = var::LOG_FORMAT, default_value = "text", global = true)]
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
    listen: ListenSettings,
    #[command(flatten)]
    sink: SinkSettings,
    #[command(flatten)]
    relay: RelaySettings,
    #[command(flatten)]
    retention: RetentionSettings,
    #[command(flatten)]
    http: HttpSettings,
}

impl RunArgs {
    /// Validates everything, before anything connects.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let database = self.database.validate()?;
        let relay = self.relay.validate()?;
        Ok(Config {
            listen: self.listen.validate(&database)?,
            database,
            sink: self.sink.validate()?.with_publish_timeout(relay.publish_timeout),
            format: self.sink.format()?,
            relay,
            retention: self.retention.validate()?,
            http_addr: self.http.validate()?,
        })
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the relay loop, retention and the HTTP endpoints until SIGTERM/SIGINT.
    Run(RunArgs),
    /// Apply the embedded migrations to the outbox table (idempotent).
    Migrate(MigrateSettings),
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

/// `quarantine` actions.
#[derive(Debug, Subcommand)]
pub enum QuarantineAction {
    /// List quarantined rows, oldest quarantine first, a page at a time.
    List {
        #[command(flatten)]
        database: DatabaseSettings,
        /// Machine-readable output: a JSON array, written as rows arrive.
        #[arg(long)]
        json: bool,
        /// Rows on this page at most.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
        /// Start after this row, `<quarantined_at>,<id>`: the last row of the
        /// previous page, as printed on stderr (or taken from its JSON).
        #[arg(long, value_name = "QUARANTINED_AT,ID")]
        after: Option<admin::QuarantineCursor>,
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
    let format = match parse_log_format(&cli.log_format) {
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
        None => Ok(crate::app::run(cli.run.validate()?).await?),
        Some(Command::Run(args)) => Ok(crate::app::run(args.validate()?).await?),
        Some(Command::Migrate(args)) => migrate(args).await,
        Some(Command::Check(args)) => check(args.validate()?).await,
        Some(Command::Status { database, json }) => admin::status(database.validate()?, json).await,
        Some(Command::Quarantine { action }) => match action {
            QuarantineAction::List {
                database,
                json,
                limit,
                after,
            } => admin::quarantine_list(database.validate()?, json, limit, after).await,
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

async fn migrate(args: MigrateSettings) -> Result<(), CliError> {
    let (database, notify_trigger) = args.validate()?;
    let store = Store::new(&database, 1);
    let mut client = store
        .client()
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", describe_pg(&database.pg)))?;
    let applied = crate::store::migrate(&mut client, &database.table, notify_trigger, database.pooler)
        .await
        .map_err(|e| anyhow::anyhow!("migration failed: {e}"))?;
    if applied.is_empty() {
        info!(table = %database.table, "schema is up to date");
    } else {
        info!(table = %database.table, applied = ?applied, "migrations applied");
    }
    // The migrations add what is missing but never convert a producer's
    // column, so a type the relay cannot read survives them: say so now,
    // with the fix, rather than at the first claim. What they added stays;
    // it is what a later `migrate` would add anyway.
    let findings = crate::store::check_table(&client, &database.table)
        .await
        .map_err(|e| anyhow::anyhow!("cannot check the table's columns: {e}"))?;
    crate::store::report_table_check(&findings).map_err(anyhow::Error::from)?;
    Ok(())
}

async fn check(config: Config) -> Result<(), CliError> {
    let store = Store::new(&config.database, 1);
    store
        .ping()
        .await
        .map_err(|e| anyhow::anyhow!("database {}: {e}", describe_pg(&config.database.pg)))?;
    let sink = crate::sink::build(&config.sink, &config.format)
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
