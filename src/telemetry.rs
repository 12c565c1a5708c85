//! Logging set-up: `tracing` to stderr, text or JSON, level from `RUST_LOG`;
//! and, when the `OTEL_*` variables ask for it, the publish spans to an
//! OTLP exporter (see `otel.rs`).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;

use tracing::{Level, Metadata};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::filter::{filter_fn, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::otel::{PUBLISH_LEVEL, PUBLISH_TARGET};
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
    // A second init (tests) keeps the first subscriber.
    let _ = subscriber(format, filter, spans).try_init();
}

/// The subscriber [`init`] installs, with `filter` for the log lines.
///
/// Every layer states the most verbose level it can enable. The global
/// maximum is what `tracing`'s macros test first, and where a layer has
/// no hint it is `TRACE`: the libraries' `trace!` lines then build their
/// fields and reach the subscriber only to be dropped there, and lapin
/// keeps a name for every promise it makes: a fifth of the relay's
/// instructions per event (see docs/performance.md).
fn subscriber(
    format: LogFormat,
    filter: EnvFilter,
    spans: Option<&SdkTracerProvider>,
) -> impl tracing::Subscriber + Send + Sync {
    // The caps are a filter of their own, and'ed with RUST_LOG's rather
    // than directives added to it: a more specific directive in RUST_LOG
    // (`lapin::channels=trace`) would win over an added `lapin=info`. They
    // only ever narrow, so their hint leaves RUST_LOG's in charge.
    let caps = filter_fn(|metadata: &Metadata<'_>| {
        within_caps(metadata.target(), *metadata.level()) && metadata.target() != PUBLISH_TARGET
    })
    .with_max_level_hint(LevelFilter::TRACE);
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Text => lines.boxed(),
        LogFormat::Json => lines.json().flatten_event(true).boxed(),
    };
    let mut layers = vec![lines.with_filter(filter.and(caps)).boxed()];
    if let Some(provider) = spans {
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("outbox-relay"))
                // The conventions' attributes only: no source file, thread,
                // level or busy/idle times on every span.
                .with_location(false)
                .with_tracked_inactivity(false)
                .with_threads(false)
                .with_level(false)
                .with_target(false)
                .with_filter(
                    filter_fn(|metadata: &Metadata<'_>| metadata.target() == PUBLISH_TARGET)
                        .with_max_level_hint(PUBLISH_LEVEL),
                )
                .boxed(),
        );
    }
    // No layer at all where spans are off: an absent optional layer
    // (`Option::None`) counts as interested in everything.
    tracing_subscriber::registry().with(layers)
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

    /// The most verbose level any layer can enable bounds every library's
    /// `trace!` before it builds anything (see [`subscriber`]).
    #[test]
    fn the_subscriber_enables_no_level_beyond_rust_log_and_the_publish_spans() {
        use tracing::Subscriber as _;
        let hint = |directives: &str, spans: Option<&SdkTracerProvider>| {
            subscriber(LogFormat::Text, EnvFilter::new(directives), spans).max_level_hint()
        };
        assert_eq!(hint("warn", None), Some(LevelFilter::WARN));
        assert_eq!(hint("info", None), Some(LevelFilter::INFO));
        assert_eq!(hint("warn,outbox_relay=debug", None), Some(LevelFilter::DEBUG));
        let provider = SdkTracerProvider::builder().build();
        assert_eq!(hint("warn", Some(&provider)), Some(LevelFilter::INFO));
        assert_eq!(hint("trace", Some(&provider)), Some(LevelFilter::TRACE));
        let _ = provider.shutdown();
    }
}
