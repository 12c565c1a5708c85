//! The configuration file, `OUTBOX_CONFIG`: TOML read into plain text
//! settings, each with the line it came from, so that the parts parse the
//! file's values exactly as they parse the environment's, and every error
//! names the file, the line and the key.
//!
//! The shape: top-level keys are settings named like their variables (lower
//! case, without `OUTBOX_`); `[[source]]`, `[[destination]]` and `[[route]]`
//! are arrays of tables of such keys. Values are scalars (strings, numbers, booleans),
//! turned into the text a variable would hold. `${VAR}` in a string is that
//! environment variable, so secrets stay in the environment (a Kubernetes
//! Secret) while the file can live in a ConfigMap; `$${` is a literal `${`.

use std::fmt;

use thiserror::Error;
use toml::de::{DeTable, DeValue};

/// The key of the destinations' array of tables.
pub const DESTINATION: &str = "destination";
/// The key of the routes' array of tables.
pub const ROUTE: &str = "route";
/// The key of the sources' array of tables.
pub const SOURCE: &str = "source";

/// A configuration file, read and checked for unknown keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    /// The path as given, for messages.
    pub path: String,
    /// Top-level settings.
    pub settings: Vec<Entry>,
    /// `[[destination]]` tables, in order.
    pub destinations: Vec<Section>,
    /// `[[route]]` tables, in order.
    pub routes: Vec<Section>,
    /// `[[source]]` tables, in order.
    pub sources: Vec<Section>,
}

/// One setting: its key, its value as text (substituted), its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key as written.
    pub key: String,
    /// The value, as the corresponding variable would hold it.
    pub value: String,
    /// 1-based line of the value.
    pub line: usize,
}

/// One `[[destination]]` or `[[route]]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// 1-based line where the table starts.
    pub line: usize,
    /// Its settings.
    pub entries: Vec<Entry>,
}

impl Section {
    /// The entry for `key`, if the table has one.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|entry| entry.key == key)
    }
}

/// The keys each part of the file may hold.
#[derive(Debug, Clone, Copy)]
pub struct Keys<'a> {
    /// Top-level settings.
    pub top: &'a [&'a str],
    /// Keys of a `[[destination]]`.
    pub destination: &'a [&'a str],
    /// Keys of a `[[route]]`.
    pub route: &'a [&'a str],
    /// Keys of a `[[source]]`.
    pub source: &'a [&'a str],
}

/// Something wrong in the file: `path:line: what`.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("{path}:{line}: {what}")]
pub struct FileError {
    /// The file.
    pub path: String,
    /// 1-based line; 1 when the problem is the file as a whole.
    pub line: usize,
    /// The key and the problem, without secret values.
    pub what: String,
}

/// Where in the file a setting is, for messages: at the top level, or in
/// a destination (by name, or number when it has none) or a route (by
/// number, from 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// A top-level setting.
    Top,
    /// A `[[destination]]`, by name.
    Destination(String),
    /// A `[[destination]]` without a usable name, numbered from 1.
    DestinationNumber(usize),
    /// A `[[route]]`, numbered from 1.
    Route(usize),
    /// A `[[source]]`, by name.
    Source(String),
    /// A `[[source]]` without a usable name, numbered from 1.
    SourceNumber(usize),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Top => Ok(()),
            Scope::Destination(name) => write!(f, "destination \"{name}\": "),
            Scope::DestinationNumber(number) => write!(f, "destination {number}: "),
            Scope::Route(number) => write!(f, "route {number}: "),
            Scope::Source(name) => write!(f, "source \"{name}\": "),
            Scope::SourceNumber(number) => write!(f, "source {number}: "),
        }
    }
}

impl ConfigFile {
    /// Reads and parses the file at `path`; `env` looks variables up.
    pub fn read(path: &str, env: &dyn Fn(&str) -> Option<String>, keys: Keys<'_>) -> Result<Self, FileError> {
        let text = std::fs::read_to_string(path).map_err(|e| FileError {
            path: path.to_owned(),
            line: 1,
            what: format!("cannot read the configuration file: {e}"),
        })?;
        Self::parse(path, &text, env, keys)
    }

