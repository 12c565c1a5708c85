//! The relay loop's settings as the user gives them, validated into a
//! [`RelayConfig`].

use clap::Args;

use super::{OnPublish, RelayConfig};
use crate::settings::{parse_choice, parse_nonzero_duration, parse_positive, var, ConfigError};
use crate::store::Ordering;

/// PostgreSQL's values of `synchronous_commit`, weakest first.
const SYNCHRONOUS_COMMIT_LEVELS: [&str; 5] = ["off", "local", "remote_write", "on", "remote_apply"];

/// Settings of the relay loop.
#[derive(Debug, Clone, Args)]
pub struct RelaySettings {
    /// Rows a worker claims at once, 1 to 10000 (one statement per batch).
    #[arg(long, env = var::BATCH_SIZE, default_value = "100")]
    pub batch_size: String,

    /// Longest sleep when there is nothing to publish.
    #[arg(long, env = var::POLL_INTERVAL, default_value = "500ms")]
    pub poll_interval: String,

    /// Failed attempts before a row is quarantined.
    #[arg(long, env = var::MAX_ATTEMPTS, default_value = "10")]
    pub max_attempts: String,

    /// What the broker has confirmed by then is published; the rest of
    /// the batch is deferred: published again later, no attempt charged.
    #[arg(long, env = var::PUBLISH_TIMEOUT, default_value = "30s")]
    pub publish_timeout: String,

    /// First retry delay of the exponential backoff.
    #[arg(long, env = var::BACKOFF_BASE, default_value = "1s")]
    pub backoff_base: String,

    /// Cap of the exponential backoff.
    #[arg(long, env = var::BACKOFF_MAX, default_value = "5m")]
    pub backoff_max: String,

    /// `mark` sets `published_at`; `delete` deletes the row once confirmed.
    #[arg(long, env = var::ON_PUBLISH, default_value = "mark")]
    pub on_publish: String,

    /// `none`, or `aggregate` for per-aggregate (created_at, id) order.
    #[arg(long, env = var::ORDERING, default_value = "none")]
    pub ordering: String,

    /// Batches in flight at once in this replica, per source (each claims,
    /// publishes and records on its own), 1 to 64.
    #[arg(long, env = var::WORKERS, default_value = "4")]
    pub workers: String,

    /// A claim stops adding rows once their payloads reach this many bytes
    /// (it always takes at least one row): what one batch holds in memory.
    #[arg(long, env = var::MAX_BATCH_BYTES, default_value = "16777216")]
    pub max_batch_bytes: String,

    /// PostgreSQL's `synchronous_commit` for the relay's own transactions
    /// (leases, marks, reschedules, retention): `off` does not wait for
    /// their WAL flush, as a lost one only publishes rows again.
    #[arg(long, env = var::SYNCHRONOUS_COMMIT, default_value = "off")]
    pub synchronous_commit: String,
}

