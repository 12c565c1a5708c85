//! The validated [`Config`] of `outbox-relay run`, assembled from what each
//! part validated of its own settings.
//!
//! Each part owns its settings and their validation (the store's in
//! `store`, each sink's in its folder, the loop's in `relay`, the HTTP
//! server's in `http`, retention's in `maintenance::retention`), and what
//! they share sits in the leaf `settings`. So this module imports the
//! parts and no part imports it: adding a setting touches its part, not a
//! hub every feature edits.
//!
//! The configuration file (`OUTBOX_CONFIG`, see [`file`]) is read into the
//! same settings structs, through the same clap arguments, as the
//! environment: a key of the file is the id of a part's argument, so every
//! part reads its settings one way wherever they come from. A flag or a set
//! variable wins over the file's top level, the top level over the
//! defaults. What only the file can say is assembled here: the sources
//! (`[[source]]`, each a database with its own relay settings, which win
//! over everything else since nothing else can address one source), the
//! destinations and the routes between them.

pub mod file;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, FromArgMatches};
use thiserror::Error;

use crate::cloudevents::MessageFormat;
use crate::http::HttpSettings;
use crate::maintenance::retention::RetentionSettings;
use crate::relay::{RelayConfig, RelaySettings, DEFAULT_DESTINATION};
use crate::route::{Glob, Route, Router};
use crate::settings::ConfigError;
use crate::sink::{SinkConfig, SinkSettings};
use crate::store::{DatabaseConfig, DatabaseSettings, Endpoint, ListenSettings, MigrateSettings};
use file::{ConfigFile, Entry, FileError, Keys, Scope, Section};

pub use crate::relay::DEFAULT_SOURCE;

/// Everything `outbox-relay run` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// The databases the relay serves, each with its own loop.
    pub sources: Vec<SourceConfig>,
    /// Whether the sources are the configuration file's `[[source]]`
    /// tables, named in metrics, logs and `/readyz`; otherwise there is one,
    /// the environment's, and the relay answers as it always has.
    pub named_sources: bool,
    /// Where events go: one destination per sink, each with its name.
    pub destinations: Vec<DestinationConfig>,
    /// Bound on one batch's publish, the same for every source (each
    /// destination's sink is built with it).
    pub publish_timeout: Duration,
    /// Listen address of the HTTP endpoints.
    pub http_addr: SocketAddr,
}

/// One source: a database and table, and the loop that relays its rows.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// Its name (metrics, logs, `/readyz`); [`DEFAULT_SOURCE`] for the
    /// environment's.
    pub name: String,
    /// Database and table.
    pub database: DatabaseConfig,
    /// Where to LISTEN for new rows; `None` polls only.
    pub listen: Option<Endpoint>,
    /// Which destination each of its events goes to (indexes into
    /// [`Config::destinations`]).
    pub router: Router,
    /// Its relay loop.
    pub relay: RelayConfig,
    /// Age after which its published rows are deleted; `None` keeps them.
    pub retention: Option<Duration>,
}

/// One destination, validated.
#[derive(Debug, Clone)]
pub struct DestinationConfig {
    /// Its name (metrics, logs, `/readyz`).
    pub name: String,
    /// Its sink's settings.
    pub sink: SinkConfig,
    /// How events become its messages.
    pub format: MessageFormat,
}

/// One source's database, as `migrate` and the admin commands use it.
#[derive(Debug, Clone)]
pub struct SourceDatabase {
    /// The source's name; [`DEFAULT_SOURCE`] for the environment's.
    pub name: String,
    /// Database and table.
    pub database: DatabaseConfig,
    /// Whether `migrate` installs the NOTIFY trigger.
    pub notify_trigger: bool,
}

/// Routes, each with the source it is limited to (`None`: every source
/// without routes of its own).
type SourceRoutes = Vec<(Option<String>, Route)>;

/// The destinations and the routes of the file, every source's.
#[derive(Debug, Clone)]
pub struct Routing {
    /// The destinations, in the file's order (or the environment's one).
    pub destinations: Vec<DestinationConfig>,
    /// Every route, with the source it is limited to.
    routes: SourceRoutes,
    /// No routes: every event to the one destination.
    everything_to_one: bool,
}

