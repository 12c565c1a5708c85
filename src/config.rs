//! Settings as the user gives them (environment variables and flags) and the
//! validated [`Config`] the rest of the relay works from.
//!
//! Validation happens once, before anything connects: every error names the
//! variable it is about, and never echoes a secret.

use std::fmt;
use std::time::Duration;

use clap::Args;
use thiserror::Error;

pub use crate::sink::sqs::SqsConfig;

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
    pub(crate) fn new(variable: &'static str, problem: impl Into<String>) -> Self {
        Self {
            variable,
            problem: problem.into(),
        }
    }
}

/// Connection settings every command needs: the database and the table.
#[derive(Debug, Clone, Args)]
pub struct DatabaseSettings {
    /// PostgreSQL connection URL (or key=value string) of the producer database.
    #[arg(
        long,
        env = "OUTBOX_DATABASE_URL",
        default_value = "postgres://postgres@localhost:5432/postgres",
        hide_env_values = true
    )]
    pub database_url: String,

    /// Outbox table, optionally schema-qualified (`schema.table`).
    #[arg(long, env = "OUTBOX_TABLE", default_value = "outbox_event")]
    pub table: String,
}

/// Settings of the sink the relay publishes to.
#[derive(Debug, Clone, Args)]
pub struct SinkSettings {
    /// Where events go: `rabbitmq` or `sqs`.
    #[arg(long, env = "OUTBOX_SINK", default_value = "rabbitmq")]
    pub sink: String,

    /// RabbitMQ URL (`amqp://` or `amqps://`).
    #[arg(
        long,
        env = "OUTBOX_AMQP_URL",
        default_value = "amqp://guest:guest@localhost:5672/%2f",
        hide_env_values = true
    )]
    pub amqp_url: String,

    /// Exchange the relay publishes to.
    #[arg(long, env = "OUTBOX_AMQP_EXCHANGE", default_value = "amq.topic")]
    pub amqp_exchange: String,

    /// Routing key template; `{event_type}` and `{aggregate_id}` are substituted.
    #[arg(long, env = "OUTBOX_AMQP_ROUTING_KEY", default_value = "{event_type}")]
    pub amqp_routing_key: String,

    /// SQS queue URL; required with `OUTBOX_SINK=sqs`. A `.fifo` URL turns on FIFO fields.
    #[arg(long, env = "OUTBOX_SQS_QUEUE_URL")]
    pub sqs_queue_url: Option<String>,

    /// Endpoint override for SQS emulators (LocalStack, ElasticMQ, moto).
    #[arg(long, env = "OUTBOX_SQS_ENDPOINT_URL")]
    pub sqs_endpoint_url: Option<String>,
}

/// Settings of the relay loop, retention and the HTTP endpoints.
#[derive(Debug, Clone, Args)]
pub struct RelaySettings {
    /// Rows claimed per transaction.
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value = "100")]
    pub batch_size: String,

    /// Longest sleep when there is nothing to publish.
    #[arg(long, env = "OUTBOX_POLL_INTERVAL", default_value = "500ms")]
    pub poll_interval: String,

    /// Failed attempts before a row is quarantined.
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value = "10")]
    pub max_attempts: String,

    /// A batch not confirmed by then counts as a failed attempt.
    #[arg(long, env = "OUTBOX_PUBLISH_TIMEOUT", default_value = "30s")]
    pub publish_timeout: String,

    /// First retry delay of the exponential backoff.
    #[arg(long, env = "OUTBOX_BACKOFF_BASE", default_value = "1s")]
    pub backoff_base: String,

    /// Cap of the exponential backoff.
    #[arg(long, env = "OUTBOX_BACKOFF_MAX", default_value = "5m")]
    pub backoff_max: String,

    /// `mark` sets `published_at`; `delete` deletes the row once confirmed.
    #[arg(long, env = "OUTBOX_ON_PUBLISH", default_value = "mark")]
    pub on_publish: String,

    /// Published rows older than this are deleted; `0` keeps them.
    #[arg(long, env = "OUTBOX_RETENTION", default_value = "7d")]
    pub retention: String,

    /// `none`, or `aggregate` for per-aggregate (created_at, id) order.
    #[arg(long, env = "OUTBOX_ORDERING", default_value = "none")]
    pub ordering: String,

    /// Listen address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "OUTBOX_HTTP_ADDR", default_value = "0.0.0.0:9090")]
    pub http_addr: String,

    /// Batches in flight at once in this replica (each claims, publishes
    /// and records on its own).
    #[arg(long, env = "OUTBOX_WORKERS", default_value = "4")]
    pub workers: String,
}

