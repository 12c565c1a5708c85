//! RabbitMQ settings: the broker URL (its password kept out of every log
//! and error), the exchange, the routing-key template, and for `amqps://`
//! the CA and client certificate files.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::settings::{var, ConfigError};
pub use crate::sink::template::RoutingKeyTemplate;
use crate::tls::{self, Trust, Which};

/// RabbitMQ sink settings.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpConfig {
    /// Full URL, including credentials: never log it, use [`AmqpConfig::redacted_url`].
    pub url: String,
    /// Exchange to publish to (empty string is the default exchange).
    pub exchange: String,
    /// Routing key template.
    pub routing_key: RoutingKeyTemplate,
    /// The broker's `max_message_size`: a larger payload is quarantined
    /// without being sent (RabbitMQ would close the channel on it).
    pub max_message_bytes: usize,
    /// TLS for an `amqps://` URL; `None` for `amqp://`.
    pub tls: Option<AmqpTls>,
}

/// How an `amqps://` connection checks the broker and identifies itself.
#[derive(Clone)]
pub struct AmqpTls {
    /// The files it was made from, for equality and logs.
    files: [Option<String>; 3],
    /// The rustls configuration: the broker's certificate must chain to the
    /// CA file (or the system's CAs) and name the URL's host.
    pub config: Arc<rustls::ClientConfig>,
}

impl PartialEq for AmqpTls {
    fn eq(&self, other: &Self) -> bool {
        self.files == other.files
    }
}

impl Eq for AmqpTls {}

impl fmt::Debug for AmqpTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [ca, cert, key] = &self.files;
        f.debug_struct("AmqpTls")
            .field("ca_file", ca)
            .field("client_cert_file", cert)
            .field("client_key_file", key)
            .finish()
    }
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
            .field("max_message_bytes", &self.max_message_bytes)
            .field("tls", &self.tls)
            .finish()
    }
}

