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
//! variable wins over the file, the file over the defaults. What only the
//! file can say, the destinations and the routes between them, is
//! assembled here.

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
use file::{ConfigFile, FileError, Keys, Scope, Section};

/// Everything `outbox-relay run` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Database and table.
    pub database: DatabaseConfig,
    /// Where to LISTEN for new rows; `None` polls only.
    pub listen: Option<Endpoint>,
    /// Where events go: one destination per sink, each with its name.
    pub destinations: Vec<DestinationConfig>,
    /// Which destination each event goes to (indexes into `destinations`).
    pub router: Router,
    /// The relay loop.
    pub relay: RelayConfig,
    /// Age after which published rows are deleted; `None` keeps them.
    pub retention: Option<Duration>,
    /// Listen address of the HTTP endpoints.
    pub http_addr: SocketAddr,
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

/// The settings a configuration file names, and where each comes from: a
/// flag or a set variable wins over the file, the file over the defaults.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// The file, when `OUTBOX_CONFIG` names one.
    pub file: Option<ConfigFile>,
    /// Ids (`batch_size`) of the settings given by a flag or a variable.
    pub explicit: BTreeSet<String>,
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

impl Sources {
    /// Reads the file at `path`, if any, checking its keys.
    pub fn read(path: Option<&str>, explicit: BTreeSet<String>) -> Result<Self, FileError> {
        let file = match path.map(str::trim).filter(|path| !path.is_empty()) {
            Some(path) => {
                let top = top_keys();
                let mut destination = ids::<SinkSettings>();
                destination.push("name".to_owned());
                let top: Vec<&str> = top.iter().map(String::as_str).collect();
                let destination: Vec<&str> = destination.iter().map(String::as_str).collect();
                let keys = Keys {
                    top: &top,
                    destination: &destination,
                    route: &["event_type", "destination"],
                };
                Some(ConfigFile::read(path, &|name| std::env::var(name).ok(), keys)?)
            }
            None => None,
        };
        Ok(Self { file, explicit })
    }

    /// Gives `settings` the file's values for the settings no flag or
    /// variable set.
    pub fn apply<T: Args + FromArgMatches>(&self, settings: &mut T) -> Result<(), FileError> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        // The settings' own arguments, reading nothing but what is given.
        let command = T::augment_args(clap::Command::new("file").no_binary_name(true))
            .mut_args(|arg| arg.env(None::<&str>).default_value(None::<&str>).required(false));
        let mut given = Vec::new();
        for entry in &file.settings {
            if self.explicit.contains(&entry.key) {
                continue;
            }
            if let Some(long) = command
                .get_arguments()
                .find(|arg| arg.get_id() == entry.key.as_str())
                .and_then(|arg| arg.get_long())
            {
                given.push(format!("--{long}={}", entry.value));
            }
        }
        if given.is_empty() {
            return Ok(());
        }
        command
            .try_get_matches_from(given)
            .and_then(|matches| settings.update_from_arg_matches(&matches))
            .map_err(|e| file.error(1, &Scope::Top, "settings", e.kind()))
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

    /// The destinations and the routes between them: those of the file,
    /// or the one of the environment's sink settings, every event to it.
    pub fn destinations(
        &self,
        environment: &SinkSettings,
        publish_timeout: Duration,
    ) -> Result<(Vec<DestinationConfig>, Router), SettingsError> {
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
                return Ok((vec![destination], Router::everything_to_one()));
            }
        };
        self.file_destinations(file, publish_timeout)
    }

    /// The file's destinations and routes, `None` without `[[destination]]`
    /// tables: what `status` splits the backlog by.
    pub fn routes(&self) -> Result<Option<(Vec<DestinationConfig>, Router)>, SettingsError> {
        match &self.file {
            Some(file) if !file.destinations.is_empty() => {
                // The timeout only matters to a sink that publishes.
                self.file_destinations(file, Duration::from_secs(30)).map(Some)
            }
            _ => Ok(None),
        }
    }

    fn file_destinations(
        &self,
        file: &ConfigFile,
        publish_timeout: Duration,
    ) -> Result<(Vec<DestinationConfig>, Router), SettingsError> {
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
        let router = routes(file, &destinations)?;
        Ok((destinations, router))
    }
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
            let valid = !entry.value.is_empty()
                && entry.value.len() <= 64
                && entry
                    .value
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'));
            if !valid {
                return Err(file.error(
                    entry.line,
                    &Scope::DestinationNumber(number),
                    "name",
                    "must be 1 to 64 lower-case letters, digits, '_' or '-' (it is a metrics label)",
                ));
            }
            if entry.value == DEFAULT_DESTINATION {
                return Err(file.error(
                    entry.line,
                    &Scope::DestinationNumber(number),
                    "name",
                    format!("\"{DEFAULT_DESTINATION}\" names the environment's destination; choose another"),
                ));
            }
            entry.value.clone()
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

/// The `[[route]]` tables, in order; one destination and no routes sends
/// every event to it.
fn routes(file: &ConfigFile, destinations: &[DestinationConfig]) -> Result<Router, FileError> {
    if file.routes.is_empty() {
        if destinations.len() == 1 {
            return Ok(Router::everything_to_one());
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
        routes.push(Route {
            event_type,
            destination,
        });
    }
    for (index, destination) in destinations.iter().enumerate() {
        if !routes.iter().any(|route| route.destination == index) {
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
    Ok(Router::new(routes))
}

#[cfg(test)]
mod tests;
