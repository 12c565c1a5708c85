//! Publish spans over OTLP, received by a real OTLP/HTTP endpoint in the
//! test that decodes what the relay sends with the official protobuf
//! definitions (`opentelemetry-proto`): a row with a `traceparent` yields a
//! publish span in that trace, whose id the message carries as its
//! `traceparent` (the producer's `tracestate` and `baggage` unchanged); every
//! outcome is on its span; and nothing is exported, nor any header changed,
//! without the variables.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use common::{eventually, quick_settings, with, RelayProcess, TestBroker, TestDb};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prost::Message;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";
const TRACESTATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
const BAGGAGE: &str = "userId=alice,serverNode=DF%2028";

/// A span as the receiver decoded it.
#[derive(Debug, Clone)]
struct ReceivedSpan {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: i32,
    attributes: HashMap<String, String>,
    status_code: i32,
    status_message: String,
    service_name: String,
}

impl ReceivedSpan {
    fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).map(String::as_str)
    }
}

/// An OTLP/HTTP trace endpoint on a free port, keeping what it receives.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    requests: Arc<Mutex<usize>>,
}

#[derive(Clone)]
struct Received {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    requests: Arc<Mutex<usize>>,
}

fn text(attributes: &[KeyValue]) -> HashMap<String, String> {
    attributes
        .iter()
        .map(|pair| {
            let value = match pair.value.as_ref().and_then(|value| value.value.as_ref()) {
                Some(Value::StringValue(text)) => text.clone(),
                Some(Value::IntValue(number)) => number.to_string(),
                Some(Value::BoolValue(flag)) => flag.to_string(),
                Some(Value::DoubleValue(number)) => number.to_string(),
                other => format!("{other:?}"),
            };
            (pair.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

async fn traces(State(received): State<Received>, body: Bytes) -> impl IntoResponse {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf trace request");
    *received.requests.lock().unwrap() += 1;
    let mut spans = received.spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let resource = text(&resource_spans.resource.map(|r| r.attributes).unwrap_or_default());
        let service_name = resource.get("service.name").cloned().unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                let status = span.status.unwrap_or_default();
                spans.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes: text(&span.attributes),
                    status_code: status.code,
                    status_message: status.message,
                    service_name: service_name.clone(),
                });
            }
        }
    }
    (
        [(CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

impl Receiver {
    async fn start() -> Self {
        let received = Received {
            spans: Arc::default(),
            requests: Arc::default(),
        };
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .with_state(received.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            addr,
            spans: received.spans,
            requests: received.requests,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    fn requests(&self) -> usize {
        *self.requests.lock().unwrap()
    }

    /// The spans of the message `id`, in the order they came.
    fn of(&self, id: Uuid) -> Vec<ReceivedSpan> {
        let id = id.to_string();
        self.spans()
            .into_iter()
            .filter(|span| span.attribute("messaging.message.id") == Some(id.as_str()))
            .collect()
    }
}

async fn insert(db: &TestDb, event_type: &str, headers: Option<serde_json::Value>) -> Uuid {
    let id = Uuid::new_v4();
    let headers = headers.map(|value| value.to_string());
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at, headers)
             VALUES ($1, $2, 'order-1', '{\"a\": 1}', clock_timestamp(), $3::text::jsonb)",
            &[&id, &event_type, &headers],
        )
        .await
        .expect("insert row");
    id
}

fn trace_headers() -> serde_json::Value {
    serde_json::json!({
        "traceparent": format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01"),
        "tracestate": TRACESTATE,
        "baggage": BAGGAGE,
    })
}

fn exporting(broker: &TestBroker, receiver: &Receiver) -> Vec<(&'static str, String)> {
    let mut env = broker.env();
    env.extend(quick_settings());
    with(
        env,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint()),
            ("OTEL_SERVICE_NAME", "spans-test"),
            // Sent every 100 ms rather than 5 s; the stop flushes the rest.
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
}

/// Stops the relay as a deployment does and waits for it to exit: its
/// spans are all exported by then.
async fn stop(mut relay: RelayProcess) {
    relay.signal("TERM");
    let status = relay.wait(WAIT).await.expect("the relay exits on SIGTERM");
    assert!(status.success(), "exit status {status:?}");
}

fn outcome_of(spans: &[ReceivedSpan]) -> Vec<&str> {
    spans
        .iter()
        .map(|span| span.attribute("outbox.outcome").unwrap_or("none"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_spans_continue_the_rows_trace_and_messages_name_them() {
    let receiver = Receiver::start().await;
    let db = TestDb::migrated_with_headers().await;
    // Bound for `order.*` only: a `lost.*` message comes back unroutable.
    let broker = TestBroker::create("order.*").await;
    let traced = insert(&db, "order.created", Some(trace_headers())).await;
    let untraced = insert(&db, "order.created", None).await;
    let unroutable = insert(&db, "lost.thing", None).await;
    // A header name longer than an AMQP short string.
    let mut long_name = serde_json::Map::new();
    long_name.insert("n".repeat(256), "v".into());
    let uncarriable = insert(&db, "order.created", Some(long_name.into())).await;
    let env = with(exporting(&broker, &receiver), &[("OUTBOX_MAX_ATTEMPTS", "2")]);
    let relay = RelayProcess::start(&db, &env);

    let received = broker.receive(2, WAIT).await;
    assert_eq!(received.len(), 2);
    eventually(
        WAIT,
        "the unroutable and uncarriable rows quarantined",
        || async { db.count("quarantined_at IS NOT NULL").await == 2 },
    )
    .await;
    eventually(WAIT, "both good rows marked published", || async {
        db.count("published_at IS NOT NULL").await == 2
    })
    .await;
    stop(relay).await;

    // The traced row: a producer span of the relay's in the row's trace,
    // child of the producer's span, and named by the message.
    let by_id: HashMap<&str, _> = received.iter().map(|m| (m.message_id.as_str(), m)).collect();
    let message = by_id[traced.to_string().as_str()];
    let traceparent = &message.headers["traceparent"];
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(
        (parts[0], parts[1], parts[3]),
        ("00", TRACE_ID, "01"),
        "{traceparent}"
    );
    assert_ne!(
        parts[2], PRODUCER_SPAN,
        "the message names the relay's span, not the producer's"
    );
    assert_eq!(message.headers["tracestate"], TRACESTATE);
    assert_eq!(message.headers["baggage"], BAGGAGE);

    let spans = receiver.of(traced);
    assert_eq!(spans.len(), 1, "one publish span for one publish: {spans:#?}");
    let span = &spans[0];
    assert_eq!(span.trace_id, TRACE_ID);
    assert_eq!(span.parent_span_id, PRODUCER_SPAN);
    assert_eq!(
        span.span_id, parts[2],
        "the message's traceparent names the publish span"
    );
    assert_eq!(span.kind, SpanKind::Producer as i32);
    assert_eq!(span.name, format!("publish {}", broker.exchange));
    assert_eq!(span.service_name, "spans-test");
    for (name, value) in [
        ("messaging.system", "rabbitmq"),
        ("messaging.operation.type", "send"),
        ("messaging.operation.name", "publish"),
        ("messaging.destination.name", broker.exchange.as_str()),
        ("messaging.message.id", traced.to_string().as_str()),
        ("outbox.outcome", "published"),
        ("outbox.attempt", "1"),
        ("outbox.destination", "default"),
    ] {
        assert_eq!(span.attribute(name), Some(value), "{name} of {span:#?}");
    }
    assert_ne!(span.status_code, StatusCode::Error as i32);
    // Only the conventions' attributes and the relay's own: no code
    // locations, threads or levels.
    assert!(
        span.attributes
            .keys()
            .all(|key| key.starts_with("messaging.") || key.starts_with("outbox.")),
        "{:?}",
        span.attributes.keys()
    );

    // A row that continues no trace: a root span of its own, and the
    // message gets no traceparent the producer did not write.
    let root = receiver.of(untraced);
    assert_eq!(outcome_of(&root), ["published"]);
    assert_eq!(root[0].parent_span_id, "");
    assert_ne!(root[0].trace_id, TRACE_ID);
    assert!(!by_id[untraced.to_string().as_str()]
        .headers
        .contains_key("traceparent"));

    // Returned unroutable twice: retried, then quarantined, each with why.
    let returned = receiver.of(unroutable);
    assert_eq!(outcome_of(&returned), ["retried", "quarantined"], "{returned:#?}");
    for span in &returned {
        assert_eq!(span.status_code, StatusCode::Error as i32);
        assert!(span.status_message.contains("unroutable"), "{span:#?}");
        assert_eq!(span.attribute("error.type"), span.attribute("outbox.outcome"));
    }
    assert_eq!(returned[1].attribute("outbox.attempt"), Some("2"));

    // Refused before sending: quarantined at once.
    let refused = receiver.of(uncarriable);
    assert_eq!(outcome_of(&refused), ["quarantined"], "{refused:#?}");
    assert_eq!(refused[0].status_code, StatusCode::Error as i32);
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deferred_publish_says_so_on_its_span() {
    let receiver = Receiver::start().await;
    let db = TestDb::migrated_with_headers().await;
    // Room for nothing: the broker nacks every message.
    let broker = TestBroker::create_rejecting_beyond("#", 0).await;
    let id = insert(&db, "order.created", Some(trace_headers())).await;
    let relay = RelayProcess::start(&db, &exporting(&broker, &receiver));
    eventually(WAIT, "a deferred publish span", || async {
        outcome_of(&receiver.of(id)).contains(&"deferred")
    })
    .await;
    stop(relay).await;
    let spans = receiver.of(id);
    assert!(
        outcome_of(&spans).iter().all(|outcome| *outcome == "deferred"),
        "{spans:#?}"
    );
    for span in &spans {
        assert_eq!(span.trace_id, TRACE_ID);
        assert_eq!(span.status_code, StatusCode::Error as i32);
        assert_eq!(span.attribute("error.type"), Some("deferred"));
        // A deferral is not the row's attempt: every try is the first.
        assert_eq!(span.attribute("outbox.attempt"), Some("1"));
    }
    assert_eq!(db.count("attempt_count = 0 AND published_at IS NULL").await, 1);
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_exported_and_headers_stay_verbatim_without_the_variables() {
    let receiver = Receiver::start().await;
    let traceparent = format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01");
    // Other OTEL_* variables but no endpoint; then an endpoint with the SDK
    // disabled, and one with the traces exporter `none`.
    let cases: [&[(&'static str, &str)]; 3] = [
        &[
            ("OTEL_SERVICE_NAME", "spans-test"),
            ("OTEL_TRACES_SAMPLER", "always_on"),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint()),
            ("OTEL_SDK_DISABLED", "true"),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint()),
            ("OTEL_TRACES_EXPORTER", "none"),
        ],
    ];
    for case in cases {
        let db = TestDb::migrated_with_headers().await;
        let broker = TestBroker::create("#").await;
        let id = insert(&db, "order.created", Some(trace_headers())).await;
        let mut env = broker.env();
        env.extend(quick_settings());
        let env = with(with(env, &[("OTEL_BSP_SCHEDULE_DELAY", "100")]), case);
        let relay = RelayProcess::start(&db, &env);
        let received = broker.receive(1, WAIT).await;
        assert_eq!(received.len(), 1);
        assert_eq!(received[0].message_id, id.to_string());
        assert_eq!(received[0].headers["traceparent"], traceparent, "{case:?}");
        assert_eq!(received[0].headers["tracestate"], TRACESTATE);
        eventually(WAIT, "the row marked published", || async {
            db.count("published_at IS NOT NULL").await == 1
        })
        .await;
        // An exporting relay would have sent its spans by the time it exits.
        stop(relay).await;
        assert_eq!(receiver.requests(), 0, "nothing exported with {case:?}");
        broker.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collector_that_is_down_never_holds_up_a_publish() {
    // A port nothing listens on: every export is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let db = TestDb::migrated_with_headers().await;
    let broker = TestBroker::create("#").await;
    for _ in 0..300 {
        insert(&db, "order.created", Some(trace_headers())).await;
    }
    let mut env = broker.env();
    env.extend(quick_settings());
    let env = with(
        env,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
        ],
    );
    let relay = RelayProcess::start(&db, &env);
    assert_eq!(broker.receive(300, WAIT).await.len(), 300);
    eventually(WAIT, "every row marked published", || async {
        db.count("published_at IS NOT NULL AND attempt_count = 1").await == 300
    })
    .await;
    // And it still stops cleanly: the last export fails within its timeout.
    stop(relay).await;
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unusable_otel_setting_stops_the_relay_with_its_name() {
    let db = TestDb::migrated().await;
    let output = common::run_to_end(db.relay_command(
        &["run"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ],
    ));
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' is not built into the relay"),
        "{stderr}"
    );
}
