//! An HTTP proxy in front of the SQS emulator that a test tells to answer
//! for SQS: an error for every `SendMessageBatch` (`AccessDenied`,
//! throttling, a 5xx), every entry failed, some entries failed, or no
//! answer at all ([`Fault`]). It counts the `SendMessageBatch` requests it
//! sees, so a test can tell how often the relay asks during an outage.
//! Everything else (the health check's `GetQueueAttributes`, the test's
//! own calls) passes on untouched.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::sqs::endpoint;

/// What the proxy does with the relay's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
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

/// An HTTP proxy in front of the SQS emulator, passing everything on until
/// told otherwise ([`SqsProxy::set`]); it stops when dropped.
pub struct SqsProxy {
    /// Where it listens: give `http://{addr}` ([`SqsProxy::url`]) to the
    /// relay as its SQS endpoint.
    pub addr: SocketAddr,
    state: ProxyState,
    task: tokio::task::JoinHandle<()>,
}

impl SqsProxy {
    /// Listens on an ephemeral local port, in front of the emulator
    /// [`endpoint`] names.
    pub async fn start() -> Self {
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

    /// The proxy as an SQS endpoint URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What to do with the requests from now on.
    pub fn set(&self, fault: Fault) {
        *self.state.fault.lock().expect("fault") = fault;
    }

    /// `SendMessageBatch` requests received so far, answered by the proxy
    /// or passed on.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
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