impl Routing {
    /// The routes of one source: those naming it, or, when none does,
    /// those naming no source.
    pub fn router(&self, source: &str) -> Router {
        if self.everything_to_one {
            return Router::everything_to_one();
        }
        let own: Vec<Route> = self
            .routes
            .iter()
            .filter(|(only, _)| only.as_deref() == Some(source))
            .map(|(_, route)| route.clone())
            .collect();
        if !own.is_empty() {
            return Router::new(own);
        }
        Router::new(
            self.routes
                .iter()
                .filter(|(only, _)| only.is_none())
                .map(|(_, route)| route.clone())
                .collect(),
        )
    }
}

/// A configuration that cannot be used: a setting (named by its
/// variable) or a place in the configuration file. Exit status 2.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SettingsError {
    /// A setting from a flag, a variable or a default.
    #[error(transparent)]
    Setting(#[from] ConfigError),
    /// Something in the file, with its line.
    #[error(transparent)]
    File(#[from] FileError),
}

/// Where the settings come from, in layers: the configuration file, and
/// which settings a flag or a set variable gave (those win over the file's
/// top level, which wins over the defaults; a source's own keys win over
/// all of them).
#[derive(Debug, Clone, Default)]
pub struct Layers {
    /// The file, when `OUTBOX_CONFIG` names one.
    pub file: Option<ConfigFile>,
    /// Ids (`batch_size`) of the settings given by a flag or a variable.
    pub explicit: BTreeSet<String>,
}

/// A `[[source]]` table whose name was checked.
struct SourceSection<'a> {
    name: String,
    section: &'a Section,
}

impl SourceSection<'_> {
    fn scope(&self) -> Scope {
        Scope::Source(self.name.clone())
    }
}

/// The relay settings a `[[source]]` may give for itself: all but the
/// publish timeout, which each destination's sink is built with.
fn source_relay_keys() -> Vec<String> {
    ids::<RelaySettings>()
        .into_iter()
        .filter(|key| key != "publish_timeout")
        .collect()
}

/// The database settings that belong to a source once the file has
/// `[[source]]` tables.
fn source_database_keys() -> Vec<String> {
    let mut keys = ids::<DatabaseSettings>();
    keys.extend(ids::<ListenSettings>());
    keys
}

/// Every key a `[[source]]` may hold.
fn source_keys() -> Vec<String> {
    let mut keys = vec!["name".to_owned()];
    keys.extend(source_database_keys());
    keys.extend(source_relay_keys());
    keys.extend(ids::<RetentionSettings>());
    keys.push("notify_trigger".to_owned());
    keys
}

/// A name the file gives a source or a destination: a metrics label.
fn label_name(file: &ConfigFile, entry: &Entry, scope: &Scope) -> Result<String, FileError> {
    let valid = !entry.value.is_empty()
        && entry.value.len() <= 64
        && entry
            .value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'));
    if valid {
        Ok(entry.value.clone())
    } else {
        Err(file.error(
            entry.line,
            scope,
            "name",
            "must be 1 to 64 lower-case letters, digits, '_' or '-' (it is a metrics label)",
        ))
    }
}

/// A settings struct with its defaults only: no flag, no variable.
fn default_settings<T: Args + FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults").no_binary_name(true))
        .mut_args(|arg| arg.env(None::<&str>));
    let matches = command
        .try_get_matches_from(Vec::<String>::new())
        // Every setting has a default or is optional: nothing is required.
        .expect("settings with defaults parse from nothing");
    T::from_arg_matches(&matches).expect("settings with defaults parse from nothing")
}

/// The ids of a settings struct's arguments: the keys the file uses.
fn ids<T: Args>() -> Vec<String> {
    T::augment_args(clap::Command::new("settings"))
        .get_arguments()
        .map(|arg| arg.get_id().to_string())
        .collect()
}

