//! The Kafka sink's settings: bootstrap servers, the topic template,
//! security as Kafka clients name it, and the librdkafka properties a user
//! may add, less those the relay's guarantees depend on.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use rdkafka::ClientConfig;

use crate::settings::{var, ConfigError};
use crate::sink::template::RoutingKeyTemplate;

/// librdkafka's default `message.max.bytes`, and so the largest message a
/// producer sends unless told otherwise (brokers default to 1 MiB too).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1_000_000;

/// `security.protocol`, as Kafka clients name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    /// No TLS, no authentication.
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL without TLS.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }

    fn tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    fn sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// SASL credentials. The password never leaves this type but into
/// librdkafka's configuration: `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct Sasl {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: &'static str,
    /// The user name.
    pub username: String,
    password: String,
}

impl fmt::Debug for Sasl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"****")
            .finish()
    }
}

/// What a user gives, as text: [`KafkaConfig::parse`] validates it.
#[derive(Debug, Clone, Default)]
pub struct KafkaSettings<'a> {
    /// `OUTBOX_KAFKA_BROKERS`.
    pub brokers: Option<&'a str>,
    /// `OUTBOX_KAFKA_TOPIC`.
    pub topic: &'a str,
    /// `OUTBOX_KAFKA_SECURITY_PROTOCOL`.
    pub security_protocol: &'a str,
    /// `OUTBOX_KAFKA_SASL_MECHANISM`.
    pub sasl_mechanism: Option<&'a str>,
    /// `OUTBOX_KAFKA_SASL_USERNAME`.
    pub sasl_username: Option<&'a str>,
    /// `OUTBOX_KAFKA_SASL_PASSWORD`.
    pub sasl_password: Option<&'a str>,
    /// `OUTBOX_KAFKA_CA_FILE`.
    pub ca_file: Option<&'a str>,
    /// `OUTBOX_KAFKA_CLIENT_CERT_FILE`.
    pub client_cert_file: Option<&'a str>,
    /// `OUTBOX_KAFKA_CLIENT_KEY_FILE`.
    pub client_key_file: Option<&'a str>,
    /// `OUTBOX_KAFKA_PROPERTIES`.
    pub properties: Option<&'a str>,
}

/// Validated settings of the Kafka sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    /// Bootstrap servers, `host:port,…`.
    pub brokers: String,
    /// Topic template; `{event_type}` and `{aggregate_id}` are substituted.
    pub topic: RoutingKeyTemplate,
    /// `security.protocol`.
    pub security: SecurityProtocol,
    /// SASL credentials with `sasl_*`.
    pub sasl: Option<Sasl>,
    /// PEM CA bundle (`ssl.ca.location`); the system's CAs when unset.
    pub ca_file: Option<String>,
    /// PEM client certificate and key, for mutual TLS.
    pub client_identity: Option<(String, String)>,
    /// The user's other librdkafka properties, in the order given.
    pub properties: Vec<(String, String)>,
    /// The producer's `message.max.bytes`: a larger message is refused
    /// before it is sent.
    pub max_message_bytes: usize,
    /// How long the producer tries a message (`message.timeout.ms`): the
    /// relay's `OUTBOX_PUBLISH_TIMEOUT`, so that nothing the relay gave up
    /// on is still sent behind its back.
    pub message_timeout: Duration,
}

/// Properties the relay sets itself because its guarantees rest on them
/// (idempotence, acknowledgements by every in-sync replica, the
/// partitioner that puts an aggregate on the partition Java clients would,
/// no topic creation, per-message delivery reports, a producer that tries
/// no longer than the relay waits), or that have a variable of their own
/// (servers, security, credentials), so that there is one way to give them,
/// or that would switch off the check of the brokers' certificates.
const RELAY_PROPERTIES: &[&str] = &[
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "partitioner",
    "partitioner_cb",
    "allow.auto.create.topics",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "retries",
    "message.send.max.retries",
    "transactional.id",
    "enable.gapless.guarantee",
    "delivery.report.only.error",
    "dr_cb",
    "dr_msg_cb",
    "bootstrap.servers",
    "metadata.broker.list",
    "security.protocol",
    // TLS that checks nothing is no TLS: give the CA with OUTBOX_KAFKA_CA_FILE.
    "enable.ssl.certificate.verification",
    "ssl.endpoint.identification.algorithm",
];

/// Prefixes of properties with a variable of their own, or that would put
/// a secret in a variable that is not treated as one.
const RELAY_PREFIXES: &[&str] = &[
    "sasl.",
    "ssl.key.",
    "ssl.certificate.",
    "ssl.ca.",
    "ssl_key",
    "ssl.keystore.",
];

