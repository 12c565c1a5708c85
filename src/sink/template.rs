//! The template every sink renders an event's destination with (routing
//! key, subject, topic): literals with `{event_type}` and `{aggregate_id}`
//! placeholders. It lives apart from the sinks so that each sink can be
//! left out of a build (see the cargo features) without the others.

/// One part of a routing key template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyPart {
    Literal(String),
    EventType,
    AggregateId,
}

/// A parsed `OUTBOX_AMQP_ROUTING_KEY`, `OUTBOX_NATS_SUBJECT` or
/// `OUTBOX_KAFKA_TOPIC` (each sink then holds it to its broker's own rules): literals
/// with `{event_type}` and `{aggregate_id}` placeholders. Where it may
/// start with a placeholder is each sink's rule, not the template's.
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
}
