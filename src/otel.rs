//! Spans over OTLP, opt-in through the standard `OTEL_*` variables.
//!
//! With `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! set, every message the relay publishes gets a `publish` span (OpenTelemetry
//! messaging conventions, kind producer) that continues the trace of its
//! row's `traceparent`, ends with the row's outcome on it, and becomes the
//! message's `traceparent`, so a consumer's span is a child of the publish.
//! The producer's `tracestate` and `baggage` are carried unchanged.
//!
//! One span per message rather than one per batch with links: a consumer
//! continues the trace of the message it got, so the span it names must be
//! that message's own; and a per-message span costs about as much as the
//! link a batch span would need for it (docs/performance.md, "Tracing").
//!
//! Without the variables nothing is set up: no exporter, no thread, no span
//! is ever created ([`enabled`] is one relaxed atomic load per batch part),
//! and messages carry the producer's `traceparent` verbatim.
//!
//! Spans are `tracing` spans of the target [`PUBLISH_TARGET`], which only the
//! OpenTelemetry layer sees (see `telemetry.rs`); the rest of the relay's
//! spans stay in the logs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Status, TraceContextExt};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use uuid::Uuid;

use crate::event::Event;
use crate::headers::{Headers, TRACEPARENT};
use crate::settings::ConfigError;

/// The `tracing` target of the publish spans: the OpenTelemetry layer takes
/// these and nothing else, the log layer never these.
pub const PUBLISH_TARGET: &str = "outbox_relay::publish";

/// The level of the publish spans (`info_span!` below), the most verbose
/// the OpenTelemetry layer enables.
pub const PUBLISH_LEVEL: tracing::level_filters::LevelFilter = tracing::level_filters::LevelFilter::INFO;

/// Set once the exporter is up; read before a batch part is published.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether publish spans are exported.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// What the `OTEL_*` variables ask for: `None` when they leave export off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportSettings {
    /// OTLP over HTTP, protobuf or JSON.
    pub protocol: Protocol,
    /// Whether the service name is the relay's default (`outbox-relay`):
    /// neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one.
    pub default_service_name: bool,
}

/// Reads the standard variables through `var` (the environment, or a test's
/// map). Export is on when an OTLP endpoint is set, unless
/// `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`; the endpoint,
/// headers, timeout, sampler and resource variables are the SDK's own.
pub fn export_settings(var: impl Fn(&str) -> Option<String>) -> Result<Option<ExportSettings>, ConfigError> {
    let set = |name: &str| {
        var(name)
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    };
    let endpoint_variable = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .into_iter()
    .find(|name| set(name).is_some());
    let Some(endpoint_variable) = endpoint_variable else {
        return Ok(None);
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match set("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => {
            return Err(ConfigError::new(
                "OTEL_TRACES_EXPORTER",
                format!("'{}' is not one of otlp, none", other.escape_debug()),
            ))
        }
    }
    let endpoint = set(endpoint_variable).unwrap_or_default();
    // The value is not repeated: an endpoint may carry a token in its query.
    if !matches!(
        url::Url::parse(&endpoint)
            .map(|url| url.scheme().to_owned())
            .as_deref(),
        Ok("http" | "https")
    ) {
        return Err(ConfigError::new(
            if endpoint_variable == "OTEL_EXPORTER_OTLP_ENDPOINT" {
                "OTEL_EXPORTER_OTLP_ENDPOINT"
            } else {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
            },
            "is not an http:// or https:// URL (OTLP over HTTP, e.g. http://collector:4318)",
        ));
    }
    let protocol_variable = [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ]
    .into_iter()
    .find(|name| set(name).is_some());
    let protocol = match protocol_variable {
        None => Protocol::HttpBinary,
        Some(name) => match set(name).unwrap_or_default().as_str() {
            "http/protobuf" => Protocol::HttpBinary,
            "http/json" => Protocol::HttpJson,
            "grpc" => {
                return Err(ConfigError::new(
                    static_protocol_name(name),
                    "'grpc' is not built into the relay; use http/protobuf (a collector's port 4318)",
                ))
            }
            other => {
                return Err(ConfigError::new(
                    static_protocol_name(name),
                    format!(
                        "'{}' is not one of http/protobuf, http/json",
                        other.escape_debug()
                    ),
                ))
            }
        },
    };
    let default_service_name = set("OTEL_SERVICE_NAME").is_none()
        && !set("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attributes| {
            attributes
                .split(',')
                .any(|pair| pair.split('=').next().map(str::trim) == Some("service.name"))
        });
    Ok(Some(ExportSettings {
        protocol,
        default_service_name,
    }))
}