/// Every key the top level of the file may hold.
fn top_keys() -> Vec<String> {
    let mut keys = vec!["log_format".to_owned()];
    keys.extend(ids::<DatabaseSettings>());
    keys.extend(ids::<ListenSettings>());
    keys.extend(ids::<SinkSettings>());
    keys.extend(ids::<RelaySettings>());
    keys.extend(ids::<RetentionSettings>());
    keys.extend(ids::<HttpSettings>());
    keys.extend(ids::<MigrateSettings>());
    keys.sort();
    keys.dedup();
    keys
}

/// `run`'s settings, each part's, with flags, variables and the file's
/// top level applied: what [`Layers::config`] assembles.
#[derive(Debug, Clone, Copy)]
pub struct RunParts<'a> {
    /// The environment's database (unused with `[[source]]` tables).
    pub database: &'a DatabaseSettings,
    /// The environment's LISTEN URL (unused with `[[source]]` tables).
    pub listen: &'a ListenSettings,
    /// The environment's sink (unused with `[[destination]]` tables).
    pub sink: &'a SinkSettings,
    /// The relay loop's settings, every source's unless it gives its own.
    pub relay: &'a RelaySettings,
    /// Retention, every source's unless it gives its own.
    pub retention: &'a RetentionSettings,
    /// The HTTP endpoints.
    pub http: &'a HttpSettings,
}

impl Layers {
    /// Reads the file at `path`, if any, checking its keys.
    pub fn read(path: Option<&str>, explicit: BTreeSet<String>) -> Result<Self, FileError> {
        let file = match path.map(str::trim).filter(|path| !path.is_empty()) {
            Some(path) => {
                let top = top_keys();
                let mut destination = ids::<SinkSettings>();
                destination.push("name".to_owned());
                let source = source_keys();
                let top: Vec<&str> = top.iter().map(String::as_str).collect();
                let destination: Vec<&str> = destination.iter().map(String::as_str).collect();
                let source: Vec<&str> = source.iter().map(String::as_str).collect();
                let keys = Keys {
                    top: &top,
                    destination: &destination,
                    route: &["event_type", "destination", "source"],
                    source: &source,
                };
                Some(ConfigFile::read(path, &|name| std::env::var(name).ok(), keys)?)
            }
            None => None,
        };
        Ok(Self { file, explicit })
    }

