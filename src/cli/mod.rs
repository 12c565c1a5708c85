//! The command line: `run` (the default), `migrate`, `check`, and the admin
//! commands. Exit status: 0 success, 2 invalid configuration or arguments,
//! 1 any other failure.

pub mod admin;

use std::collections::BTreeSet;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use thiserror::Error;
use tracing::info;
use uuid::Uuid;

use crate::config::{Config, SettingsError, Sources};
use crate::http::HttpSettings;
use crate::maintenance::retention::RetentionSettings;
use crate::relay::RelaySettings;
use crate::settings::{var, ConfigError};
use crate::sink::SinkSettings;
use crate::store::{describe_pg, DatabaseConfig, DatabaseSettings, ListenSettings, MigrateSettings, Store};
use crate::telemetry::parse_log_format;

/// Command-line interface of `outbox-relay`.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Log format: `text` or `json`; the level comes from `RUST_LOG`.
    #[arg(long, env = var::LOG_FORMAT, default_value = "text", global = true)]
    pub log_format: String,

    /// Configuration file (TOML): every setting below by its name in lower
    /// case without `OUTBOX_`, plus `[[destination]]` and `[[route]]`
    /// tables; a flag or a set variable wins over the file.
    #[arg(long, env = var::CONFIG, global = true)]
    pub config: Option<String>,

    /// The settings a flag or a variable gave, which the file does not
    /// override (filled by [`Cli::parse_with_sources`]).
    #[arg(skip)]
    pub explicit: BTreeSet<String>,

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
    /// Validates everything, the file's settings included, before anything
    /// connects.
    pub fn validate(&self, sources: &Sources) -> Result<Config, SettingsError> {
        let mut args = self.clone();
        sources.apply(&mut args)?;
        let locate = |error: ConfigError| sources.locate(error);
        let database = args.database.validate().map_err(locate)?;
        let relay = args.relay.validate().map_err(locate)?;
        let (destinations, router) = sources.destinations(&args.sink, relay.publish_timeout)?;
        Ok(Config {
            listen: args.listen.validate(&database).map_err(locate)?,
            database,
            destinations,
            router,
            relay,
            retention: args.retention.validate().map_err(locate)?,
            http_addr: args.http.validate().map_err(locate)?,
        })
    }
}

impl Cli {
    /// Parses the process's arguments, noting which settings a flag or a
    /// variable gave.
    pub fn parse_with_sources() -> Self {
        let matches = Self::command().get_matches();
        let mut cli = Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.explicit = explicit(&matches);
        cli
    }
}

/// The ids of the settings given by a flag or a variable, in the command
/// and its subcommands. A variable set to nothing is unset, as charts and
/// compose files write "unset".
fn explicit(matches: &ArgMatches) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut current = Some(matches);
    while let Some(matches) = current {
        for id in matches.ids() {
            let id = id.as_str();
            let given = matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            );
            let empty = matches
                .get_raw(id)
                .is_some_and(|mut values| values.all(|value| value.is_empty()));
            if given && !(empty && matches.value_source(id) == Some(ValueSource::EnvVariable)) {
                ids.insert(id.to_owned());
            }
        }
        current = matches.subcommand().map(|(_, sub)| sub);
    }
    ids
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
    /// Invalid configuration, from a setting or the configuration file:
    /// exit 2.
    #[error(transparent)]
    Settings(#[from] SettingsError),
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
            CliError::Config(_) | CliError::Settings(_) | CliError::Usage(_) => ExitCode::from(2),
            CliError::Failed(_) => ExitCode::from(1),
        }
    }
}

/// Runs the parsed command line and returns the process exit status.
pub fn execute(cli: Cli) -> ExitCode {
    let sources = match Sources::read(cli.config.as_deref(), cli.explicit.clone()) {
        Ok(sources) => sources,
        Err(e) => {
            eprintln!("outbox-relay: {e}");
            return ExitCode::from(2);
        }
    };
    let log_format = match sources.file.as_ref().and_then(|file| file.setting("log_format")) {
        Some(entry) if !sources.explicit.contains("log_format") => entry.value.clone(),
        _ => cli.log_format.clone(),
    };
    let format = match parse_log_format(&log_format) {
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
    match runtime.block_on(dispatch(cli, sources)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outbox-relay: {e}");
            e.exit_code()
        }
    }
}

async fn dispatch(cli: Cli, sources: Sources) -> Result<(), CliError> {
    // The admin commands read the database settings from the file too.
    let database = |mut settings: DatabaseSettings| -> Result<DatabaseConfig, CliError> {
        sources.apply(&mut settings).map_err(SettingsError::from)?;
        Ok(settings.validate().map_err(|e| sources.locate(e))?)
    };
    match cli.command {
        None => Ok(crate::app::run(cli.run.validate(&sources)?).await?),
        Some(Command::Run(args)) => Ok(crate::app::run(args.validate(&sources)?).await?),
        Some(Command::Migrate(mut args)) => {
            sources.apply(&mut args).map_err(SettingsError::from)?;
            migrate(args, &sources).await
        }
        Some(Command::Check(args)) => check(args.validate(&sources)?).await,
        Some(Command::Status {
            database: settings,
            json,
        }) => {
            let routes = sources.routes()?;
            admin::status(database(settings)?, json, routes.as_ref()).await
        }
        Some(Command::Quarantine { action }) => match action {
            QuarantineAction::List {
                database: settings,
                json,
                limit,
                after,
            } => admin::quarantine_list(database(settings)?, json, limit, after).await,
            QuarantineAction::Release {
                database: settings,
                ids,
                all,
            } => admin::quarantine_release(database(settings)?, ids, all).await,
        },
        Some(Command::Replay {
            database: settings,
            since,
            until,
            event_type,
        }) => {
            if until.is_some_and(|until| until <= since) {
                return Err(CliError::Usage("--until must be later than --since".to_owned()));
            }
            admin::replay(database(settings)?, since, until, event_type).await
        }
    }
}

async fn migrate(args: MigrateSettings, sources: &Sources) -> Result<(), CliError> {
    let (database, notify_trigger) = args.validate().map_err(|e| sources.locate(e))?;
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
    if let [only] = config.destinations.as_slice() {
        if only.name == crate::relay::DEFAULT_DESTINATION {
            let sink = crate::sink::build(&only.sink, &only.format)
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
            return Ok(());
        }
    }
    println!("ok: database {} reachable", describe_pg(&config.database.pg));
    // Every destination is checked, at once, so one report names them all.
    let checks = config.destinations.iter().map(|destination| async move {
        let sink = crate::sink::build(&destination.sink, &destination.format).await?;
        sink.ready().await.map(|()| sink.kind())
    });
    let mut failed = Vec::new();
    for (destination, result) in config
        .destinations
        .iter()
        .zip(futures::future::join_all(checks).await)
    {
        match result {
            Ok(kind) => println!("ok: destination {} ({kind}) reachable", destination.name),
            Err(e) => {
                println!("failed: destination {}: {e}", destination.name);
                failed.push(destination.name.as_str());
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!("destination(s) not reachable: {}", failed.join(", ")).into())
    }
}
