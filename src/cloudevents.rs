//! The message format (`OUTBOX_MESSAGE_FORMAT`): the relay's plain
//! messages, or CloudEvents 1.0 — the same messages with the CloudEvents
//! context attributes added, in the content mode each broker has:
//!
//! - RabbitMQ: binary content mode as the CloudEvents SDKs' RabbitMQ
//!   binding reads it: a `ce-<attribute>` header per attribute, the
//!   `content_type` property for `datacontenttype`, the payload as the body.
//! - SQS (no protocol binding exists): structured content mode, the body a
//!   JSON event (`application/cloudevents+json`) with the payload as `data`.
//!
//! The attributes: `id` = row id, `source` = `OUTBOX_CLOUDEVENTS_SOURCE`,
//! `type` = event_type, `subject` = aggregate_id, `time` = created_at,
//! `datacontenttype` = `application/json`. A producer header whose name is
//! a valid extension attribute name (see [`is_extension_name`]) is also an
//! extension attribute; every header stays what it is in the plain format
//! too (an AMQP header, an SQS message attribute).

use chrono::SecondsFormat;

use crate::event::Event;
use crate::headers::printable;

/// The CloudEvents version the relay writes.
pub const SPEC_VERSION: &str = "1.0";

/// `datacontenttype`: the payload is the row's JSON.
pub const DATA_CONTENT_TYPE: &str = "application/json";

/// The header prefix of the RabbitMQ binding's binary content mode (the
/// CloudEvents SDKs read `ce-` headers, names compared lowercased).
pub const AMQP_PREFIX: &str = "ce-";

/// Context attribute names the relay sets, and the JSON format's member
/// names for the data: a producer header may not take any of them.
pub const RESERVED: [&str; 9] = [
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "data",
    "data_base64",
];

/// The longest extension attribute name the CloudEvents spec recommends;
/// a longer header name stays a plain header only.
pub const MAX_EXTENSION_NAME: usize = 20;

/// How events become messages.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MessageFormat {
    /// The relay's own message mapping (the default).
    #[default]
    Plain,
    /// CloudEvents 1.0 with this `source`.
    CloudEvents {
        /// A URI-reference naming the producer.
        source: String,
    },
}

impl MessageFormat {
    /// Validates `OUTBOX_MESSAGE_FORMAT` and `OUTBOX_CLOUDEVENTS_SOURCE`;
    /// errors are the problem with the variable returned alongside.
    pub fn parse(format: &str, source: Option<&str>) -> Result<Self, (&'static str, String)> {
        use crate::settings::var;
        match format.trim() {
            "plain" => Ok(Self::Plain),
            "cloudevents" => {
                let source = source.map(str::trim).filter(|s| !s.is_empty()).ok_or_else(|| {
                    (
                        var::CLOUDEVENTS_SOURCE,
                        "is required when OUTBOX_MESSAGE_FORMAT=cloudevents".to_owned(),
                    )
                })?;
                validate_uri_reference(source).map_err(|why| (var::CLOUDEVENTS_SOURCE, why))?;
                Ok(Self::CloudEvents {
                    source: source.to_owned(),
                })
            }
            other => Err((
                var::MESSAGE_FORMAT,
                format!("'{}' is not one of plain, cloudevents", printable(other)),
            )),
        }
    }

    /// The `source`, in CloudEvents mode.
    pub fn cloudevents_source(&self) -> Option<&str> {
        match self {
            Self::Plain => None,
            Self::CloudEvents { source } => Some(source),
        }
    }
}

/// Whether `name` (a producer header) is refused in CloudEvents mode: a
/// context attribute the relay sets, or anything the RabbitMQ binding
/// would read as one (a `ce-` name, in any case).
pub fn is_reserved(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    RESERVED.contains(&lower.as_str()) || lower.starts_with(AMQP_PREFIX)
}

