//! Producer-written message headers: the optional `headers` column (a JSON
//! object of string values), parsed once when a row is claimed, and the
//! W3C trace context they may carry.
//!
//! Parsing here checks only what every sink needs (an object whose values
//! are all strings, no name the relay sets itself); each sink then checks
//! what its broker can carry (names, counts, sizes) before sending.

use std::fmt;

/// Header names every sink sets itself, on every message: a producer's
/// header may not take their place. Compared without regard to case, so
/// that `Event_Id` cannot pose as `event_id` to a consumer that folds case.
pub const RELAY_NAMES: [&str; 4] = ["event_id", "event_type", "aggregate_id", "causation_id"];

/// The W3C trace context headers, carried verbatim like any other.
pub const TRACEPARENT: &str = "traceparent";

/// A row's headers, sorted by name (no broker keeps their order: AMQP
/// header tables and SQS attributes are maps).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    /// Parses the column's JSON text. Errors say what is wrong in words
    /// that follow "column headers", e.g. `is not a JSON object`.
    pub fn parse(json: &str) -> Result<Self, String> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| format!("is not valid JSON: {e}"))?;
        let serde_json::Value::Object(map) = value else {
            return Err(format!(
                "is not a JSON object of string values but {}",
                kind(&value)
            ));
        };
        let mut pairs = Vec::with_capacity(map.len());
        for (name, value) in map {
            if name.is_empty() {
                return Err("has an empty header name".to_owned());
            }
            match value {
                serde_json::Value::String(text) => pairs.push((name, text)),
                other => {
                    return Err(format!(
                        "has a non-string value for \"{}\" ({}); every value must be a JSON string",
                        printable(&name),
                        kind(&other)
                    ))
                }
            }
        }
        if let Some((name, _)) = pairs.iter().find(|(name, _)| is_relay_name(name)) {
            return Err(format!(
                "names \"{}\", which the relay sets itself (reserved: {})",
                printable(name),
                RELAY_NAMES.join(", ")
            ));
        }
        Ok(Self(pairs))
    }

    /// Headers from pairs, as parsed (for tests and other producers of
    /// events); no checks.
    pub fn from_pairs(pairs: Vec<(String, String)>) -> Self {
        Self(pairs)
    }

    /// Name and value of each header.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none (no column, NULL, or `{}`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of the header `name` (exact name).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(n, _)| *n == name).map(|(_, value)| value)
    }

    /// Gives the header `name` (exact name) a new value, if the row has it.
    pub fn replace(&mut self, name: &str, value: String) {
        if let Some((_, old)) = self.0.iter_mut().find(|(n, _)| n == name) {
            *old = value;
        }
    }

    /// The trace id of a valid W3C `traceparent` header, for logs. An
    /// invalid one is still carried, but names no trace.
    pub fn trace_id(&self) -> Option<&str> {
        self.get(TRACEPARENT).and_then(trace_id)
    }
}

/// Whether `name` is one of [`RELAY_NAMES`], in any case.
fn is_relay_name(name: &str) -> bool {
    RELAY_NAMES
        .iter()
        .any(|reserved| reserved.eq_ignore_ascii_case(name))
}

fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A header name as it may appear in a reason: at most 64 characters,
/// control characters escaped, so that `last_error` stays one short line.
pub fn printable(name: &str) -> Printable<'_> {
    Printable(name)
}

/// See [`printable`].
pub struct Printable<'a>(&'a str);

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (count, c) in self.0.chars().enumerate() {
            if count == 64 {
                return f.write_str("…");
            }
            write!(f, "{}", c.escape_debug())?;
        }
        Ok(())
    }
}

/// The trace id of a W3C `traceparent` value
/// (`version-traceid-parentid-flags`, lowercase hex), or `None` when it is
/// not valid: version `ff` is invalid, and so is an all-zero trace or
/// parent id. A later version may append fields after a `-`; version `00`
/// may not.
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let bytes = traceparent.as_bytes();
    let lower_hex = |range: std::ops::Range<usize>| {
        bytes.get(range).is_some_and(|part| {
            part.iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        })
    };
    let dashes = [2, 35, 52].iter().all(|&at| bytes.get(at) == Some(&b'-'));
    if !(dashes && lower_hex(0..2) && lower_hex(3..35) && lower_hex(36..52) && lower_hex(53..55)) {
        return None;
    }
    let version = &traceparent[0..2];
    let trace = &traceparent[3..35];
    let parent = &traceparent[36..52];
    let all_zero = |part: &str| part.bytes().all(|b| b == b'0');
    if version == "ff" || all_zero(trace) || all_zero(parent) {
        return None;
    }
    let well_ended = match (version, bytes.len()) {
        (_, 55) => true,
        ("00", _) => false,
        (_, _) => bytes.get(55) == Some(&b'-'),
    };
    well_ended.then_some(trace)
}