    /// Gives `settings` the file's top-level values for the settings no
    /// flag or variable set.
    pub fn apply<T: Args + FromArgMatches>(&self, settings: &mut T) -> Result<(), FileError> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let entries = file
            .settings
            .iter()
            .filter(|entry| !self.explicit.contains(&entry.key));
        update(settings, entries).map_err(|e| file.error(1, &Scope::Top, "settings", e.kind()))
    }

    /// An error about a setting, placed in the file when its value came
    /// from there.
    pub fn locate(&self, error: ConfigError) -> SettingsError {
        let key = key_of(error.variable);
        match &self.file {
            Some(file) if !self.explicit.contains(&key) => match file.setting(&key) {
                Some(entry) => SettingsError::File(file.error(entry.line, &Scope::Top, &key, &error.problem)),
                None => SettingsError::Setting(error),
            },
            _ => SettingsError::Setting(error),
        }
    }

    /// Whether the file has `[[source]]` tables.
    pub fn has_sources(&self) -> bool {
        self.file.as_ref().is_some_and(|file| !file.sources.is_empty())
    }

    /// `run`'s configuration: every source with its database, loop and
    /// routes, and the destinations.
    pub fn config(&self, parts: RunParts<'_>) -> Result<Config, SettingsError> {
        let locate = |error: ConfigError| self.locate(error);
        let relay = parts.relay.validate().map_err(locate)?;
        let routing = self.routing(parts.sink, relay.publish_timeout)?;
        let http_addr = parts.http.validate().map_err(locate)?;
        let Some((file, sections)) = self.source_sections()? else {
            let database = parts.database.validate().map_err(locate)?;
            let source = SourceConfig {
                name: DEFAULT_SOURCE.to_owned(),
                listen: parts.listen.validate(&database).map_err(locate)?,
                database,
                router: routing.router(DEFAULT_SOURCE),
                relay: relay.clone(),
                retention: parts.retention.validate().map_err(locate)?,
            };
            return Ok(Config {
                sources: vec![source],
                named_sources: false,
                destinations: routing.destinations,
                publish_timeout: relay.publish_timeout,
                http_addr,
            });
        };
        self.warn_ignored_database_settings();
        let mut sources = Vec::with_capacity(sections.len());
        for source in &sections {
            let in_source = |error: ConfigError| self.locate_in_source(file, source, error);
            let database = self.source_database(file, source)?;
            let mut listen = default_settings::<ListenSettings>();
            self.overlay(file, source, &mut listen)?;
            let mut relay_settings = parts.relay.clone();
            self.overlay(file, source, &mut relay_settings)?;
            let mut retention = parts.retention.clone();
            self.overlay(file, source, &mut retention)?;
            let router = routing.router(&source.name);
            if router.routes().is_empty() {
                return Err(file
                    .error(
                        source.section.line,
                        &source.scope(),
                        "route",
                        "no [[route]] applies to this source: add routes that name it, or routes that name no source",
                    )
                    .into());
            }
            sources.push(SourceConfig {
                name: source.name.clone(),
                listen: listen.validate(&database).map_err(in_source)?,
                database,
                router,
                relay: relay_settings.validate().map_err(in_source)?,
                retention: retention.validate().map_err(in_source)?,
            });
        }
        Ok(Config {
            sources,
            named_sources: true,
            destinations: routing.destinations,
            publish_timeout: relay.publish_timeout,
            http_addr,
        })
    }

    /// Each source's database, for `migrate` and the admin commands: the
    /// file's `[[source]]` tables, or the one `environment` gives (with the
    /// file's top level applied here).
    pub fn databases(&self, environment: &MigrateSettings) -> Result<Vec<SourceDatabase>, SettingsError> {
        let mut base = environment.clone();
        self.apply(&mut base)?;
        let Some((file, sections)) = self.source_sections()? else {
            let (database, notify_trigger) = base.validate().map_err(|e| self.locate(e))?;
            return Ok(vec![SourceDatabase {
                name: DEFAULT_SOURCE.to_owned(),
                database,
                notify_trigger,
            }]);
        };
        self.warn_ignored_database_settings();
        sections
            .iter()
            .map(|source| {
                let mut settings = MigrateSettings {
                    database: default_settings(),
                    notify_trigger: base.notify_trigger.clone(),
                };
                self.overlay(file, source, &mut settings)?;
                self.require_database_url(file, source)?;
                let (database, notify_trigger) = settings
                    .validate()
                    .map_err(|e| self.locate_in_source(file, source, e))?;
                Ok(SourceDatabase {
                    name: source.name.clone(),
                    database,
                    notify_trigger,
                })
            })
            .collect()
    }

    /// The file's destinations and routes, `None` without `[[destination]]`
    /// tables: what `status` splits each source's backlog by.
    pub fn routes(&self) -> Result<Option<Routing>, SettingsError> {
        match &self.file {
            Some(file) if !file.destinations.is_empty() => {
                // The timeout only matters to a sink that publishes.
                self.file_routing(file, Duration::from_secs(30)).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The destinations and the routes between them: those of the file,
    /// or the one of the environment's sink settings, every event to it.
    pub fn routing(
        &self,
        environment: &SinkSettings,
        publish_timeout: Duration,
    ) -> Result<Routing, SettingsError> {
        let file = match &self.file {
            Some(file) if !file.destinations.is_empty() => file,
            _ => {
                let mut sink = environment.clone();
                self.apply(&mut sink)?;
                let destination = DestinationConfig {
                    name: DEFAULT_DESTINATION.to_owned(),
                    sink: sink
                        .validate()
                        .map_err(|e| self.locate(e))?
                        .with_publish_timeout(publish_timeout),
                    format: sink.format().map_err(|e| self.locate(e))?,
                };
                if let Some(file) = &self.file {
                    if let Some(route) = file.routes.first() {
                        return Err(file
                            .error(
                                route.line,
                                &Scope::Route(1),
                                "destination",
                                "routes need [[destination]] tables to name",
                            )
                            .into());
                    }
                }
                return Ok(Routing {
                    destinations: vec![destination],
                    routes: Vec::new(),
                    everything_to_one: true,
                });
            }
        };
        self.file_routing(file, publish_timeout)
    }

    fn file_routing(&self, file: &ConfigFile, publish_timeout: Duration) -> Result<Routing, SettingsError> {
        let sink_keys = ids::<SinkSettings>();
        if let Some(entry) = file.settings.iter().find(|entry| sink_keys.contains(&entry.key)) {
            return Err(file
                .error(
                    entry.line,
                    &Scope::Top,
                    &entry.key,
                    "is a destination's setting: with [[destination]] tables, it belongs in one of them",
                )
                .into());
        }
        let ignored: Vec<&String> = sink_keys
            .iter()
            .filter(|key| self.explicit.contains(*key))
            .collect();
        if !ignored.is_empty() {
            let variables: Vec<String> = ignored
                .iter()
                .map(|key| format!("OUTBOX_{}", key.to_uppercase()))
                .collect();
            tracing::warn!(
                report = "sink_variables_ignored",
                variables = %variables.join(", "),
                "the configuration file has [[destination]] tables: the sink variables of the environment are not used"
            );
        }
        let mut destinations: Vec<DestinationConfig> = Vec::new();
        for (index, section) in file.destinations.iter().enumerate() {
            let destination = destination(file, section, index + 1, publish_timeout)?;
            if destinations.iter().any(|other| other.name == destination.name) {
                let line = section.get("name").map_or(section.line, |entry| entry.line);
                return Err(file
                    .error(
                        line,
                        &Scope::DestinationNumber(index + 1),
                        "name",
                        format!("\"{}\" is used by an earlier destination", destination.name),
                    )
                    .into());
            }
            destinations.push(destination);
        }
        let source_names: Vec<String> = self
            .source_sections()?
            .map(|(_, sections)| sections.into_iter().map(|source| source.name).collect())
            .unwrap_or_default();
        let (routes, everything_to_one) = routes(file, &destinations, &source_names)?;
        Ok(Routing {
            destinations,
            routes,
            everything_to_one,
        })
    }

    /// The file's `[[source]]` tables, each name checked; `None` when it
    /// has none. With sources, the database settings belong to them: one at
    /// the top level of the file is refused.
    fn source_sections(&self) -> Result<Option<(&ConfigFile, Vec<SourceSection<'_>>)>, FileError> {
        let Some(file) = self.file.as_ref().filter(|file| !file.sources.is_empty()) else {
            return Ok(None);
        };
        let database_keys = source_database_keys();
        if let Some(entry) = file
            .settings
            .iter()
            .find(|entry| database_keys.contains(&entry.key))
        {
            return Err(file.error(
                entry.line,
                &Scope::Top,
                &entry.key,
                "is a source's setting: with [[source]] tables, it belongs in one of them",
            ));
        }
        let mut sources: Vec<SourceSection<'_>> = Vec::with_capacity(file.sources.len());
        for (index, section) in file.sources.iter().enumerate() {
            let number = Scope::SourceNumber(index + 1);
            let Some(entry) = section.get("name") else {
                return Err(file.error(section.line, &number, "name", "is required"));
            };
            let name = label_name(file, entry, &number)?;
            if sources.iter().any(|other| other.name == name) {
                return Err(file.error(
                    entry.line,
                    &number,
                    "name",
                    format!("\"{name}\" is used by an earlier source"),
                ));
            }
            sources.push(SourceSection { name, section });
        }
        Ok(Some((file, sources)))
    }

    /// With `[[source]]` tables, the environment's database settings are
    /// not used: said once, naming the variables.
    fn warn_ignored_database_settings(&self) {
        let ignored: Vec<String> = source_database_keys()
            .iter()
            .filter(|key| self.explicit.contains(*key))
            .map(|key| format!("OUTBOX_{}", key.to_uppercase()))
            .collect();
        if !ignored.is_empty() {
            tracing::warn!(
                report = "database_variables_ignored",
                variables = %ignored.join(", "),
                "the configuration file has [[source]] tables: the database settings of the environment and flags are not used"
            );
        }
    }

    /// A source's database and table: its own keys over the defaults,
    /// never the environment's (which names another database).
    fn source_database(
        &self,
        file: &ConfigFile,
        source: &SourceSection<'_>,
    ) -> Result<DatabaseConfig, SettingsError> {
        self.require_database_url(file, source)?;
        let mut settings = default_settings::<DatabaseSettings>();
        self.overlay(file, source, &mut settings)?;
        settings
            .validate()
            .map_err(|e| self.locate_in_source(file, source, e))
    }

    fn require_database_url(&self, file: &ConfigFile, source: &SourceSection<'_>) -> Result<(), FileError> {
        if source.section.get("database_url").is_some() {
            return Ok(());
        }
        Err(file.error(
            source.section.line,
            &source.scope(),
            "database_url",
            "is required",
        ))
    }

    /// Gives `settings` the values a `[[source]]` sets for them.
    fn overlay<T: Args + FromArgMatches>(
        &self,
        file: &ConfigFile,
        source: &SourceSection<'_>,
        settings: &mut T,
    ) -> Result<(), FileError> {
        let entries = source.section.entries.iter().filter(|entry| entry.key != "name");
        update(settings, entries)
            .map_err(|e| file.error(source.section.line, &source.scope(), "settings", e.kind()))
    }

    /// An error about a source's setting: at the source's line for it when
    /// the source gives it, else where the value came from.
    fn locate_in_source(
        &self,
        file: &ConfigFile,
        source: &SourceSection<'_>,
        error: ConfigError,
    ) -> SettingsError {
        let key = key_of(error.variable);
        match source.section.get(&key) {
            Some(entry) => file
                .error(entry.line, &source.scope(), &key, &error.problem)
                .into(),
            None => self.locate(error),
        }
    }
}

/// Updates `settings` with `entries` whose keys are its arguments' ids,
/// parsed by the same arguments as the flags and variables; other keys
/// are left to the parts they belong to.
fn update<'a, T: Args + FromArgMatches>(
    settings: &mut T,
    entries: impl Iterator<Item = &'a Entry>,
) -> Result<(), clap::Error> {
    // The settings' own arguments, reading nothing but what is given.
    let command = T::augment_args(clap::Command::new("file").no_binary_name(true))
        .mut_args(|arg| arg.env(None::<&str>).default_value(None::<&str>).required(false));
    let given: Vec<String> = entries
        .filter_map(|entry| {
            let arg = command
                .get_arguments()
                .find(|arg| arg.get_id() == entry.key.as_str())?;
            Some(format!("--{}={}", arg.get_long()?, entry.value))
        })
        .collect();
    if given.is_empty() {
        return Ok(());
    }
    command
        .try_get_matches_from(given)
        .and_then(|matches| settings.update_from_arg_matches(&matches))
}

/// The key of a variable's setting: `OUTBOX_BATCH_SIZE` is `batch_size`.
fn key_of(variable: &str) -> String {
    variable
        .strip_prefix("OUTBOX_")
        .unwrap_or(variable)
        .to_ascii_lowercase()
}

/// One `[[destination]]`: its settings read as the environment's are,
/// with the same defaults.
fn destination(
    file: &ConfigFile,
    section: &Section,
    number: usize,
    publish_timeout: Duration,
) -> Result<DestinationConfig, FileError> {
    let name = match section.get("name") {
        Some(entry) => {
            let name = label_name(file, entry, &Scope::DestinationNumber(number))?;
            if name == DEFAULT_DESTINATION {
                return Err(file.error(
                    entry.line,
                    &Scope::DestinationNumber(number),
                    "name",
                    format!("\"{DEFAULT_DESTINATION}\" names the environment's destination; choose another"),
                ));
            }
            name
        }
        None => {
            return Err(file.error(
                section.line,
                &Scope::DestinationNumber(number),
                "name",
                "is required",
            ))
        }
    };
    let scope = Scope::Destination(name.clone());
    if section.get("sink").is_none() {
        return Err(file.error(
            section.line,
            &scope,
            "sink",
            "is required: rabbitmq, sqs, nats or kafka",
        ));
    }
    let command = SinkSettings::augment_args(clap::Command::new("destination").no_binary_name(true))
        .mut_args(|arg| arg.env(None::<&str>));
    let given: Vec<String> = section
        .entries
        .iter()
        .filter(|entry| entry.key != "name")
        .filter_map(|entry| {
            let arg = command
                .get_arguments()
                .find(|arg| arg.get_id() == entry.key.as_str())?;
            Some(format!("--{}={}", arg.get_long()?, entry.value))
        })
        .collect();
    let settings = command
        .try_get_matches_from(given)
        .and_then(|matches| SinkSettings::from_arg_matches(&matches))
        .map_err(|e| file.error(section.line, &scope, "settings", e.kind()))?;
    let locate = |error: ConfigError| {
        let key = key_of(error.variable);
        let line = section.get(&key).map_or(section.line, |entry| entry.line);
        file.error(line, &scope, &key, error.problem)
    };
    Ok(DestinationConfig {
        sink: settings
            .validate()
            .map_err(locate)?
            .with_publish_timeout(publish_timeout),
        format: settings.format().map_err(locate)?,
        name,
    })
}

/// The `[[route]]` tables, in order, each with the source it is limited
/// to; one destination and no routes sends every event to it (`true`).
fn routes(
    file: &ConfigFile,
    destinations: &[DestinationConfig],
    sources: &[String],
) -> Result<(SourceRoutes, bool), FileError> {
    if file.routes.is_empty() {
        if destinations.len() == 1 {
            return Ok((Vec::new(), true));
        }
        let line = file.destinations.get(1).map_or(1, |section| section.line);
        return Err(file.error(
            line,
            &Scope::Top,
            "route",
            "several destinations need [[route]] tables saying which events go where",
        ));
    }
    let mut routes = Vec::new();
    for (index, section) in file.routes.iter().enumerate() {
        let scope = Scope::Route(index + 1);
        let required = |key: &str| {
            section
                .get(key)
                .ok_or_else(|| file.error(section.line, &scope, key, "is required"))
        };
        let pattern = required("event_type")?;
        let event_type =
            Glob::parse(&pattern.value).map_err(|e| file.error(pattern.line, &scope, "event_type", e))?;
        let target = required("destination")?;
        let destination = destinations
            .iter()
            .position(|destination| destination.name == target.value)
            .ok_or_else(|| {
                let names: Vec<&str> = destinations.iter().map(|d| d.name.as_str()).collect();
                file.error(
                    target.line,
                    &scope,
                    "destination",
                    format!(
                        "\"{}\" is not a destination (they are: {})",
                        target.value,
                        names.join(", ")
                    ),
                )
            })?;
        let only = match section.get("source") {
            None => None,
            Some(entry) if sources.is_empty() => {
                return Err(file.error(
                    entry.line,
                    &scope,
                    "source",
                    "names a source, but the file has no [[source]] tables",
                ))
            }
            Some(entry) if !sources.contains(&entry.value) => {
                return Err(file.error(
                    entry.line,
                    &scope,
                    "source",
                    format!(
                        "\"{}\" is not a source (they are: {})",
                        entry.value,
                        sources.join(", ")
                    ),
                ))
            }
            Some(entry) => Some(entry.value.clone()),
        };
        routes.push((
            only,
            Route {
                event_type,
                destination,
            },
        ));
    }
    for (index, destination) in destinations.iter().enumerate() {
        if !routes.iter().any(|(_, route)| route.destination == index) {
            let section = &file.destinations[index];
            let line = section.get("name").map_or(section.line, |entry| entry.line);
            return Err(file.error(
                line,
                &Scope::Destination(destination.name.clone()),
                "name",
                "no [[route]] names this destination",
            ));
        }
    }
    Ok((routes, false))
}

#[cfg(test)]
mod tests;