impl KafkaConfig {
    /// Validates the `OUTBOX_KAFKA_*` settings. Every error names its
    /// variable and never shows the SASL password.
    pub fn parse(settings: &KafkaSettings<'_>) -> Result<Self, ConfigError> {
        let brokers = parse_brokers(settings.brokers)?;
        let topic = parse_topic(settings.topic).map_err(|e| ConfigError::new(var::KAFKA_TOPIC, e))?;
        let security = match settings.security_protocol.trim().to_ascii_lowercase().as_str() {
            "plaintext" => SecurityProtocol::Plaintext,
            "ssl" => SecurityProtocol::Ssl,
            "sasl_plaintext" => SecurityProtocol::SaslPlaintext,
            "sasl_ssl" => SecurityProtocol::SaslSsl,
            other => {
                return Err(ConfigError::new(
                    var::KAFKA_SECURITY_PROTOCOL,
                    format!("'{other}' is not one of plaintext, ssl, sasl_plaintext, sasl_ssl"),
                ))
            }
        };
        let sasl = parse_sasl(settings, security)?;
        let (ca_file, client_identity) = parse_tls_files(settings, security)?;
        let properties = parse_properties(settings.properties.unwrap_or_default())?;
        let max_message_bytes = match properties.iter().find(|(key, _)| key == "message.max.bytes") {
            Some((_, value)) => value.parse::<usize>().map_err(|_| {
                ConfigError::new(
                    var::KAFKA_PROPERTIES,
                    format!("message.max.bytes '{value}' is not a number of bytes"),
                )
            })?,
            None => DEFAULT_MAX_MESSAGE_BYTES,
        };
        let config = Self {
            brokers,
            topic,
            security,
            sasl,
            ca_file,
            client_identity,
            properties,
            max_message_bytes,
            message_timeout: Duration::from_secs(30),
        };
        // librdkafka checks names and values itself, without connecting:
        // an unknown property or a bad value stops the relay here.
        config.client_config().create_native_config().map_err(|e| {
            ConfigError::new(
                var::KAFKA_PROPERTIES,
                format!("librdkafka refused the configuration: {e}"),
            )
        })?;
        Ok(config)
    }

    /// The producer configuration: the relay's own properties first, then
    /// the user's (which cannot name the relay's, see [`RELAY_PROPERTIES`]).
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("client.id", "outbox-relay")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set("allow.auto.create.topics", "false")
            // What the relay did not hear back about by its deadline is
            // deferred and claimed again: the producer must not go on
            // trying it meanwhile.
            .set(
                "message.timeout.ms",
                self.message_timeout
                    .as_millis()
                    .clamp(1, i32::MAX as u128)
                    .to_string(),
            )
            // A topic that does not exist fails its messages after this,
            // instead of librdkafka's 30 s, which would hold every batch
            // holding such a row for the whole publish timeout. Topics
            // are created before the relay publishes to them, so a topic
            // just being created is the rare case (and is only retried).
            .set("topic.metadata.propagation.max.ms", "2000")
            .set("compression.type", "none")
            .set("security.protocol", self.security.name());
        if let Some(sasl) = &self.sasl {
            config
                .set("sasl.mechanism", sasl.mechanism)
                .set("sasl.username", &sasl.username)
                .set("sasl.password", &sasl.password);
        }
        if let Some(ca_file) = &self.ca_file {
            config.set("ssl.ca.location", ca_file);
        }
        if let Some((cert, key)) = &self.client_identity {
            config
                .set("ssl.certificate.location", cert)
                .set("ssl.key.location", key);
        }
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
    }

    /// Sets how long the producer tries a message: the publish timeout.
    pub fn with_message_timeout(mut self, timeout: Duration) -> Self {
        self.message_timeout = timeout;
        self
    }

    /// The bootstrap servers, for logs and errors (they carry no secret).
    pub fn describe_brokers(&self) -> &str {
        &self.brokers
    }
}

fn parse_brokers(raw: Option<&str>) -> Result<String, ConfigError> {
    let raw = raw.map(str::trim).filter(|raw| !raw.is_empty()).ok_or_else(|| {
        ConfigError::new(
            var::KAFKA_BROKERS,
            "is required with OUTBOX_SINK=kafka (bootstrap servers, host:port,…)",
        )
    })?;
    let mut servers = Vec::new();
    for server in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if server.contains("://") || server.contains('@') {
            return Err(ConfigError::new(
                var::KAFKA_BROKERS,
                "takes host:port pairs without a scheme or credentials \
                 (security: OUTBOX_KAFKA_SECURITY_PROTOCOL and OUTBOX_KAFKA_SASL_*)",
            ));
        }
        let port = server
            .rsplit_once(':')
            .map(|(host, port)| (host, port.parse::<u16>()));
        match port {
            Some((host, Ok(port))) if !host.is_empty() && port > 0 => servers.push(server),
            _ => {
                return Err(ConfigError::new(
                    var::KAFKA_BROKERS,
                    format!("'{server}' is not host:port"),
                ))
            }
        }
    }
    if servers.is_empty() {
        return Err(ConfigError::new(var::KAFKA_BROKERS, "names no server"));
    }
    Ok(servers.join(","))
}