/// A validated, possibly schema-qualified table name, quoted for SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    /// Parses `table` or `schema.table`; each part must be a plain SQL
    /// identifier, so the quoted form can be spliced into SQL safely.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let parts: Vec<&str> = raw.split('.').collect();
        let (schema, name) = match parts.as_slice() {
            [name] => (None, *name),
            [schema, name] => (Some(*schema), *name),
            _ => return Err(format!("'{raw}' is not `table` or `schema.table`")),
        };
        for part in schema.iter().chain(std::iter::once(&name)) {
            validate_identifier(part).map_err(|why| format!("'{raw}' is not a valid table name: {why}"))?;
        }
        Ok(Self {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
        })
    }

    /// The unqualified table name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema, when the name was qualified.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The quoted, qualified form for SQL text, e.g. `"app"."outbox_event"`.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{}\"", self.name),
            None => format!("\"{}\"", self.name),
        }
    }

    /// A quoted name for an object (index, trigger) that belongs to this
    /// table, unqualified: indexes live in the table's schema anyway.
    pub fn derived(&self, suffix: &str) -> String {
        // Identifiers are limited to 63 bytes; validation keeps the table
        // name ASCII, so byte truncation cannot split a character.
        let mut base = format!("{}_{suffix}", self.name);
        base.truncate(63);
        format!("\"{base}\"")
    }
}

impl TableName {
    /// Like [`TableName::derived`], qualified with the table's schema (for
    /// functions, which are not implicitly in the table's schema).
    pub fn qualified_derived(&self, suffix: &str) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".{}", self.derived(suffix)),
            None => self.derived(suffix),
        }
    }

    /// The LISTEN/NOTIFY channel announcing new rows of this table. Only
    /// identifier characters (validated) and '_' go in, so it needs no
    /// escaping as a literal or a quoted identifier.
    pub fn notify_channel(&self) -> String {
        let mut channel = match &self.schema {
            Some(schema) => format!("outbox_relay_{schema}_{}", self.name),
            None => format!("outbox_relay_{}", self.name),
        };
        channel.truncate(63);
        channel
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

fn validate_identifier(part: &str) -> Result<(), &'static str> {
    let mut chars = part.chars();
    match chars.next() {
        None => return Err("empty identifier"),
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        Some(_) => return Err("an identifier must start with a letter or '_'"),
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("only ASCII letters, digits and '_' are allowed");
    }
    if part.len() > 63 {
        return Err("an identifier is at most 63 characters");
    }
    Ok(())
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

/// Hides the password of a URL, for logs and errors.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            if url.password().is_some() {
                let _ = url.set_password(Some("****"));
            }
            url.to_string()
        }
        Err(_) => "<unparseable url>".to_owned(),
    }
}

/// Which sink publishes events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkConfig {
    /// RabbitMQ through an exchange, with publisher confirms.
    RabbitMq(AmqpConfig),
    /// Amazon SQS, standard or FIFO.
    Sqs(SqsConfig),
}

/// RabbitMQ sink settings.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpConfig {
    /// Full URL, including credentials: never log it, use [`AmqpConfig::redacted_url`].
    pub url: String,
    /// Exchange to publish to (empty string is the default exchange).
    pub exchange: String,
    /// Routing key template.
    pub routing_key: RoutingKeyTemplate,
}

impl AmqpConfig {
    /// The URL with its password hidden.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }
}

impl fmt::Debug for AmqpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpConfig")
            .field("url", &self.redacted_url())
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .finish()
    }
}

