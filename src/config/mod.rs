//! Settings as the user gives them (environment variables and flags) and the
//! validated [`Config`] the rest of the relay works from.
//!
//! This module only parses: each part owns the types its settings become
//! (the table in `store`, each sink's settings in its own folder, the loop's
//! in `relay`). Validation happens once, before anything connects: every
//! error names the variable it is about, and never echoes a secret.
//!
//! Settings stay text until validation, rather than being typed by clap:
//! clap's own errors name the flag, not the variable, and take several
//! lines, while the contract is one line naming the variable and exit 2.

use std::time::Duration;

use clap::Args;
use thiserror::Error;

use crate::cloudevents::MessageFormat;
use crate::relay::{OnPublish, RelayConfig};
#[cfg(feature = "rabbitmq")]
use crate::sink::amqp::AmqpConfig;
#[cfg(feature = "kafka")]
use crate::sink::kafka::{KafkaConfig, KafkaSettings};
#[cfg(feature = "nats")]
use crate::sink::nats::NatsConfig;
#[cfg(feature = "sqs")]
use crate::sink::sqs::SqsConfig;
use crate::sink::SinkConfig;
use crate::store::{DatabaseConfig, Endpoint, Ordering, Pooler};
use crate::telemetry::LogFormat;

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
    pub const RETENTION: &str = "OUTBOX_RETENTION";
    pub const ORDERING: &str = "OUTBOX_ORDERING";
    pub const HTTP_ADDR: &str = "OUTBOX_HTTP_ADDR";
    pub const WORKERS: &str = "OUTBOX_WORKERS";
    pub const LOG_FORMAT: &str = "OUTBOX_LOG_FORMAT";
    pub const NOTIFY_TRIGGER: &str = "OUTBOX_NOTIFY_TRIGGER";
    pub const MESSAGE_FORMAT: &str = "OUTBOX_MESSAGE_FORMAT";
    pub const CLOUDEVENTS_SOURCE: &str = "OUTBOX_CLOUDEVENTS_SOURCE";
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

/// Connection settings every command needs: the database and the table.
#[derive(Debug, Clone, Args)]
pub struct DatabaseSettings {
    /// PostgreSQL connection URL (or key=value string) of the producer
    /// database; `sslmode`, `sslrootcert`, `sslcert` and `sslkey` as for psql.
    #[arg(
        long,
        env = var::DATABASE_URL,
        default_value = "postgres://postgres@localhost:5432/postgres",
        hide_env_values = true
    )]
    pub database_url: String,

    /// Outbox table, optionally schema-qualified (`schema.table`).
    #[arg(long, env = var::TABLE, default_value = "outbox_event")]
    pub table: String,

    /// `none`, or `transaction` when the database URL goes through a
    /// transaction-pooling proxy (PgBouncer in transaction mode, RDS Proxy).
    #[arg(long, env = var::DATABASE_POOLER, default_value = "none")]
    pub database_pooler: String,
}

impl DatabaseSettings {
    /// Validates the database settings.
    pub fn validate(&self) -> Result<DatabaseConfig, ConfigError> {
        let pooler = parse_choice(
            var::DATABASE_POOLER,
            &self.database_pooler,
            &[("none", Pooler::None), ("transaction", Pooler::Transaction)],
        )?;
        DatabaseConfig::parse(&self.database_url, &self.table, pooler)
    }
}

/// Where the relay LISTENs for new rows.
#[derive(Debug, Clone, Args)]
pub struct ListenSettings {
    /// A direct connection used only for LISTEN. Default: the database URL,
    /// or none (polling) with `OUTBOX_DATABASE_POOLER=transaction`.
    #[arg(long, env = var::LISTEN_DATABASE_URL, hide_env_values = true)]
    pub listen_database_url: Option<String>,
}

impl ListenSettings {
    /// The server to LISTEN on, if any: a transaction pooler cannot carry
    /// LISTEN (the session it runs in is handed to other clients), so
    /// behind one there is none unless a direct URL is given.
    pub fn validate(&self, database: &DatabaseConfig) -> Result<Option<Endpoint>, ConfigError> {
        match self.listen_database_url.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => Endpoint::parse(var::LISTEN_DATABASE_URL, url).map(Some),
            _ => Ok(match database.pooler {
                Pooler::None => Some(database.endpoint()),
                Pooler::Transaction => None,
            }),
        }
    }
}

