//! Admin commands: status, quarantine list/release, replay.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::CliError;
use crate::config::DatabaseConfig;

/// `outbox-relay status [--json]`.
pub async fn status(_database: DatabaseConfig, _json: bool) -> Result<(), CliError> {
    Err(CliError::Failed(anyhow::anyhow!("status is not available yet")))
}

/// `outbox-relay quarantine list [--json]`.
pub async fn quarantine_list(_database: DatabaseConfig, _json: bool) -> Result<(), CliError> {
    Err(CliError::Failed(anyhow::anyhow!(
        "quarantine list is not available yet"
    )))
}

/// `outbox-relay quarantine release <ID>... | --all`.
pub async fn quarantine_release(
    _database: DatabaseConfig,
    _ids: Vec<Uuid>,
    _all: bool,
) -> Result<(), CliError> {
    Err(CliError::Failed(anyhow::anyhow!(
        "quarantine release is not available yet"
    )))
}

/// `outbox-relay replay --since … [--until …] [--event-type …]`.
pub async fn replay(
    _database: DatabaseConfig,
    _since: DateTime<Utc>,
    _until: Option<DateTime<Utc>>,
    _event_type: Option<String>,
) -> Result<(), CliError> {
    Err(CliError::Failed(anyhow::anyhow!("replay is not available yet")))
}
