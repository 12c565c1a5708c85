//! What every part's settings share: the variables' names, the error that
//! names one, and the parsing of the values they all take (durations,
//! choices, counts).
//!
//! It imports nothing of the crate's own, so that each part (store, sinks,
//! relay, HTTP, retention) can own its settings without importing the
//! assembler in `config`, and `config` can import every part: imports go one
//! way.
//!
//! Every part's settings stay text until validation, rather than being
//! typed by clap: clap's own errors name the flag, not the variable, and
//! take several lines, while the contract is one line naming the variable
//! and exit 2. Validation happens once, before anything connects, and never
//! echoes a secret.

use std::time::Duration;

use thiserror::Error;

/// The name of every environment variable, written once: clap reads them
/// and errors name them through these constants.
pub mod var {
    #![allow(missing_docs)]
    pub const DATABASE_URL: &str = "OUTBOX_DATABASE_URL";
    pub const DATABASE_POOLER: &str = "OUTBOX_DATABASE_POOLER";
    pub const LISTEN_DATABASE_URL: &str = "OUTBOX_LISTEN_DATABASE_URL";
    pub const TABLE: &str = "OUTBOX_TABLE";
    pub const SINK: &str = "OUTBOX_SINK";
    pub const AMQP_URL: &str = "OUTBOX_AMQP_URL";
    pub const AMQP_EXCHANGE: &str = "OUTBOX_AMQP_EXCHANGE";
    pub const AMQP_ROUTING_KEY: &str = "OUTBOX_AMQP_ROUTING_KEY";
    pub const AMQP_MAX_MESSAGE_BYTES: &str = "OUTBOX_AMQP_MAX_MESSAGE_BYTES";
    pub const MAX_BATCH_BYTES: &str = "OUTBOX_MAX_BATCH_BYTES";
    pub const AMQP_CA_FILE: &str = "OUTBOX_AMQP_CA_FILE";
    pub const AMQP_CLIENT_CERT_FILE: &str = "OUTBOX_AMQP_CLIENT_CERT_FILE";
    pub const AMQP_CLIENT_KEY_FILE: &str = "OUTBOX_AMQP_CLIENT_KEY_FILE";
    pub const SQS_QUEUE_URL: &str = "OUTBOX_SQS_QUEUE_URL";
    pub const SQS_ENDPOINT_URL: &str = "OUTBOX_SQS_ENDPOINT_URL";
    pub const NATS_URL: &str = "OUTBOX_NATS_URL";
    pub const NATS_SUBJECT: &str = "OUTBOX_NATS_SUBJECT";
    pub const NATS_CREDS_FILE: &str = "OUTBOX_NATS_CREDS_FILE";
    pub const NATS_CA_FILE: &str = "OUTBOX_NATS_CA_FILE";
    pub const NATS_MAX_CONTROL_LINE: &str = "OUTBOX_NATS_MAX_CONTROL_LINE";
    pub const KAFKA_BROKERS: &str = "OUTBOX_KAFKA_BROKERS";
    pub const KAFKA_TOPIC: &str = "OUTBOX_KAFKA_TOPIC";
    pub const KAFKA_SECURITY_PROTOCOL: &str = "OUTBOX_KAFKA_SECURITY_PROTOCOL";
    pub const KAFKA_SASL_MECHANISM: &str = "OUTBOX_KAFKA_SASL_MECHANISM";
    pub const KAFKA_SASL_USERNAME: &str = "OUTBOX_KAFKA_SASL_USERNAME";
    pub const KAFKA_SASL_PASSWORD: &str = "OUTBOX_KAFKA_SASL_PASSWORD";
    pub const KAFKA_CA_FILE: &str = "OUTBOX_KAFKA_CA_FILE";
    pub const KAFKA_CLIENT_CERT_FILE: &str = "OUTBOX_KAFKA_CLIENT_CERT_FILE";
    pub const KAFKA_CLIENT_KEY_FILE: &str = "OUTBOX_KAFKA_CLIENT_KEY_FILE";
    pub const KAFKA_PROPERTIES: &str = "OUTBOX_KAFKA_PROPERTIES";
    pub const BATCH_SIZE: &str = "OUTBOX_BATCH_SIZE";
    pub const POLL_INTERVAL: &str = "OUTBOX_POLL_INTERVAL";
    pub const MAX_ATTEMPTS: &str = "OUTBOX_MAX_ATTEMPTS";
    pub const PUBLISH_TIMEOUT: &str = "OUTBOX_PUBLISH_TIMEOUT";
    pub const BACKOFF_BASE: &str = "OUTBOX_BACKOFF_BASE";
    pub const BACKOFF_MAX: &str = "OUTBOX_BACKOFF_MAX";
    pub const ON_PUBLISH: &str = "OUTBOX_ON_PUBLISH";
    pub const SYNCHRONOUS_COMMIT: &str = "OUTBOX_SYNCHRONOUS_COMMIT";
    pub const RETENTION: &str = "OUTBOX_RETENTION";
    pub const ORDERING: &str = "OUTBOX_ORDERING";
    pub const HTTP_ADDR: &str = "OUTBOX_HTTP_ADDR";
    pub const WORKERS: &str = "OUTBOX_WORKERS";
    pub const LOG_FORMAT: &str = "OUTBOX_LOG_FORMAT";
    pub const NOTIFY_TRIGGER: &str = "OUTBOX_NOTIFY_TRIGGER";
    pub const MESSAGE_FORMAT: &str = "OUTBOX_MESSAGE_FORMAT";
    pub const CLOUDEVENTS_SOURCE: &str = "OUTBOX_CLOUDEVENTS_SOURCE";
    pub const CONFIG: &str = "OUTBOX_CONFIG";
}

