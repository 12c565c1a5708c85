//! From an outbox row to an SQS message: its attributes, its size as SQS
//! counts it, and the checks that reject a row SQS can never accept before
//! it can take a whole request down with it.

use std::borrow::Cow;

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};

use crate::cloudevents::{self, MessageFormat};
use crate::event::Event;
use crate::headers::printable;

/// The data type of every message attribute the relay sets.
const STRING: &str = "String";

/// The most message attributes SQS takes on one message.
const MAX_ATTRIBUTES: usize = 10;

/// The longest message attribute name SQS takes.
const MAX_ATTRIBUTE_NAME: usize = 256;

/// The message attributes of an event, in a fixed order: the relay's own,
/// then the producer's headers.
fn attributes(event: &Event) -> Vec<(&str, String)> {
    let mut attributes = vec![
        ("event_id", event.id.to_string()),
        ("event_type", event.event_type.clone()),
        ("aggregate_id", event.aggregate_id.clone()),
    ];
    if let Some(causation_id) = event.causation_id {
        attributes.push(("causation_id", causation_id.to_string()));
    }
    attributes.extend(event.headers.iter().map(|(name, value)| (name, value.to_owned())));
    attributes
}

/// The message body: the payload, or in CloudEvents mode the JSON event
/// (structured content mode) carrying it as `data`.
fn body<'a>(event: &'a Event, format: &MessageFormat) -> Result<Cow<'a, str>, String> {
    match format.cloudevents_source() {
        None => Ok(Cow::Borrowed(&event.payload)),
        Some(source) => cloudevents::structured(event, source).map(Cow::Owned),
    }
}

/// Why SQS would refuse `name` as a message attribute name: 1 to 256 of
/// `A-Za-z0-9_-.`, not starting with `AWS.` or `Amazon.` (any case), no
/// period first, last or twice in a row.
fn invalid_attribute_name(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if name.is_empty() || name.len() > MAX_ATTRIBUTE_NAME {
        Some("SQS attribute names are 1 to 256 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        Some("SQS attribute names may only hold A-Z, a-z, 0-9, '_', '-' and '.'")
    } else if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        Some("SQS reserves attribute names starting with AWS. or Amazon.")
    } else if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        Some("SQS attribute names may not start or end with '.' or hold '..'")
    } else {
        None
    }
}

/// Checks the producer's headers as SQS attributes: names, values, count.
fn check_headers(event: &Event, format: &MessageFormat, attribute_count: usize) -> Result<(), String> {
    for (name, value) in event.headers.iter() {
        if let Some(why) = invalid_attribute_name(name) {
            return Err(format!(
                "headers: \"{}\" cannot be an SQS attribute name: {why}",
                printable(name)
            ));
        }
        if format.cloudevents_source().is_some() && cloudevents::is_reserved(name) {
            return Err(format!(
                "headers: \"{}\" is reserved in CloudEvents mode (the relay sets the attributes {})",
                printable(name),
                cloudevents::RESERVED.join(", ")
            ));
        }
        if value.is_empty() {
            return Err(format!(
                "headers: \"{}\" is empty; SQS does not allow empty attribute values",
                printable(name)
            ));
        }
    }
    if attribute_count > MAX_ATTRIBUTES {
        return Err(format!(
            "headers: {} headers and the relay's {} attributes make {attribute_count} message attributes; \
             SQS allows {MAX_ATTRIBUTES}",
            event.headers.len(),
            attribute_count - event.headers.len()
        ));
    }
    Ok(())
}

