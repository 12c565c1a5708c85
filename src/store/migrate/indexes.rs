//! The indexes of the outbox table, made to match the migrations on every
//! `migrate`, whatever the history table says: an index is looked up by
//! its expected name, built if missing, and dropped and rebuilt if an
//! interrupted build left it invalid.

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use tracing::{info, warn};

use super::super::{StoreError, TableName};
use super::statements::{Index, IndexPlan};

/// How indexes are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// `CONCURRENTLY`, each statement on its own outside any transaction:
    /// producers keep writing during the build, which only waits for the
    /// transactions already open on the table.
    Concurrently,
    /// Inside the migration's transaction (through a transaction pooler,
    /// where the session lock `Concurrently` needs is unavailable): writes
    /// to the table wait for the build.
    InTransaction,
}

impl Build {
    fn keyword(self) -> &'static str {
        match self {
            Build::Concurrently => "CONCURRENTLY ",
            Build::InTransaction => "",
        }
    }
}

/// What the catalog holds under an expected index name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Missing,
    /// An index of the table, valid and maintained.
    Usable {
        qualified: String,
    },
    /// An index of the table that a failed or cancelled build left behind:
    /// not used by queries, yet (once ready) still written to.
    Invalid {
        qualified: String,
    },
    /// Another relation has the name, so `IF NOT EXISTS` would skip it.
    Taken {
        qualified: String,
    },
}

/// The state of each name in `names`, in that order.
async fn states(
    client: &impl GenericClient,
    table: &TableName,
    names: &[&str],
) -> Result<Vec<State>, StoreError> {
    let rows = client
        .query_typed(
            include_str!("../sql/index_states.sql"),
            &[(&table.quoted(), Type::TEXT), (&names, Type::TEXT_ARRAY)],
        )
        .await?;
    let mut found: Vec<(String, State)> = rows
        .iter()
        .map(|row| {
            let qualified: String = row.get("qualified");
            let state = match (row.get("taken"), row.get("on_table"), row.get("usable")) {
                (false, _, _) => State::Missing,
                (true, true, true) => State::Usable { qualified },
                (true, true, false) => State::Invalid { qualified },
                (true, false, _) => State::Taken { qualified },
            };
            (row.get("name"), state)
        })
        .collect();
    Ok(names
        .iter()
        .map(|name| {
            found
                .iter()
                .position(|(found, _)| found == name)
                .map_or(State::Missing, |at| found.swap_remove(at).1)
        })
        .collect())
}

/// Builds what `plan` wants and is not there or not valid, then drops the
/// indexes later migrations dropped; returns what it did, for the log.
/// New indexes are built before obsolete ones go, so queries always have
/// an index to use. Fails if an index is still not usable afterwards.
pub async fn ensure(
    client: &impl GenericClient,
    table: &TableName,
    plan: &IndexPlan,
    build: Build,
) -> Result<Vec<String>, StoreError> {
    let wanted: Vec<&str> = plan.wanted.iter().map(|index| index.name.as_str()).collect();
    let mut done = Vec::new();
    for (index, state) in plan.wanted.iter().zip(states(client, table, &wanted).await?) {
        match state {
            State::Usable { .. } => continue,
            State::Missing => {}
            State::Invalid { qualified } => {
                warn!(index = %index.name, "index left invalid by an interrupted build: rebuilding it");
                drop_index(client, &qualified, build).await?;
            }
            State::Taken { qualified } => {
                return Err(StoreError::Migration(format!(
                    "the name of index {} is taken by {qualified}, which is not an index of {table}; \
                     rename or drop it and run migrate again",
                    index.name
                )))
            }
        }
        create_index(client, index, build).await?;
        done.push(format!("index {} built", index.name));
    }
    let dropped: Vec<&str> = plan.dropped.iter().map(String::as_str).collect();
    for (name, state) in dropped.iter().zip(states(client, table, &dropped).await?) {
        let (State::Usable { qualified } | State::Invalid { qualified }) = state else {
            continue;
        };
        drop_index(client, &qualified, build).await?;
        done.push(format!("index {name} dropped"));
    }
    let after = states(client, table, &wanted).await?;
    let unusable = wanted
        .iter()
        .zip(after)
        .find(|(_, state)| !matches!(state, State::Usable { .. }));
    if let Some((name, state)) = unusable {
        return Err(StoreError::Migration(format!(
            "index {name} is {} after migrate built it",
            if state == State::Missing {
                "missing"
            } else {
                "not valid"
            }
        )));
    }
    Ok(done)
}

async fn create_index(client: &impl GenericClient, index: &Index, build: Build) -> Result<(), StoreError> {
    info!(index = %index.name, concurrently = build == Build::Concurrently, "building index");
    client
        .batch_execute(&index.create_sql(build == Build::Concurrently))
        .await?;
    Ok(())
}

async fn drop_index(client: &impl GenericClient, qualified: &str, build: Build) -> Result<(), StoreError> {
    client
        .batch_execute(&format!("DROP INDEX {}IF EXISTS {qualified}", build.keyword()))
        .await?;
    Ok(())
}