/// The trace ids of a batch for one log field: distinct, in order, at most
/// [`MAX_TRACE_IDS`], then how many more; `None` when no row has one.
pub fn batch_trace_ids<'a>(ids: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut distinct: Vec<&str> = Vec::new();
    let mut more = 0usize;
    for id in ids {
        if distinct.contains(&id) {
            continue;
        }
        if distinct.len() < MAX_TRACE_IDS {
            distinct.push(id);
        } else {
            more += 1;
        }
    }
    if distinct.is_empty() {
        return None;
    }
    let mut field = distinct.join(",");
    if more > 0 {
        field.push_str(&format!(",+{more} more"));
    }
    Some(field)
}

/// Trace ids named in one batch log line: enough to find every trace of
/// a typical batch, bounded so that a large batch does not make a huge line.
pub const MAX_TRACE_IDS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn an_object_of_strings_is_kept_sorted_by_name() {
        let headers = Headers::parse(r#"{"tenant": "acme", "traceparent": "x", "a": ""}"#).unwrap();
        let pairs: Vec<(&str, &str)> = headers.iter().collect();
        assert_eq!(pairs, vec![("a", ""), ("tenant", "acme"), ("traceparent", "x")]);
        assert_eq!(headers.get("tenant"), Some("acme"));
        assert!(Headers::parse("{}").unwrap().is_empty());
    }

    #[test]
    fn other_shapes_are_refused_with_the_reason() {
        assert_eq!(
            Headers::parse(r#"["a"]"#).unwrap_err(),
            "is not a JSON object of string values but an array"
        );
        assert_eq!(
            Headers::parse(r#""a""#).unwrap_err(),
            "is not a JSON object of string values but a string"
        );
        let number = Headers::parse(r#"{"ok": "x", "retries": 3}"#).unwrap_err();
        assert!(number.contains("\"retries\" (a number)"), "{number}");
        let nested = Headers::parse(r#"{"o": {"a": "b"}}"#).unwrap_err();
        assert!(nested.contains("(an object)"), "{nested}");
        assert!(Headers::parse(r#"{"n": null}"#).unwrap_err().contains("(null)"));
        assert!(Headers::parse(r#"{"": "x"}"#)
            .unwrap_err()
            .contains("empty header name"));
        assert!(Headers::parse("{").unwrap_err().starts_with("is not valid JSON"));
    }

    #[test]
    fn the_relay_names_are_reserved_in_any_case() {
        for name in [
            "event_id",
            "event_type",
            "aggregate_id",
            "causation_id",
            "Event_ID",
        ] {
            let reason = Headers::parse(&format!(r#"{{"{name}": "x"}}"#)).unwrap_err();
            assert!(reason.contains("which the relay sets itself"), "{reason}");
            assert!(reason.contains(name), "{reason}");
        }
        assert!(Headers::parse(r#"{"event": "x", "event_idx": "y"}"#).is_ok());
    }

    #[test]
    fn names_in_reasons_are_short_and_on_one_line() {
        let long = "n".repeat(300);
        assert_eq!(printable(&long).to_string(), format!("{}…", "n".repeat(64)));
        assert_eq!(printable("a\nb\"c").to_string(), "a\\nb\\\"c");
    }

    #[test]
    fn traceparent_is_parsed_per_w3c() {
        assert_eq!(trace_id(VALID), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        // A later version may carry more fields after a dash.
        let future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert_eq!(trace_id(future), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        for invalid in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
        ] {
            assert_eq!(trace_id(invalid), None, "{invalid}");
        }
        let headers = Headers::from_pairs(vec![("traceparent".into(), VALID.into())]);
        assert_eq!(headers.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        let headers = Headers::from_pairs(vec![("traceparent".into(), "garbage".into())]);
        assert_eq!(headers.trace_id(), None);
    }

    #[test]
    fn a_batch_names_its_distinct_trace_ids_bounded() {
        assert_eq!(batch_trace_ids(std::iter::empty()), None);
        assert_eq!(
            batch_trace_ids(["a", "b", "a"].into_iter()).as_deref(),
            Some("a,b")
        );
        let many: Vec<String> = (0..20).map(|n| format!("t{n}")).collect();
        let field = batch_trace_ids(many.iter().map(String::as_str)).unwrap();
        assert!(field.starts_with("t0,t1,"), "{field}");
        assert!(field.ends_with(",t15,+4 more"), "{field}");
    }
}