/// Settings of the sink the relay publishes to.
#[derive(Debug, Clone, Args)]
pub struct SinkSettings {
    /// Where events go: `rabbitmq`, `sqs`, `nats` or `kafka`.
    #[arg(long, env = var::SINK, default_value = "rabbitmq")]
    pub sink: String,

    /// RabbitMQ URL (`amqp://` or `amqps://`).
    #[arg(
        long,
        env = var::AMQP_URL,
        default_value = "amqp://guest:guest@localhost:5672/%2f",
        hide_env_values = true
    )]
    pub amqp_url: String,

    /// Exchange the relay publishes to.
    #[arg(long, env = var::AMQP_EXCHANGE, default_value = "amq.topic")]
    pub amqp_exchange: String,

    /// Routing key template; `{event_type}` and `{aggregate_id}` are substituted.
    #[arg(long, env = var::AMQP_ROUTING_KEY, default_value = "{event_type}")]
    pub amqp_routing_key: String,

    /// The broker's `max_message_size` in bytes (RabbitMQ 4's default): a
    /// larger row is quarantined on its first attempt without being sent.
    #[arg(long, env = var::AMQP_MAX_MESSAGE_BYTES, default_value = "16777216")]
    pub amqp_max_message_bytes: String,

    /// PEM CA bundle the broker's certificate must chain to (`amqps://`);
    /// the system's CAs when unset.
    #[arg(long, env = var::AMQP_CA_FILE)]
    pub amqp_ca_file: Option<String>,

    /// PEM client certificate for mutual TLS with the broker.
    #[arg(long, env = var::AMQP_CLIENT_CERT_FILE)]
    pub amqp_client_cert_file: Option<String>,

    /// PEM private key of the client certificate.
    #[arg(long, env = var::AMQP_CLIENT_KEY_FILE)]
    pub amqp_client_key_file: Option<String>,

    /// SQS queue URL; required with `OUTBOX_SINK=sqs`. A `.fifo` URL turns on FIFO fields.
    #[arg(long, env = var::SQS_QUEUE_URL)]
    pub sqs_queue_url: Option<String>,

    /// Endpoint override for SQS emulators (LocalStack, ElasticMQ, moto).
    #[arg(long, env = var::SQS_ENDPOINT_URL)]
    pub sqs_endpoint_url: Option<String>,

    /// NATS server URL(s), comma-separated (`nats://` or `tls://`); a
    /// `user:password@` or `token@` in them is used to authenticate.
    #[arg(
        long,
        env = var::NATS_URL,
        default_value = "nats://localhost:4222",
        hide_env_values = true
    )]
    pub nats_url: String,

    /// Subject template; `{event_type}` and `{aggregate_id}` are substituted.
    #[arg(long, env = var::NATS_SUBJECT, default_value = "outbox.{event_type}")]
    pub nats_subject: String,

    /// NATS credentials file (user JWT and NKey seed).
    #[arg(long, env = var::NATS_CREDS_FILE)]
    pub nats_creds_file: Option<String>,

    /// PEM CA bundle the NATS server's certificate must chain to (`tls://`);
    /// the system's CAs when unset.
    #[arg(long, env = var::NATS_CA_FILE)]
    pub nats_ca_file: Option<String>,

    /// The NATS servers' `max_control_line` in bytes (their setting; the
    /// servers do not announce it): a row whose publish line (subject,
    /// reply subject, sizes) would be longer is quarantined before sending.
    #[arg(long, env = var::NATS_MAX_CONTROL_LINE, default_value = "4096")]
    pub nats_max_control_line: String,

    /// Kafka bootstrap servers, `host:port,…`; required with `OUTBOX_SINK=kafka`.
    #[arg(long, env = var::KAFKA_BROKERS)]
    pub kafka_brokers: Option<String>,

    /// Topic template; `{event_type}` and `{aggregate_id}` are substituted.
    /// Topics must exist: the relay never creates one.
    #[arg(long, env = var::KAFKA_TOPIC, default_value = "outbox.{event_type}")]
    pub kafka_topic: String,

    /// `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl`.
    #[arg(long, env = var::KAFKA_SECURITY_PROTOCOL, default_value = "plaintext")]
    pub kafka_security_protocol: String,

    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`, with `sasl_*`.
    #[arg(long, env = var::KAFKA_SASL_MECHANISM)]
    pub kafka_sasl_mechanism: Option<String>,

    /// SASL user name.
    #[arg(long, env = var::KAFKA_SASL_USERNAME)]
    pub kafka_sasl_username: Option<String>,

    /// SASL password (give it from a Secret; never logged).
    #[arg(long, env = var::KAFKA_SASL_PASSWORD, hide_env_values = true)]
    pub kafka_sasl_password: Option<String>,

    /// PEM CA bundle the brokers' certificates must chain to (`ssl`,
    /// `sasl_ssl`); the system's CAs when unset.
    #[arg(long, env = var::KAFKA_CA_FILE)]
    pub kafka_ca_file: Option<String>,

    /// PEM client certificate for mutual TLS with the brokers.
    #[arg(long, env = var::KAFKA_CLIENT_CERT_FILE)]
    pub kafka_client_cert_file: Option<String>,

    /// PEM private key of the client certificate.
    #[arg(long, env = var::KAFKA_CLIENT_KEY_FILE)]
    pub kafka_client_key_file: Option<String>,

    /// Other librdkafka producer properties, `key=value,…` (`linger.ms`,
    /// `compression.type`, `message.max.bytes`, …); those the relay's
    /// guarantees rest on are refused.
    #[arg(long, env = var::KAFKA_PROPERTIES)]
    pub kafka_properties: Option<String>,

    /// `plain`, or `cloudevents`: CloudEvents 1.0, binary content mode on
    /// RabbitMQ (`ce-` headers) and Kafka (`ce_` headers), structured
    /// content mode on SQS.
    #[arg(long, env = var::MESSAGE_FORMAT, default_value = "plain")]
    pub message_format: String,

    /// The CloudEvents `source` (a URI-reference); required with
    /// `OUTBOX_MESSAGE_FORMAT=cloudevents`.
    #[arg(long, env = var::CLOUDEVENTS_SOURCE)]
    pub cloudevents_source: Option<String>,
}

impl SinkSettings {
    /// Validates the message format and, for CloudEvents, its source.
    pub fn format(&self) -> Result<MessageFormat, ConfigError> {
        let format = MessageFormat::parse(&self.message_format, self.cloudevents_source.as_deref())
            .map_err(|(variable, problem)| ConfigError::new(variable, problem))?;
        // The NATS sink writes plain messages only, for now: refusing is
        // better than sending something else than asked for.
        if self.sink.trim() == "nats" && format.cloudevents_source().is_some() {
            return Err(ConfigError::new(
                var::MESSAGE_FORMAT,
                "cloudevents is not supported with OUTBOX_SINK=nats (plain only)",
            ));
        }
        Ok(format)
    }

    /// Validates the settings of the chosen sink (only those). A sink this
    /// binary was built without is refused, naming its cargo feature.
    pub fn validate(&self) -> Result<SinkConfig, ConfigError> {
        match self.sink.trim() {
            #[cfg(feature = "rabbitmq")]
            "rabbitmq" => AmqpConfig::parse(
                &self.amqp_url,
                &self.amqp_exchange,
                &self.amqp_routing_key,
                &self.amqp_max_message_bytes,
            )
            .and_then(|config| {
                config.with_tls_files(
                    non_empty(&self.amqp_ca_file),
                    non_empty(&self.amqp_client_cert_file),
                    non_empty(&self.amqp_client_key_file),
                )
            })
            .map(SinkConfig::RabbitMq),
            #[cfg(feature = "sqs")]
            "sqs" => {
                SqsConfig::from_settings(self.sqs_queue_url.as_deref(), self.sqs_endpoint_url.as_deref())
                    .map(SinkConfig::Sqs)
            }
            #[cfg(feature = "nats")]
            "nats" => NatsConfig::parse(
                &self.nats_url,
                &self.nats_subject,
                non_empty(&self.nats_creds_file),
                non_empty(&self.nats_ca_file),
            )
            .and_then(|nats| nats.with_max_control_line(&self.nats_max_control_line))
            .map(SinkConfig::Nats),
            #[cfg(feature = "kafka")]
            "kafka" => KafkaConfig::parse(&KafkaSettings {
                brokers: self.kafka_brokers.as_deref(),
                topic: &self.kafka_topic,
                security_protocol: &self.kafka_security_protocol,
                sasl_mechanism: self.kafka_sasl_mechanism.as_deref(),
                sasl_username: self.kafka_sasl_username.as_deref(),
                sasl_password: self.kafka_sasl_password.as_deref(),
                ca_file: self.kafka_ca_file.as_deref(),
                client_cert_file: self.kafka_client_cert_file.as_deref(),
                client_key_file: self.kafka_client_key_file.as_deref(),
                properties: self.kafka_properties.as_deref(),
            })
            .map(SinkConfig::Kafka),
            // Reached only for a sink whose feature is off.
            #[allow(unreachable_patterns)]
            other @ ("rabbitmq" | "sqs" | "nats" | "kafka") => Err(ConfigError::new(
                var::SINK,
                format!(
                    "'{other}' is not built into this binary (build it with the cargo feature `{other}`)"
                ),
            )),
            other => Err(ConfigError::new(
                var::SINK,
                format!("'{other}' is not one of rabbitmq, sqs, nats, kafka"),
            )),
        }
    }
}

/// Settings of the relay loop.
#[derive(Debug, Clone, Args)]
pub struct RelaySettings {
    /// Rows claimed per transaction.
    #[arg(long, env = var::BATCH_SIZE, default_value = "100")]
    pub batch_size: String,

    /// Longest sleep when there is nothing to publish.
    #[arg(long, env = var::POLL_INTERVAL, default_value = "500ms")]
    pub poll_interval: String,

    /// Failed attempts before a row is quarantined.
    #[arg(long, env = var::MAX_ATTEMPTS, default_value = "10")]
    pub max_attempts: String,

    /// What the broker has confirmed by then is published; the rest of
    /// the batch is deferred: published again later, no attempt charged.
    #[arg(long, env = var::PUBLISH_TIMEOUT, default_value = "30s")]
    pub publish_timeout: String,

    /// First retry delay of the exponential backoff.
    #[arg(long, env = var::BACKOFF_BASE, default_value = "1s")]
    pub backoff_base: String,

    /// Cap of the exponential backoff.
    #[arg(long, env = var::BACKOFF_MAX, default_value = "5m")]
    pub backoff_max: String,

    /// `mark` sets `published_at`; `delete` deletes the row once confirmed.
    #[arg(long, env = var::ON_PUBLISH, default_value = "mark")]
    pub on_publish: String,

    /// `none`, or `aggregate` for per-aggregate (created_at, id) order.
    #[arg(long, env = var::ORDERING, default_value = "none")]
    pub ordering: String,

    /// Batches in flight at once in this replica (each claims, publishes
    /// and records on its own).
    #[arg(long, env = var::WORKERS, default_value = "4")]
    pub workers: String,

    /// A claim stops adding rows once their payloads reach this many bytes
    /// (it always takes at least one row): what one batch holds in memory.
    #[arg(long, env = var::MAX_BATCH_BYTES, default_value = "16777216")]
    pub max_batch_bytes: String,
}

impl RelaySettings {
    /// Validates the relay-loop settings.
    pub fn validate(&self) -> Result<RelayConfig, ConfigError> {
        let batch_size = parse_positive(var::BATCH_SIZE, &self.batch_size, 10_000)?;
        let poll_interval = parse_nonzero_duration(var::POLL_INTERVAL, &self.poll_interval)?;
        let max_attempts = parse_positive(var::MAX_ATTEMPTS, &self.max_attempts, 1_000_000)?;
        let publish_timeout = parse_nonzero_duration(var::PUBLISH_TIMEOUT, &self.publish_timeout)?;
        let backoff_base = parse_nonzero_duration(var::BACKOFF_BASE, &self.backoff_base)?;
        let backoff_max = parse_nonzero_duration(var::BACKOFF_MAX, &self.backoff_max)?;
        if backoff_max < backoff_base {
            return Err(ConfigError::new(
                var::BACKOFF_MAX,
                format!("must not be shorter than {}", var::BACKOFF_BASE),
            ));
        }
        let on_publish = parse_choice(
            var::ON_PUBLISH,
            &self.on_publish,
            &[("mark", OnPublish::Mark), ("delete", OnPublish::Delete)],
        )?;
        let ordering = parse_choice(
            var::ORDERING,
            &self.ordering,
            &[("none", Ordering::None), ("aggregate", Ordering::Aggregate)],
        )?;
        let workers = parse_positive(var::WORKERS, &self.workers, 64)?;
        let max_batch_bytes = parse_positive(var::MAX_BATCH_BYTES, &self.max_batch_bytes, u32::MAX)?;
        Ok(RelayConfig {
            batch_size,
            poll_interval,
            max_attempts,
            publish_timeout,
            backoff_base,
            backoff_max,
            on_publish,
            ordering,
            workers,
            max_batch_bytes: max_batch_bytes as usize,
        })
    }
}

/// Settings of what runs beside the loop: retention and the HTTP endpoints.
#[derive(Debug, Clone, Args)]
pub struct ServiceSettings {
    /// Published rows older than this are deleted; `0` keeps them.
    #[arg(long, env = var::RETENTION, default_value = "7d")]
    pub retention: String,

    /// Listen address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = var::HTTP_ADDR, default_value = "0.0.0.0:9090")]
    pub http_addr: String,
}

impl ServiceSettings {
    /// Validated retention: `None` keeps published rows.
    pub fn retention(&self) -> Result<Option<Duration>, ConfigError> {
        let retention = parse_duration(&self.retention).map_err(|e| ConfigError::new(var::RETENTION, e))?;
        Ok((!retention.is_zero()).then_some(retention))
    }

    /// Validated HTTP listen address.
    pub fn http_addr(&self) -> Result<std::net::SocketAddr, ConfigError> {
        self.http_addr.trim().parse().map_err(|_| {
            ConfigError::new(
                var::HTTP_ADDR,
                format!("'{}' is not an address like 0.0.0.0:9090", self.http_addr),
            )
        })
    }
}

/// Everything `outbox-relay run` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Database and table.
    pub database: DatabaseConfig,
    /// Where to LISTEN for new rows; `None` polls only.
    pub listen: Option<Endpoint>,
    /// Sink.
    pub sink: SinkConfig,
    /// How events become messages on the sink.
    pub format: MessageFormat,
    /// The relay loop.
    pub relay: RelayConfig,
    /// Age after which published rows are deleted; `None` keeps them.
    pub retention: Option<Duration>,
    /// Listen address of the HTTP endpoints.
    pub http_addr: std::net::SocketAddr,
}

/// Settings of `migrate`.
#[derive(Debug, Clone, Args)]
pub struct MigrateSettings {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseSettings,

    /// `on` installs the trigger that NOTIFYs relays of new rows (low idle
    /// latency, a cost for concurrent producers); `off` removes it.
    #[arg(long, env = var::NOTIFY_TRIGGER, default_value = "on")]
    pub notify_trigger: String,
}

impl MigrateSettings {
    /// Validated settings: the database, and whether to install the trigger.
    pub fn validate(&self) -> Result<(DatabaseConfig, bool), ConfigError> {
        let database = self.database.validate()?;
        let notify_trigger = parse_choice(
            var::NOTIFY_TRIGGER,
            &self.notify_trigger,
            &[("on", true), ("true", true), ("off", false), ("false", false)],
        )?;
        Ok((database, notify_trigger))
    }
}

/// An optional setting; set to an empty string (as a chart or compose file
/// does for "unset"), it is unset.
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// Parses `OUTBOX_LOG_FORMAT`.
pub fn parse_log_format(raw: &str) -> Result<LogFormat, ConfigError> {
    parse_choice(
        var::LOG_FORMAT,
        raw,
        &[("text", LogFormat::Text), ("json", LogFormat::Json)],
    )
}

/// One of a fixed set of words; the error lists them.
fn parse_choice<T: Copy>(variable: &'static str, raw: &str, choices: &[(&str, T)]) -> Result<T, ConfigError> {
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

fn parse_nonzero_duration(variable: &'static str, raw: &str) -> Result<Duration, ConfigError> {
    let value = parse_duration(raw).map_err(|e| ConfigError::new(variable, e))?;
    if value.is_zero() {
        return Err(ConfigError::new(variable, "must be greater than 0"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests;