impl RelaySettings {
    /// Validates the relay-loop settings.
    pub fn validate(&self) -> Result<RelayConfig, ConfigError> {
        let batch_size = parse_positive(var::BATCH_SIZE, &self.batch_size, 10_000)?;
        let poll_interval = parse_nonzero_duration(var::POLL_INTERVAL, &self.poll_interval)?;
        let max_attempts = parse_positive(var::MAX_ATTEMPTS, &self.max_attempts, 1_000_000)?;
        let publish_timeout = parse_nonzero_duration(var::PUBLISH_TIMEOUT, &self.publish_timeout)?;
        let backoff_base = parse_nonzero_duration(var::BACKOFF_BASE, &self.backoff_base)?;
        let backoff_max = parse_nonzero_duration(var::BACKOFF_MAX, &self.backoff_max)?;
        if backoff_max < backoff_base {
            return Err(ConfigError::new(
                var::BACKOFF_MAX,
                format!("must not be shorter than {}", var::BACKOFF_BASE),
            ));
        }
        let on_publish = parse_choice(
            var::ON_PUBLISH,
            &self.on_publish,
            &[("mark", OnPublish::Mark), ("delete", OnPublish::Delete)],
        )?;
        let ordering = parse_choice(
            var::ORDERING,
            &self.ordering,
            &[("none", Ordering::None), ("aggregate", Ordering::Aggregate)],
        )?;
        let workers = parse_positive(var::WORKERS, &self.workers, 64)?;
        let max_batch_bytes = parse_positive(var::MAX_BATCH_BYTES, &self.max_batch_bytes, u32::MAX)?;
        let synchronous_commit = parse_choice(
            var::SYNCHRONOUS_COMMIT,
            &self.synchronous_commit,
            &SYNCHRONOUS_COMMIT_LEVELS.map(|level| (level, level)),
        )?;
        Ok(RelayConfig {
            batch_size,
            poll_interval,
            max_attempts,
            publish_timeout,
            backoff_base,
            backoff_max,
            on_publish,
            ordering,
            workers,
            max_batch_bytes: max_batch_bytes as usize,
            synchronous_commit,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::liveness::{stall_limit, LoopBounds};

    fn relay_settings() -> RelaySettings {
        RelaySettings {
            batch_size: "100".into(),
            poll_interval: "500ms".into(),
            max_attempts: "10".into(),
            publish_timeout: "30s".into(),
            backoff_base: "1s".into(),
            backoff_max: "5m".into(),
            on_publish: "mark".into(),
            ordering: "none".into(),
            workers: "4".into(),
            max_batch_bytes: "16777216".into(),
            synchronous_commit: "off".into(),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let relay = relay_settings().validate().unwrap();
        assert_eq!(relay.batch_size, 100);
        assert_eq!(relay.synchronous_commit, "off");
    }

    #[test]
    fn every_level_of_synchronous_commit_is_postgresqls_own() {
        for level in ["off", "local", "remote_write", "on", "remote_apply"] {
            let relay = RelaySettings {
                synchronous_commit: level.into(),
                ..relay_settings()
            }
            .validate()
            .unwrap();
            assert_eq!(relay.synchronous_commit, level);
        }
    }

    #[test]
    fn the_defaults_tolerate_285_seconds_of_silence() {
        let relay = relay_settings().validate().unwrap();
        let bounds = LoopBounds {
            lease: relay.lease(),
            publish_timeout: relay.publish_timeout,
            poll_interval: relay.poll_interval,
        };
        assert_eq!(stall_limit(bounds), Duration::from_secs(285));
    }

    #[test]
    fn invalid_values_name_their_variable() {
        let cases: Vec<(RelaySettings, &str)> = vec![
            (
                RelaySettings {
                    batch_size: "0".into(),
                    ..relay_settings()
                },
                "OUTBOX_BATCH_SIZE",
            ),
            (
                RelaySettings {
                    batch_size: "many".into(),
                    ..relay_settings()
                },
                "OUTBOX_BATCH_SIZE",
            ),
            (
                RelaySettings {
                    poll_interval: "fast".into(),
                    ..relay_settings()
                },
                "OUTBOX_POLL_INTERVAL",
            ),
            (
                RelaySettings {
                    max_attempts: "0".into(),
                    ..relay_settings()
                },
                "OUTBOX_MAX_ATTEMPTS",
            ),
            (
                RelaySettings {
                    publish_timeout: "0".into(),
                    ..relay_settings()
                },
                "OUTBOX_PUBLISH_TIMEOUT",
            ),
            (
                RelaySettings {
                    backoff_max: "1ms".into(),
                    ..relay_settings()
                },
                "OUTBOX_BACKOFF_MAX",
            ),
            (
                RelaySettings {
                    on_publish: "archive".into(),
                    ..relay_settings()
                },
                "OUTBOX_ON_PUBLISH",
            ),
            (
                RelaySettings {
                    ordering: "global".into(),
                    ..relay_settings()
                },
                "OUTBOX_ORDERING",
            ),
            (
                RelaySettings {
                    synchronous_commit: "sometimes".into(),
                    ..relay_settings()
                },
                "OUTBOX_SYNCHRONOUS_COMMIT",
            ),
        ];
        for (settings, variable) in cases {
            assert_eq!(settings.validate().unwrap_err().variable, variable);
        }
    }
}
