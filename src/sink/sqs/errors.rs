//! What an SQS error means for the rows it concerns: retry, reject, or
//! split the request to find the one row at fault; and whether it says the
//! queue may be unreachable.

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::BatchResultErrorEntry;

use super::batching::Sent;
use super::Outcome;

/// An SDK error in one line with its causes: the code and message for a
/// service error, the cause chain (connection refused, timeout, missing
/// credentials) otherwise. SDK errors never include credentials.
pub(super) fn describe_sdk_error<E, R>(error: &SdkError<E, R>) -> String
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
    R: std::fmt::Debug,
{
    match (error.code(), error.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        _ => DisplayErrorContext(error).to_string(),
    }
}

/// Maps a `SendMessageBatch` answer back to its `count` entries (ids are
/// positions). An entry SQS reports as failed, or does not mention at all,
/// is never `Published`.
pub(super) fn entry_outcomes(
    count: usize,
    successful: &[&str],
    failed: &[BatchResultErrorEntry],
) -> Vec<Outcome> {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; count];
    for failure in failed {
        let Some(slot) = failure
            .id()
            .parse::<usize>()
            .ok()
            .and_then(|at| outcomes.get_mut(at))
        else {
            continue;
        };
        let reason = format!(
            "SQS refused the message: {}: {}",
            failure.code(),
            failure.message().unwrap_or("no message")
        );
        *slot = Some(classify_entry_error(
            failure.code(),
            failure.sender_fault(),
            reason,
        ));
    }
    for id in successful {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|at| outcomes.get_mut(at)) {
            slot.get_or_insert(Outcome::Published);
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| {
            // SQS did not answer for it, as a confirm that never came: not
            // the row's doing.
            outcome.unwrap_or_else(|| Outcome::Deferred("SQS returned no result for this entry".to_owned()))
        })
        .collect()
}

/// An error code without the `AWS.SimpleQueueService.` prefix some carry.
fn unprefixed(code: &str) -> &str {
    code.strip_prefix("AWS.SimpleQueueService.").unwrap_or(code)
}

/// Error codes that are about the moment or the setup (throttling, KMS,
/// permissions, the queue), never about the message, whatever the
/// SenderFault flag says: retrying them is right, quarantining every row
/// because of a missing IAM permission is not.
fn is_transient_code(code: &str) -> bool {
    let code = unprefixed(code);
    let lower = code.to_ascii_lowercase();
    lower.contains("throttl")
        || lower.starts_with("kms")
        || lower.contains("accessdenied")
        || lower.contains("unavailable")
        || matches!(
            code,
            "InternalError"
                | "InternalFailure"
                | "RequestExpired"
                | "InvalidSecurity"
                | "InvalidClientTokenId"
                | "UnrecognizedClientException"
                | "SignatureDoesNotMatch"
                | "ExpiredToken"
                | "MissingAuthenticationToken"
                | "QueueDoesNotExist"
                | "NonExistentQueue"
                | "RequestCanceled"
                | "OverLimit"
        )
}

/// A failed entry. A code about the moment or the setup (throttling, KMS,
/// permissions, the queue) is one every entry would get: not the row's
/// fault, deferred. Otherwise the sender's fault means this message is
/// wrong and will stay wrong (too large, invalid characters or attribute):
/// rejected; and any other failure of this entry alone is its failed
/// attempt. Never `Published`.
fn classify_entry_error(code: &str, sender_fault: bool, reason: String) -> Outcome {
    if is_transient_code(code) {
        Outcome::Deferred(reason)
    } else if sender_fault {
        Outcome::Reject(reason)
    } else {
        Outcome::Retry(reason)
    }
}

/// Whether a whole-request failure is a content error one entry can cause.
fn is_content_error(code: Option<&str>) -> bool {
    const CONTENT_CODES: [&str; 8] = [
        "InvalidParameterValue",
        "InvalidMessageContents",
        "MessageTooLong",
        "BatchRequestTooLong",
        "InvalidAttributeValue",
        "InvalidAttributeName",
        "MessageAttributesInvalid",
        "MissingParameter",
    ];
    code.is_some_and(|code| !is_transient_code(code) && CONTENT_CODES.contains(&unprefixed(code)))
}

/// What a `SendMessageBatch` that failed as a whole, with error `code` (if
/// SQS answered), means for its `entries`: a content error is split to find
/// the entry that causes it. Any other error (throttling, a malformed queue
/// URL, an unsupported operation, no answer at all) has nothing to do with
/// one row, so every row waits without being charged an attempt.
pub(super) fn classify_request_error(code: Option<&str>, reason: String, entries: usize) -> Sent {
    if is_content_error(code) {
        Sent::Split(reason)
    } else {
        Sent::Outcomes(vec![Outcome::Deferred(reason); entries])
    }
}