    /// Parses `text`, the contents of `path`.
    pub fn parse(
        path: &str,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        keys: Keys<'_>,
    ) -> Result<Self, FileError> {
        let reader = Reader { path, text, env };
        let document = DeTable::parse(text).map_err(|e| {
            let line = e.span().map_or(1, |span| reader.line(span.start));
            reader.error(line, e.message().trim_end().to_owned())
        })?;
        let mut file = Self {
            path: path.to_owned(),
            settings: Vec::new(),
            destinations: Vec::new(),
            routes: Vec::new(),
            sources: Vec::new(),
        };
        for (key, value) in document.get_ref() {
            let line = reader.line(key.span().start);
            match key.get_ref().as_ref() {
                DESTINATION => {
                    file.destinations =
                        reader.sections(value, DESTINATION, keys.destination, |number, _| {
                            Scope::DestinationNumber(number)
                        })?
                }
                ROUTE => {
                    file.routes =
                        reader.sections(value, ROUTE, keys.route, |number, _| Scope::Route(number))?
                }
                SOURCE => {
                    file.sources = reader.sections(value, SOURCE, keys.source, |number, _| {
                        Scope::SourceNumber(number)
                    })?
                }
                name => {
                    reader.known(&Scope::Top, line, name, keys.top)?;
                    file.settings.push(reader.entry(&Scope::Top, name, value)?);
                }
            }
        }
        Ok(file)
    }

    /// The line of a top-level setting, if the file has it.
    pub fn setting(&self, key: &str) -> Option<&Entry> {
        self.settings.iter().find(|entry| entry.key == key)
    }

    /// An error at `line`, in `scope`, about `key`.
    pub fn error(&self, line: usize, scope: &Scope, key: &str, problem: impl fmt::Display) -> FileError {
        FileError {
            path: self.path.clone(),
            line,
            what: format!("{scope}{key}: {problem}"),
        }
    }
}

struct Reader<'a> {
    path: &'a str,
    text: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Reader<'_> {
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        1 + self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
    }

    fn error(&self, line: usize, what: String) -> FileError {
        FileError {
            path: self.path.to_owned(),
            line,
            what,
        }
    }

    fn known(&self, scope: &Scope, line: usize, key: &str, allowed: &[&str]) -> Result<(), FileError> {
        if allowed.contains(&key) {
            return Ok(());
        }
        let hint = closest(key, allowed)
            .map(|near| format!(" (did you mean {near}?)"))
            .unwrap_or_default();
        Err(self.error(line, format!("{scope}{key}: unknown key{hint}")))
    }

    /// An array of tables, `[[name]]`, each table's keys checked.
    fn sections(
        &self,
        value: &toml::Spanned<DeValue<'_>>,
        name: &str,
        allowed: &[&str],
        scope_of: impl Fn(usize, &DeTable<'_>) -> Scope,
    ) -> Result<Vec<Section>, FileError> {
        let line = self.line(value.span().start);
        let DeValue::Array(tables) = value.get_ref() else {
            return Err(self.error(
                line,
                format!("{name}: must be an array of tables, written [[{name}]] before each one"),
            ));
        };
        let mut sections = Vec::new();
        for (index, table) in tables.iter().enumerate() {
            let line = self.line(table.span().start);
            let DeValue::Table(entries) = table.get_ref() else {
                return Err(self.error(
                    line,
                    format!("{name}: must be an array of tables, written [[{name}]]"),
                ));
            };
            let mut scope = scope_of(index + 1, entries);
            // Messages name a destination or a source by its name once it
            // has one.
            if name == DESTINATION || name == SOURCE {
                if let Some((_, value)) = entries.iter().find(|(key, _)| key.get_ref() == "name") {
                    if let DeValue::String(text) = value.get_ref() {
                        scope = if name == DESTINATION {
                            Scope::Destination(text.to_string())
                        } else {
                            Scope::Source(text.to_string())
                        };
                    }
                }
            }
            let mut section = Section {
                line,
                entries: Vec::new(),
            };
            for (key, value) in entries {
                let key_line = self.line(key.span().start);
                self.known(&scope, key_line, key.get_ref(), allowed)?;
                section.entries.push(self.entry(&scope, key.get_ref(), value)?);
            }
            sections.push(section);
        }
        Ok(sections)
    }

    fn entry(
        &self,
        scope: &Scope,
        key: &str,
        value: &toml::Spanned<DeValue<'_>>,
    ) -> Result<Entry, FileError> {
        let line = self.line(value.span().start);
        let problem = |problem: String| self.error(line, format!("{scope}{key}: {problem}"));
        let text = match value.get_ref() {
            DeValue::String(text) => substitute(text, self.env).map_err(problem)?,
            DeValue::Integer(number) => number.to_string(),
            DeValue::Float(number) => number.to_string(),
            DeValue::Boolean(flag) => flag.to_string(),
            DeValue::Datetime(_) => {
                return Err(problem(
                    "must be a string, a number or a boolean, not a date (quote it)".to_owned(),
                ))
            }
            DeValue::Array(_) => {
                return Err(problem(
                    "must be a single value, not an array (a list is one comma-separated string)".to_owned(),
                ))
            }
            DeValue::Table(_) => return Err(problem("must be a single value, not a table".to_owned())),
        };
        Ok(Entry {
            key: key.to_owned(),
            value: text,
            line,
        })
    }
}