fn static_protocol_name(name: &str) -> &'static str {
    if name == "OTEL_EXPORTER_OTLP_PROTOCOL" {
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    } else {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    }
}

/// Builds the exporter and its batch processor (a thread of the SDK's,
/// sending every `OTEL_BSP_SCHEDULE_DELAY`, 5 s by default) and marks export
/// on. The provider must be shut down at exit to send what is pending.
pub fn start(settings: ExportSettings) -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(settings.protocol)
        .build()
        .map_err(|e| format!("cannot set up the OTLP span exporter: {e}"))?;
    let mut resource = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if settings.default_service_name {
        resource = resource.with_service_name("outbox-relay");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    ENABLED.store(true, Ordering::Relaxed);
    Ok(provider)
}

/// The messaging system's name as the conventions spell it.
fn messaging_system(sink_kind: &str) -> &str {
    match sink_kind {
        "sqs" => "aws_sqs",
        other => other,
    }
}

/// How a published row ended, on its span.
#[derive(Debug, Clone, Copy)]
pub enum SpanOutcome<'a> {
    /// The broker confirmed it.
    Published,
    /// Refused for its own sake: tried again later.
    Retried(&'a str),
    /// Refused for good, or out of attempts.
    Quarantined(&'a str),
    /// The broker or the network failed it: published again, no attempt charged.
    Deferred(&'a str),
}

impl SpanOutcome<'_> {
    fn word(&self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Retried(_) => "retried",
            Self::Quarantined(_) => "quarantined",
            Self::Deferred(_) => "deferred",
        }
    }
}

/// The publish spans of one destination's part of a batch, by event id.
/// A span ends when it is dropped, with or without an outcome.
#[derive(Default)]
pub struct PublishSpans {
    spans: HashMap<Uuid, tracing::Span>,
}

/// Where a message goes, for its span.
pub struct SpanDestination<'a> {
    /// The sink's kind (`rabbitmq`, `sqs`, `nats`, `kafka`).
    pub sink_kind: &'a str,
    /// The relay's name of the destination (`default` without a file).
    pub name: &'a str,
}

impl PublishSpans {
    /// Starts a span per event when export is on (none otherwise), and
    /// gives each message whose row continues a valid trace the span as its
    /// `traceparent`. `destination_of` names the broker's destination of an
    /// event (exchange, queue, subject, topic).
    pub fn start(
        events: &mut [Event],
        destination: SpanDestination<'_>,
        destination_of: impl Fn(&Event) -> String,
    ) -> Self {
        if !enabled() {
            return Self::default();
        }
        let propagator = TraceContextPropagator::new();
        let system = messaging_system(destination.sink_kind);
        let spans = events
            .iter_mut()
            .map(|event| {
                let target = destination_of(event);
                let name = format!("publish {target}");
                let span = tracing::info_span!(
                    target: "outbox_relay::publish",
                    parent: None,
                    "publish",
                    otel.name = name.as_str(),
                    otel.kind = "producer",
                    messaging.system = system,
                    messaging.operation.type = "send",
                    messaging.operation.name = "publish",
                    messaging.destination.name = target.as_str(),
                    messaging.message.id = %event.id,
                    outbox.destination = destination.name,
                    outbox.attempt = i64::from(event.attempt_count),
                );
                let parent = propagator.extract(&HeaderExtractor(&event.headers));
                let continues = parent.span().span_context().is_valid();
                if continues {
                    // Cannot fail: the span is new and the layer sees it.
                    let _ = span.set_parent(parent);
                }
                let context = span.context();
                let own = context.span().span_context().clone();
                if continues && own.is_valid() {
                    event.headers.replace(
                        TRACEPARENT,
                        format!(
                            "00-{}-{}-{:02x}",
                            own.trace_id(),
                            own.span_id(),
                            own.trace_flags().to_u8()
                        ),
                    );
                }
                (event.id, span)
            })
            .collect();
        Self { spans }
    }