/// Whether a whole-request failure, by its error code (if SQS answered)
/// and HTTP status (if any response arrived), says the queue may be
/// unreachable, so readiness is checked again before the next claim.
pub(super) fn suggests_outage(code: Option<&str>, status: Option<u16>) -> bool {
    match code {
        // No service answer at all: connection refused or reset, timeout.
        None => true,
        Some(_) if is_content_error(code) => false,
        // Throttling is the service asking every sender to slow down.
        Some(code) if unprefixed(code).to_ascii_lowercase().contains("throttl") => true,
        Some(_) => status.is_some_and(|s| s >= 500),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_errors_are_classified_by_sender_fault_and_code() {
        // Only the kind of outcome is under test; the reason is passed through.
        let classify =
            |code: &str, sender_fault: bool| classify_entry_error(code, sender_fault, String::new());
        let (retry, reject, deferred) = (
            Outcome::Retry(String::new()),
            Outcome::Reject(String::new()),
            Outcome::Deferred(String::new()),
        );
        assert_eq!(classify("InvalidParameterValue", true), reject);
        assert_eq!(classify("InvalidMessageContents", true), reject);
        assert_eq!(classify("MessageTooLong", true), reject);
        assert_eq!(classify("SomethingNew", false), retry);
        assert_eq!(classify("SomethingNew", true), reject);
        // About the moment or the setup, whatever SenderFault says: every
        // entry would get it.
        assert_eq!(classify("InternalError", false), deferred);
        assert_eq!(classify("ServiceUnavailable", false), deferred);
        assert_eq!(classify("RequestThrottled", true), deferred);
        assert_eq!(classify("ThrottlingException", true), deferred);
        assert_eq!(classify("KMS.ThrottlingException", true), deferred);
        assert_eq!(classify("KMS.DisabledException", true), deferred);
        assert_eq!(classify("KmsAccessDenied", true), deferred);
        assert_eq!(classify("AccessDenied", true), deferred);
        assert_eq!(
            classify("AWS.SimpleQueueService.NonExistentQueue", true),
            deferred
        );
    }

    #[test]
    fn request_errors_split_only_for_content_problems() {
        // Each case: what happens to the rows, then whether readiness is
        // checked again.
        let rows = |code: Option<&str>| classify_request_error(code, "r".to_owned(), 2);
        let split = Sent::Split("r".to_owned());
        let retry = Sent::Outcomes(vec![Outcome::Deferred("r".to_owned()); 2]);
        assert_eq!(rows(Some("InvalidParameterValue")), split);
        assert!(!suggests_outage(Some("InvalidParameterValue"), Some(400)));
        assert_eq!(rows(Some("BatchRequestTooLong")), split);
        assert!(!suggests_outage(Some("BatchRequestTooLong"), Some(400)));
        assert_eq!(rows(Some("RequestThrottled")), retry);
        assert!(suggests_outage(Some("RequestThrottled"), Some(400)));
        assert_eq!(rows(Some("InternalError")), retry);
        assert!(suggests_outage(Some("InternalError"), Some(500)));
        assert_eq!(rows(Some("AWS.SimpleQueueService.NonExistentQueue")), retry);
        assert!(!suggests_outage(
            Some("AWS.SimpleQueueService.NonExistentQueue"),
            Some(400)
        ));
        assert_eq!(rows(Some("AccessDenied")), retry);
        assert!(!suggests_outage(Some("AccessDenied"), Some(403)));
        assert_eq!(rows(None), retry);
        assert!(suggests_outage(None, None));
        assert!(suggests_outage(None, Some(502)));
    }

    fn failure(id: &str, sender_fault: bool, code: &str) -> BatchResultErrorEntry {
        BatchResultErrorEntry::builder()
            .id(id)
            .sender_fault(sender_fault)
            .code(code)
            .message("m")
            .build()
            .unwrap()
    }

    #[test]
    fn each_entry_result_maps_to_its_own_row() {
        let failed = [
            failure("1", true, "InvalidParameterValue"),
            failure("3", false, "InternalError"),
        ];
        let outcomes = entry_outcomes(5, &["0", "2", "99", "x"], &failed);
        assert_eq!(outcomes[0], Outcome::Published);
        assert!(matches!(&outcomes[1], Outcome::Reject(r) if r.contains("InvalidParameterValue")));
        assert_eq!(outcomes[2], Outcome::Published);
        assert!(matches!(&outcomes[3], Outcome::Deferred(r) if r.contains("InternalError")));
        assert!(matches!(&outcomes[4], Outcome::Deferred(r) if r.contains("no result")));
        // Listed as both: not published.
        let outcomes = entry_outcomes(1, &["0"], &[failure("0", false, "SomethingNew")]);
        assert!(matches!(outcomes[0], Outcome::Retry(_)));
    }
}
