//! `outbox-relay migrate`: the embedded migrations, applied once per table.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::StoreError;
use super::TableName;

/// One embedded migration: a version, a name and SQL with `{table}` (and
/// index-name) placeholders.
#[derive(Debug)]
pub struct Migration {
    /// Applied in ascending order; recorded per table once applied.
    pub version: i32,
    /// File name, for the history table and logs.
    pub name: &'static str,
    sql: &'static str,
}

/// A migration embedded from `migrations/`, named after its file.
macro_rules! migration {
    ($version:literal, $file:literal) => {
        Migration {
            version: $version,
            name: $file,
            sql: include_str!(concat!("../../migrations/", $file)),
        }
    };
}

/// Every migration, in order. The files are idempotent on their own
/// (`IF NOT EXISTS`), so a table created by hand or by an older relay is
/// brought up to date rather than rejected.
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001_outbox_table.sql"),
    migration!(2, "0002_relay_columns.sql"),
    migration!(3, "0003_indexes.sql"),
    migration!(4, "0004_aggregate_order_index.sql"),
    migration!(5, "0005_notify_trigger.sql"),
    migration!(6, "0006_gauges_state.sql"),
    migration!(7, "0007_claim_paths.sql"),
];

/// The state table of the gauges (0006), beside the outbox table.
pub const GAUGES_TABLE: &str = "outbox_relay_gauges";

impl Migration {
    fn render(&self, table: &TableName) -> String {
        render(self.sql, table)
    }
}

/// Fills the placeholders of migration and trigger SQL for one table.
fn render(sql: &str, table: &TableName) -> String {
    sql.replace("{table}", &table.quoted())
        .replace("{gauges_table}", &table.beside(GAUGES_TABLE))
        .replace("{pending_index}", &table.derived("pending_idx"))
        .replace("{quarantined_index}", &table.derived("quarantined_idx"))
        .replace("{published_index}", &table.derived("published_idx"))
        .replace("{aggregate_index}", &table.derived("aggregate_idx"))
        .replace("{untried_index}", &table.derived("untried_idx"))
        .replace("{tried_index}", &table.derived("tried_idx"))
        .replace("{notify_function}", &table.qualified_derived("relay_notify"))
        .replace("{notify_trigger}", &table.derived("relay_notify"))
        .replace(
            "{notify_channel_literal}",
            &format!("'{}'", table.notify_channel()),
        )
}

/// Applies the migrations `table` has not had yet; returns the names applied.
///
/// Safe under concurrent replicas: everything runs in one transaction behind
/// a transaction-level advisory lock, so a second `migrate` waits and then
/// finds nothing left to do. The same holds through a transaction-pooling
/// proxy: one transaction keeps one server connection, the lock ends with
/// it, and every statement is sent unnamed (no prepared statement outlives
/// its transaction), so `migrate` needs no direct URL. `lock_timeout` keeps
/// a migration that queues behind a long producer transaction from blocking
/// the producer's writes for long: it fails instead, and can be retried.
///
/// `notify_trigger` installs (or removes) the NOTIFY trigger that wakes idle
/// relays; it is applied on every run, and only touches the table when the
/// trigger's presence has to change.
pub async fn migrate(
    client: &mut Client,
    table: &TableName,
    notify_trigger: bool,
) -> Result<Vec<&'static str>, StoreError> {
    let schema_sql = table
        .schema()
        .map(|schema| format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";"))
        .unwrap_or_default();
    let history = history_table(table);
    let tx = client.transaction().await?;
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '10s';
         SET LOCAL statement_timeout = 0;
         SET LOCAL client_min_messages = warning;
         SELECT pg_advisory_xact_lock(hashtext('outbox-relay migrate'));
         {schema_sql}
         CREATE TABLE IF NOT EXISTS {history} (
             table_name  TEXT NOT NULL,
             version     INTEGER NOT NULL,
             name        TEXT NOT NULL,
             applied_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
             PRIMARY KEY (table_name, version)
         );"
    ))
    .await?;
    let applied: Vec<i32> = tx
        .query_typed(
            &format!("SELECT version FROM {history} WHERE table_name = $1"),
            &[(&table.name(), Type::TEXT)],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut done = Vec::new();
    for migration in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        tx.batch_execute(&migration.render(table)).await?;
        tx.execute_typed(
            &format!("INSERT INTO {history} (table_name, version, name) VALUES ($1, $2, $3)"),
            &[
                (&table.name(), Type::TEXT),
                (&migration.version, Type::INT4),
                (&migration.name, Type::TEXT),
            ],
        )
        .await?;
        done.push(migration.name);
    }
    // The NOTIFY function names its channel in its body. Re-creating it
    // (no lock on the outbox table) keeps it on the channel relays listen
    // to, should the channel's derivation change after it was created.
    if let Some(notify) = MIGRATIONS
        .iter()
        .find(|m| m.version == 5 && applied.contains(&m.version))
    {
        tx.batch_execute(&notify.render(table)).await?;
    }
    let trigger_name = table.derived("relay_notify");
    let installed: bool = tx
        .query_typed_one(
            include_str!("sql/notify_trigger_exists.sql"),
            &[
                (&table.quoted(), Type::TEXT),
                (&trigger_name.trim_matches('"'), Type::TEXT),
            ],
        )
        .await?
        .get(0);
    if notify_trigger && !installed {
        tx.batch_execute(&render(include_str!("sql/notify_trigger_create.sql"), table))
            .await?;
        done.push("NOTIFY trigger installed");
    } else if !notify_trigger && installed {
        tx.batch_execute(&render(include_str!("sql/notify_trigger_drop.sql"), table))
            .await?;
        done.push("NOTIFY trigger removed");
    }
    tx.commit().await?;
    Ok(done)
}

/// The migration history lives beside the outbox table, in its schema.
fn history_table(table: &TableName) -> String {
    match table.schema() {
        Some(schema) => format!("\"{schema}\".\"outbox_relay_migrations\""),
        None => "\"outbox_relay_migrations\"".to_owned(),
    }
}
