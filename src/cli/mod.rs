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
use tracing::{info, Instrument};
use uuid::Uuid;

use crate::config::{Config, Layers, RunParts, SettingsError, SourceDatabase};
use crate::http::HttpSettings;
use crate::maintenance::retention::RetentionSettings;
use crate::relay::RelaySettings;
use crate::settings::{var, ConfigError};
use crate::sink::SinkSettings;
use crate::store::{describe_pg, DatabaseSettings, Granularity, ListenSettings, MigrateSettings, Store};
use crate::telemetry::parse_log_format;

/// Command-line interface of `outbox-relay`.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Log format: `text` or `json`; the level comes from `RUST_LOG`.
    #[arg(long, env = var::LOG_FORMAT, default_value = "text", global = true)]
    pub log_format: String,

    /// Configuration file (TOML): every setting below by its name in lower
    /// case without `OUTBOX_`, plus `[[source]]`, `[[destination]]` and
    /// `[[route]]` tables; a flag or a set variable wins over the file's
    /// top level, a source's own settings over everything.
    #[arg(long, env = var::CONFIG, global = true)]
    pub config: Option<String>,

    /// Only this `[[source]]` of the configuration file: `run`, `check`,
    /// `migrate` and `status` act on every source without it; `quarantine`
    /// and `replay` need it when the file has several.
    #[arg(long, global = true, value_name = "NAME")]
    pub source: Option<String>,

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
    pub fn validate(&self, layers: &Layers) -> Result<Config, SettingsError> {
        let mut args = self.clone();
        layers.apply(&mut args)?;
        layers.config(RunParts {
            database: &args.database,
            listen: &args.listen,
            sink: &args.sink,
            relay: &args.relay,
            retention: &args.retention,
            http: &args.http,
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
    Migrate {
        #[command(flatten)]
        #[allow(missing_docs)]
        settings: MigrateSettings,
        /// Create the table partitioned by range of created_at, one
        /// partition per day or per hour (`daily` or `hourly`), when it does
        /// not exist; an existing plain table is refused, never converted.
        /// Relays find a partitioned table by themselves.
        #[arg(long, value_parser = ["daily", "hourly"])]
        partitioned: Option<String>,
    },
    /// Validate the configuration and connect to the database and the sink.
    Check(RunArgs),
    /// Backlog, oldest unpublished age, quarantined rows, recent throughput.
    Status {
        #[command(flatten)]
        database: DatabaseSettings,
        /// Machine-readable output (with --watch, one JSON line per refresh).
        #[arg(long)]
        json: bool,
        /// Refresh until Ctrl-C, with the rates between refreshes.
        #[arg(long)]
        watch: bool,
        /// Time between refreshes of --watch (e.g. 2s, 500ms).
        #[arg(long, default_value = "2s", requires = "watch")]
        interval: String,
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
    let layers = match Layers::read(cli.config.as_deref(), cli.explicit.clone()) {
        Ok(layers) => layers,
        Err(e) => {
            eprintln!("outbox-relay: {e}");
            return ExitCode::from(2);
        }
    };
    let log_format = match layers.file.as_ref().and_then(|file| file.setting("log_format")) {
        Some(entry) if !layers.explicit.contains("log_format") => entry.value.clone(),
        _ => cli.log_format.clone(),
    };
    let format = match parse_log_format(&log_format) {
        Ok(format) => format,
        Err(e) => {
            eprintln!("outbox-relay: {e}");
            return ExitCode::from(2);
        }
    };
    let spans = match crate::otel::export_settings(|name| std::env::var(name).ok()) {
        Ok(Some(settings)) => match crate::otel::start(settings) {
            Ok(provider) => Some(provider),
            Err(e) => {
                eprintln!("outbox-relay: {e}");
                return ExitCode::from(2);
            }
        },
        Ok(None) => None,
        Err(e) => {
            eprintln!("outbox-relay: {e}");
            return ExitCode::from(2);
        }
    };
    crate::telemetry::init(format, spans.as_ref());
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("outbox-relay: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(dispatch(cli, layers));
    // Sends the spans still waiting in the batch processor (bounded by
    // the exporter's timeout): the last batches' spans are the ones an
    // operator looks for after a shutdown.
    if let Some(provider) = spans {
        if let Err(e) = provider.shutdown() {
            eprintln!("outbox-relay: not every span was exported at exit: {e}");
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outbox-relay: {e}");
            e.exit_code()
        }
    }
}

/// Keeps the sources `--source` names: all of them without it. `named`:
/// whether the sources are the file's (else `--source` has nothing to
/// pick from).
fn select<T>(
    mut items: Vec<T>,
    name_of: impl Fn(&T) -> &str,
    wanted: Option<&str>,
    named: bool,
) -> Result<Vec<T>, CliError> {
    let Some(wanted) = wanted else {
        return Ok(items);
    };
    if !named {
        return Err(CliError::Usage(
            "--source: the configuration has no [[source]] tables; it serves one database".to_owned(),
        ));
    }
    if !items.iter().any(|item| name_of(item) == wanted) {
        let names: Vec<&str> = items.iter().map(&name_of).collect();
        return Err(CliError::Usage(format!(
            "--source: no source is named \"{wanted}\" (they are: {})",
            names.join(", ")
        )));
    }
    items.retain(|item| name_of(item) == wanted);
    Ok(items)
}

/// The one source a command acts on: `--source`'s, or the only one.
fn one_source(
    databases: Vec<SourceDatabase>,
    wanted: Option<&str>,
    named: bool,
) -> Result<admin::Target, CliError> {
    let mut selected = select(databases, |source| &source.name, wanted, named)?;
    if selected.len() > 1 {
        let names: Vec<&str> = selected.iter().map(|source| source.name.as_str()).collect();
        return Err(CliError::Usage(format!(
            "--source: the configuration file has several sources ({}); name the one to act on",
            names.join(", ")
        )));
    }
    // `select` keeps at least one: the named one, or all of at least one.
    let source = selected.remove(0);
    Ok(admin::Target::new(source, named))
}

async fn dispatch(cli: Cli, layers: Layers) -> Result<(), CliError> {
    let wanted = cli.source.as_deref();
    let named = layers.has_sources();
    // The admin commands read the database settings from the file too:
    // the top level's, or each source's.
    let databases = |settings: DatabaseSettings| -> Result<Vec<SourceDatabase>, CliError> {
        let settings = MigrateSettings {
            database: settings,
            notify_trigger: "on".to_owned(),
        };
        Ok(layers.databases(&settings)?)
    };
    let run_config = |args: RunArgs| -> Result<Config, CliError> {
        let mut config = args.validate(&layers)?;
        config.sources = select(config.sources, |source| &source.name, wanted, named)?;
        Ok(config)
    };
    match cli.command {
        None => Ok(crate::app::run(run_config(cli.run)?).await?),
        Some(Command::Run(args)) => Ok(crate::app::run(run_config(args)?).await?),
        Some(Command::Migrate {
            settings,
            partitioned,
        }) => {
            let targets = select(layers.databases(&settings)?, |source| &source.name, wanted, named)?;
            let partitioned = partitioned.map(|granularity| match granularity.as_str() {
                "hourly" => Granularity::Hourly,
                _ => Granularity::Daily,
            });
            migrate(targets, named, partitioned).await
        }
        Some(Command::Check(args)) => check(run_config(args)?).await,
        Some(Command::Status {
            database: settings,
            json,
            watch,
            interval,
        }) => {
            let targets = select(databases(settings)?, |source| &source.name, wanted, named)?;
            let routes = layers.routes()?;
            let targets = targets
                .into_iter()
                .map(|source| admin::Target::new(source, named))
                .collect();
            if watch {
                let every = crate::settings::parse_nonzero_duration("--interval", &interval)
                    .map_err(|e| CliError::Usage(e.to_string()))?;
                return admin::status_watch(targets, json, wanted.is_some(), routes.as_ref(), every).await;
            }
            admin::status(targets, json, wanted.is_some(), routes.as_ref()).await
        }
        Some(Command::Quarantine { action }) => match action {
            QuarantineAction::List {
                database: settings,
                json,
                limit,
                after,
            } => {
                admin::quarantine_list(
                    one_source(databases(settings)?, wanted, named)?,
                    json,
                    limit,
                    after,
                )
                .await
            }
            QuarantineAction::Release {
                database: settings,
                ids,
                all,
            } => admin::quarantine_release(one_source(databases(settings)?, wanted, named)?, ids, all).await,
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
            admin::replay(
                one_source(databases(settings)?, wanted, named)?,
                since,
                until,
                event_type,
            )
            .await
        }
    }
}

/// Migrates every source's table in turn; one that fails does not stop
/// the others, and the command fails naming it.
async fn migrate(
    targets: Vec<SourceDatabase>,
    named: bool,
    partitioned: Option<Granularity>,
) -> Result<(), CliError> {
    let mut failed = Vec::new();
    for target in &targets {
        let span = if named {
            tracing::info_span!("source", source = %target.name)
        } else {
            tracing::Span::none()
        };
        let result = migrate_one(target, partitioned).instrument(span).await;
        match result {
            Ok(()) => {}
            Err(e) if !named => return Err(e),
            Err(e) => {
                tracing::error!(source = %target.name, error = %e, "migration of this source failed");
                failed.push(format!("{}: {e}", target.name));
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!("migration failed for source(s): {}", failed.join("; ")).into())
    }
}

async fn migrate_one(target: &SourceDatabase, partitioned: Option<Granularity>) -> Result<(), CliError> {
    let database = &target.database;
    let store = Store::new(database, 1);
    let mut client = store
        .client()
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", describe_pg(&database.pg)))?;
    let applied = crate::store::migrate(
        &mut client,
        &database.table,
        target.notify_trigger,
        database.pooler,
        partitioned,
    )
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
    let mut failed = Vec::new();
    if !config.named_sources {
        let database = &config.sources[0].database;
        Store::new(database, 1)
            .ping()
            .await
            .map_err(|e| anyhow::anyhow!("database {}: {e}", describe_pg(&database.pg)))?;
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
                    describe_pg(&database.pg),
                    sink.kind()
                );
                return Ok(());
            }
        }
        println!("ok: database {} reachable", describe_pg(&database.pg));
    } else {
        // Every source at once, so one report names them all.
        let pings = config.sources.iter().map(|source| async move {
            let store = Store::new(&source.database, 1);
            match store.ping().await {
                Ok(()) => store
                    .check_table()
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|findings| {
                        let unusable: Vec<String> = findings
                            .into_iter()
                            .filter(|finding| finding.severity == crate::store::Severity::Unusable)
                            .map(|finding| finding.message)
                            .collect();
                        if unusable.is_empty() {
                            Ok(())
                        } else {
                            Err(unusable.join("; "))
                        }
                    }),
                Err(e) => Err(e.to_string()),
            }
        });
        for (source, result) in config.sources.iter().zip(futures::future::join_all(pings).await) {
            let place = format!(
                "database {} table {}",
                describe_pg(&source.database.pg),
                source.database.table
            );
            match result {
                Ok(()) => println!("ok: source {}: {place} reachable", source.name),
                Err(e) => {
                    println!("failed: source {}: {place}: {e}", source.name);
                    failed.push(format!("source {}", source.name));
                }
            }
        }
    }
    // Every destination is checked, at once, so one report names them all.
    let checks = config.destinations.iter().map(|destination| async move {
        let sink = crate::sink::build(&destination.sink, &destination.format).await?;
        sink.ready().await.map(|()| sink.kind())
    });
    for (destination, result) in config
        .destinations
        .iter()
        .zip(futures::future::join_all(checks).await)
    {
        match result {
            Ok(kind) => println!("ok: destination {} ({kind}) reachable", destination.name),
            Err(e) => {
                println!("failed: destination {}: {e}", destination.name);
                failed.push(format!("destination {}", destination.name));
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!("not reachable: {}", failed.join(", ")).into())
    }
}
