//! Whose fault a failed Kafka delivery is: the row's (it is charged an
//! attempt, or quarantined when it can never be stored) or the cluster's
//! and the network's (nothing is charged; the relay backs off and reports
//! not ready). docs/kafka.md#broker-answers lists every answer with its
//! class and the conformance case that proves it.
//!
//! librdkafka retries what Kafka calls retriable (a leader moving, not
//! enough in-sync replicas, a request timing out, a lost connection)
//! inside the producer, until `message.timeout.ms`, which the relay sets
//! to its publish timeout: such answers reach the relay as a message
//! timeout, or not at all before its deadline. What reaches it otherwise
//! is a refusal that retrying inside the producer would not change.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::sink::Outcome;

/// What a delivery report (or a refused enqueue) says about one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The row's own: an outcome for it alone.
    Row(Outcome),
    /// The cluster's, the network's or the producer's: deferred, no
    /// attempt charged.
    Cluster(String),
    /// The producer must be made anew before anything else is sent (a
    /// fatal error of the idempotent producer); deferred meanwhile.
    Fatal(String),
    /// The broker refused the request carrying the message as too large:
    /// the row's only if it was alone in it, since a request holds many.
    TooLarge(String),
    /// The message's topic does not exist: the row's if other topics of
    /// the template do, the operator's if none does yet.
    UnknownTopic,
}

/// Where an error came from: the producer refusing to take a message, or
/// a delivery report. A code alone cannot tell librdkafka's own size check
/// from the broker's answer for a whole request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// `send_result` refused the message; nothing was sent.
    Enqueue,
    /// The delivery report of a message that was sent (or tried).
    Report,
}

/// Classifies a failed delivery by its error code.
pub(super) fn classify(error: &KafkaError, stage: Stage) -> Verdict {
    let Some(code) = error.rdkafka_error_code() else {
        return Verdict::Cluster(format!("Kafka producer: {error}"));
    };
    let said = || format!("Kafka: {code} ({code:?})");
    use RDKafkaErrorCode as E;
    match code {
        // Larger than the producer's message.max.bytes: librdkafka refuses
        // it when it is handed over, alone, before anything is sent.
        E::MessageSizeTooLarge if stage == Stage::Enqueue => Verdict::Row(Outcome::Reject(format!(
            "the record is larger than the producer's message.max.bytes (OUTBOX_KAFKA_PROPERTIES): {}",
            said()
        ))),
        // The broker's (or the topic's max.message.bytes): of the request.
        E::MessageSizeTooLarge | E::MessageBatchTooLarge | E::InvalidMessageSize => Verdict::TooLarge(said()),
        E::UnknownTopicOrPartition | E::UnknownTopic => Verdict::UnknownTopic,
        // True of this record whatever the cluster's state: a name Kafka
        // refuses, a record its validation refuses (a compacted topic's
        // null key cannot happen: every record has one), a timestamp out
        // of the topic's bounds.
        E::InvalidTopic | E::InvalidRecord | E::InvalidTimestamp => {
            Verdict::Row(Outcome::Reject(format!("Kafka refused the record: {}", said())))
        }
        // A broker policy refusing this record; it may change its mind
        // once the policy does, so it is tried again, not quarantined.
        E::PolicyViolation => Verdict::Row(Outcome::Retry(format!("Kafka refused the record: {}", said()))),
        // The producer's epoch or sequence state is gone: librdkafka raises
        // a fatal error, after which the producer sends nothing more.
        E::Fatal | E::ProducerFenced | E::InvalidProducerEpoch | E::OutOfOrderSequenceNumber | E::Fenced => {
            Verdict::Fatal(said())
        }
        E::MessageTimedOut => Verdict::Cluster(format!(
            "Kafka did not acknowledge the record within OUTBOX_PUBLISH_TIMEOUT ({code:?})"
        )),
        E::QueueFull => Verdict::Cluster(format!(
            "the Kafka producer's queue is full (queue.buffering.max.messages): backpressure ({code:?})"
        )),
        // Everything else is about the cluster, the connection, the
        // credentials or the producer (authorisation, authentication, not
        // enough replicas, leaders, throttling, transport, a purged
        // queue), which any record would get: never the row's fault. An
        // answer not named here is taken the same way: a row the cluster
        // keeps refusing for an unnamed reason stays unpublished (and in
        // the oldest-age alert) rather than being quarantined for the
        // cluster's sake.
        _ => Verdict::Cluster(said()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn produced(code: RDKafkaErrorCode) -> KafkaError {
        KafkaError::MessageProduction(code)
    }

    #[test]
    fn answers_any_record_would_get_are_the_clusters() {
        for code in [
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::ClusterAuthorizationFailed,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::NotEnoughReplicasAfterAppend,
            RDKafkaErrorCode::LeaderNotAvailable,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::SaslAuthenticationFailed,
            RDKafkaErrorCode::ThrottlingQuotaExceeded,
            RDKafkaErrorCode::KafkaStorageError,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::PurgeQueue,
        ] {
            assert!(
                matches!(classify(&produced(code), Stage::Report), Verdict::Cluster(_)),
                "{code:?}"
            );
        }
        match classify(
            &produced(RDKafkaErrorCode::TopicAuthorizationFailed),
            Stage::Report,
        ) {
            Verdict::Cluster(reason) => assert!(reason.contains("TopicAuthorizationFailed"), "{reason}"),
            other => panic!("{other:?}"),
        }
        match classify(&produced(RDKafkaErrorCode::MessageTimedOut), Stage::Report) {
            Verdict::Cluster(reason) => assert!(reason.contains("OUTBOX_PUBLISH_TIMEOUT"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_record_too_large_is_the_rows_only_when_the_producer_says_so() {
        let too_large = produced(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(matches!(
            classify(&too_large, Stage::Enqueue),
            Verdict::Row(Outcome::Reject(reason)) if reason.contains("message.max.bytes")
        ));
        assert!(matches!(
            classify(&too_large, Stage::Report),
            Verdict::TooLarge(_)
        ));
        assert!(matches!(
            classify(&produced(RDKafkaErrorCode::MessageBatchTooLarge), Stage::Report),
            Verdict::TooLarge(_)
        ));
    }

    #[test]
    fn the_rows_own_answers() {
        assert!(matches!(
            classify(&produced(RDKafkaErrorCode::InvalidTopic), Stage::Report),
            Verdict::Row(Outcome::Reject(_))
        ));
        assert!(matches!(
            classify(&produced(RDKafkaErrorCode::InvalidRecord), Stage::Report),
            Verdict::Row(Outcome::Reject(_))
        ));
        assert!(matches!(
            classify(&produced(RDKafkaErrorCode::PolicyViolation), Stage::Report),
            Verdict::Row(Outcome::Retry(_))
        ));
        assert_eq!(
            classify(
                &produced(RDKafkaErrorCode::UnknownTopicOrPartition),
                Stage::Report
            ),
            Verdict::UnknownTopic
        );
        assert_eq!(
            classify(&produced(RDKafkaErrorCode::UnknownTopic), Stage::Report),
            Verdict::UnknownTopic
        );
        assert!(matches!(
            classify(&produced(RDKafkaErrorCode::Fatal), Stage::Report),
            Verdict::Fatal(_)
        ));
    }
}
