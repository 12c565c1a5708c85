//! Whose fault a refused JetStream publish is: the row's (it is charged an
//! attempt, or quarantined when it can never be stored) or the server's
//! (the stream is full with `discard: new`, sealed, has no leader, the
//! server is out of resources, the acknowledgement did not come: nothing
//! is charged and the relay backs off).

use std::error::Error as _;

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::{Error as ApiError, ErrorCode};
use async_nats::subject::SubjectError;

use crate::sink::Outcome;

/// What one publish's answer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The row's own: an outcome for it alone.
    Row(Outcome),
    /// The server's, the stream's or the network's: deferred, no attempt
    /// charged, the sink not ready for a moment.
    Server(String),
    /// No responders: no stream captures the subject, or JetStream is not
    /// answering for it; which of the two decides whose fault it is.
    NoResponders,
}

/// Classifies a failed publish (its send or its acknowledgement).
pub(super) fn classify(error: &PublishError) -> Verdict {
    match error.kind() {
        PublishErrorKind::StreamNotFound => Verdict::NoResponders,
        PublishErrorKind::TimedOut => {
            Verdict::Server("JetStream did not acknowledge the message in time".to_owned())
        }
        PublishErrorKind::BrokenPipe => {
            Verdict::Server("the NATS connection was lost before the acknowledgement".to_owned())
        }
        PublishErrorKind::MaxAckPending => {
            Verdict::Server("too many acknowledgements pending on the NATS connection".to_owned())
        }
        // The relay checks the size against the server's max_payload before
        // sending; the client checking it too means the row can never go.
        PublishErrorKind::MaxPayloadExceeded => Verdict::Row(Outcome::Reject(format!(
            "larger than the NATS server's max_payload: {error}"
        ))),
        // Only sent with expected-last headers, which the relay never sets.
        PublishErrorKind::WrongLastMessageId | PublishErrorKind::WrongLastSequence => {
            Verdict::Row(Outcome::Retry(format!("JetStream refused the message: {error}")))
        }
        PublishErrorKind::Other => {
            let source = error.source();
            if let Some(api) = source.and_then(|s| s.downcast_ref::<ApiError>()) {
                classify_api_error(api.code(), api.error_code(), &api.to_string())
            } else if source.is_some_and(|s| s.is::<SubjectError>()) {
                // The client refused the subject before sending (empty,
                // white space): true of this row whatever the server. The
                // relay checks more than this before sending, so this is
                // a second line of defence.
                Verdict::Row(Outcome::Reject(format!(
                    "the NATS client refused the subject: {}",
                    describe(error)
                )))
            } else {
                // A reply that is not JetStream's, or the request never left.
                Verdict::Server(format!("JetStream publish failed: {}", describe(error)))
            }
        }
    }
}

/// A JetStream API error answered for one message. `code` is its HTTP-like
/// status, `error_code` the server's precise code.
pub(super) fn classify_api_error(code: usize, error_code: ErrorCode, text: &str) -> Verdict {
    let refused = || format!("JetStream refused the message: {text}");
    match error_code {
        // Larger than the stream's max_msg_size, or headers over 64 KiB:
        // stays true of this row for as long as the stream is set so.
        ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM | ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM => {
            Verdict::Row(Outcome::Reject(refused()))
        }
        // Storing failed: the stream is full with `discard: new` (messages,
        // bytes) or the store itself failed. A full subject
        // (`max_msgs_per_subject` with per-subject discard) is this row's
        // own subject, not the stream's state: the other rows still flow.
        ErrorCode::STREAM_STORE_FAILED if text.contains("per subject") => {
            Verdict::Row(Outcome::Retry(refused()))
        }
        ErrorCode::STREAM_STORE_FAILED | ErrorCode::STREAM_SEALED | ErrorCode::INSUFFICIENT_RESOURCES => {
            Verdict::Server(refused())
        }
        // A server-side state (no leader, offline, throttled), whatever
        // the code: not this row's doing.
        _ if code >= 500 || code == 429 => Verdict::Server(refused()),
        // Anything else answered for this message alone is its refusal.
        _ => Verdict::Row(Outcome::Retry(refused())),
    }
}

/// An error with its sources, which hold the useful part ("connection
/// refused", the TLS failure) while the top level is generic.
pub(super) fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    if let Some(tls) = crate::tls::describe_chain(error) {
        return tls;
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(verdict: Verdict) -> &'static str {
        match verdict {
            Verdict::Row(Outcome::Retry(_)) => "retry",
            Verdict::Row(Outcome::Reject(_)) => "reject",
            Verdict::Row(_) => "other",
            Verdict::Server(_) => "server",
            Verdict::NoResponders => "no responders",
        }
    }

    #[test]
    fn size_refusals_are_the_rows_and_permanent() {
        assert_eq!(
            kind(classify_api_error(
                400,
                ErrorCode(10054),
                "message size exceeds maximum allowed"
            )),
            "reject"
        );
        assert_eq!(
            kind(classify_api_error(
                400,
                ErrorCode(10097),
                "header size exceeds maximum allowed of 64k"
            )),
            "reject"
        );
    }

    #[test]
    fn a_stream_that_refuses_everything_is_the_servers_fault() {
        for (code, error_code, text) in [
            (503, 10077, "maximum messages exceeded"),
            (503, 10077, "maximum bytes exceeded"),
            (400, 10109, "invalid operation on sealed stream"),
            (503, 10023, "insufficient resources"),
            (503, 10008, "JetStream system temporarily unavailable"),
            (429, 10167, "too many requests"),
        ] {
            assert_eq!(
                kind(classify_api_error(code, ErrorCode(error_code), text)),
                "server",
                "{text}"
            );
        }
    }

    #[test]
    fn a_full_subject_and_other_refusals_are_the_rows() {
        assert_eq!(
            kind(classify_api_error(
                503,
                ErrorCode(10077),
                "maximum messages per subject exceeded"
            )),
            "retry"
        );
        assert_eq!(
            kind(classify_api_error(400, ErrorCode(10999), "something new")),
            "retry"
        );
    }

    #[test]
    fn transport_failures_are_the_servers_and_no_responders_stay_undecided() {
        assert_eq!(
            kind(classify(&PublishError::new(PublishErrorKind::TimedOut))),
            "server"
        );
        assert_eq!(
            kind(classify(&PublishError::new(PublishErrorKind::BrokenPipe))),
            "server"
        );
        assert_eq!(
            kind(classify(&PublishError::new(PublishErrorKind::Other))),
            "server"
        );
        assert_eq!(
            classify(&PublishError::new(PublishErrorKind::StreamNotFound)),
            Verdict::NoResponders
        );
    }

    #[test]
    fn a_subject_the_client_refuses_is_the_rows_and_permanent() {
        // What `send_publish` returns for an empty or white-space subject.
        let error = PublishError::with_source(PublishErrorKind::Other, SubjectError::InvalidFormat);
        assert_eq!(kind(classify(&error)), "reject");
    }
}
