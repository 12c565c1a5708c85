//! One event as a Kafka record: its topic, key, value and headers (plain,
//! or CloudEvents binary content mode), and the checks that refuse a row
//! before it is sent when it could never be stored.
//!
//! Every header is set in [`headers`], so that the benchmark's bare
//! producer sends exactly the relay's records.

use rdkafka::message::{Header, OwnedHeaders};

use crate::cloudevents::{self, MessageFormat};
use crate::event::Event;
use crate::headers::printable;
use crate::sink::template::RoutingKeyTemplate;

/// The prefix of CloudEvents attributes in the Kafka protocol binding's
/// binary content mode.
pub const CLOUDEVENTS_PREFIX: &str = "ce_";

/// The header carrying the content type (the binding's `content-type`,
/// which is also CloudEvents' `datacontenttype` in binary mode).
pub const CONTENT_TYPE: &str = "content-type";

/// Kafka's longest topic name.
const MAX_TOPIC: usize = 249;

/// Whether `topic` is a name Kafka accepts: 1 to 249 characters of ASCII
/// letters, digits, `.`, `_` and `-`, and not `.` or `..`. Kafka refuses
/// anything else (`InvalidTopic`) whatever the cluster, so a row whose
/// template renders such a name is refused before sending.
pub fn check_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() {
        return Err("is an empty topic name".to_owned());
    }
    if topic.len() > MAX_TOPIC {
        return Err(format!(
            "is {} characters long; Kafka allows {MAX_TOPIC}",
            topic.len()
        ));
    }
    if topic == "." || topic == ".." {
        return Err("is '.' or '..', which Kafka does not allow".to_owned());
    }
    if let Some(bad) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "holds '{}', which a Kafka topic name cannot (letters, digits, '.', '_', '-')",
            bad.escape_default()
        ));
    }
    Ok(())
}

/// The topics a template can render, as its literal pieces in order: a
/// topic matches when it is those pieces with at least one character in
/// the place of each placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TopicPattern {
    /// Literal pieces between placeholders; `pieces.len() - 1` placeholders.
    pieces: Vec<String>,
}

impl TopicPattern {
    pub(super) fn of(template: &RoutingKeyTemplate) -> Self {
        let marked = template.render("\u{1}", "\u{1}");
        Self {
            pieces: marked.split('\u{1}').map(str::to_owned).collect(),
        }
    }

    /// The one topic the template names, when it has no placeholder.
    pub(super) fn literal(&self) -> Option<&str> {
        match self.pieces.as_slice() {
            [only] => Some(only),
            _ => None,
        }
    }

    /// Whether the template could have rendered `topic`.
    pub(super) fn matches(&self, topic: &str) -> bool {
        let (first, rest) = match self.pieces.split_first() {
            Some(split) => split,
            None => return false,
        };
        let Some(mut remaining) = topic.strip_prefix(first.as_str()) else {
            return false;
        };
        if rest.is_empty() {
            return remaining.is_empty();
        }
        let (last, middle) = rest.split_last().unwrap_or((&rest[0], &[]));
        for piece in middle {
            // At least one character for the placeholder before `piece`;
            // the leftmost place leaves the most for what follows.
            let Some(found) = remaining.get(1..).and_then(|tail| tail.find(piece.as_str())) else {
                return false;
            };
            remaining = &remaining[1 + found + piece.len()..];
        }
        remaining.len() > last.len() && remaining.ends_with(last.as_str())
    }

    /// The pattern for messages: placeholders shown as `*`.
    pub(super) fn describe(&self) -> String {
        self.pieces.join("*")
    }
}