/// The size SQS counts for a message: the body plus, for each attribute,
/// its name, data type and value.
fn message_size(body: &str, attributes: &[(&str, String)]) -> usize {
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
pub(super) fn precheck(
    event: &Event,
    fifo: bool,
    format: &MessageFormat,
    max_message_size: usize,
) -> Result<usize, String> {
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
    check_headers(event, format, attributes.len())?;
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
    let body = body(event, format)?;
    let size = message_size(&body, &attributes);
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
    format: &MessageFormat,
) -> Result<SendMessageBatchRequestEntry, String> {
    let mut builder = SendMessageBatchRequestEntry::builder()
        .id(position.to_string())
        .message_body(body(event, format)?.into_owned());
    for (name, value) in attributes(event) {
        builder = builder.message_attributes(
            name,
            MessageAttributeValue::builder()
                .data_type(STRING)
                .string_value(value)
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    if fifo {
        builder = builder
            .message_group_id(event.aggregate_id.clone())
            .message_deduplication_id(event.id.to_string());
    }
    builder.build().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::Headers;
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
            headers: Headers::default(),
        }
    }

    fn with_headers(headers: &[(&str, &str)]) -> Event {
        Event {
            headers: Headers::from_pairs(
                headers
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..event("agg-1", "{}")
        }
    }

    const PLAIN: MessageFormat = MessageFormat::Plain;

    fn cloudevents() -> MessageFormat {
        MessageFormat::CloudEvents {
            source: "urn:shop".into(),
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
        let standard = entry(3, &e, false, &PLAIN).unwrap();
        assert_eq!(standard.id(), "3");
        assert_eq!(standard.message_body(), r#"{"a":1}"#);
        assert!(standard.message_group_id().is_none());
        assert!(standard.message_deduplication_id().is_none());
        let attrs = standard.message_attributes().unwrap();
        assert_eq!(attrs.len(), 3);
        assert_eq!(attrs["event_id"].string_value(), Some(e.id.to_string().as_str()));
        assert_eq!(attrs["event_id"].data_type(), "String");
        let fifo = entry(0, &e, true, &PLAIN).unwrap();
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
        assert!(precheck(&event("a", "{}"), false, &PLAIN, 1024).is_ok());
        let big = format!("\"{}\"", "x".repeat(2000));
        let reason = precheck(&event("a", &big), false, &PLAIN, 1024).unwrap_err();
        assert!(reason.contains("MaximumMessageSize of 1024"), "{reason}");
        let bad = precheck(&event("a", "\"\u{FFFF}\""), false, &PLAIN, 1024).unwrap_err();
        assert!(bad.contains("U+FFFF"), "{bad}");
        assert!(precheck(&event("", "{}"), false, &PLAIN, 1024)
            .unwrap_err()
            .contains("aggregate_id is empty"));
        // Fine on a standard queue, not as a FIFO group id.
        assert!(precheck(&event("order 7", "{}"), false, &PLAIN, 1024).is_ok());
        assert!(precheck(&event("order 7", "{}"), true, &PLAIN, 1024).is_err());
        assert!(precheck(&event(&"a".repeat(129), "{}"), true, &PLAIN, 1024).is_err());
        assert!(precheck(&event("order-7/é", "{}"), true, &PLAIN, 1024).is_err());
        assert!(precheck(&event("order-7:{x}", "{}"), true, &PLAIN, 1024).is_ok());
        // Attributes count towards the size: a body that fits alone does not.
        let e = event("a", &"1".repeat(1000));
        assert!(precheck(&e, false, &PLAIN, 1024).is_err());
        assert!(precheck(&e, false, &PLAIN, 1100).is_ok());
    }

    #[test]
    fn headers_follow_the_relay_attributes() {
        let e = with_headers(&[("traceparent", "00-x"), ("tenant-id", "acme")]);
        let names: Vec<&str> = attributes(&e).iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            [
                "event_id",
                "event_type",
                "aggregate_id",
                "traceparent",
                "tenant-id"
            ]
        );
        let built = entry(0, &e, false, &PLAIN).unwrap();
        assert_eq!(
            built.message_attributes().unwrap()["traceparent"].string_value(),
            Some("00-x")
        );
    }

    #[test]
    fn header_names_follow_the_sqs_rules() {
        for good in ["a", "tenant-id", "x.y_z", "AWSome", "n".repeat(256).as_str()] {
            assert_eq!(invalid_attribute_name(good), None, "{good}");
        }
        for bad in [
            "has space",
            "ü",
            "AWS.x",
            "amazon.x",
            ".a",
            "a.",
            "a..b",
            "n".repeat(257).as_str(),
        ] {
            let e = with_headers(&[(bad, "v")]);
            let reason = precheck(&e, false, &PLAIN, 1024).unwrap_err();
            assert!(
                reason.contains("cannot be an SQS attribute name"),
                "{bad}: {reason}"
            );
        }
        let reason = precheck(&with_headers(&[("a", "")]), false, &PLAIN, 1024).unwrap_err();
        assert!(reason.contains("\"a\" is empty"), "{reason}");
    }

    #[test]
    fn ten_attributes_in_all() {
        // Three of the relay's (no causation id) and seven headers fit.
        let seven: Vec<(String, String)> = (0..7).map(|n| (format!("h{n}"), "v".to_owned())).collect();
        let pairs: Vec<(&str, &str)> = seven.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert!(precheck(&with_headers(&pairs), false, &PLAIN, 4096).is_ok());
        let mut with_cause = with_headers(&pairs);
        with_cause.causation_id = Some(Uuid::new_v4());
        let reason = precheck(&with_cause, false, &PLAIN, 4096).unwrap_err();
        assert!(
            reason.contains("make 11 message attributes; SQS allows 10"),
            "{reason}"
        );
    }

    #[test]
    fn header_bytes_count_towards_the_size() {
        let e = with_headers(&[("big", &"v".repeat(900))]);
        let reason = precheck(&e, false, &PLAIN, 1000).unwrap_err();
        assert!(reason.contains("MaximumMessageSize of 1000"), "{reason}");
        assert!(precheck(&e, false, &PLAIN, 2000).is_ok());
    }

    #[test]
    fn cloudevents_bodies_are_json_events_and_count_in_full() {
        let e = with_headers(&[("traceparent", "00-x")]);
        let built = entry(0, &e, false, &cloudevents()).unwrap();
        let body: serde_json::Value = serde_json::from_str(built.message_body()).unwrap();
        assert_eq!(body["id"], e.id.to_string());
        assert_eq!(body["traceparent"], "00-x");
        assert_eq!(body["data"], serde_json::json!({}));
        // Attributes are the same as in the plain format.
        assert_eq!(built.message_attributes().unwrap().len(), 4);
        let plain_size = precheck(&e, false, &PLAIN, 4096).unwrap();
        let ce_size = precheck(&e, false, &cloudevents(), 4096).unwrap();
        assert_eq!(ce_size - plain_size, built.message_body().len() - e.payload.len());
        let reason = precheck(&with_headers(&[("source", "x")]), false, &cloudevents(), 4096).unwrap_err();
        assert!(reason.contains("reserved in CloudEvents mode"), "{reason}");
        assert!(precheck(&with_headers(&[("source", "x")]), false, &PLAIN, 4096).is_ok());
    }
}
