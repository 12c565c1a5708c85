//! `outbox-relay migrate`: the embedded migrations, applied once per table.

mod indexes;
mod statements;

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};
use tracing::{info, warn};

use super::partitions::{self, Granularity};
use super::{Pooler, StoreError, TableName};
use indexes::Build;
use statements::{IndexPlan, Statement};

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
            sql: include_str!(concat!("../../../migrations/", $file)),
        }
    };
}

/// Every migration, in order. The files are idempotent on their own
/// (`IF NOT EXISTS`), so a table created by hand or by an older relay is
/// brought up to date rather than rejected. A file's `CREATE INDEX` and
/// `DROP INDEX` statements are not run with the rest of it: `migrate`
/// builds (and drops) indexes concurrently afterwards, and checks them on
/// every run, so every index must be named (a `{placeholder}`).
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001_outbox_table.sql"),
    migration!(2, "0002_relay_columns.sql"),
    migration!(3, "0003_indexes.sql"),
    migration!(4, "0004_aggregate_order_index.sql"),
    migration!(5, "0005_notify_trigger.sql"),
    migration!(6, "0006_gauges_state.sql"),
    migration!(7, "0007_claim_paths.sql"),
    migration!(8, "0008_hot_lease.sql"),
    migration!(9, "0009_lease_room.sql"),
];

/// The state table of the gauges (0006), beside the outbox table.
pub const GAUGES_TABLE: &str = "outbox_relay_gauges";

impl Migration {
    /// The file's statements, classified.
    fn statements(&self) -> Result<Vec<Statement<'static>>, StoreError> {
        statements::split(self.sql)
            .into_iter()
            .map(|statement| {
                statements::classify(statement)
                    .map_err(|why| StoreError::Migration(format!("{}: {why}", self.name)))
            })
            .collect()
    }

    /// The file without its index statements (those are [`indexes`]'
    /// business), rendered for `table`: what runs in the transaction.
    ///
    /// On a partitioned table, storage parameters (`ALTER TABLE … SET (…)`)
    /// are left out: PostgreSQL refuses them on the parent, and the
    /// partitions are created with them.
    fn catalog_sql(&self, table: &TableName, partitioned: bool) -> Result<String, StoreError> {
        let catalog: Vec<String> = self
            .statements()?
            .into_iter()
            .filter_map(|statement| match statement {
                Statement::Catalog(sql) if partitioned && sets_storage_parameters(sql) => None,
                Statement::Catalog(sql) => Some(render(sql, table)),
                Statement::CreateIndex(_) | Statement::DropIndex(_) => None,
            })
            .collect();
        Ok(catalog.join(";\n"))
    }
}

/// Whether a catalog statement sets the table's storage parameters.
fn sets_storage_parameters(sql: &str) -> bool {
    let words: Vec<&str> = statements_words(sql);
    words.len() >= 4
        && words[0].eq_ignore_ascii_case("ALTER")
        && words[1].eq_ignore_ascii_case("TABLE")
        && words[3].eq_ignore_ascii_case("SET")
        && words.get(4).is_some_and(|word| word.starts_with('('))
}

/// The words of a statement, comments left out.
fn statements_words(sql: &str) -> Vec<&str> {
    sql.lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .flat_map(str::split_whitespace)
        .collect()
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
        .replace("{fresh_index}", &table.derived("fresh_idx"))
        .replace("{retry_index}", &table.derived("retry_idx"))
        .replace("{notify_function}", &table.qualified_derived("relay_notify"))
        .replace("{notify_trigger}", &table.derived("relay_notify"))
        .replace("{default_partition}", &partitions::default_partition(table))
        .replace(
            "{notify_channel_literal}",
            &format!("'{}'", table.notify_channel()),
        )
}