/// One part of a routing key template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyPart {
    Literal(String),
    EventType,
    AggregateId,
}

/// A parsed `OUTBOX_AMQP_ROUTING_KEY`: literals with `{event_type}` and
/// `{aggregate_id}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingKeyTemplate {
    parts: Vec<KeyPart>,
}

impl RoutingKeyTemplate {
    /// Parses a template; an unknown `{placeholder}` or an unbalanced brace
    /// is an error rather than a literal, because it is almost surely a typo.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = raw;
        while let Some(open) = rest.find(['{', '}']) {
            if rest[open..].starts_with('}') {
                return Err(format!("'{raw}' has an unmatched '}}'"));
            }
            if open > 0 {
                parts.push(KeyPart::Literal(rest[..open].to_owned()));
            }
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("'{raw}' has an unmatched '{{'"))?;
            let name = &rest[open + 1..open + close];
            parts.push(match name {
                "event_type" => KeyPart::EventType,
                "aggregate_id" => KeyPart::AggregateId,
                other => {
                    return Err(format!(
                        "'{raw}' has an unknown placeholder {{{other}}} (known: {{event_type}}, {{aggregate_id}})"
                    ))
                }
            });
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(KeyPart::Literal(rest.to_owned()));
        }
        Ok(Self { parts })
    }

    /// The routing key of one event.
    pub fn render(&self, event_type: &str, aggregate_id: &str) -> String {
        let mut key = String::new();
        for part in &self.parts {
            match part {
                KeyPart::Literal(text) => key.push_str(text),
                KeyPart::EventType => key.push_str(event_type),
                KeyPart::AggregateId => key.push_str(aggregate_id),
            }
        }
        key
    }
}

/// What happens to a row once the broker confirmed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPublish {
    /// Set `published_at` (retention deletes it later).
    Mark,
    /// Delete the row at once.
    Delete,
}

/// Publication order guarantees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// Any order; maximum throughput.
    None,
    /// Per `aggregate_id`, in `(created_at, id)` order.
    Aggregate,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// Parses `OUTBOX_LOG_FORMAT`.
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        match raw {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(ConfigError::new(
                "OUTBOX_LOG_FORMAT",
                format!("'{other}' is not one of text, json"),
            )),
        }
    }
}

/// The database half of the configuration.
#[derive(Clone)]
pub struct DatabaseConfig {
    /// Parsed connection settings (the password stays inside).
    pub pg: tokio_postgres::Config,
    /// The outbox table.
    pub table: TableName,
}

impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("target", &describe_pg(&self.pg))
            .field("table", &self.table)
            .finish()
    }
}

/// `host:port/dbname` of a PostgreSQL config, for logs; never the password.
pub fn describe_pg(pg: &tokio_postgres::Config) -> String {
    let host = pg
        .get_hosts()
        .first()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".to_owned());
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let db = pg.get_dbname().or(pg.get_user()).unwrap_or("postgres");
    format!("{host}:{port}/{db}")
}

impl DatabaseSettings {
    /// Validates the database settings.
    pub fn validate(&self) -> Result<DatabaseConfig, ConfigError> {
        let url = self.database_url.trim();
        if url.is_empty() {
            return Err(ConfigError::new("OUTBOX_DATABASE_URL", "is empty"));
        }
        // tokio-postgres' parse errors name the offending part, not the
        // whole string, so they are safe to show.
        let pg: tokio_postgres::Config = url.parse().map_err(|e| {
            ConfigError::new(
                "OUTBOX_DATABASE_URL",
                format!("is not a valid PostgreSQL URL: {e}"),
            )
        })?;
        if url.contains("://") && url::Url::parse(url).is_err() {
            return Err(ConfigError::new("OUTBOX_DATABASE_URL", "is not a valid URL"));
        }
        let table = TableName::parse(self.table.trim()).map_err(|e| ConfigError::new("OUTBOX_TABLE", e))?;
        Ok(DatabaseConfig { pg, table })
    }
}