impl AmqpConfig {
    /// Validates `OUTBOX_AMQP_URL`, `OUTBOX_AMQP_EXCHANGE` and
    /// `OUTBOX_AMQP_ROUTING_KEY`.
    pub fn parse(
        url: &str,
        exchange: &str,
        routing_key: &str,
        max_message_bytes: &str,
    ) -> Result<Self, ConfigError> {
        let parsed = url::Url::parse(url)
            .map_err(|e| ConfigError::new(var::AMQP_URL, format!("is not a valid URL: {e}")))?;
        if !matches!(parsed.scheme(), "amqp" | "amqps") {
            return Err(ConfigError::new(
                var::AMQP_URL,
                format!("scheme '{}' is not amqp or amqps", parsed.scheme()),
            ));
        }
        if url.parse::<lapin::uri::AMQPUri>().is_err() {
            return Err(ConfigError::new(var::AMQP_URL, "is not a valid AMQP URL"));
        }
        if exchange.len() > 255 {
            return Err(ConfigError::new(var::AMQP_EXCHANGE, "is longer than 255 bytes"));
        }
        // Unlike a NATS subject (see the NATS sink's config), a routing key
        // may start with a placeholder, as the default `{event_type}` does:
        // the operator fixes the exchange, and a key only picks among that
        // exchange's bindings; no routing key reaches a broker API or
        // another client's replies the way `$JS.…` or `_INBOX.…` subjects
        // do. (On the default exchange, "", a key names any queue of the
        // vhost; an operator who picks it has chosen that.)
        let routing_key =
            RoutingKeyTemplate::parse(routing_key).map_err(|e| ConfigError::new(var::AMQP_ROUTING_KEY, e))?;
        // RabbitMQ itself accepts at most 512 MiB, whatever it is set to.
        let max_message_bytes = max_message_bytes
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|bytes| (1..=512 * 1024 * 1024).contains(bytes))
            .ok_or_else(|| {
                ConfigError::new(
                    var::AMQP_MAX_MESSAGE_BYTES,
                    format!("'{max_message_bytes}' is not a number of bytes from 1 to 536870912"),
                )
            })?;
        Ok(Self {
            url: url.to_owned(),
            exchange: exchange.to_owned(),
            routing_key,
            max_message_bytes,
            tls: None,
        })
    }

    /// Reads `OUTBOX_AMQP_CA_FILE`, `OUTBOX_AMQP_CLIENT_CERT_FILE` and
    /// `OUTBOX_AMQP_CLIENT_KEY_FILE` for an `amqps://` URL: the broker's
    /// certificate must chain to the CA file (the system's CAs without one)
    /// and name the URL's host. Files given with a plain `amqp://` URL are
    /// an error rather than silently unused.
    pub fn with_tls_files(
        mut self,
        ca_file: Option<&str>,
        cert_file: Option<&str>,
        key_file: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let secure = url::Url::parse(&self.url).is_ok_and(|url| url.scheme() == "amqps");
        if !secure {
            let given = [
                (var::AMQP_CA_FILE, ca_file),
                (var::AMQP_CLIENT_CERT_FILE, cert_file),
                (var::AMQP_CLIENT_KEY_FILE, key_file),
            ];
            if let Some((variable, _)) = given.iter().find(|(_, file)| file.is_some()) {
                return Err(ConfigError::new(
                    variable,
                    format!("is set, but {} is not an amqps:// URL", var::AMQP_URL),
                ));
            }
            return Ok(self);
        }
        let roots = match ca_file {
            Some(path) => tls::read_roots(Path::new(path)),
            None => tls::system_roots(),
        }
        .map_err(|e| ConfigError::new(var::AMQP_CA_FILE, e.0))?;
        let identity = match (cert_file, key_file) {
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::new(
                    var::AMQP_CLIENT_KEY_FILE,
                    format!("is needed with {}", var::AMQP_CLIENT_CERT_FILE),
                ))
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    var::AMQP_CLIENT_CERT_FILE,
                    format!("is needed with {}", var::AMQP_CLIENT_KEY_FILE),
                ))
            }
            (Some(cert), Some(key)) => Some(tls::read_identity(Path::new(cert), Path::new(key)).map_err(
                |(which, e)| match which {
                    Which::Cert => ConfigError::new(var::AMQP_CLIENT_CERT_FILE, e.0),
                    Which::Key => ConfigError::new(var::AMQP_CLIENT_KEY_FILE, e.0),
                },
            )?),
        };
        let trust = Trust::Chain {
            roots: Arc::new(roots),
            check_name: true,
        };
        let config = tls::client_config(&trust, identity.as_ref())
            .map_err(|e| ConfigError::new(var::AMQP_URL, format!("TLS set-up: {e}")))?;
        self.tls = Some(AmqpTls {
            files: [ca_file, cert_file, key_file].map(|file| file.map(str::to_owned)),
            config: Arc::new(config),
        });
        Ok(self)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_files_name_their_variable() {
        let plain =
            AmqpConfig::parse("amqp://guest:guest@h:5672/%2f", "x", "{event_type}", "16777216").unwrap();
        let error = plain
            .clone()
            .with_tls_files(Some("/x/ca.pem"), None, None)
            .unwrap_err();
        assert_eq!(error.variable, "OUTBOX_AMQP_CA_FILE");
        assert!(plain.with_tls_files(None, None, None).unwrap().tls.is_none());
        let secure =
            AmqpConfig::parse("amqps://guest:hunter2@h/%2f", "x", "{event_type}", "16777216").unwrap();
        let error = secure
            .clone()
            .with_tls_files(Some("/x/ca.pem"), None, None)
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "OUTBOX_AMQP_CA_FILE: cannot read /x/ca.pem: No such file or directory"
        );
        let error = secure.with_tls_files(None, Some("/x/c.pem"), None).unwrap_err();
        assert_eq!(error.variable, "OUTBOX_AMQP_CLIENT_KEY_FILE");
    }

    #[test]
    fn redacted_urls_hide_the_password() {
        assert_eq!(
            redact_url("amqp://guest:hunter2@h:5672/%2f"),
            "amqp://guest:****@h:5672/%2f"
        );
    }
}