/// Replaces each `${NAME}` by the variable's value; `$${` stays a literal
/// `${`. The error names the variable, never a value.
fn substitute(raw: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(start) = rest.find('$') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        if let Some(literal) = after.strip_prefix("${") {
            out.push_str("${");
            rest = literal;
        } else if let Some(reference) = after.strip_prefix('{') {
            let end = reference
                .find('}')
                .ok_or_else(|| "has a ${ without its closing }".to_owned())?;
            let name = &reference[..end];
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "${{{name}}} is not a variable name (letters, digits and _)"
                ));
            }
            let value = env(name)
                .ok_or_else(|| format!("${{{name}}}: the environment variable {name} is not set"))?;
            out.push_str(&value);
            rest = &reference[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The allowed key nearest to a mistyped one, if it is near enough to be
/// a typo (two edits at most).
fn closest<'a>(key: &str, allowed: &[&'a str]) -> Option<&'a str> {
    allowed
        .iter()
        .map(|candidate| (edit_distance(key, candidate), *candidate))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map(|(_, candidate)| candidate)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: Keys<'static> = Keys {
        top: &["batch_size", "database_url", "workers"],
        destination: &["name", "sink", "sqs_queue_url", "amqp_url"],
        route: &["event_type", "destination", "source"],
        source: &["name", "database_url", "batch_size"],
    };

    fn env(name: &str) -> Option<String> {
        match name {
            "SECRET_URL" => Some("amqp://u:p@broker/%2f".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn parse(text: &str) -> Result<ConfigFile, FileError> {
        ConfigFile::parse("relay.toml", text, &env, KEYS)
    }

    fn error(text: &str) -> String {
        parse(text).expect_err("an error").to_string()
    }

    #[test]
    fn settings_destinations_and_routes_with_their_lines() {
        let file = parse(
            "batch_size = 200\nworkers = 2\n\n[[destination]]\nname = \"orders\"\nsink = \"sqs\"\n\
             sqs_queue_url = \"http://q/1\"\n\n[[destination]]\nname = \"payments\"\nsink = \"rabbitmq\"\n\
             amqp_url = \"${SECRET_URL}\"\n\n[[route]]\nevent_type = \"order.*\"\ndestination = \"orders\"\n",
        )
        .expect("valid file");
        assert_eq!(
            file.setting("batch_size").map(|e| (e.value.as_str(), e.line)),
            Some(("200", 1))
        );
        assert_eq!(file.setting("workers").map(|e| e.value.as_str()), Some("2"));
        assert_eq!(file.destinations.len(), 2);
        assert_eq!(file.destinations[0].line, 4);
        assert_eq!(file.destinations[0].get("sqs_queue_url").map(|e| e.line), Some(7));
        let url = file.destinations[1].get("amqp_url").expect("amqp_url");
        assert_eq!(url.value, "amqp://u:p@broker/%2f");
        assert_eq!(url.line, 12);
        assert_eq!(file.routes.len(), 1);
        assert_eq!(
            file.routes[0].get("event_type").map(|e| e.value.as_str()),
            Some("order.*")
        );
    }

    #[test]
    fn sources_are_read_with_their_lines_and_named_in_errors() {
        let file = parse(
            "workers = 2\n\n[[source]]\nname = \"orders\"\ndatabase_url = \"${SECRET_URL}\"\n\n\
             [[source]]\nname = \"billing\"\nbatch_size = 50\n",
        )
        .expect("valid file");
        assert_eq!(file.sources.len(), 2);
        assert_eq!(file.sources[0].line, 3);
        assert_eq!(
            file.sources[0]
                .get("database_url")
                .map(|e| (e.value.as_str(), e.line)),
            Some(("amqp://u:p@broker/%2f", 5))
        );
        assert_eq!(
            file.sources[1].get("batch_size").map(|e| e.value.as_str()),
            Some("50")
        );
        assert_eq!(
            error("[[source]]\nname = \"orders\"\ndatabase_ulr = \"x\"\n"),
            "relay.toml:3: source \"orders\": database_ulr: unknown key (did you mean database_url?)"
        );
        assert_eq!(
            error("[[source]]\nworkers = 1\n"),
            "relay.toml:2: source 1: workers: unknown key"
        );
    }

    #[test]
    fn unknown_keys_are_refused_with_their_line_and_a_suggestion() {
        assert_eq!(
            error("workers = 1\nbatsh_size = 1\n"),
            "relay.toml:2: batsh_size: unknown key (did you mean batch_size?)"
        );
        assert_eq!(error("colour = 1\n"), "relay.toml:1: colour: unknown key");
        assert_eq!(
            error("[[destination]]\nname = \"orders\"\nsqs_queue_ulr = \"x\"\n"),
            "relay.toml:3: destination \"orders\": sqs_queue_ulr: unknown key (did you mean sqs_queue_url?)"
        );
        assert_eq!(
            error("[[destination]]\nsink = \"sqs\"\n[[route]]\nevent_type = \"*\"\ndest = \"x\"\n"),
            "relay.toml:5: route 1: dest: unknown key"
        );
    }

    #[test]
    fn variables_are_substituted_and_a_missing_one_is_named() {
        let file = parse("database_url = \"postgres://${EMPTY}db/$${NOT} $5\"\n").expect("valid");
        assert_eq!(file.settings[0].value, "postgres://db/${NOT} $5");
        assert_eq!(
            error("\n\ndatabase_url = \"${DATABASE_PASSWORD}\"\n"),
            "relay.toml:3: database_url: ${DATABASE_PASSWORD}: the environment variable DATABASE_PASSWORD is not set"
        );
        assert!(error("database_url = \"${OPEN\"\n").contains("without its closing }"));
        assert!(error("database_url = \"${1X}\"\n").contains("not a variable name"));
    }

    #[test]
    fn values_must_be_scalars_and_sections_arrays_of_tables() {
        assert_eq!(
            error("workers = [1, 2]\n"),
            "relay.toml:1: workers: must be a single value, not an array (a list is one comma-separated string)"
        );
        assert!(error("[destination]\nname = \"x\"\n").contains("written [[destination]]"));
        assert_eq!(
            parse("workers = true\n").expect("valid").settings[0].value,
            "true"
        );
    }

    #[test]
    fn syntax_errors_name_the_file_and_line() {
        let message = error("workers = 1\nbatch_size = = 2\n");
        assert!(message.starts_with("relay.toml:2: "), "{message}");
        let message = error("workers = 1\nworkers = 2\n");
        assert!(message.starts_with("relay.toml:2: "), "{message}");
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let message = ConfigFile::read("/nonexistent/relay.toml", &env, KEYS)
            .expect_err("missing file")
            .to_string();
        assert!(
            message.starts_with("/nonexistent/relay.toml:1: cannot read"),
            "{message}"
        );
    }
}
