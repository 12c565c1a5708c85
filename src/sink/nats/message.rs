//! One event as a NATS message: its subject, its headers and its size as
//! the server counts it, and the checks that refuse a row before it is
//! sent when it could never be stored, above all those whose publish would
//! make the server close the connection (failing every batch-mate with it,
//! on every claim): a message over `max_payload`, a control line over
//! `max_control_line`, a subject or header that breaks the protocol.
//!
//! Every header is set in [`headers`], so that headers carried from the
//! row itself are added in one place.

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::HeaderMap;

use super::config::check_subject;
use crate::event::Event;
use crate::sink::template::RoutingKeyTemplate;

/// The headers of an event's message: `Nats-Msg-Id` = id (JetStream's
/// deduplication key), `Content-Type`, `event_type`, `aggregate_id` and
/// `causation_id` when set. Public so that the benchmark's bare publisher
/// sends exactly the relay's messages.
pub fn headers(event: &Event) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, event.id.to_string().as_str());
    headers.insert("Content-Type", "application/json");
    headers.insert("event_type", event.event_type.as_str());
    headers.insert("aggregate_id", event.aggregate_id.as_str());
    if let Some(causation_id) = event.causation_id {
        headers.insert("causation_id", causation_id.to_string().as_str());
    }
    // The producer's headers (W3C trace context included), verbatim;
    // `check_headers` has refused the names NATS or the relay own.
    for (name, value) in event.headers.iter() {
        headers.insert(name, value);
    }
    headers
}

/// Whether NATS can carry the producer's headers: names of printable ASCII
/// without `:`, values without line breaks, and none that NATS acts on
/// (`Nats-*`: deduplication, expectations, rollups, TTLs) or that the
/// relay sets (`Content-Type`; the row's own fields are refused when the
/// column is read).
fn check_headers(event: &Event) -> Result<(), String> {
    for (name, value) in event.headers.iter() {
        let shown = crate::headers::printable(name);
        if !name.bytes().all(|b| (33..=126).contains(&b) && b != b':') {
            return Err(format!(
                "headers: \"{shown}\" is not a NATS header name (printable ASCII, no ':' or space)"
            ));
        }
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("nats-") || lower == "content-type" {
            return Err(format!(
                "headers: \"{shown}\" is reserved on NATS (Nats-* headers steer JetStream; the relay sets Content-Type)"
            ));
        }
        if value.contains(['\r', '\n']) {
            return Err(format!("headers: the value of \"{shown}\" contains a line break"));
        }
    }
    Ok(())
}

/// The bytes the server counts against its `max_payload` for a message:
/// the header block as the protocol writes it (`NATS/1.0`, one line per
/// header, a blank line) plus the payload.
pub(super) fn wire_size(headers: &HeaderMap, payload: &str) -> usize {
    let mut size = "NATS/1.0\r\n".len() + "\r\n".len();
    for (name, values) in headers.iter() {
        for value in values {
            size += AsRef::<str>::as_ref(name).len() + ": ".len() + value.as_str().len() + "\r\n".len();
        }
    }
    size + payload.len()
}

/// The NATS server's default `max_control_line`: the longest protocol line
/// (`HPUB <subject> <reply> <header bytes> <total bytes>`) it reads before
/// closing the connection with "Maximum Control Line Exceeded". Unlike
/// `max_payload`, the server does not announce it in its INFO (async-nats's
/// `ServerInfo` has no such field), so the relay is told it
/// (`OUTBOX_NATS_MAX_CONTROL_LINE`) and assumes the default otherwise: a
/// server set lower than the relay was told would close the connection on
/// a long subject; one set higher only sees such rows refused sooner.
pub const MAX_CONTROL_LINE: usize = 4096;

/// Room kept in the control line for the reply subject async-nats gives
/// each publish, `_INBOX.<22-character nuid>.<22-character nuid>` (52
/// bytes with the default inbox prefix, which the relay keeps): more than
/// twice that, so that a longer prefix or token in a later client still
/// fits.
const REPLY_ALLOWANCE: usize = 128;

/// The length of the `HPUB` line publishing a message with `subject`,
/// `header_bytes` of header block and `total_bytes` in all, its reply
/// subject counted at [`REPLY_ALLOWANCE`]. The server counts the line
/// without its verb and line end; counting them is a little headroom.
pub(super) fn control_line_len(subject: &str, header_bytes: usize, total_bytes: usize) -> usize {
    let digits = |n: usize| n.to_string().len();
    "HPUB ".len()
        + subject.len()
        + " ".len()
        + REPLY_ALLOWANCE
        + " ".len()
        + digits(header_bytes)
        + " ".len()
        + digits(total_bytes)
        + "\r\n".len()
}

