//! RabbitMQ settings: the broker URL (its password kept out of every log
//! and error), the exchange and the routing-key template.

use std::fmt;

use crate::config::{var, ConfigError};

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
        })
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

    #[test]
    fn redacted_urls_hide_the_password() {
        assert_eq!(
            redact_url("amqp://guest:hunter2@h:5672/%2f"),
            "amqp://guest:****@h:5672/%2f"
        );
    }
}
