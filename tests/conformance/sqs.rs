//! Amazon SQS's answers, one case each (docs/sqs.md#broker-answers), on the
//! emulator behind an HTTP proxy of the case's own that counts requests
//! and answers for SQS when told to: `AccessDenied`, throttling and a 5xx
//! for every `SendMessageBatch`, a disabled KMS key failing every entry, a
//! request that is never answered, a deleted queue, a connection that
//! cannot be made (outages); an entry failed on its own (the row's,
//! retried); a message over the queue's `MaximumMessageSize` (the row's,
//! quarantined at once).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use uuid::Uuid;

use super::kit::{Bench, Broker, RowFault};
use crate::common::proxy::Proxy;
use crate::common::sqs::{endpoint, endpoint_addr, TestQueue};

/// What the proxy does with the relay's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fault {
    /// Passes every request on.
    None,
    /// Answers every `SendMessageBatch` with this error.
    RequestError { status: u16, code: &'static str },
    /// Passes `SendMessageBatch` on and fails every entry with this code.
    EveryEntry { code: &'static str, sender_fault: bool },
    /// Passes `SendMessageBatch` on without the entries whose body contains
    /// the marker, and reports those as failed with this code.
    EntriesContaining {
        marker: &'static str,
        code: &'static str,
    },
    /// Holds every `SendMessageBatch` unanswered while the fault lasts.
    Hang,
}

#[derive(Clone)]
struct ProxyState {
    fault: Arc<Mutex<Fault>>,
    requests: Arc<AtomicU64>,
    upstream: String,
    client: reqwest::Client,
}

/// An HTTP proxy in front of the SQS emulator.
struct SqsProxy {
    addr: SocketAddr,
    state: ProxyState,
    task: tokio::task::JoinHandle<()>,
}

impl SqsProxy {
    async fn start() -> Self {
        let state = ProxyState {
            fault: Arc::new(Mutex::new(Fault::None)),
            requests: Arc::default(),
            upstream: endpoint(),
            client: reqwest::Client::new(),
        };
        let app = axum::Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, state, task }
    }

    fn set(&self, fault: Fault) {
        *self.state.fault.lock().expect("fault") = fault;
    }
}

impl Drop for SqsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn is_send_batch(headers: &HeaderMap) -> bool {
    headers
        .get("x-amz-target")
        .and_then(|target| target.to_str().ok())
        .is_some_and(|target| target.ends_with("SendMessageBatch"))
}

/// An SQS error as the JSON protocol writes it.
fn sqs_error(status: u16, code: &str) -> Response {
    let mut response = (
        StatusCode::from_u16(status).expect("status"),
        json!({"__type": format!("com.amazonaws.sqs#{code}"), "message": format!("{code} (injected by the test)")})
            .to_string(),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    let fault = if status >= 500 { "Receiver" } else { "Sender" };
    headers.insert(
        "x-amzn-query-error",
        HeaderValue::from_str(&format!("{code};{fault}")).expect("header"),
    );
    response
}

async fn handle(State(state): State<ProxyState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = to_bytes(body, usize::MAX).await.unwrap_or_default();
    let sending = is_send_batch(&parts.headers);
    if sending {
        state.requests.fetch_add(1, Ordering::SeqCst);
    }
    let fault = state.fault.lock().expect("fault").clone();
    match (sending, fault) {
        (true, Fault::RequestError { status, code }) => sqs_error(status, code),
        (true, Fault::Hang) => {
            while *state.fault.lock().expect("fault") == Fault::Hang {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            sqs_error(503, "ServiceUnavailable")
        }
        (true, Fault::EveryEntry { code, sender_fault }) => {
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let failed: Vec<Value> = entries(&request)
                .iter()
                .map(|entry| failure(entry, code, sender_fault))
                .collect();
            json_response(json!({"Successful": [], "Failed": failed}))
        }
        (true, Fault::EntriesContaining { marker, code }) => {
            let mut request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let (marked, kept): (Vec<Value>, Vec<Value>) = entries(&request).into_iter().partition(|entry| {
                entry["MessageBody"]
                    .as_str()
                    .is_some_and(|body| body.contains(marker))
            });
            let failed: Vec<Value> = marked.iter().map(|entry| failure(entry, code, false)).collect();
            if kept.is_empty() {
                return json_response(json!({"Successful": [], "Failed": failed}));
            }
            request["Entries"] = Value::Array(kept);
            let forwarded = forward(&state, &parts, Bytes::from(request.to_string())).await;
            let (parts, body) = forwarded.into_parts();
            let body = to_bytes(body, usize::MAX).await.unwrap_or_default();
            let mut answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if !parts.status.is_success() || !answer.is_object() {
                return Response::from_parts(parts, Body::from(body));
            }
            let mut all_failed = answer["Failed"].as_array().cloned().unwrap_or_default();
            all_failed.extend(failed);
            answer["Failed"] = Value::Array(all_failed);
            json_response(answer)
        }
        _ => forward(&state, &parts, body).await,
    }
}

fn entries(request: &Value) -> Vec<Value> {
    request["Entries"].as_array().cloned().unwrap_or_default()
}

fn failure(entry: &Value, code: &str, sender_fault: bool) -> Value {
    json!({"Id": entry["Id"], "Code": code, "SenderFault": sender_fault, "Message": "injected by the test"})
}

fn json_response(body: Value) -> Response {
    let mut response = (StatusCode::OK, body.to_string()).into_response();
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    response
}

async fn forward(state: &ProxyState, parts: &axum::http::request::Parts, body: Bytes) -> Response {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = state
        .client
        .request(parts.method.clone(), format!("{}{path}", state.upstream));
    for (name, value) in &parts.headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    match request.body(body).send().await {
        Ok(answer) => {
            let status = answer.status();
            let headers = answer.headers().clone();
            let body = answer.bytes().await.unwrap_or_default();
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            for (name, value) in &headers {
                if name != "content-length" && name != "transfer-encoding" && name != "connection" {
                    response.headers_mut().insert(name, value.clone());
                }
            }
            response
        }
        Err(e) => (StatusCode::BAD_GATEWAY, format!("emulator unreachable: {e}")).into_response(),
    }
}

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
            (Some(http), _) => format!("http://{}", http.addr),
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
        self.http
            .as_ref()
            .map(|http| http.state.requests.load(Ordering::SeqCst))
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
