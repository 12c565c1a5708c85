//! Amazon SQS's answers, one case each (docs/sqs.md#broker-answers), on the
//! emulator behind an HTTP proxy of the case's own that counts requests
//! and answers for SQS when told to: `AccessDenied`, throttling and a 5xx
//! for every `SendMessageBatch`, a disabled KMS key failing every entry, a
//! request that is never answered, a deleted queue, a connection that
//! cannot be made (outages); an entry failed on its own (the row's,
//! retried); a message over the queue's `MaximumMessageSize` (the row's,
//! quarantined at once).

use std::collections::HashSet;

use futures::future::BoxFuture;
use uuid::Uuid;

use super::kit::{Bench, Broker, RowFault};
use crate::common::proxy::Proxy;
use crate::common::sqs::{endpoint, endpoint_addr, TestQueue};
use crate::common::sqs_faults::{Fault, SqsProxy};

/// A queue of the case's own, reached through the HTTP proxy or through a
/// TCP proxy.
struct Sqs {
    queue: TestQueue,
    http: Option<SqsProxy>,
    tcp: Option<Proxy>,
}

impl Sqs {
    async fn new(max_message_size: Option<u32>) -> Self {
        Self {
            queue: TestQueue::create(false, max_message_size).await,
            http: Some(SqsProxy::start().await),
            tcp: None,
        }
    }

    async fn behind_tcp_proxy() -> Self {
        Self {
            queue: TestQueue::create(false, None).await,
            http: None,
            tcp: Some(Proxy::start(endpoint_addr()).await),
        }
    }

    fn fault(&self, fault: Fault) {
        self.http.as_ref().expect("the HTTP proxy").set(fault);
    }

    /// Deletes the queue, or creates it again under the same name (and so
    /// the same URL).
    async fn queue_exists(&self, exists: bool) {
        if exists {
            self.queue
                .client
                .create_queue()
                .queue_name(&self.queue.name)
                .send()
                .await
                .expect("create the queue again");
        } else {
            self.queue
                .client
                .delete_queue()
                .queue_url(&self.queue.url)
                .send()
                .await
                .expect("delete the queue");
        }
    }
}

impl Broker for Sqs {
    fn env(&self) -> Vec<(&'static str, String)> {
        let via = match (&self.http, &self.tcp) {
            (Some(http), _) => http.url(),
            (None, Some(tcp)) => format!("http://{}", tcp.addr),
            (None, None) => endpoint(),
        };
        self.queue.env_via(&via)
    }

    fn received(&self) -> BoxFuture<'_, HashSet<Uuid>> {
        Box::pin(async move {
            let mut ids = HashSet::new();
            loop {
                let batch = self.queue.receive_once(120).await;
                if batch.is_empty() {
                    return ids;
                }
                for message in &batch {
                    self.queue.delete(message).await;
                    if let Ok(id) = message.event_id().parse() {
                        ids.insert(id);
                    }
                }
            }
        })
    }

    fn requests(&self) -> Option<u64> {
        self.http.as_ref().map(SqsProxy::requests)
    }
}

/// Runs one outage case: `fault` on before any row, 300 rows, the kit's
/// outage assertions naming `reason`, then full delivery once it ends.
async fn outage(fault: Fault, reason: &str) {
    let mut bench = Bench::new(Sqs::new(None).await).await;
    bench.broker.fault(fault);
    let ids = bench.insert(300, "conformance.sqs").await;
    bench.start(&[]);
    bench.assert_outage(reason).await;
    bench.broker.fault(Fault::None);
    bench.assert_delivered(&ids).await;
}

/// A policy change or a disabled key: `AccessDenied` for every request.
#[tokio::test(flavor = "multi_thread")]
async fn access_denied_for_every_request_is_an_outage() {
    outage(
        Fault::RequestError {
            status: 400,
            code: "AccessDenied",
        },
        "AccessDenied",
    )
    .await;
}

/// Throttling of every request.
#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_an_outage() {
    outage(
        Fault::RequestError {
            status: 400,
            code: "ThrottlingException",
        },
        "ThrottlingException",
    )
    .await;
}

/// A 5xx for every request.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_error_for_every_request_is_an_outage() {
    outage(
        Fault::RequestError {
            status: 500,
            code: "InternalError",
        },
        "InternalError",
    )
    .await;
}

/// A disabled KMS key fails every entry of every request, each with a
/// sender fault: still an answer every row gets.
#[tokio::test(flavor = "multi_thread")]
async fn a_kms_error_on_every_entry_is_an_outage() {
    outage(
        Fault::EveryEntry {
            code: "KMS.DisabledException",
            sender_fault: true,
        },
        "KMS.DisabledException",
    )
    .await;
}

/// Requests that are never answered.
#[tokio::test(flavor = "multi_thread")]
async fn unanswered_requests_are_an_outage() {
    let mut bench = Bench::new(Sqs::new(None).await).await;
    bench.broker.fault(Fault::Hang);
    let ids = bench.insert(300, "conformance.sqs").await;
    bench.start(&[("OUTBOX_PUBLISH_TIMEOUT", "2s")]);
    bench.assert_outage("OUTBOX_PUBLISH_TIMEOUT").await;
    bench.broker.fault(Fault::None);
    bench.assert_delivered(&ids).await;
}

/// The queue is deleted while the relay runs, and created again.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_queue_is_an_outage() {
    let mut bench = Bench::new(Sqs::new(None).await).await;
    bench.start_delivering(&[]).await;
    bench.broker.queue_exists(false).await;
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage("NonExistentQueue").await;
    bench.broker.queue_exists(true).await;
    bench.assert_delivered(&during).await;
}

/// A connection that cannot be made.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_endpoint_is_an_outage() {
    let mut bench = Bench::new(Sqs::behind_tcp_proxy().await).await;
    bench.start_delivering(&[]).await;
    let proxy = bench.broker.tcp.as_ref().expect("TCP proxy");
    proxy.refuse(true);
    proxy.cut();
    let during = bench.insert(100, "conformance.during").await;
    bench.assert_outage("GetQueueAttributes").await;
    bench.broker.tcp.as_ref().expect("TCP proxy").refuse(false);
    bench.assert_delivered(&during).await;
}

/// One entry failed on its own, without a sender fault: that row's failed
/// attempt, quarantined once out of attempts.
#[tokio::test(flavor = "multi_thread")]
async fn an_entry_failed_alone_is_the_rows_retry() {
    let mut bench = Bench::new(Sqs::new(None).await).await;
    bench.broker.fault(Fault::EntriesContaining {
        marker: "poison",
        code: "EntryNotStored",
    });
    let (bad, good) = bench
        .among_good_rows(
            "conformance.sqs",
            bench.insert_row("conformance.sqs", "a", r#"{"note": "poison"}"#),
        )
        .await;
    bench.start(&[]);
    bench
        .assert_row_fault(bad, RowFault::Retry, "EntryNotStored", &good)
        .await;
}

/// A message over the queue's `MaximumMessageSize` is never sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_over_the_queue_limit_is_rejected_before_sending() {
    let mut bench = Bench::new(Sqs::new(Some(1024)).await).await;
    let (bad, good) = bench
        .among_good_rows(
            "conformance.sqs",
            bench.insert_row(
                "conformance.sqs",
                "a",
                &format!("{{\"blob\": \"{}\"}}", "x".repeat(2000)),
            ),
        )
        .await;
    bench.start(&[]);
    bench
        .assert_row_fault(bad, RowFault::Reject, "MaximumMessageSize", &good)
        .await;
}
