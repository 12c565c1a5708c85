//! Logging set-up: `tracing` to stderr, text or JSON, level from `RUST_LOG`;
//! and, when the `OTEL_*` variables ask for it, the publish spans to an
//! OTLP exporter (see `otel.rs`).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;

use tracing::{Level, Metadata};
use tracing_subscriber::filter::{filter_fn, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::otel::PUBLISH_TARGET;
use crate::settings::{parse_choice, var, ConfigError};

/// Log output format (`OUTBOX_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Parses `OUTBOX_LOG_FORMAT`.
pub fn parse_log_format(raw: &str) -> Result<LogFormat, ConfigError> {
    parse_choice(
        var::LOG_FORMAT,
        raw,
        &[("text", LogFormat::Text), ("json", LogFormat::Json)],
    )
}

/// Libraries whose own log lines carry credentials or payloads past some
/// level, and the most verbose level each may log at, whatever `RUST_LOG`
/// says: credentials and payloads never reach the logs (the contract), and
/// an operator turning on `RUST_LOG=trace` to chase a problem must not leak
/// them. The first matching prefix applies, so the narrower come first.
const CAPS: &[(&str, Level)] = &[
    // Each returned (unroutable) message, in full with its payload, at
    // warn; the relay reports returns itself, without the payload.
    ("lapin::returned_messages", Level::ERROR),
    // At trace lapin logs every frame it sends or receives: the StartOk
    // frame carries the PLAIN credentials, a publish the payload.
    ("lapin", Level::INFO),
    // amq-protocol-tcp logs the AMQP URI, password included, at trace.
    ("amq_protocol", Level::INFO),
    // At trace the AWS SDK logs whole requests and responses (message
    // bodies, the session token header), sigv4 the request it signs, and
    // aws-config a credential_process command line unredacted.
    ("aws_smithy_runtime", Level::DEBUG),
    ("aws_sigv4", Level::DEBUG),
    ("aws_config", Level::DEBUG),
];

/// Whether a line of `target` at `level` passes [`CAPS`].
fn within_caps(target: &str, level: Level) -> bool {
    CAPS.iter()
        .find(|(prefix, _)| target.starts_with(prefix))
        .is_none_or(|(_, max)| level <= *max)
}

/// Installs the global subscriber. The default level is `info`. With
/// `spans`, the publish spans go to its tracer, and only they: the other
/// spans of the relay are for the logs.
pub fn init(format: LogFormat, spans: Option<&SdkTracerProvider>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // The caps are a filter of their own, and'ed with RUST_LOG's rather
    // than directives added to it: a more specific directive in RUST_LOG
    // (`lapin::channels=trace`) would win over an added `lapin=info`.
    let filter = filter.and(filter_fn(|metadata: &Metadata<'_>| {
        within_caps(metadata.target(), *metadata.level()) && metadata.target() != PUBLISH_TARGET
    }));
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let layer = match format {
        LogFormat::Text => layer.boxed(),
        LogFormat::Json => layer.json().flatten_event(true).boxed(),
    };
    let spans = spans.map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("outbox-relay"))
            // The conventions' attributes only: no source file, thread,
            // level or busy/idle times on every span.
            .with_location(false)
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_level(false)
            .with_target(false)
            .with_filter(filter_fn(|metadata: &Metadata<'_>| {
                metadata.target() == PUBLISH_TARGET
            }))
    });
    // A second init (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .with(spans)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_format_names_the_accepted_words() {
        assert_eq!(parse_log_format("json"), Ok(LogFormat::Json));
        let error = parse_log_format("xml").unwrap_err();
        assert_eq!(
            error.to_string(),
            "OUTBOX_LOG_FORMAT: 'xml' is not one of text, json"
        );
    }

    #[test]
    fn amqp_and_aws_internals_are_capped_and_the_rest_follows_rust_log() {
        assert!(!within_caps("lapin::channels", Level::TRACE));
        assert!(!within_caps("lapin::channels", Level::DEBUG));
        assert!(within_caps("lapin::channels", Level::INFO));
        assert!(!within_caps("lapin::returned_messages", Level::WARN));
        assert!(within_caps("lapin::returned_messages", Level::ERROR));
        assert!(!within_caps("amq_protocol_tcp", Level::TRACE));
        assert!(!within_caps(
            "aws_smithy_runtime::client::orchestrator",
            Level::TRACE
        ));
        assert!(within_caps(
            "aws_smithy_runtime::client::orchestrator",
            Level::DEBUG
        ));
        assert!(within_caps("outbox_relay::relay", Level::TRACE));
        assert!(within_caps("tokio_postgres::query", Level::TRACE));
    }
}