/// Whether a producer header is also an extension attribute: lowercase
/// ASCII letters and digits, 1 to [`MAX_EXTENSION_NAME`] characters, as the
/// CloudEvents spec asks of attribute names. Other headers (`tenant-id`,
/// `X-Request-Id`) stay plain headers or SQS attributes only.
pub fn is_extension_name(name: &str) -> bool {
    (1..=MAX_EXTENSION_NAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && !is_reserved(name)
}

/// `time`: created_at in RFC 3339, UTC, with as many fraction digits as it has.
pub fn time(event: &Event) -> String {
    event.created_at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The context attributes of `event` as (name, value), then its extension
/// attributes; `datacontenttype` is not among them (a content-type
/// property in binary mode, a member of its own in structured mode).
pub fn attributes<'a>(event: &'a Event, source: &'a str) -> Vec<(&'a str, String)> {
    let mut attributes = vec![
        ("specversion", SPEC_VERSION.to_owned()),
        ("id", event.id.to_string()),
        ("source", source.to_owned()),
        ("type", event.event_type.clone()),
        ("subject", event.aggregate_id.clone()),
        ("time", time(event)),
    ];
    attributes.extend(
        event
            .headers
            .iter()
            .filter(|(name, _)| is_extension_name(name))
            .map(|(name, value)| (name, value.to_owned())),
    );
    attributes
}

/// The event in the JSON format (structured content mode): the attributes,
/// `datacontenttype`, and the payload as `data`, embedded as it is. Fails
/// when the payload is not JSON (a `text` payload column may hold
/// anything), which this format cannot embed.
pub fn structured(event: &Event, source: &str) -> Result<String, String> {
    serde_json::from_str::<&serde_json::value::RawValue>(&event.payload).map_err(|e| {
        format!("payload is not JSON ({e}), which a CloudEvents JSON event cannot carry as data")
    })?;
    let mut json = String::with_capacity(event.payload.len() + 512);
    json.push('{');
    for (name, value) in attributes(event, source) {
        push_member(&mut json, name, &value);
        json.push(',');
    }
    push_member(&mut json, "datacontenttype", DATA_CONTENT_TYPE);
    json.push_str(",\"data\":");
    json.push_str(&event.payload);
    json.push('}');
    Ok(json)
}

fn push_member(json: &mut String, name: &str, value: &str) {
    // Serialising a string cannot fail.
    json.push_str(&serde_json::to_string(name).unwrap_or_default());
    json.push(':');
    json.push_str(&serde_json::to_string(value).unwrap_or_default());
}

/// Checks that `raw` is a URI-reference (RFC 3986): an absolute URI
/// (`urn:…`, `https://…`) or a relative reference (`/orders`), only
/// characters a URI may hold, `%` followed by two hex digits, and a
/// well-formed scheme when it has one.
pub fn validate_uri_reference(raw: &str) -> Result<(), String> {
    const ALLOWED: &[u8] = b"-._~:/?#[]@!$&'()*+,;=%";
    if let Some(bad) = raw
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || (c.is_ascii() && ALLOWED.contains(&(*c as u8)))))
    {
        return Err(format!(
            "is not a URI-reference: the character {:?} must be percent-encoded",
            bad
        ));
    }
    let bytes = raw.as_bytes();
    for (at, _) in raw.match_indices('%') {
        let hex = |i: usize| bytes.get(i).is_some_and(u8::is_ascii_hexdigit);
        if !(hex(at + 1) && hex(at + 2)) {
            return Err("is not a URI-reference: '%' must be followed by two hex digits".to_owned());
        }
    }
    if raw.matches('#').count() > 1 {
        return Err("is not a URI-reference: it has more than one '#'".to_owned());
    }
    // A ':' before the first '/', '?' or '#' ends a scheme; a relative
    // reference cannot have one there.
    let first_part_end = raw.find(['/', '?', '#']).unwrap_or(raw.len());
    if let Some(colon) = raw[..first_part_end].find(':') {
        let scheme = &raw[..colon];
        let mut chars = scheme.chars();
        let well_formed = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !well_formed {
            return Err(format!(
                "is not a URI-reference: '{scheme}' before ':' is not a URI scheme"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::Headers;
    use chrono::TimeZone;
    use uuid::Uuid;

    fn event(payload: &str, headers: &[(&str, &str)]) -> Event {
        Event {
            id: Uuid::parse_str("5f0c1a52-8a4b-4a51-9b1e-0e8f3f1d2c3b").unwrap(),
            causation_id: None,
            event_type: "order.created".into(),
            aggregate_id: "order-7".into(),
            payload: payload.into(),
            created_at: chrono::Utc
                .with_ymd_and_hms(2026, 1, 2, 3, 4, 5)
                .unwrap()
                .checked_add_signed(chrono::Duration::microseconds(120))
                .unwrap(),
            attempt_count: 1,
            headers: Headers::from_pairs(
                headers
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
        }
    }

    #[test]
    fn sources_are_uri_references() {
        for good in [
            "urn:example:orders",
            "https://shop.example.com/orders",
            "/orders",
            "orders",
            "//host/path",
            "mailto:ops@example.com",
            "https://example.com/a%20b?x=1#frag",
            "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66",
        ] {
            assert_eq!(validate_uri_reference(good), Ok(()), "{good}");
        }
        for bad in [
            "has space",
            "https://example.com/ü",
            "a%2",
            "a%zz",
            "1http://x",
            "a#b#c",
            "tab\there",
            "<x>",
            ":nothing",
        ] {
            assert!(validate_uri_reference(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_format_is_plain_unless_cloudevents_with_a_source() {
        assert_eq!(MessageFormat::parse("plain", None), Ok(MessageFormat::Plain));
        assert_eq!(
            MessageFormat::parse(" cloudevents ", Some(" urn:shop ")),
            Ok(MessageFormat::CloudEvents {
                source: "urn:shop".into()
            })
        );
        let (variable, why) = MessageFormat::parse("cloudevents", Some(" ")).unwrap_err();
        assert_eq!(variable, "OUTBOX_CLOUDEVENTS_SOURCE");
        assert!(why.contains("required"), "{why}");
        let (variable, _) = MessageFormat::parse("cloudevents", Some("a b")).unwrap_err();
        assert_eq!(variable, "OUTBOX_CLOUDEVENTS_SOURCE");
        let (variable, why) = MessageFormat::parse("json", None).unwrap_err();
        assert_eq!(variable, "OUTBOX_MESSAGE_FORMAT");
        assert_eq!(why, "'json' is not one of plain, cloudevents");
    }

    #[test]
    fn extension_names_are_short_lowercase_alphanumerics_not_taken() {
        for name in [
            "traceparent",
            "tracestate",
            "baggage",
            "tenant",
            "v2",
            "dataschema",
        ] {
            assert!(is_extension_name(name), "{name}");
        }
        for name in [
            "tenant-id",
            "Tenant",
            "x_y",
            "",
            "averyveryverylongname1",
            "id",
            "data",
            "ce-x",
        ] {
            assert!(!is_extension_name(name), "{name}");
        }
        for name in ["source", "TYPE", "ce-id", "CE-Tenant", "data_base64"] {
            assert!(is_reserved(name), "{name}");
        }
        assert!(!is_reserved("tenant-id"));
    }

    #[test]
    fn attributes_map_the_row_and_extension_headers() {
        let e = event("{}", &[("tenant", "acme"), ("tenant-id", "7")]);
        let attributes = attributes(&e, "urn:shop");
        let names: Vec<&str> = attributes.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            ["specversion", "id", "source", "type", "subject", "time", "tenant"]
        );
        assert_eq!(attributes[1].1, "5f0c1a52-8a4b-4a51-9b1e-0e8f3f1d2c3b");
        assert_eq!(attributes[4].1, "order-7");
        assert_eq!(attributes[5].1, "2026-01-02T03:04:05.000120Z");
    }

    #[test]
    fn the_json_format_embeds_the_payload_as_data() {
        let e = event(r#"{"a": [1, 2.50]}"#, &[("traceparent", "00-x")]);
        let json = structured(&e, "urn:shop").unwrap();
        assert!(
            json.ends_with(r#","datacontenttype":"application/json","data":{"a": [1, 2.50]}}"#),
            "{json}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["specversion"], "1.0");
        assert_eq!(parsed["type"], "order.created");
        assert_eq!(parsed["traceparent"], "00-x");
        let reason = structured(&event("not json", &[]), "urn:shop").unwrap_err();
        assert!(reason.starts_with("payload is not JSON"), "{reason}");
    }
}
