//! Connections the server closes because of a message.
//!
//! A NATS server answers a publish it cannot parse or accept at the
//! protocol level (a control line over its `max_control_line`, a payload
//! over `max_payload`, a parser error) with `-ERR` and closes the
//! connection: every acknowledgement still pending on it is lost, so the
//! message's batch-mates fail with it. The relay checks the limits it
//! knows before sending (`message.rs`); for what it cannot know (a server
//! configured below what the relay was told), the `-ERR` is recorded here
//! from the client's event stream, so that a batch can tell "the server
//! closed the connection on something I sent" from a network outage and
//! have the culprit isolated by halving, as the RabbitMQ sink does with a
//! channel closed for a message.

use std::sync::Mutex;
use std::time::Instant;

/// The protocol errors the server sent, as the client reported them.
#[derive(Debug, Default)]
pub(super) struct ProtocolErrors {
    last: Mutex<Option<(Instant, String)>>,
}

impl ProtocolErrors {
    /// Records a server error, if it is one the server closes the
    /// connection with because of what was sent. Permission violations,
    /// authorisation errors and slow-consumer notices are not: they are
    /// about the account or the subject, and the connection stays.
    pub(super) fn record(&self, text: &str) {
        if closes_for_a_message(text) {
            *self.lock() = Some((Instant::now(), text.to_owned()));
        }
    }

    /// The last such error, if it came after `since`.
    pub(super) fn since(&self, since: Instant) -> Option<String> {
        self.lock()
            .as_ref()
            .filter(|(at, _)| *at >= since)
            .map(|(_, text)| text.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        // A plain value, consistent whatever panicked elsewhere.
        self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Whether a server `-ERR` text is one the server closes the connection
/// with because of what the client sent.
fn closes_for_a_message(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    [
        "maximum control line",
        "maximum payload",
        "parser error",
        "unknown protocol operation",
    ]
    .iter()
    .any(|known| lower.contains(known))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_protocol_errors_about_what_was_sent_are_recorded() {
        let errors = ProtocolErrors::default();
        let before = Instant::now();
        errors.record("permissions violation for publish to \"x\"");
        errors.record("authorization violation");
        assert_eq!(errors.since(before), None);
        errors.record("maximum control line exceeded");
        assert_eq!(
            errors.since(before).as_deref(),
            Some("maximum control line exceeded")
        );
        errors.record("Maximum Payload Violation");
        assert!(errors.since(before).is_some());
    }

    #[test]
    fn an_error_from_before_a_publish_is_not_its_own() {
        let errors = ProtocolErrors::default();
        errors.record("maximum control line exceeded");
        let later = Instant::now() + std::time::Duration::from_millis(1);
        assert_eq!(errors.since(later), None);
    }
}