    /// Puts the outcome on the row's span and ends it.
    pub fn end(&mut self, id: &Uuid, outcome: SpanOutcome<'_>) {
        let Some(span) = self.spans.remove(id) else {
            return;
        };
        span.set_attribute("outbox.outcome", outcome.word());
        match outcome {
            SpanOutcome::Published => {}
            SpanOutcome::Retried(reason)
            | SpanOutcome::Quarantined(reason)
            | SpanOutcome::Deferred(reason) => {
                span.set_attribute("error.type", outcome.word());
                span.set_status(Status::error(reason.to_owned()));
            }
        }
    }

    /// Whether any span is open (export is on and rows were published).
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

/// A row's headers as a W3C trace context carrier.
struct HeaderExtractor<'a>(&'a Headers);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Option<ExportSettings>, ConfigError> {
        let vars: HashMap<String, String> = pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        export_settings(|name| vars.get(name).cloned())
    }

    #[test]
    fn export_is_off_without_an_endpoint_and_when_disabled() {
        assert_eq!(settings(&[]), Ok(None));
        assert_eq!(settings(&[("OTEL_SERVICE_NAME", "orders")]), Ok(None));
        assert_eq!(settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]), Ok(None));
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        assert_eq!(settings(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]), Ok(None));
        assert_eq!(settings(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
        let on = settings(&[endpoint]).unwrap().unwrap();
        assert_eq!(on.protocol, Protocol::HttpBinary);
        assert!(on.default_service_name);
        let traces_only = settings(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c/v1/traces")]);
        assert!(traces_only.unwrap().is_some());
    }

    #[test]
    fn protocols_other_than_http_are_refused_by_name() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        let json = settings(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]);
        assert_eq!(json.unwrap().unwrap().protocol, Protocol::HttpJson);
        let grpc = settings(&[endpoint, ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")]).unwrap_err();
        assert_eq!(grpc.variable, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
        assert!(grpc.problem.contains("use http/protobuf"), "{grpc}");
        let odd = settings(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")]).unwrap_err();
        assert_eq!(
            odd.to_string(),
            "OTEL_EXPORTER_OTLP_PROTOCOL: 'carrier-pigeon' is not one of http/protobuf, http/json"
        );
        let exporter = settings(&[endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")]).unwrap_err();
        assert_eq!(exporter.variable, "OTEL_TRACES_EXPORTER");
    }

    #[test]
    fn a_bad_endpoint_is_named_without_its_value() {
        let error = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318?token=s3cret")]).unwrap_err();
        assert_eq!(error.variable, "OTEL_EXPORTER_OTLP_ENDPOINT");
        assert!(!error.to_string().contains("s3cret"), "{error}");
    }

    #[test]
    fn a_service_name_of_the_operators_wins() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        let named = settings(&[endpoint, ("OTEL_SERVICE_NAME", "orders-relay")]);
        assert!(!named.unwrap().unwrap().default_service_name);
        let attributed = settings(&[
            endpoint,
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "team=sales, service.name=orders-relay",
            ),
        ]);
        assert!(!attributed.unwrap().unwrap().default_service_name);
        let other = settings(&[endpoint, ("OTEL_RESOURCE_ATTRIBUTES", "team=sales")]);
        assert!(other.unwrap().unwrap().default_service_name);
    }

    #[test]
    fn sqs_is_named_as_the_conventions_name_it() {
        assert_eq!(messaging_system("sqs"), "aws_sqs");
        assert_eq!(messaging_system("rabbitmq"), "rabbitmq");
    }

    #[test]
    fn without_export_no_span_is_made_and_headers_stay() {
        let mut events = vec![Event {
            id: Uuid::new_v4(),
            causation_id: None,
            event_type: "order.created".into(),
            aggregate_id: "1".into(),
            payload: "{}".into(),
            created_at: chrono::Utc::now(),
            attempt_count: 1,
            headers: Headers::from_pairs(vec![(
                TRACEPARENT.into(),
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            )]),
        }];
        let before = events[0].headers.clone();
        let destination = SpanDestination {
            sink_kind: "rabbitmq",
            name: "default",
        };
        let spans = PublishSpans::start(&mut events, destination, |_| "orders".to_owned());
        assert!(spans.is_empty());
        assert_eq!(events[0].headers, before);
    }
}