fn parse_sasl(settings: &KafkaSettings<'_>, security: SecurityProtocol) -> Result<Option<Sasl>, ConfigError> {
    let (mechanism, username) = (given(settings.sasl_mechanism), given(settings.sasl_username));
    // A password is taken as given: white space may be part of it.
    let password = settings.sasl_password.filter(|p| !p.is_empty());
    if !security.sasl() {
        let stray = [
            (var::KAFKA_SASL_MECHANISM, mechanism.is_some()),
            (var::KAFKA_SASL_USERNAME, username.is_some()),
            (var::KAFKA_SASL_PASSWORD, password.is_some()),
        ];
        if let Some((variable, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(ConfigError::new(
                variable,
                format!(
                    "is set, but OUTBOX_KAFKA_SECURITY_PROTOCOL is {} (use sasl_ssl or sasl_plaintext)",
                    security.name()
                ),
            ));
        }
        return Ok(None);
    }
    let mechanism = match mechanism.map(str::to_ascii_uppercase).as_deref() {
        Some("PLAIN") => "PLAIN",
        Some("SCRAM-SHA-256") => "SCRAM-SHA-256",
        Some("SCRAM-SHA-512") => "SCRAM-SHA-512",
        Some(other) => {
            return Err(ConfigError::new(
                var::KAFKA_SASL_MECHANISM,
                format!("'{other}' is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
            ))
        }
        None => {
            return Err(ConfigError::new(
                var::KAFKA_SASL_MECHANISM,
                format!(
                "is required with OUTBOX_KAFKA_SECURITY_PROTOCOL={} (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)",
                security.name()
            ),
            ))
        }
    };
    let username = username
        .ok_or_else(|| ConfigError::new(var::KAFKA_SASL_USERNAME, format!("is required with {mechanism}")))?;
    let password = password
        .ok_or_else(|| ConfigError::new(var::KAFKA_SASL_PASSWORD, format!("is required with {mechanism}")))?;
    Ok(Some(Sasl {
        mechanism,
        username: username.to_owned(),
        password: password.to_owned(),
    }))
}

/// An optional setting; empty (as a chart or compose file gives "unset"),
/// it is unset.
fn given(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

type TlsFiles = (Option<String>, Option<(String, String)>);

fn parse_tls_files(
    settings: &KafkaSettings<'_>,
    security: SecurityProtocol,
) -> Result<TlsFiles, ConfigError> {
    let ca = given(settings.ca_file).map(str::to_owned);
    let cert = given(settings.client_cert_file).map(str::to_owned);
    let key = given(settings.client_key_file).map(str::to_owned);
    if !security.tls() {
        let stray = [
            (var::KAFKA_CA_FILE, ca.is_some()),
            (var::KAFKA_CLIENT_CERT_FILE, cert.is_some()),
            (var::KAFKA_CLIENT_KEY_FILE, key.is_some()),
        ];
        if let Some((variable, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(ConfigError::new(
                variable,
                format!(
                    "is set, but OUTBOX_KAFKA_SECURITY_PROTOCOL is {} (use ssl or sasl_ssl)",
                    security.name()
                ),
            ));
        }
        return Ok((None, None));
    }
    if let Some(path) = &ca {
        check_pem(var::KAFKA_CA_FILE, path, "CERTIFICATE")?;
    }
    let identity = match (cert, key) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(ConfigError::new(
                var::KAFKA_CLIENT_KEY_FILE,
                format!("is needed with {}", var::KAFKA_CLIENT_CERT_FILE),
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                var::KAFKA_CLIENT_CERT_FILE,
                format!("is needed with {}", var::KAFKA_CLIENT_KEY_FILE),
            ))
        }
        (Some(cert), Some(key)) => {
            check_pem(var::KAFKA_CLIENT_CERT_FILE, &cert, "CERTIFICATE")?;
            check_pem(var::KAFKA_CLIENT_KEY_FILE, &key, "PRIVATE KEY")?;
            Some((cert, key))
        }
    };
    Ok((ca, identity))
}

/// A PEM file that holds a `what` block; read now so that a wrong path
/// stops the relay at start-up, naming the variable, rather than failing
/// every connection.
fn check_pem(variable: &'static str, path: &str, what: &str) -> Result<(), ConfigError> {
    let text = std::fs::read_to_string(Path::new(path)).map_err(|e| {
        ConfigError::new(
            variable,
            format!("cannot read {path}: {}", crate::tls::io_reason(&e)),
        )
    })?;
    if !text
        .lines()
        .any(|line| line.starts_with("-----BEGIN") && line.contains(what))
    {
        return Err(ConfigError::new(variable, format!("{path} holds no PEM {what}")));
    }
    Ok(())
}

/// `key=value,key=value`. A piece without `=` continues the value before
/// it, so that list values (`ssl.cipher.suites=A,B`) need no escaping.
fn parse_properties(raw: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut properties: Vec<(String, String)> = Vec::new();
    for piece in raw.split(',') {
        match piece.split_once('=') {
            Some((key, value)) => {
                let key = key.trim().to_owned();
                if key.is_empty() {
                    return Err(ConfigError::new(
                        var::KAFKA_PROPERTIES,
                        "has a property without a name",
                    ));
                }
                properties.push((key, value.trim().to_owned()));
            }
            None if piece.trim().is_empty() => {}
            None => match properties.last_mut() {
                Some((_, value)) => {
                    value.push(',');
                    value.push_str(piece.trim());
                }
                None => {
                    return Err(ConfigError::new(
                        var::KAFKA_PROPERTIES,
                        format!("'{}' is not key=value", piece.trim()),
                    ))
                }
            },
        }
    }
    for (key, _) in &properties {
        let lower = key.to_ascii_lowercase();
        if RELAY_PROPERTIES.contains(&lower.as_str()) || RELAY_PREFIXES.iter().any(|p| lower.starts_with(p)) {
            return Err(ConfigError::new(
                var::KAFKA_PROPERTIES,
                format!(
                    "{key} is set by the relay (its delivery guarantees rest on it, or it has a variable of its own: \
                     OUTBOX_KAFKA_BROKERS, OUTBOX_KAFKA_SECURITY_PROTOCOL, OUTBOX_KAFKA_SASL_*, OUTBOX_KAFKA_*_FILE, \
                     OUTBOX_PUBLISH_TIMEOUT)"
                ),
            ));
        }
    }
    Ok(properties)
}

/// The topic template: literal parts only of the characters a topic name
/// may hold; what the placeholders bring is checked per event.
fn parse_topic(raw: &str) -> Result<RoutingKeyTemplate, String> {
    let template = RoutingKeyTemplate::parse(raw.trim())?;
    let literal = template.render("x", "x");
    super::message::check_topic(&literal).map_err(|e| format!("'{raw}' {e}"))?;
    Ok(template)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(brokers: &str) -> KafkaSettings<'_> {
        KafkaSettings {
            brokers: Some(brokers),
            topic: "outbox.{event_type}",
            security_protocol: "plaintext",
            ..KafkaSettings::default()
        }
    }

    #[test]
    fn brokers_are_host_port_pairs() {
        let config = KafkaConfig::parse(&settings(" k1:9092, k2:9093 ")).unwrap();
        assert_eq!(config.brokers, "k1:9092,k2:9093");
        for bad in ["", "k1", "k1:x", "kafka://k1:9092", "u:p@k1:9092", ":9092"] {
            let error = KafkaConfig::parse(&settings(bad)).unwrap_err();
            assert_eq!(error.variable, "OUTBOX_KAFKA_BROKERS", "{bad}");
        }
        let error = KafkaConfig::parse(&KafkaSettings {
            brokers: None,
            ..settings("")
        })
        .unwrap_err();
        assert!(error.problem.contains("is required"), "{error}");
    }

    #[test]
    fn the_relays_own_properties_are_refused() {
        for key in [
            "enable.idempotence",
            "acks",
            "partitioner",
            "allow.auto.create.topics",
            "message.timeout.ms",
            "transactional.id",
            "sasl.password",
            "ssl.key.password",
            "bootstrap.servers",
            "enable.ssl.certificate.verification",
        ] {
            let raw = format!("linger.ms=5,{key}=x");
            let error = KafkaConfig::parse(&KafkaSettings {
                properties: Some(&raw),
                ..settings("k:9092")
            })
            .unwrap_err();
            assert_eq!(error.variable, "OUTBOX_KAFKA_PROPERTIES", "{key}");
            assert!(error.problem.contains(key), "{error}");
        }
    }

    #[test]
    fn other_properties_are_passed_on_and_checked_by_librdkafka() {
        let config = KafkaConfig::parse(&KafkaSettings {
            properties: Some(
                "linger.ms=20, compression.type=zstd,ssl.cipher.suites=A,B,message.max.bytes=2000",
            ),
            ..settings("k:9092")
        })
        .unwrap();
        assert_eq!(
            config.properties,
            [
                ("linger.ms".to_owned(), "20".to_owned()),
                ("compression.type".to_owned(), "zstd".to_owned()),
                ("ssl.cipher.suites".to_owned(), "A,B".to_owned()),
                ("message.max.bytes".to_owned(), "2000".to_owned()),
            ]
        );
        assert_eq!(config.max_message_bytes, 2000);
        for bad in ["no.such.property=1", "linger.ms=soon", "=1", "linger.ms"] {
            let error = KafkaConfig::parse(&KafkaSettings {
                properties: Some(bad),
                ..settings("k:9092")
            })
            .unwrap_err();
            assert_eq!(error.variable, "OUTBOX_KAFKA_PROPERTIES", "{bad}: {error}");
        }
    }

    #[test]
    fn sasl_needs_a_mechanism_and_credentials_and_hides_the_password() {
        let sasl = |mechanism: Option<&'static str>, password: Option<&'static str>| KafkaSettings {
            security_protocol: "sasl_plaintext",
            sasl_mechanism: mechanism,
            sasl_username: Some("alice"),
            sasl_password: password,
            ..settings("k:9092")
        };
        let config = KafkaConfig::parse(&sasl(Some("scram-sha-512"), Some("hunter2"))).unwrap();
        assert_eq!(config.sasl.as_ref().unwrap().mechanism, "SCRAM-SHA-512");
        assert!(!format!("{config:?}").contains("hunter2"));
        assert_eq!(
            KafkaConfig::parse(&sasl(None, Some("hunter2")))
                .unwrap_err()
                .variable,
            "OUTBOX_KAFKA_SASL_MECHANISM"
        );
        assert_eq!(
            KafkaConfig::parse(&sasl(Some("GSSAPI"), Some("hunter2")))
                .unwrap_err()
                .variable,
            "OUTBOX_KAFKA_SASL_MECHANISM"
        );
        assert_eq!(
            KafkaConfig::parse(&sasl(Some("PLAIN"), None))
                .unwrap_err()
                .variable,
            "OUTBOX_KAFKA_SASL_PASSWORD"
        );
        let error = KafkaConfig::parse(&KafkaSettings {
            sasl_password: Some("hunter2"),
            ..settings("k:9092")
        })
        .unwrap_err();
        assert_eq!(error.variable, "OUTBOX_KAFKA_SASL_PASSWORD");
        assert!(!error.to_string().contains("hunter2"));
    }

    #[test]
    fn certificate_files_go_with_tls_and_are_read_at_start_up() {
        let error = KafkaConfig::parse(&KafkaSettings {
            ca_file: Some("/x/ca.pem"),
            ..settings("k:9092")
        })
        .unwrap_err();
        assert_eq!(error.variable, "OUTBOX_KAFKA_CA_FILE");
        let error = KafkaConfig::parse(&KafkaSettings {
            security_protocol: "ssl",
            ca_file: Some("/x/ca.pem"),
            ..settings("k:9092")
        })
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "OUTBOX_KAFKA_CA_FILE: cannot read /x/ca.pem: No such file or directory"
        );
        let error = KafkaConfig::parse(&KafkaSettings {
            security_protocol: "ssl",
            client_cert_file: Some("/x/c.pem"),
            ..settings("k:9092")
        })
        .unwrap_err();
        assert_eq!(error.variable, "OUTBOX_KAFKA_CLIENT_KEY_FILE");
        let error = KafkaConfig::parse(&KafkaSettings {
            security_protocol: "tls",
            ..settings("k:9092")
        })
        .unwrap_err();
        assert_eq!(error.variable, "OUTBOX_KAFKA_SECURITY_PROTOCOL");
    }

    #[test]
    fn topic_templates_hold_only_topic_characters() {
        for bad in ["", "outbox {event_type}", "a/{event_type}", "{nope}", "."] {
            let error = KafkaConfig::parse(&KafkaSettings {
                topic: bad,
                ..settings("k:9092")
            })
            .unwrap_err();
            assert_eq!(error.variable, "OUTBOX_KAFKA_TOPIC", "{bad}");
        }
        assert!(KafkaConfig::parse(&KafkaSettings {
            topic: "{event_type}",
            ..settings("k:9092")
        })
        .is_ok());
    }
}