impl SinkSettings {
    /// Validates the sink settings.
    pub fn validate(&self) -> Result<SinkConfig, ConfigError> {
        match self.sink.trim() {
            "rabbitmq" => {
                let parsed = url::Url::parse(&self.amqp_url)
                    .map_err(|e| ConfigError::new("OUTBOX_AMQP_URL", format!("is not a valid URL: {e}")))?;
                if !matches!(parsed.scheme(), "amqp" | "amqps") {
                    return Err(ConfigError::new(
                        "OUTBOX_AMQP_URL",
                        format!("scheme '{}' is not amqp or amqps", parsed.scheme()),
                    ));
                }
                if self.amqp_url.parse::<lapin::uri::AMQPUri>().is_err() {
                    return Err(ConfigError::new("OUTBOX_AMQP_URL", "is not a valid AMQP URL"));
                }
                if self.amqp_exchange.len() > 255 {
                    return Err(ConfigError::new(
                        "OUTBOX_AMQP_EXCHANGE",
                        "is longer than 255 bytes",
                    ));
                }
                let routing_key = RoutingKeyTemplate::parse(&self.amqp_routing_key)
                    .map_err(|e| ConfigError::new("OUTBOX_AMQP_ROUTING_KEY", e))?;
                Ok(SinkConfig::RabbitMq(AmqpConfig {
                    url: self.amqp_url.clone(),
                    exchange: self.amqp_exchange.clone(),
                    routing_key,
                }))
            }
            "sqs" => {
                SqsConfig::from_settings(self.sqs_queue_url.as_deref(), self.sqs_endpoint_url.as_deref())
                    .map(SinkConfig::Sqs)
            }
            other => Err(ConfigError::new(
                "OUTBOX_SINK",
                format!("'{other}' is not one of rabbitmq, sqs"),
            )),
        }
    }
}

/// Validated relay-loop settings.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows claimed per batch.
    pub batch_size: u32,
    /// Longest idle sleep.
    pub poll_interval: Duration,
    /// Failed attempts before quarantine.
    pub max_attempts: u32,
    /// Bound on one batch's publish.
    pub publish_timeout: Duration,
    /// First backoff delay.
    pub backoff_base: Duration,
    /// Backoff cap.
    pub backoff_max: Duration,
    /// Mark or delete confirmed rows.
    pub on_publish: OnPublish,
    /// Age after which published rows are deleted; `None` keeps them.
    pub retention: Option<Duration>,
    /// Ordering guarantee.
    pub ordering: Ordering,
    /// HTTP listen address.
    pub http_addr: std::net::SocketAddr,
    /// Batches in flight at once.
    pub workers: u32,
}

impl RelayConfig {
    /// How long a claim keeps other replicas off a row. A relay that dies
    /// mid-batch delays its rows by this much; a live relay always records
    /// an outcome well before it runs out (the publish is bounded by
    /// `publish_timeout`, recording by the rest).
    pub fn lease(&self) -> Duration {
        self.publish_timeout * 2 + Duration::from_secs(5)
    }
}

