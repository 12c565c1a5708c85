//! From an outbox row to a RabbitMQ message: its properties and headers
//! (plain, or CloudEvents binary content mode), and the checks that reject
//! a row RabbitMQ can never take before it is sent.

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;

use super::config::AmqpConfig;
use crate::cloudevents::{self, MessageFormat};
use crate::event::Event;
use crate::headers::printable;

/// AMQP short strings (routing keys, header names, property values) are
/// limited to 255 bytes.
pub(super) const MAX_SHORT_STRING: usize = 255;

/// RabbitMQ's default `frame_max`, assumed until a connection has
/// negotiated the real one.
pub(super) const DEFAULT_FRAME_MAX: usize = 131_072;

/// Header names RabbitMQ itself acts on or writes, which a producer's
/// header must not set: `CC` and `BCC` add routing keys (sender-selected
/// distribution), and the dead-lettering and delivery history headers are
/// the broker's record of what happened to the message. Compared without
/// regard to case; a name that starts with one ending in `-` is refused too.
const BROKER_NAMES: [&str; 7] = [
    "cc",
    "bcc",
    "x-death",
    "x-first-death-",
    "x-last-death-",
    "x-delivery-count",
    "x-received-from",
];

/// The message properties of an event in `format`: `message_id` = id,
/// `type`, `content_type`, persistent delivery, `timestamp` = created_at,
/// the `aggregate_id` / `causation_id` headers, the producer's headers, and
/// in CloudEvents mode a `ce-` header per CloudEvents attribute.
pub fn properties(event: &Event, format: &MessageFormat) -> BasicProperties {
    let mut headers = FieldTable::default();
    let mut put = |name: &str, value: &str| {
        headers.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
    };
    put("aggregate_id", &event.aggregate_id);
    if let Some(causation_id) = event.causation_id {
        put("causation_id", &causation_id.to_string());
    }
    for (name, value) in event.headers.iter() {
        put(name, value);
    }
    if let Some(source) = format.cloudevents_source() {
        for (name, value) in cloudevents::attributes(event, source) {
            put(&format!("{}{name}", cloudevents::AMQP_PREFIX), &value);
        }
    }
    let timestamp = u64::try_from(event.created_at.timestamp()).unwrap_or(0);
    // The CloudEvents datacontenttype is this same content type.
    BasicProperties::default()
        .with_message_id(ShortString::from(event.id.to_string()))
        .with_type(ShortString::from(event.event_type.as_str()))
        .with_content_type(cloudevents::DATA_CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_timestamp(timestamp)
        .with_headers(headers)
}

/// Checks that can fail before anything is sent, and never succeed later;
/// returns the routing key. `frame_max` is the connection's: the
/// properties travel in one frame, and a larger one would make RabbitMQ
/// close the whole connection, failing every batch on it.
pub(super) fn precheck(
    event: &Event,
    config: &AmqpConfig,
    format: &MessageFormat,
    frame_max: usize,
) -> Result<String, String> {
    if event.payload.len() > config.max_message_bytes {
        return Err(format!(
            "payload of {} bytes exceeds the broker's maximum message size of {} bytes (OUTBOX_AMQP_MAX_MESSAGE_BYTES)",
            event.payload.len(),
            config.max_message_bytes
        ));
    }
    if event.event_type.len() > MAX_SHORT_STRING {
        return Err("event_type is longer than the 255 bytes an AMQP type property holds".to_owned());
    }
    let routing_key = config.routing_key.render(&event.event_type, &event.aggregate_id);
    if routing_key.len() > MAX_SHORT_STRING {
        return Err(format!(
            "routing key of {} bytes exceeds AMQP's 255-byte limit",
            routing_key.len()
        ));
    }
    // On the default exchange the routing key names a queue, and the
    // server's own queues (`amq.rabbitmq.reply-to…`, other `amq.` names)
    // are not an event's to address.
    if config.exchange.is_empty() && routing_key.starts_with("amq.") {
        return Err(format!(
            "routing key '{}' names a server queue (amq.*) on the default exchange",
            printable(&routing_key)
        ));
    }
    check_headers(event, format)?;
    let frame = header_frame_bytes(event, format);
    if frame > frame_max {
        return Err(format!(
            "headers: the message properties take {frame} bytes, more than the connection's frame_max of {frame_max} bytes \
             that an AMQP content header must fit in"
        ));
    }
    Ok(routing_key)
}

/// Producer header names RabbitMQ cannot carry or would act on.
fn check_headers(event: &Event, format: &MessageFormat) -> Result<(), String> {
    for (name, _) in event.headers.iter() {
        if name.len() > MAX_SHORT_STRING {
            return Err(format!(
                "headers: the name \"{}\" is {} bytes, more than the 255 an AMQP header name holds",
                printable(name),
                name.len()
            ));
        }
        let lower = name.to_ascii_lowercase();
        let broker_name = BROKER_NAMES.iter().any(|reserved| {
            if reserved.ends_with('-') {
                lower.starts_with(reserved)
            } else {
                lower == *reserved
            }
        });
        if broker_name {
            return Err(format!(
                "headers: \"{}\" is reserved: RabbitMQ acts on it (CC, BCC, x-death, x-first-death-*, \
                 x-last-death-*, x-delivery-count, x-received-from)",
                printable(name)
            ));
        }
        if format.cloudevents_source().is_some() && cloudevents::is_reserved(name) {
            return Err(format!(
                "headers: \"{}\" is reserved in CloudEvents mode (the relay sets the ce- headers and the \
                 attributes {})",
                printable(name),
                cloudevents::RESERVED.join(", ")
            ));
        }
    }
    Ok(())
}

/// The size of the content header frame carrying `event`'s properties, as
/// AMQP 0-9-1 encodes it: frame header and end (8), class, weight, body
/// size and property flags (14), then each property. Counted from the
/// event itself in the plain format, so that a message's properties are
/// built once, for its publish; `properties_frame_bytes` of its
/// [`properties`] is the same number (a test holds them together).
fn header_frame_bytes(event: &Event, format: &MessageFormat) -> usize {
    if format.cloudevents_source().is_some() {
        return properties_frame_bytes(&properties(event, format));
    }
    const HYPHENATED_UUID: usize = 36;
    // The headers in the order `properties` puts them: a later one of the
    // same name replaces an earlier one in the table.
    let own = [
        Some(("aggregate_id", event.aggregate_id.len())),
        event.causation_id.map(|_| ("causation_id", HYPHENATED_UUID)),
    ];
    let headers = || {
        own.iter()
            .flatten()
            .copied()
            .chain(event.headers.iter().map(|(name, value)| (name, value.len())))
    };
    let table = 4 + headers()
        .enumerate()
        .filter(|(position, (name, _))| !headers().skip(position + 1).any(|(later, _)| later == *name))
        .map(|(_, (name, value))| table_entry_bytes(name, 4 + value))
        .sum::<usize>();
    fixed_frame_bytes(
        HYPHENATED_UUID,
        event.event_type.len(),
        cloudevents::DATA_CONTENT_TYPE.len(),
        table,
    )
}

/// [`header_frame_bytes`] of built properties.
fn properties_frame_bytes(properties: &BasicProperties) -> usize {
    let short = |value: &Option<ShortString>| value.as_ref().map_or(0, |s| s.as_str().len());
    let table = properties.headers().as_ref().map_or(0, |headers| {
        4 + headers
            .inner()
            .iter()
            .map(|(name, value)| {
                let value_bytes = match value {
                    AMQPValue::LongString(text) => 4 + text.as_bytes().len(),
                    // Only long strings are set here; anything else is
                    // counted generously.
                    _ => 16,
                };
                table_entry_bytes(name.as_str(), value_bytes)
            })
            .sum::<usize>()
    });
    fixed_frame_bytes(
        short(properties.message_id()),
        short(properties.kind()),
        short(properties.content_type()),
        table,
    )
}

/// A field table entry: the name as a short string, a type octet, the value.
fn table_entry_bytes(name: &str, value_bytes: usize) -> usize {
    1 + name.len() + 1 + value_bytes
}

/// The frame around the properties `properties` sets: three short strings
/// (each a length octet and its bytes), the delivery mode, the timestamp
/// and the header table.
fn fixed_frame_bytes(message_id: usize, kind: usize, content_type: usize, table: usize) -> usize {
    8 + 14
        + (1 + message_id)
        + (1 + kind)
        + (1 + content_type)
        + 1 // delivery mode
        + 8 // timestamp
        + table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::Headers;
    use chrono::Utc;
    use uuid::Uuid;

    fn event(headers: &[(&str, &str)]) -> Event {
        Event {
            id: Uuid::new_v4(),
            causation_id: None,
            event_type: "order.created".into(),
            aggregate_id: "order-7".into(),
            payload: "{}".into(),
            created_at: Utc::now(),
            attempt_count: 1,
            headers: Headers::from_pairs(
                headers
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
        }
    }

    fn config() -> AmqpConfig {
        AmqpConfig::parse("amqp://localhost", "amq.topic", "{event_type}", "1000").unwrap()
    }

    fn cloudevents() -> MessageFormat {
        MessageFormat::CloudEvents {
            source: "urn:shop".into(),
        }
    }

    fn header(properties: &BasicProperties, name: &str) -> Option<String> {
        properties
            .headers()
            .as_ref()
            .and_then(|table| table.inner().get(name).cloned())
            .map(|value| match value {
                AMQPValue::LongString(text) => text.to_string(),
                other => format!("{other:?}"),
            })
    }

    #[test]
    fn on_the_default_exchange_an_event_cannot_address_the_servers_queues() {
        let mut reply_to = event(&[]);
        reply_to.event_type = "amq.rabbitmq.reply-to.g2dkABNyYWJiaXRAbG9jYWxob3N0".into();
        let default_exchange = AmqpConfig::parse("amqp://localhost", "", "{event_type}", "1000").unwrap();
        let refused = precheck(&reply_to, &default_exchange, &MessageFormat::Plain, 131_072).unwrap_err();
        assert!(refused.contains("amq.*"), "{refused}");
        // On a named exchange a key only picks among its bindings.
        assert!(precheck(&reply_to, &config(), &MessageFormat::Plain, 131_072).is_ok());
        let mut ordinary = event(&[]);
        ordinary.event_type = "orders".into();
        assert!(precheck(&ordinary, &default_exchange, &MessageFormat::Plain, 131_072).is_ok());
    }

    #[test]
    fn plain_messages_carry_the_producer_headers_and_no_ce_header() {
        let e = event(&[("traceparent", "00-abc"), ("tenant-id", "acme")]);
        let plain = properties(&e, &MessageFormat::Plain);
        assert_eq!(header(&plain, "traceparent").as_deref(), Some("00-abc"));
        assert_eq!(header(&plain, "tenant-id").as_deref(), Some("acme"));
        assert_eq!(header(&plain, "aggregate_id").as_deref(), Some("order-7"));
        assert_eq!(plain.headers().as_ref().unwrap().inner().len(), 3);
    }

    #[test]
    fn cloudevents_messages_add_ce_headers_and_extensions() {
        let e = event(&[("traceparent", "00-abc"), ("tenant-id", "acme")]);
        let ce = properties(&e, &cloudevents());
        assert_eq!(header(&ce, "ce-specversion").as_deref(), Some("1.0"));
        assert_eq!(header(&ce, "ce-id"), Some(e.id.to_string()));
        assert_eq!(header(&ce, "ce-source").as_deref(), Some("urn:shop"));
        assert_eq!(header(&ce, "ce-type").as_deref(), Some("order.created"));
        assert_eq!(header(&ce, "ce-subject").as_deref(), Some("order-7"));
        assert!(header(&ce, "ce-time").is_some());
        assert_eq!(header(&ce, "ce-traceparent").as_deref(), Some("00-abc"));
        // Not an extension name: a plain header only.
        assert_eq!(header(&ce, "ce-tenant-id"), None);
        assert_eq!(header(&ce, "tenant-id").as_deref(), Some("acme"));
        assert_eq!(header(&ce, "traceparent").as_deref(), Some("00-abc"));
        assert_eq!(
            ce.content_type().as_ref().map(|c| c.as_str()),
            Some("application/json")
        );
    }

    #[test]
    fn names_rabbitmq_acts_on_are_refused() {
        for name in [
            "CC",
            "bcc",
            "x-death",
            "x-first-death-queue",
            "X-Last-Death-Reason",
            "x-received-from",
        ] {
            let reason = precheck(
                &event(&[(name, "q")]),
                &config(),
                &MessageFormat::Plain,
                DEFAULT_FRAME_MAX,
            )
            .unwrap_err();
            assert!(reason.contains("RabbitMQ acts on it"), "{name}: {reason}");
        }
        assert!(precheck(
            &event(&[("x-tenant", "a")]),
            &config(),
            &MessageFormat::Plain,
            DEFAULT_FRAME_MAX
        )
        .is_ok());
        let long = "n".repeat(256);
        let reason = precheck(
            &event(&[(&long, "v")]),
            &config(),
            &MessageFormat::Plain,
            DEFAULT_FRAME_MAX,
        )
        .unwrap_err();
        assert!(reason.contains("255"), "{reason}");
    }

    #[test]
    fn cloudevents_names_are_refused_only_in_cloudevents_mode() {
        for name in ["ce-id", "CE-Source", "source", "time", "data"] {
            let e = event(&[(name, "x")]);
            assert!(
                precheck(&e, &config(), &MessageFormat::Plain, DEFAULT_FRAME_MAX).is_ok(),
                "{name}"
            );
            let reason = precheck(&e, &config(), &cloudevents(), DEFAULT_FRAME_MAX).unwrap_err();
            assert!(
                reason.contains("reserved in CloudEvents mode"),
                "{name}: {reason}"
            );
        }
    }

    #[test]
    fn headers_must_fit_one_frame() {
        let e = event(&[("big", &"v".repeat(5000))]);
        assert!(precheck(&e, &config(), &MessageFormat::Plain, DEFAULT_FRAME_MAX).is_ok());
        let reason = precheck(&e, &config(), &MessageFormat::Plain, 4096).unwrap_err();
        assert!(reason.contains("frame_max of 4096"), "{reason}");
        // The limit applies at the size counted.
        let size = header_frame_bytes(&e, &MessageFormat::Plain);
        assert!(precheck(&e, &config(), &MessageFormat::Plain, size).is_ok());
        assert!(precheck(&e, &config(), &MessageFormat::Plain, size - 1).is_err());
    }

    #[test]
    fn the_frame_counted_from_the_event_is_the_frame_of_its_properties() {
        let mut cases = vec![
            event(&[]),
            event(&[("traceparent", "00-abc"), ("tenant-id", "acme")]),
            // A producer's header of the relay's own names replaces it.
            event(&[("aggregate_id", "theirs, longer than ours"), ("x", "")]),
            event(&[("causation_id", "c")]),
            event(&[("big", &"v".repeat(5000))]),
        ];
        let mut caused = event(&[("a", "1")]);
        caused.causation_id = Some(Uuid::new_v4());
        cases.push(caused);
        let mut overridden = event(&[("causation_id", "short")]);
        overridden.causation_id = Some(Uuid::new_v4());
        cases.push(overridden);
        for e in &cases {
            for format in [MessageFormat::Plain, cloudevents()] {
                assert_eq!(
                    header_frame_bytes(e, &format),
                    properties_frame_bytes(&properties(e, &format)),
                    "{:?} in {format:?}",
                    e.headers
                );
            }
        }
    }
}