/// A configuration value that cannot be used. `Display` is the one line the
/// binary prints before exiting with status 2.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{variable}: {problem}")]
pub struct ConfigError {
    /// The environment variable (or its flag) that is wrong.
    pub variable: &'static str,
    /// What is wrong with it, without the secret parts of the value.
    pub problem: String,
}

impl ConfigError {
    /// An error about `variable` (one of [`var`]).
    pub fn new(variable: &'static str, problem: impl Into<String>) -> Self {
        Self {
            variable,
            problem: problem.into(),
        }
    }
}

/// An optional setting; set to an empty string (as a chart or compose file
/// does for "unset"), it is unset.
pub fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// One of a fixed set of words; the error lists them.
pub fn parse_choice<T: Copy>(
    variable: &'static str,
    raw: &str,
    choices: &[(&str, T)],
) -> Result<T, ConfigError> {
    let raw = raw.trim();
    choices
        .iter()
        .find(|(name, _)| *name == raw)
        .map(|(_, value)| *value)
        .ok_or_else(|| {
            // Aliases (`true` for `on`) work but are not advertised.
            let mut names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
            names.retain(|name| !matches!(*name, "true" | "false"));
            ConfigError::new(variable, format!("'{raw}' is not one of {}", names.join(", ")))
        })
}

/// Parses durations such as `500ms`, `30s`, `5m`, `2h`, `7d`; a bare `0`
/// is zero.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    if raw == "0" {
        return Ok(Duration::ZERO);
    }
    let split = raw
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("'{raw}' has no unit (use ms, s, m, h or d, e.g. 500ms or 30s)"))?;
    let (number, unit) = raw.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("'{raw}' is not a duration (e.g. 500ms, 30s, 5m, 7d)"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "'{raw}' has an unknown unit '{unit}' (use ms, s, m, h or d)"
            ))
        }
    };
    value
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("'{raw}' is too long"))
}

/// A whole number from 1 to `max`.
pub fn parse_positive(variable: &'static str, raw: &str, max: u32) -> Result<u32, ConfigError> {
    let value: u32 = raw
        .trim()
        .parse()
        .map_err(|_| ConfigError::new(variable, format!("'{raw}' is not a positive whole number")))?;
    if value == 0 {
        return Err(ConfigError::new(variable, "must be at least 1"));
    }
    if value > max {
        return Err(ConfigError::new(variable, format!("must be at most {max}")));
    }
    Ok(value)
}

/// A duration (as [`parse_duration`]) longer than zero.
pub fn parse_nonzero_duration(variable: &'static str, raw: &str) -> Result<Duration, ConfigError> {
    let value = parse_duration(raw).map_err(|e| ConfigError::new(variable, e))?;
    if value.is_zero() {
        return Err(ConfigError::new(variable, "must be greater than 0"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_the_documented_forms() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn durations_reject_malformed_values() {
        for bad in ["", "5", "ms", "5x", "-1s", "1.5s", "5 s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad} should be rejected");
        }
    }
}
