//! Logging set-up: `tracing` to stderr, text or JSON, level from `RUST_LOG`.

use tracing_subscriber::EnvFilter;

/// Log output format (`OUTBOX_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. The default level is `info`.
pub fn init(format: LogFormat) {
    // lapin logs every returned (unroutable) message in full, payload
    // included, at warn; the relay reports those itself without the payload.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive(
            "lapin::returned_messages=error"
                .parse()
                .expect("a constant, valid directive"),
        );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