/// Brings `table` up to date; returns what it did, for the log.
///
/// Two phases, so that producers are never held up for longer than a
/// catalog change takes:
///
/// 1. **Catalog changes** (the table, column adds and defaults,
///    fillfactor, the NOTIFY function and trigger) of the migrations the
///    history table has not recorded, in one transaction. They take the
///    table's ACCESS EXCLUSIVE lock, but none rewrites rows, so it is held
///    for milliseconds; `lock_timeout` (10 s) makes a change that queues
///    behind a long producer transaction give up rather than block the
///    producers queued behind it; a re-run picks up where it stopped.
/// 2. **Indexes**, [`indexes::ensure`]d on every run whatever the history
///    says: each one every migration wants is looked up by its expected
///    name and built `CONCURRENTLY` if missing, or dropped and rebuilt if
///    an interrupted build left it invalid. This also repairs tables whose
///    index names older versions cut short and never created.
///
/// Concurrent runs are serialised by a session advisory lock on a
/// dedicated connection. Behind a transaction pooler
/// ([`Pooler::Transaction`]) there are no session locks and a
/// `CONCURRENTLY` build cannot be held to one server connection, so
/// everything, index builds included, runs in one transaction behind a
/// transaction-level advisory lock, as before; on a large table run
/// `migrate` with a direct URL instead (docs/operations.md).
///
/// `notify_trigger` installs (or removes) the NOTIFY trigger that wakes idle
/// relays; it is applied on every run, and only touches the table when the
/// trigger's presence has to change.
///
/// `partitioned` (`migrate --partitioned daily|hourly`) creates the table
/// partitioned by range of `created_at` when it does not exist yet, with
/// a DEFAULT partition and the partitions of the next days or hours; an
/// existing plain table is refused, never converted (docs/operations.md
/// says how to convert one without downtime). An existing partitioned
/// table is found by itself, flag or not: its indexes are built on the
/// parent, which cascades them to every partition, without
/// `CONCURRENTLY`, which PostgreSQL does not support on a partitioned
/// table.
pub async fn migrate(
    client: &mut Client,
    table: &TableName,
    notify_trigger: bool,
    pooler: Pooler,
    partitioned: Option<Granularity>,
) -> Result<Vec<String>, StoreError> {
    let plan = index_plan(table)?;
    match pooler {
        Pooler::Transaction => {
            let tx = client.transaction().await?;
            tx.batch_execute(include_str!("../sql/migrate_lock_transaction.sql"))
                .await?;
            let mut done = apply_catalog(&tx, table, notify_trigger, partitioned).await?;
            let built = indexes::ensure(&tx, table, &plan, Build::InTransaction).await?;
            if !built.is_empty() {
                warn!(
                    "indexes were built inside a transaction, through the transaction pooler: \
                     writes to the table waited for each build; on a large table run migrate \
                     with a direct database URL (OUTBOX_DATABASE_POOLER=none)"
                );
            }
            done.extend(built);
            tx.commit().await?;
            done.extend(create_initial_partitions(client, table, partitioned).await?);
            Ok(done)
        }
        Pooler::None => {
            // The session may wait as long as it takes: while it waits for
            // the lock it holds nothing, and an index build waits only for
            // transactions already open on the table, never blocking writes.
            client
                .batch_execute("SET statement_timeout = 0; SET lock_timeout = 0")
                .await?;
            lock_session(client).await?;
            let result = async {
                let started = std::time::Instant::now();
                let tx = client.transaction().await?;
                let mut done = apply_catalog(&tx, table, notify_trigger, partitioned).await?;
                tx.commit().await?;
                // How long producers could have waited for this run.
                info!(
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "catalog changes committed"
                );
                let build = if partitions::is_partitioned(&*client, table).await? {
                    Build::InTransaction
                } else {
                    Build::Concurrently
                };
                done.extend(indexes::ensure(&*client, table, &plan, build).await?);
                done.extend(create_initial_partitions(client, table, partitioned).await?);
                Ok::<_, StoreError>(done)
            }
            .await;
            // Ending the session would release the lock too; this is for a
            // connection that lives on.
            let unlocked = client
                .batch_execute(include_str!("../sql/migrate_unlock.sql"))
                .await;
            let done = result?;
            unlocked?;
            Ok(done)
        }
    }
}

/// How often a waiting `migrate` asks for the lock again.
const LOCK_POLL: Duration = Duration::from_millis(250);

