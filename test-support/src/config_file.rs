//! A relay configuration file (`OUTBOX_CONFIG`, TOML) of a test's own, in
//! a temporary directory removed with it, and the TOML text tests write
//! into one.

use std::path::PathBuf;

use crate::system::{temp_dir, OwnedDir};

/// A configuration file written for one test, removed when dropped.
#[derive(Debug)]
pub struct ConfigFile {
    /// Where the file is: what `OUTBOX_CONFIG` (or `--config`) names, and
    /// so what the relay's errors about it name.
    pub path: PathBuf,
    /// The text written.
    pub contents: String,
    _dir: OwnedDir,
}

impl ConfigFile {
    /// Writes `contents` to `outbox-relay.toml` in a fresh directory.
    pub fn write(contents: &str) -> Self {
        let dir = temp_dir("outbox-test-config");
        let path = dir.path.join("outbox-relay.toml");
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        Self {
            path,
            contents: contents.to_owned(),
            _dir: dir,
        }
    }

    /// The path as text, for an environment variable or a flag.
    pub fn path_str(&self) -> &str {
        self.path.to_str().expect("temporary paths are UTF-8")
    }

    /// The number (from 1) of the first line of the file that contains
    /// `needle`; panics if none does.
    pub fn line_of(&self, needle: &str) -> usize {
        self.contents
            .lines()
            .position(|line| line.contains(needle))
            .map(|index| index + 1)
            .unwrap_or_else(|| panic!("no line contains {needle:?} in\n{}", self.contents))
    }
}

/// `value` as a TOML basic string, quotes included.
pub fn toml_string(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            '\t' => quoted.push_str("\\t"),
            c if c.is_control() => quoted.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// A `[[destination]]` table: `name`, `sink`, then `settings` in order
/// (each value written as a TOML string), as
/// [`crate::TestBroker::destination_settings`] and
/// [`crate::sqs::TestQueue::destination_settings`] give them.
pub fn destination(name: &str, sink: &str, settings: &[(&str, String)]) -> String {
    let mut table = format!(
        "[[destination]]\nname = {}\nsink = {}\n",
        toml_string(name),
        toml_string(sink)
    );
    for (key, value) in settings {
        table.push_str(&format!("{key} = {}\n", toml_string(value)));
    }
    table
}

/// A `[[route]]` table sending event types matching `event_type` (a glob)
/// to `destination`.
pub fn route(event_type: &str, destination: &str) -> String {
    format!(
        "[[route]]\nevent_type = {}\ndestination = {}\n",
        toml_string(event_type),
        toml_string(destination)
    )
}
