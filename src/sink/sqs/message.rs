//! From an outbox row to an SQS message: its attributes, its size as SQS
//! counts it, and the checks that reject a row SQS can never accept before
//! it can take a whole request down with it.

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};

use crate::event::Event;

/// The data type of every message attribute the relay sets.
const STRING: &str = "String";

/// The message attributes of an event, in a fixed order.
fn attributes(event: &Event) -> Vec<(&'static str, String)> {
    let mut attributes = vec![
        ("event_id", event.id.to_string()),
        ("event_type", event.event_type.clone()),
        ("aggregate_id", event.aggregate_id.clone()),
    ];
    if let Some(causation_id) = event.causation_id {
        attributes.push(("causation_id", causation_id.to_string()));
    }
    attributes
}

/// The size SQS counts for a message: the body plus, for each attribute,
/// its name, data type and value.
fn message_size(body: &str, attributes: &[(&'static str, String)]) -> usize {
    body.len()
        + attributes
            .iter()
            .map(|(name, value)| name.len() + STRING.len() + value.len())
            .sum::<usize>()
}

/// The first character SQS does not accept in a message body or string
/// attribute (only #x9 #xA #xD #x20–#xD7FF #xE000–#xFFFD #x10000–#x10FFFF
/// are allowed), with its byte offset.
fn first_invalid_char(text: &str) -> Option<(usize, char)> {
    text.char_indices().find(|&(_, c)| {
        !matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
    })
}

/// What SQS accepts as a FIFO `MessageGroupId`: 1 to 128 characters, each
/// alphanumeric or ASCII punctuation.
fn valid_group_id(group: &str) -> bool {
    (1..=128).contains(&group.len()) && group.bytes().all(|b| b.is_ascii_graphic())
}

/// Checks what can be known to fail before sending and would fail on every
/// attempt; returns the message size on success, the reason otherwise.
pub(super) fn precheck(event: &Event, fifo: bool, max_message_size: usize) -> Result<usize, String> {
    if event.payload.is_empty() {
        return Err("payload is empty; SQS needs a message body of at least one character".to_owned());
    }
    if let Some((at, c)) = first_invalid_char(&event.payload) {
        return Err(format!(
            "payload contains the character U+{:04X} at byte {at}, which SQS does not allow in a message body",
            u32::from(c)
        ));
    }
    let attributes = attributes(event);
    for (name, value) in &attributes {
        if value.is_empty() {
            return Err(format!(
                "{name} is empty; SQS does not allow empty attribute values"
            ));
        }
        if let Some((at, c)) = first_invalid_char(value) {
            return Err(format!(
                "{name} contains the character U+{:04X} at byte {at}, which SQS does not allow in an attribute",
                u32::from(c)
            ));
        }
    }
    if fifo && !valid_group_id(&event.aggregate_id) {
        return Err(
            "aggregate_id cannot be a FIFO MessageGroupId (1 to 128 ASCII letters, digits or punctuation)"
                .to_owned(),
        );
    }
    let size = message_size(&event.payload, &attributes);
    if size > max_message_size {
        return Err(format!(
            "message of {size} bytes (body and attributes) exceeds the queue's MaximumMessageSize of {max_message_size} bytes"
        ));
    }
    Ok(size)
}

/// The SQS entry for `event` at `position` in its request.
pub(super) fn entry(
    position: usize,
    event: &Event,
    fifo: bool,
) -> Result<SendMessageBatchRequestEntry, aws_sdk_sqs::error::BuildError> {
    let mut builder = SendMessageBatchRequestEntry::builder()
        .id(position.to_string())
        .message_body(event.payload.clone());
    for (name, value) in attributes(event) {
        builder = builder.message_attributes(
            name,
            MessageAttributeValue::builder()
                .data_type(STRING)
                .string_value(value)
                .build()?,
        );
    }
    if fifo {
        builder = builder
            .message_group_id(event.aggregate_id.clone())
            .message_deduplication_id(event.id.to_string());
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use uuid::Uuid;

    fn event(aggregate_id: &str, payload: &str) -> Event {
        Event {
            id: Uuid::new_v4(),
            causation_id: None,
            event_type: "order.created".into(),
            aggregate_id: aggregate_id.into(),
            payload: payload.into(),
            created_at: Utc::now(),
            attempt_count: 1,
        }
    }

    #[test]
    fn attributes_carry_the_ids_and_causation_only_when_set() {
        let mut e = event("agg-1", "{}");
        let names: Vec<&str> = attributes(&e).iter().map(|(name, _)| *name).collect();
        assert_eq!(names, vec!["event_id", "event_type", "aggregate_id"]);
        let cause = Uuid::new_v4();
        e.causation_id = Some(cause);
        let built = attributes(&e);
        assert_eq!(built[0], ("event_id", e.id.to_string()));
        assert_eq!(built[1], ("event_type", "order.created".to_owned()));
        assert_eq!(built[2], ("aggregate_id", "agg-1".to_owned()));
        assert_eq!(built[3], ("causation_id", cause.to_string()));
        // body 2 + event_id (8+6+36) + event_type (10+6+13) + aggregate_id (12+6+5) + causation (12+6+36)
        assert_eq!(message_size(&e.payload, &built), 2 + 50 + 29 + 23 + 54);
    }

    #[test]
    fn entries_carry_fifo_fields_only_on_fifo_queues() {
        let e = event("agg-1", r#"{"a":1}"#);
        let standard = entry(3, &e, false).unwrap();
        assert_eq!(standard.id(), "3");
        assert_eq!(standard.message_body(), r#"{"a":1}"#);
        assert!(standard.message_group_id().is_none());
        assert!(standard.message_deduplication_id().is_none());
        let attrs = standard.message_attributes().unwrap();
        assert_eq!(attrs.len(), 3);
        assert_eq!(attrs["event_id"].string_value(), Some(e.id.to_string().as_str()));
        assert_eq!(attrs["event_id"].data_type(), "String");
        let fifo = entry(0, &e, true).unwrap();
        assert_eq!(fifo.message_group_id(), Some("agg-1"));
        assert_eq!(fifo.message_deduplication_id(), Some(e.id.to_string().as_str()));
    }

    #[test]
    fn characters_outside_the_sqs_set_are_found() {
        assert_eq!(first_invalid_char("{\"a\":\"tab\there\nok\r\"}"), None);
        assert_eq!(
            first_invalid_char("ünïcødé ✓ 🎉 \u{D7FF}\u{E000}\u{FFFD}\u{10FFFF}"),
            None
        );
        assert_eq!(first_invalid_char("ab\u{0}"), Some((2, '\u{0}')));
        assert_eq!(first_invalid_char("\u{1F}"), Some((0, '\u{1F}')));
        assert_eq!(first_invalid_char("x\u{FFFE}"), Some((1, '\u{FFFE}')));
        assert_eq!(first_invalid_char("é\u{FFFF}"), Some((2, '\u{FFFF}')));
        assert_eq!(first_invalid_char("\u{B}"), Some((0, '\u{B}')));
    }

    #[test]
    fn prechecks_reject_what_sqs_never_accepts() {
        assert!(precheck(&event("a", "{}"), false, 1024).is_ok());
        let big = format!("\"{}\"", "x".repeat(2000));
        let reason = precheck(&event("a", &big), false, 1024).unwrap_err();
        assert!(reason.contains("MaximumMessageSize of 1024"), "{reason}");
        let bad = precheck(&event("a", "\"\u{FFFF}\""), false, 1024).unwrap_err();
        assert!(bad.contains("U+FFFF"), "{bad}");
        assert!(precheck(&event("", "{}"), false, 1024)
            .unwrap_err()
            .contains("aggregate_id is empty"));
        // Fine on a standard queue, not as a FIFO group id.
        assert!(precheck(&event("order 7", "{}"), false, 1024).is_ok());
        assert!(precheck(&event("order 7", "{}"), true, 1024).is_err());
        assert!(precheck(&event(&"a".repeat(129), "{}"), true, 1024).is_err());
        assert!(precheck(&event("order-7/é", "{}"), true, 1024).is_err());
        assert!(precheck(&event("order-7:{x}", "{}"), true, 1024).is_ok());
        // Attributes count towards the size: a body that fits alone does not.
        let e = event("a", &"1".repeat(1000));
        assert!(precheck(&e, false, 1024).is_err());
        assert!(precheck(&e, false, 1100).is_ok());
    }
}
