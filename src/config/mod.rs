//! The validated [`Config`] of `outbox-relay run`, assembled from what each
//! part validated of its own settings.
//!
//! Each part owns its settings and their validation (the store's in
//! `store`, each sink's in its folder, the loop's in `relay`, the HTTP
//! server's in `http`, retention's in `maintenance::retention`), and what
//! they share sits in the leaf `settings`. So this module imports the
//! parts and no part imports it: adding a setting touches its part, not a
//! hub every feature edits.

use std::net::SocketAddr;
use std::time::Duration;

use crate::cloudevents::MessageFormat;
use crate::relay::RelayConfig;
use crate::sink::SinkConfig;
use crate::store::{DatabaseConfig, Endpoint};

/// Everything `outbox-relay run` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Database and table.
    pub database: DatabaseConfig,
    /// Where to LISTEN for new rows; `None` polls only.
    pub listen: Option<Endpoint>,
    /// Sink.
    pub sink: SinkConfig,
    /// How events become messages on the sink.
    pub format: MessageFormat,
    /// The relay loop.
    pub relay: RelayConfig,
    /// Age after which published rows are deleted; `None` keeps them.
    pub retention: Option<Duration>,
    /// Listen address of the HTTP endpoints.
    pub http_addr: SocketAddr,
}

#[cfg(test)]
mod tests;