/// Takes the session advisory lock that serialises `migrate` runs, by
/// asking again until it is free rather than waiting inside one statement:
/// a waiting `pg_advisory_lock` holds a snapshot, and the running
/// `migrate`'s `CREATE INDEX CONCURRENTLY` waits for every older snapshot
/// to go, so the two would wait for each other (a deadlock PostgreSQL
/// resolves by failing one of them).
async fn lock_session(client: &Client) -> Result<(), StoreError> {
    let mut waiting = false;
    loop {
        let locked: bool = client
            .query_typed_one(include_str!("../sql/migrate_try_lock.sql"), &[])
            .await?
            .get(0);
        if locked {
            return Ok(());
        }
        if !waiting {
            info!("another migrate is running: waiting for it to finish");
            waiting = true;
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
}

/// Phase 1: the catalog changes of the migrations not applied yet, each
/// recorded in the history table, and the NOTIFY trigger as the setting
/// says; in the caller's transaction, under a 10 s `lock_timeout`.
async fn apply_catalog(
    tx: &Transaction<'_>,
    table: &TableName,
    notify_trigger: bool,
    partitioned: Option<Granularity>,
) -> Result<Vec<String>, StoreError> {
    let schema_sql = table
        .schema()
        .map(|schema| format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";"))
        .unwrap_or_default();
    let history = history_table(table);
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '10s';
         SET LOCAL statement_timeout = 0;
         SET LOCAL client_min_messages = warning;
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
    if let Some(granularity) = partitioned {
        let exists: bool = tx
            .query_typed_one(
                "SELECT to_regclass($1) IS NOT NULL",
                &[(&table.quoted(), Type::TEXT)],
            )
            .await?
            .get(0);
        if !exists {
            tx.batch_execute(&render(include_str!("../sql/partitioned_create.sql"), table))
                .await?;
            done.push(format!("partitioned table created ({granularity:?})").to_lowercase());
        } else if !partitions::is_partitioned(tx, table).await? {
            return Err(StoreError::Migration(format!(
                "--partitioned: {table} exists and is not partitioned; migrate never converts a table \
                 (docs/operations.md describes converting one without downtime)"
            )));
        }
    }
    let partitioned_table = partitions::is_partitioned(tx, table).await?;
    for migration in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        let catalog = migration.catalog_sql(table, partitioned_table)?;
        if !catalog.is_empty() {
            tx.batch_execute(&catalog).await?;
        }
        tx.execute_typed(
            &format!("INSERT INTO {history} (table_name, version, name) VALUES ($1, $2, $3)"),
            &[
                (&table.name(), Type::TEXT),
                (&migration.version, Type::INT4),
                (&migration.name, Type::TEXT),
            ],
        )
        .await?;
        done.push(migration.name.to_owned());
    }
    // The NOTIFY function names its channel in its body. Re-creating it
    // (no lock on the outbox table) keeps it on the channel relays listen
    // to, should the channel's derivation change after it was created.
    if let Some(notify) = MIGRATIONS
        .iter()
        .find(|m| m.version == 5 && applied.contains(&m.version))
    {
        tx.batch_execute(&notify.catalog_sql(table, partitioned_table)?)
            .await?;
    }
    let trigger_name = table.derived("relay_notify");
    let installed: bool = tx
        .query_typed_one(
            include_str!("../sql/notify_trigger_exists.sql"),
            &[
                (&table.quoted(), Type::TEXT),
                (&trigger_name.trim_matches('"'), Type::TEXT),
            ],
        )
        .await?
        .get(0);
    if notify_trigger && !installed {
        tx.batch_execute(&render(include_str!("../sql/notify_trigger_create.sql"), table))
            .await?;
        done.push("NOTIFY trigger installed".to_owned());
    } else if !notify_trigger && installed {
        tx.batch_execute(&render(include_str!("../sql/notify_trigger_drop.sql"), table))
            .await?;
        done.push("NOTIFY trigger removed".to_owned());
    }
    Ok(done)
}

/// With `--partitioned`, the partitions from the current day or hour on,
/// made the way retention makes them ahead of time (after the indexes, so
/// each new partition gets them as it is attached).
async fn create_initial_partitions(
    client: &mut Client,
    table: &TableName,
    partitioned: Option<Granularity>,
) -> Result<Vec<String>, StoreError> {
    let Some(granularity) = partitioned else {
        return Ok(Vec::new());
    };
    let created = partitions::create_ahead(client, table, granularity.width()).await?;
    Ok(created
        .into_iter()
        .map(|name| format!("partition {name} created"))
        .collect())
}

/// Every index the migrations leave on `table` (see [`IndexPlan`]).
fn index_plan(table: &TableName) -> Result<IndexPlan, StoreError> {
    let mut statements = Vec::new();
    for migration in MIGRATIONS {
        statements.extend(migration.statements()?);
    }
    IndexPlan::of(statements, |text| render(text, table)).map_err(StoreError::Migration)
}

/// The migration history lives beside the outbox table, in its schema.
fn history_table(table: &TableName) -> String {
    match table.schema() {
        Some(schema) => format!("\"{schema}\".\"outbox_relay_migrations\""),
        None => "\"outbox_relay_migrations\"".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_migration_is_understood_and_its_indexes_planned() {
        let table = TableName::parse("app.outbox_event").unwrap();
        let plan = index_plan(&table).unwrap();
        let names: Vec<&str> = plan.wanted.iter().map(|index| index.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "outbox_event_pending_idx",
                "outbox_event_quarantined_idx",
                "outbox_event_published_idx",
                "outbox_event_aggregate_idx",
                "outbox_event_fresh_idx",
                "outbox_event_retry_idx"
            ]
        );
        assert!(plan.wanted[0]
            .create_sql(true)
            .starts_with("CREATE INDEX CONCURRENTLY IF NOT EXISTS \"outbox_event_pending_idx\" ON \"app\".\"outbox_event\" (created_at, id)"));
        for migration in MIGRATIONS {
            let catalog = migration.catalog_sql(&table, false).unwrap();
            assert!(!migration
                .catalog_sql(&table, true)
                .unwrap()
                .contains("fillfactor ="));
            assert!(!catalog.contains("CREATE INDEX"), "{}", migration.name);
            assert!(!catalog.contains('{'), "a placeholder left in {}", migration.name);
        }
        let indexes = MIGRATIONS.iter().find(|m| m.version == 3).unwrap();
        assert!(indexes
            .catalog_sql(&table, false)
            .unwrap()
            .contains("fillfactor = 80"));
        assert!(sets_storage_parameters(
            "ALTER TABLE {table} SET (fillfactor = 80)"
        ));
        assert!(!sets_storage_parameters("ALTER TABLE {table} ADD COLUMN x INT"));
    }
}