fn parse_positive(variable: &'static str, raw: &str, max: u32) -> Result<u32, ConfigError> {
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

fn parse_duration_var(variable: &'static str, raw: &str) -> Result<Duration, ConfigError> {
    parse_duration(raw).map_err(|e| ConfigError::new(variable, e))
}

fn parse_nonzero_duration(variable: &'static str, raw: &str) -> Result<Duration, ConfigError> {
    let value = parse_duration_var(variable, raw)?;
    if value.is_zero() {
        return Err(ConfigError::new(variable, "must be greater than 0"));
    }
    Ok(value)
}

impl RelaySettings {
    /// Validates the relay settings.
    pub fn validate(&self) -> Result<RelayConfig, ConfigError> {
        let batch_size = parse_positive("OUTBOX_BATCH_SIZE", &self.batch_size, 10_000)?;
        let poll_interval = parse_nonzero_duration("OUTBOX_POLL_INTERVAL", &self.poll_interval)?;
        let max_attempts = parse_positive("OUTBOX_MAX_ATTEMPTS", &self.max_attempts, 1_000_000)?;
        let publish_timeout = parse_nonzero_duration("OUTBOX_PUBLISH_TIMEOUT", &self.publish_timeout)?;
        let backoff_base = parse_nonzero_duration("OUTBOX_BACKOFF_BASE", &self.backoff_base)?;
        let backoff_max = parse_nonzero_duration("OUTBOX_BACKOFF_MAX", &self.backoff_max)?;
        if backoff_max < backoff_base {
            return Err(ConfigError::new(
                "OUTBOX_BACKOFF_MAX",
                "must not be shorter than OUTBOX_BACKOFF_BASE",
            ));
        }
        let on_publish = match self.on_publish.trim() {
            "mark" => OnPublish::Mark,
            "delete" => OnPublish::Delete,
            other => {
                return Err(ConfigError::new(
                    "OUTBOX_ON_PUBLISH",
                    format!("'{other}' is not one of mark, delete"),
                ))
            }
        };
        let retention = parse_duration_var("OUTBOX_RETENTION", &self.retention)?;
        let ordering = match self.ordering.trim() {
            "none" => Ordering::None,
            "aggregate" => Ordering::Aggregate,
            other => {
                return Err(ConfigError::new(
                    "OUTBOX_ORDERING",
                    format!("'{other}' is not one of none, aggregate"),
                ))
            }
        };
        let workers = parse_positive("OUTBOX_WORKERS", &self.workers, 64)?;
        let http_addr = self.http_addr.trim().parse().map_err(|_| {
            ConfigError::new(
                "OUTBOX_HTTP_ADDR",
                format!("'{}' is not an address like 0.0.0.0:9090", self.http_addr),
            )
        })?;
        Ok(RelayConfig {
            batch_size,
            poll_interval,
            max_attempts,
            publish_timeout,
            backoff_base,
            backoff_max,
            on_publish,
            retention: (!retention.is_zero()).then_some(retention),
            ordering,
            http_addr,
            workers,
        })
    }
}

/// Everything `outbox-relay run` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Database and table.
    pub database: DatabaseConfig,
    /// Sink.
    pub sink: SinkConfig,
    /// Loop, retention and HTTP.
    pub relay: RelayConfig,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relay_settings() -> RelaySettings {
        RelaySettings {
            batch_size: "100".into(),
            poll_interval: "500ms".into(),
            max_attempts: "10".into(),
            publish_timeout: "30s".into(),
            backoff_base: "1s".into(),
            backoff_max: "5m".into(),
            on_publish: "mark".into(),
            retention: "7d".into(),
            ordering: "none".into(),
            http_addr: "0.0.0.0:9090".into(),
            workers: "4".into(),
        }
    }

    fn sink_settings() -> SinkSettings {
        SinkSettings {
            sink: "rabbitmq".into(),
            amqp_url: "amqp://guest:guest@localhost:5672/%2f".into(),
            amqp_exchange: "amq.topic".into(),
            amqp_routing_key: "{event_type}".into(),
            sqs_queue_url: None,
            sqs_endpoint_url: None,
        }
    }

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

    #[test]
    fn defaults_are_valid() {
        let relay = relay_settings().validate().unwrap();
        assert_eq!(relay.batch_size, 100);
        assert_eq!(relay.retention, Some(Duration::from_secs(7 * 86_400)));
        assert!(matches!(
            sink_settings().validate().unwrap(),
            SinkConfig::RabbitMq(_)
        ));
    }

    #[test]
    fn invalid_values_name_their_variable() {
        let cases: Vec<(RelaySettings, &str)> = vec![
            (
                RelaySettings {
                    batch_size: "0".into(),
                    ..relay_settings()
                },
                "OUTBOX_BATCH_SIZE",
            ),
            (
                RelaySettings {
                    batch_size: "many".into(),
                    ..relay_settings()
                },
                "OUTBOX_BATCH_SIZE",
            ),
            (
                RelaySettings {
                    poll_interval: "fast".into(),
                    ..relay_settings()
                },
                "OUTBOX_POLL_INTERVAL",
            ),
            (
                RelaySettings {
                    max_attempts: "0".into(),
                    ..relay_settings()
                },
                "OUTBOX_MAX_ATTEMPTS",
            ),
            (
                RelaySettings {
                    publish_timeout: "0".into(),
                    ..relay_settings()
                },
                "OUTBOX_PUBLISH_TIMEOUT",
            ),
            (
                RelaySettings {
                    backoff_max: "1ms".into(),
                    ..relay_settings()
                },
                "OUTBOX_BACKOFF_MAX",
            ),
            (
                RelaySettings {
                    on_publish: "archive".into(),
                    ..relay_settings()
                },
                "OUTBOX_ON_PUBLISH",
            ),
            (
                RelaySettings {
                    retention: "a week".into(),
                    ..relay_settings()
                },
                "OUTBOX_RETENTION",
            ),
            (
                RelaySettings {
                    ordering: "global".into(),
                    ..relay_settings()
                },
                "OUTBOX_ORDERING",
            ),
            (
                RelaySettings {
                    http_addr: "nowhere".into(),
                    ..relay_settings()
                },
                "OUTBOX_HTTP_ADDR",
            ),
        ];
        for (settings, variable) in cases {
            assert_eq!(settings.validate().unwrap_err().variable, variable);
        }
    }

    #[test]
    fn sink_errors_name_their_variable() {
        let unknown = SinkSettings {
            sink: "kafka".into(),
            ..sink_settings()
        };
        assert_eq!(unknown.validate().unwrap_err().variable, "OUTBOX_SINK");
        let sqs_without_queue = SinkSettings {
            sink: "sqs".into(),
            ..sink_settings()
        };
        assert_eq!(
            sqs_without_queue.validate().unwrap_err().variable,
            "OUTBOX_SQS_QUEUE_URL"
        );
        let bad_amqp = SinkSettings {
            amqp_url: "not a url".into(),
            ..sink_settings()
        };
        assert_eq!(bad_amqp.validate().unwrap_err().variable, "OUTBOX_AMQP_URL");
        let bad_key = SinkSettings {
            amqp_routing_key: "{tenant}".into(),
            ..sink_settings()
        };
        assert_eq!(
            bad_key.validate().unwrap_err().variable,
            "OUTBOX_AMQP_ROUTING_KEY"
        );
    }

    #[test]
    fn errors_never_echo_passwords() {
        let bad = SinkSettings {
            amqp_url: "http://user:hunter2@host/".into(),
            ..sink_settings()
        };
        assert!(!bad.validate().unwrap_err().to_string().contains("hunter2"));
        let db = DatabaseSettings {
            database_url: "postgres://u:hunter2@h:notaport/db".into(),
            table: "outbox_event".into(),
        };
        assert!(!db.validate().unwrap_err().to_string().contains("hunter2"));
        assert_eq!(
            redact_url("amqp://guest:hunter2@h:5672/%2f"),
            "amqp://guest:****@h:5672/%2f"
        );
    }

    #[test]
    fn table_names_are_identifiers() {
        assert_eq!(
            TableName::parse("outbox_event").unwrap().quoted(),
            "\"outbox_event\""
        );
        assert_eq!(
            TableName::parse("app.outbox").unwrap().quoted(),
            "\"app\".\"outbox\""
        );
        for bad in ["", "a.b.c", "x; drop table y", "1abc", "out\"box", "a.", ".a"] {
            assert!(TableName::parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn routing_key_templates_substitute_placeholders() {
        let template = RoutingKeyTemplate::parse("events.{event_type}.{aggregate_id}").unwrap();
        assert_eq!(template.render("order.created", "42"), "events.order.created.42");
        assert_eq!(
            RoutingKeyTemplate::parse("fixed").unwrap().render("a", "b"),
            "fixed"
        );
        assert!(RoutingKeyTemplate::parse("{event_type").is_err());
        assert!(RoutingKeyTemplate::parse("a}").is_err());
    }
}
