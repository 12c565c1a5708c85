//! The sink's settings as the user gives them: which sink, every sink's
//! variables, and the message format. Each sink validates its own in its
//! folder's `config.rs`; this only picks the chosen one.

use clap::Args;

#[cfg(feature = "rabbitmq")]
use super::amqp::AmqpConfig;
#[cfg(feature = "kafka")]
use super::kafka::{KafkaConfig, KafkaSettings};
#[cfg(feature = "nats")]
use super::nats::NatsConfig;
#[cfg(feature = "sqs")]
use super::sqs::SqsConfig;
use super::SinkConfig;
use crate::cloudevents::MessageFormat;
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
use crate::settings::non_empty;
use crate::settings::{var, ConfigError};

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

#[cfg(test)]
mod tests {
    use super::*;

    fn sink_settings() -> SinkSettings {
        SinkSettings {
            sink: "rabbitmq".into(),
            amqp_url: "amqp://guest:guest@localhost:5672/%2f".into(),
            amqp_exchange: "amq.topic".into(),
            amqp_routing_key: "{event_type}".into(),
            amqp_max_message_bytes: "16777216".into(),
            amqp_ca_file: None,
            amqp_client_cert_file: None,
            amqp_client_key_file: None,
            sqs_queue_url: None,
            sqs_endpoint_url: None,
            nats_url: "nats://localhost:4222".into(),
            nats_subject: "outbox.{event_type}".into(),
            nats_creds_file: None,
            nats_ca_file: None,
            nats_max_control_line: "4096".into(),
            kafka_brokers: None,
            kafka_topic: "outbox.{event_type}".into(),
            kafka_security_protocol: "plaintext".into(),
            kafka_sasl_mechanism: None,
            kafka_sasl_username: None,
            kafka_sasl_password: None,
            kafka_ca_file: None,
            kafka_client_cert_file: None,
            kafka_client_key_file: None,
            kafka_properties: None,
            message_format: "plain".into(),
            cloudevents_source: None,
        }
    }

    #[test]
    fn an_unknown_sink_names_the_variable_and_the_choices() {
        let unknown = SinkSettings {
            sink: "pulsar".into(),
            ..sink_settings()
        };
        assert_eq!(
            unknown.validate().unwrap_err().to_string(),
            "OUTBOX_SINK: 'pulsar' is not one of rabbitmq, sqs, nats, kafka"
        );
    }

    #[cfg(feature = "rabbitmq")]
    #[test]
    fn the_default_sink_is_valid() {
        assert!(matches!(
            sink_settings().validate().unwrap(),
            SinkConfig::RabbitMq(_)
        ));
    }

    #[cfg(feature = "rabbitmq")]
    #[test]
    fn rabbitmq_errors_name_their_variable() {
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

    #[cfg(feature = "rabbitmq")]
    #[test]
    fn errors_never_echo_passwords() {
        let bad = SinkSettings {
            amqp_url: "http://user:hunter2@host/".into(),
            ..sink_settings()
        };
        assert!(!bad.validate().unwrap_err().to_string().contains("hunter2"));
    }

    #[cfg(feature = "kafka")]
    #[test]
    fn kafka_requires_its_brokers() {
        let kafka_without_brokers = SinkSettings {
            sink: "kafka".into(),
            ..sink_settings()
        };
        assert_eq!(
            kafka_without_brokers.validate().unwrap_err().variable,
            "OUTBOX_KAFKA_BROKERS"
        );
    }

    #[cfg(feature = "sqs")]
    #[test]
    fn sqs_requires_its_queue() {
        let sqs_without_queue = SinkSettings {
            sink: "sqs".into(),
            ..sink_settings()
        };
        assert_eq!(
            sqs_without_queue.validate().unwrap_err().variable,
            "OUTBOX_SQS_QUEUE_URL"
        );
    }

    #[cfg(feature = "nats")]
    #[test]
    fn nats_errors_name_their_variable() {
        let nats = SinkSettings {
            sink: "nats".into(),
            ..sink_settings()
        };
        assert!(matches!(nats.validate(), Ok(SinkConfig::Nats(_))));
        let bad_subject = SinkSettings {
            sink: "nats".into(),
            nats_subject: "outbox.>".into(),
            ..sink_settings()
        };
        assert_eq!(
            bad_subject.validate().unwrap_err().variable,
            "OUTBOX_NATS_SUBJECT"
        );
        let bad_nats = SinkSettings {
            sink: "nats".into(),
            nats_url: "nats://user:hunter2@".into(),
            ..sink_settings()
        };
        let error = bad_nats.validate().unwrap_err();
        assert_eq!(error.variable, "OUTBOX_NATS_URL");
        assert!(!error.to_string().contains("hunter2"), "{error}");
        for bad in ["4k", "100", ""] {
            let bad_line = SinkSettings {
                sink: "nats".into(),
                nats_max_control_line: bad.into(),
                ..sink_settings()
            };
            assert_eq!(
                bad_line.validate().unwrap_err().variable,
                "OUTBOX_NATS_MAX_CONTROL_LINE",
                "{bad}"
            );
        }
        let lowered = SinkSettings {
            sink: "nats".into(),
            nats_max_control_line: "1024".into(),
            ..sink_settings()
        };
        match lowered.validate() {
            Ok(SinkConfig::Nats(nats)) => assert_eq!(nats.max_control_line, 1024),
            other => panic!("expected a NATS sink, got {other:?}"),
        }
    }

    #[test]
    fn the_message_format_names_its_variables() {
        assert_eq!(sink_settings().format(), Ok(MessageFormat::Plain));
        let cloudevents = SinkSettings {
            message_format: "cloudevents".into(),
            ..sink_settings()
        };
        assert_eq!(
            cloudevents.format().unwrap_err().variable,
            "OUTBOX_CLOUDEVENTS_SOURCE"
        );
        let with_source = SinkSettings {
            cloudevents_source: Some("https://shop.example.com/orders".into()),
            ..cloudevents
        };
        assert!(matches!(
            with_source.format(),
            Ok(MessageFormat::CloudEvents { .. })
        ));
        let unknown = SinkSettings {
            message_format: "avro".into(),
            ..sink_settings()
        };
        assert_eq!(unknown.format().unwrap_err().variable, "OUTBOX_MESSAGE_FORMAT");
    }
}