/// The headers of an event's record: `event_id`, `event_type`,
/// `aggregate_id`, `causation_id` when set, `content-type`, the producer's
/// headers verbatim, and in CloudEvents mode a `ce_` header per attribute.
pub fn headers(event: &Event, format: &MessageFormat) -> OwnedHeaders {
    let id = event.id.to_string();
    let causation = event.causation_id.map(|id| id.to_string());
    let mut headers = OwnedHeaders::new_with_capacity(6 + event.headers.len())
        .insert(header("event_id", &id))
        .insert(header("event_type", &event.event_type))
        .insert(header("aggregate_id", &event.aggregate_id));
    if let Some(causation) = &causation {
        headers = headers.insert(header("causation_id", causation));
    }
    headers = headers.insert(header(CONTENT_TYPE, cloudevents::DATA_CONTENT_TYPE));
    for (name, value) in event.headers.iter() {
        headers = headers.insert(header(name, value));
    }
    if let Some(source) = format.cloudevents_source() {
        for (name, value) in cloudevents::attributes(event, source) {
            headers = headers.insert(header(&format!("{CLOUDEVENTS_PREFIX}{name}"), &value));
        }
    }
    headers
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a [u8]> {
    Header {
        key,
        value: Some(value.as_bytes()),
    }
}

/// Builds the topic of `event`, or says why the row can never be
/// published: a topic name Kafka refuses, or a producer header that would
/// take the place of one the relay sets (`content-type`; in CloudEvents
/// mode the `ce_` attributes).
pub(super) fn prepare(
    event: &Event,
    template: &RoutingKeyTemplate,
    format: &MessageFormat,
) -> Result<String, String> {
    for (name, _) in event.headers.iter() {
        let lower = name.to_ascii_lowercase();
        if lower == CONTENT_TYPE {
            return Err(format!(
                "headers: \"{}\" is set by the relay on Kafka (application/json)",
                printable(name)
            ));
        }
        if format.cloudevents_source().is_some()
            && (lower.starts_with(CLOUDEVENTS_PREFIX) || cloudevents::RESERVED.contains(&lower.as_str()))
        {
            return Err(format!(
                "headers: \"{}\" is reserved in CloudEvents mode (the relay sets the ce_ headers and the \
                 attributes {})",
                printable(name),
                cloudevents::RESERVED.join(", ")
            ));
        }
    }
    let topic = template.render(&event.event_type, &event.aggregate_id);
    check_topic(&topic).map_err(|e| {
        format!(
            "topic \"{}\" is not a valid Kafka topic name: it {e}",
            printable(&topic)
        )
    })?;
    Ok(topic)
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use rdkafka::message::Headers;
    use uuid::Uuid;

    use super::*;
    use crate::headers::Headers as EventHeaders;

    fn event() -> Event {
        Event {
            id: Uuid::new_v4(),
            causation_id: None,
            event_type: "order.created".into(),
            aggregate_id: "order-7".into(),
            payload: r#"{"total": 7}"#.into(),
            created_at: Utc::now(),
            attempt_count: 1,
            headers: EventHeaders::from_pairs(vec![("traceparent".into(), "00-abc".into())]),
        }
    }

    fn template(raw: &str) -> RoutingKeyTemplate {
        RoutingKeyTemplate::parse(raw).unwrap()
    }

    fn names(headers: &OwnedHeaders) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|h| {
                (
                    h.key.to_owned(),
                    String::from_utf8(h.value.unwrap_or_default().to_vec()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn records_carry_the_relays_headers_and_the_producers() {
        let e = event();
        let plain = names(&headers(&e, &MessageFormat::Plain));
        assert_eq!(
            plain,
            [
                ("event_id".to_owned(), e.id.to_string()),
                ("event_type".to_owned(), "order.created".to_owned()),
                ("aggregate_id".to_owned(), "order-7".to_owned()),
                ("content-type".to_owned(), "application/json".to_owned()),
                ("traceparent".to_owned(), "00-abc".to_owned()),
            ]
        );
        let caused = Event {
            causation_id: Some(Uuid::nil()),
            ..event()
        };
        assert!(names(&headers(&caused, &MessageFormat::Plain))
            .contains(&("causation_id".to_owned(), Uuid::nil().to_string())));
        let ce = MessageFormat::parse("cloudevents", Some("urn:shop")).unwrap();
        let ce_headers = names(&headers(&e, &ce));
        for (name, value) in [
            ("ce_specversion", "1.0"),
            ("ce_source", "urn:shop"),
            ("ce_type", "order.created"),
            ("ce_subject", "order-7"),
            ("ce_traceparent", "00-abc"),
        ] {
            assert!(
                ce_headers.contains(&(name.to_owned(), value.to_owned())),
                "{name}"
            );
        }
        assert!(ce_headers.contains(&("ce_id".to_owned(), e.id.to_string())));
    }

    #[test]
    fn topics_kafka_refuses_are_the_rows_fault() {
        assert_eq!(
            prepare(&event(), &template("outbox.{event_type}"), &MessageFormat::Plain).unwrap(),
            "outbox.order.created"
        );
        for event_type in ["order created", "order/created", "ordér", &"x".repeat(250)] {
            let e = Event {
                event_type: event_type.to_owned(),
                ..event()
            };
            let reason = prepare(&e, &template("{event_type}"), &MessageFormat::Plain).unwrap_err();
            assert!(reason.contains("not a valid Kafka topic name"), "{reason}");
        }
        assert!(check_topic("..").is_err());
        assert!(check_topic("a-b_c.D9").is_ok());
    }

    #[test]
    fn headers_the_relay_sets_are_refused() {
        let with = |name: &str| Event {
            headers: EventHeaders::from_pairs(vec![(name.to_owned(), "x".to_owned())]),
            ..event()
        };
        let ce = MessageFormat::parse("cloudevents", Some("urn:shop")).unwrap();
        let t = template("t");
        assert!(prepare(&with("Content-Type"), &t, &MessageFormat::Plain).is_err());
        assert!(prepare(&with("ce_id"), &t, &MessageFormat::Plain).is_ok());
        assert!(prepare(&with("ce_id"), &t, &ce).is_err());
        assert!(prepare(&with("source"), &t, &ce).is_err());
        assert!(prepare(&with("tenant"), &t, &ce).is_ok());
    }

    #[test]
    fn a_pattern_matches_what_its_template_renders() {
        let pattern = TopicPattern::of(&template("outbox.{event_type}"));
        assert!(pattern.matches("outbox.order"));
        assert!(!pattern.matches("outbox."));
        assert!(!pattern.matches("other.order"));
        assert_eq!(pattern.literal(), None);
        let pattern = TopicPattern::of(&template("t-{aggregate_id}.x.{event_type}-v1"));
        assert!(pattern.matches("t-7.x.order-v1"));
        assert!(pattern.matches("t-7.x.y.x.order-v1"));
        assert!(!pattern.matches("t-.x.order-v1"));
        assert!(!pattern.matches("t-7.x.-v1"));
        assert_eq!(pattern.describe(), "t-*.x.*-v1");
        let fixed = TopicPattern::of(&template("orders"));
        assert_eq!(fixed.literal(), Some("orders"));
        assert!(fixed.matches("orders"));
        assert!(!fixed.matches("orders2"));
        assert!(TopicPattern::of(&template("{event_type}")).matches("anything"));
    }
}