/// An event ready to publish: its subject and headers.
#[derive(Debug)]
pub(super) struct Prepared {
    pub subject: String,
    pub headers: HeaderMap,
}

/// Builds the message of `event`, or says why it can never be published:
/// larger than the server's `max_payload`, or a subject so long that the
/// publish's control line exceeds [`MAX_CONTROL_LINE`] (for either the
/// server would close the connection, failing the batch-mates too), a
/// subject the template makes unpublishable (white space or control
/// characters, an empty token, a `*` or `>` token), or a header value with
/// a line break (which would end the header block early).
pub(super) fn prepare(
    event: &Event,
    subject: &RoutingKeyTemplate,
    max_payload: usize,
    max_control_line: usize,
) -> Result<Prepared, String> {
    for (name, value) in [
        ("event_type", &event.event_type),
        ("aggregate_id", &event.aggregate_id),
    ] {
        if value.contains(['\r', '\n']) {
            return Err(format!(
                "{name} contains a line break, which a NATS header cannot carry"
            ));
        }
    }
    check_headers(event)?;
    let rendered = subject.render(&event.event_type, &event.aggregate_id);
    let shown = crate::headers::printable(&rendered);
    check_subject(&rendered).map_err(|e| format!("subject '{shown}' {e}"))?;
    let headers = headers(event);
    let header_bytes = wire_size(&headers, "");
    let size = header_bytes + event.payload.len();
    if size > max_payload {
        return Err(format!(
            "message of {size} bytes (payload and headers) exceeds the NATS server's max_payload of {max_payload} bytes"
        ));
    }
    let line = control_line_len(&rendered, header_bytes, size);
    if line > max_control_line {
        return Err(format!(
            "subject '{shown}' is {} bytes long: its publish would be a protocol line of {line} bytes \
             (with the reply subject and sizes), over the NATS server's max_control_line of \
             {max_control_line} bytes (OUTBOX_NATS_MAX_CONTROL_LINE; servers do not announce it), \
             so the server would close the connection",
            rendered.len()
        ));
    }
    Ok(Prepared {
        subject: rendered,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use uuid::Uuid;

    fn event(event_type: &str, aggregate_id: &str, payload: &str) -> Event {
        Event {
            id: Uuid::new_v4(),
            causation_id: None,
            event_type: event_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            payload: payload.to_owned(),
            created_at: Utc::now(),
            attempt_count: 1,
            headers: crate::headers::Headers::default(),
        }
    }

    fn template(raw: &str) -> RoutingKeyTemplate {
        RoutingKeyTemplate::parse(raw).unwrap()
    }

    #[test]
    fn headers_carry_the_id_and_the_row_fields() {
        let mut e = event("order.paid", "order-7", "{}");
        let headers = headers(&e);
        assert_eq!(
            headers.get(NATS_MESSAGE_ID).map(|v| v.as_str().to_owned()),
            Some(e.id.to_string())
        );
        assert_eq!(headers.get("event_type").unwrap().as_str(), "order.paid");
        assert_eq!(headers.get("aggregate_id").unwrap().as_str(), "order-7");
        assert_eq!(headers.get("Content-Type").unwrap().as_str(), "application/json");
        assert!(headers.get("causation_id").is_none());
        let cause = Uuid::new_v4();
        e.causation_id = Some(cause);
        assert_eq!(
            super::headers(&e).get("causation_id").unwrap().as_str(),
            cause.to_string()
        );
    }

    #[test]
    fn producer_headers_are_carried_and_names_nats_owns_refused() {
        let subject = template("outbox.{event_type}");
        let mut e = event("order.paid", "a", "{}");
        e.headers = crate::headers::Headers::from_pairs(vec![
            (
                "traceparent".into(),
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            ),
            ("tenant".into(), "acme".into()),
        ]);
        let prepared = prepare(&e, &subject, 4096, MAX_CONTROL_LINE).unwrap();
        assert_eq!(prepared.headers.get("tenant").unwrap().as_str(), "acme");
        assert!(prepared.headers.get("traceparent").is_some());
        for (name, value, says) in [
            ("Nats-Expected-Stream", "x", "reserved on NATS"),
            ("content-type", "text/plain", "reserved on NATS"),
            ("with space", "x", "not a NATS header name"),
            ("tenant", "a\r\nb", "line break"),
        ] {
            e.headers = crate::headers::Headers::from_pairs(vec![(name.into(), value.into())]);
            let reason = prepare(&e, &subject, 4096, MAX_CONTROL_LINE).unwrap_err();
            assert!(reason.contains(says), "{name}: {reason}");
        }
    }

    #[test]
    fn the_size_counts_the_header_block() {
        let mut headers = HeaderMap::new();
        headers.insert("a", "bc");
        // "NATS/1.0\r\n" + "a: bc\r\n" + "\r\n" + payload
        assert_eq!(wire_size(&headers, "12345"), 10 + 7 + 2 + 5);
    }

    #[test]
    fn rows_that_can_never_be_published_are_named() {
        let subject = template("outbox.{event_type}");
        let ok = prepare(&event("order.paid", "a", "{}"), &subject, 1024, MAX_CONTROL_LINE).unwrap();
        assert_eq!(ok.subject, "outbox.order.paid");
        let big = event("order.paid", "a", &"x".repeat(1024));
        assert!(prepare(&big, &subject, 1024, MAX_CONTROL_LINE)
            .unwrap_err()
            .contains("max_payload of 1024"));
        let fits = prepare(&big, &subject, 4096, MAX_CONTROL_LINE);
        assert!(fits.is_ok());
        assert!(
            prepare(&event("order paid", "a", "{}"), &subject, 1024, MAX_CONTROL_LINE)
                .unwrap_err()
                .contains("white space")
        );
        assert!(
            prepare(&event("order.", "a", "{}"), &subject, 1024, MAX_CONTROL_LINE)
                .unwrap_err()
                .contains("empty token")
        );
        assert!(prepare(&event("*", "a", "{}"), &subject, 1024, MAX_CONTROL_LINE)
            .unwrap_err()
            .contains("wildcard"));
        let by_aggregate = template("events.{aggregate_id}");
        assert!(prepare(
            &event("t", "a\r\nX-Evil: 1", "{}"),
            &by_aggregate,
            1024,
            MAX_CONTROL_LINE
        )
        .unwrap_err()
        .contains("line break"));
        assert!(prepare(
            &event("t", "a\u{7}b", "{}"),
            &by_aggregate,
            1024,
            MAX_CONTROL_LINE
        )
        .unwrap_err()
        .contains("control character"));
        assert!(
            prepare(&event("t", "a.>", "{}"), &by_aggregate, 1024, MAX_CONTROL_LINE)
                .unwrap_err()
                .contains("wildcard token '>'")
        );
        assert!(
            prepare(&event("t", ".a", "{}"), &by_aggregate, 1024, MAX_CONTROL_LINE)
                .unwrap_err()
                .contains("empty token")
        );
    }

    #[test]
    fn the_control_line_counts_the_subject_the_reply_and_the_sizes() {
        // "HPUB " + subject + " " + reply allowance + " 12 345\r\n"
        assert_eq!(
            control_line_len("a.b", 12, 345),
            5 + 3 + 1 + REPLY_ALLOWANCE + 1 + 2 + 1 + 3 + 2
        );
        // The reply subject async-nats really sends fits the allowance.
        let inbox = format!("_INBOX.{}.{}", "N".repeat(22), "T".repeat(22));
        assert!(inbox.len() * 2 <= REPLY_ALLOWANCE);
    }

    #[test]
    fn a_subject_too_long_for_the_control_line_is_refused_naming_the_limit() {
        let by_aggregate = template("events.{aggregate_id}");
        let max_payload = 1024 * 1024;
        let long = event("order.paid", &"a".repeat(5000), "{}");
        let reason = prepare(&long, &by_aggregate, max_payload, MAX_CONTROL_LINE).unwrap_err();
        assert!(reason.contains("max_control_line of 4096 bytes"), "{reason}");
        assert!(reason.contains("5007 bytes long"), "{reason}");
        assert!(reason.len() < 600, "the reason stays short: {reason}");

        // The longest subject that fits, and one byte more.
        let fits = |aggregate_id: &str| {
            let e = event("order.paid", aggregate_id, "{}");
            let header_bytes = wire_size(&headers(&e), "");
            let subject = by_aggregate.render(&e.event_type, &e.aggregate_id);
            control_line_len(&subject, header_bytes, header_bytes + 2) <= MAX_CONTROL_LINE
        };
        let longest = (1..4096).rev().find(|&n| fits(&"a".repeat(n))).unwrap();
        assert!(longest > 3800, "generous, not stingy: {longest}");
        let at_limit = event("order.paid", &"a".repeat(longest), "{}");
        assert!(prepare(&at_limit, &by_aggregate, max_payload, MAX_CONTROL_LINE).is_ok());
        let over = event("order.paid", &"a".repeat(longest + 1), "{}");
        assert!(prepare(&over, &by_aggregate, max_payload, MAX_CONTROL_LINE)
            .unwrap_err()
            .contains("max_control_line"));
    }
}
