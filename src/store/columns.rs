//! The start-up check of the outbox table: each column the relay reads or
//! writes, compared with the type and nullability the relay's statements
//! need, so that a table that cannot work is reported once, by column,
//! with the fix, instead of failing row by row.
//!
//! Two severities, because they call for different reactions:
//!
//! - [`Severity::Unusable`]: a type no row can be read or written with
//!   (`created_at timestamp without time zone`, `attempt_count bigint`), or
//!   a missing column. `migrate` exits 1 and `run` refuses to start: a relay
//!   on such a table would fail on, or quarantine, every row.
//! - [`Severity::RowsAtRisk`]: a nullable column the relay needs a value
//!   in. Rows that have one work; a row with NULL there is that row's
//!   problem alone, so `migrate` and `run` log the error and carry on.

use std::fmt;

use thiserror::Error;
use tokio_postgres::Client;
use tracing::error;

use super::{bounded, Store, StoreError, TableName};

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// No row can be relayed: `migrate` fails, `run` refuses to start.
    Unusable,
    /// Rows with NULL in the column cannot be relayed; the others can.
    RowsAtRisk,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Unusable => "unusable",
            Severity::RowsAtRisk => "rows at risk",
        })
    }
}

/// One thing wrong with the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How bad it is.
    pub severity: Severity,
    /// The column concerned; `None` when the table itself is missing.
    pub column: Option<String>,
    /// What was found, what is expected and what to do, in one line.
    pub message: String,
}

/// A column as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Column name.
    pub name: String,
    /// Type as DDL writes it, e.g. `timestamp without time zone`.
    pub declared: String,
    /// Name of the type clients receive (`pg_type.typname` of the base
    /// type for a domain), e.g. `timestamp`.
    pub base: String,
    /// NULL is ruled out.
    pub not_null: bool,
}

/// What the relay needs of one column.
struct Need {
    column: &'static str,
    /// Base type names the relay's statements work with.
    types: &'static [&'static str],
    /// Read through a cast to text, so any type works.
    any_type: bool,
    /// The type to convert to, as DDL writes it.
    expected: &'static str,
    /// The relay needs a value in every row.
    not_null: bool,
    /// Who provides the column when it is missing.
    source: Source,
    /// What depends on the type, for the message.
    why: &'static str,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The producer writes it; `migrate` cannot add it.
    Producer,
    /// `migrate` adds it.
    Migrate,
    /// Optional; checked only when present.
    Optional,
}

const TEXT_TYPES: &[&str] = &["text", "varchar", "bpchar"];

/// Every column the relay uses, from the claim's `RETURNING` list (decoded
/// into Rust types, so those types are exact) to the columns only
/// compared or written in SQL.
const NEEDS: &[Need] = &[
    Need {
        column: "id",
        types: &["uuid"],
        any_type: false,
        expected: "uuid",
        not_null: true,
        source: Source::Producer,
        why: "the relay reads it as a UUID and uses it as the message id",
    },
    Need {
        column: "causation_id",
        types: &["uuid"],
        any_type: false,
        expected: "uuid",
        not_null: false,
        source: Source::Migrate,
        why: "the relay reads it as a UUID",
    },
    Need {
        column: "event_type",
        types: TEXT_TYPES,
        any_type: true,
        expected: "text",
        not_null: true,
        source: Source::Producer,
        why: "the relay reads it as text",
    },
    Need {
        column: "aggregate_id",
        types: TEXT_TYPES,
        any_type: true,
        expected: "text",
        not_null: true,
        source: Source::Producer,
        why: "the relay reads it as text",
    },
    Need {
        column: "payload",
        types: &["jsonb", "json", "text", "varchar"],
        any_type: false,
        expected: "jsonb",
        not_null: true,
        source: Source::Producer,
        why: "its JSON text is the message body",
    },
    Need {
        column: "created_at",
        types: &["timestamptz"],
        any_type: false,
        expected: "timestamptz",
        not_null: true,
        source: Source::Migrate,
        why: "the relay reads it as a point in time (timestamptz)",
    },
    Need {
        column: "published_at",
        types: &["timestamptz"],
        any_type: false,
        expected: "timestamptz",
        not_null: false,
        source: Source::Migrate,
        why: "replay and retention compare it with points in time (timestamptz)",
    },
    Need {
        column: "attempt_count",
        types: &["int4"],
        any_type: false,
        expected: "integer",
        not_null: true,
        source: Source::Migrate,
        why: "the relay reads it as a 32-bit integer",
    },
    Need {
        column: "next_attempt_at",
        types: &["timestamptz"],
        any_type: false,
        expected: "timestamptz",
        not_null: true,
        source: Source::Migrate,
        why: "the claim compares it with now() (timestamptz)",
    },
    Need {
        column: "last_error",
        types: &["text", "varchar"],
        any_type: false,
        expected: "text",
        not_null: false,
        source: Source::Migrate,
        why: "the relay writes error texts into it",
    },
    Need {
        column: "quarantined_at",
        types: &["timestamptz"],
        any_type: false,
        expected: "timestamptz",
        not_null: false,
        source: Source::Migrate,
        why: "`quarantine list` reads it as a point in time (timestamptz)",
    },
    Need {
        column: "sequence_number",
        types: &["int2", "int4", "int8"],
        any_type: false,
        expected: "bigint",
        not_null: false,
        source: Source::Optional,
        why: "OUTBOX_ORDERING=aggregate orders an aggregate's rows by it as an integer",
    },
];

/// Compares the table's columns with what the relay needs. `columns` empty
/// means the table does not exist.
pub fn check_columns(table: &TableName, columns: &[Column]) -> Vec<Finding> {
    let quoted = table.quoted();
    if columns.is_empty() {
        return vec![Finding {
            severity: Severity::Unusable,
            column: None,
            message: format!("table {table} does not exist; create it with `outbox-relay migrate`"),
        }];
    }
    let mut findings = Vec::new();
    for need in NEEDS {
        let Some(column) = columns.iter().find(|c| c.name == need.column) else {
            let fix = match need.source {
                Source::Optional => continue,
                Source::Migrate => "run `outbox-relay migrate`, which adds it".to_owned(),
                Source::Producer => format!(
                    "it is the producer's column; add it: ALTER TABLE {quoted} ADD COLUMN {} {}{}",
                    need.column,
                    need.expected,
                    if need.not_null { " NOT NULL" } else { "" }
                ),
            };
            findings.push(Finding {
                severity: Severity::Unusable,
                column: Some(need.column.to_owned()),
                message: format!("{table}.{} is missing; {fix}", need.column),
            });
            continue;
        };
        if !need.any_type && !need.types.contains(&column.base.as_str()) {
            let (using, caveat) = if column.base == "timestamp" && need.expected == "timestamptz" {
                (
                    format!("{} AT TIME ZONE 'UTC'", need.column),
                    "; the USING clause takes the stored times as UTC",
                )
            } else {
                (format!("{}::{}", need.column, need.expected), "")
            };
            findings.push(Finding {
                severity: Severity::Unusable,
                column: Some(need.column.to_owned()),
                message: format!(
                    "{table}.{} is {}, expected {}: {}; convert it (this rewrites the table under an \
                     exclusive lock{caveat}): ALTER TABLE {quoted} ALTER COLUMN {} TYPE {} USING {using}",
                    need.column, column.declared, need.expected, need.why, need.column, need.expected
                ),
            });
            continue;
        }
        if need.not_null && !column.not_null {
            findings.push(Finding {
                severity: Severity::RowsAtRisk,
                column: Some(need.column.to_owned()),
                message: format!(
                    "{table}.{} is nullable, expected NOT NULL: a row with NULL there cannot be published \
                     (the other rows are); give such rows a value, then: \
                     ALTER TABLE {quoted} ALTER COLUMN {} SET NOT NULL",
                    need.column, need.column
                ),
            });
        }
    }
    findings
}

/// Findings that leave no row relayable.
#[derive(Debug, Error)]
#[error("the outbox table cannot be relayed: {0}")]
pub struct UnusableTable(pub String);

/// Logs each finding at error (each is for an operator to fix), with
/// `report = "table_check"`, the column and the severity as stable fields
/// for log pipelines; fails when the table is unusable.
pub fn report(findings: &[Finding]) -> Result<(), UnusableTable> {
    for finding in findings {
        let column = finding.column.as_deref().unwrap_or("");
        error!(report = "table_check", severity = %finding.severity, column, "{}", finding.message);
    }
    let unusable: Vec<&str> = findings
        .iter()
        .filter(|finding| finding.severity == Severity::Unusable)
        .map(|finding| finding.message.as_str())
        .collect();
    if unusable.is_empty() {
        Ok(())
    } else {
        Err(UnusableTable(unusable.join("; ")))
    }
}

/// Reads the table's columns from the catalog and checks them.
pub async fn check_table(client: &Client, table: &TableName) -> Result<Vec<Finding>, StoreError> {
    let columns: Vec<Column> = client
        .query(include_str!("sql/table_columns.sql"), &[&table.quoted()])
        .await?
        .iter()
        .map(|row| Column {
            name: row.get(0),
            declared: row.get(1),
            base: row.get(2),
            not_null: row.get(3),
        })
        .collect();
    Ok(check_columns(table, &columns))
}

impl Store {
    /// [`check_table`] on a pooled connection, bounded like every query.
    pub async fn check_table(&self) -> Result<Vec<Finding>, StoreError> {
        bounded(async {
            let client = self.pool.get().await?;
            check_table(&client, &self.table).await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, base: &str, not_null: bool) -> Column {
        Column {
            name: name.to_owned(),
            declared: base.to_owned(),
            base: base.to_owned(),
            not_null,
        }
    }

    /// The table `migrate` creates.
    fn spec_table() -> Vec<Column> {
        vec![
            column("id", "uuid", true),
            column("causation_id", "uuid", false),
            column("event_type", "varchar", true),
            column("aggregate_id", "text", true),
            column("payload", "jsonb", true),
            column("created_at", "timestamptz", true),
            column("published_at", "timestamptz", false),
            column("attempt_count", "int4", true),
            column("next_attempt_at", "timestamptz", true),
            column("last_error", "text", false),
            column("quarantined_at", "timestamptz", false),
        ]
    }

    fn with(mut columns: Vec<Column>, replacement: Column) -> Vec<Column> {
        columns.retain(|c| c.name != replacement.name);
        columns.push(replacement);
        columns
    }

    fn table() -> TableName {
        TableName::parse("app.outbox_event").unwrap()
    }

    #[test]
    fn the_spec_table_and_the_upgraded_seed_table_pass() {
        assert_eq!(check_columns(&table(), &spec_table()), vec![]);
        let seed = with(
            with(spec_table(), column("aggregate_id", "uuid", true)),
            column("causation_id", "uuid", true),
        );
        assert_eq!(check_columns(&table(), &seed), vec![]);
        let sequenced = with(spec_table(), column("sequence_number", "int8", false));
        assert_eq!(check_columns(&table(), &sequenced), vec![]);
    }

    #[test]
    fn a_type_the_claim_cannot_decode_is_unusable_with_the_conversion() {
        let columns = with(
            spec_table(),
            Column {
                name: "created_at".to_owned(),
                declared: "timestamp without time zone".to_owned(),
                base: "timestamp".to_owned(),
                not_null: true,
            },
        );
        let findings = check_columns(&table(), &columns);
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].severity, Severity::Unusable);
        assert_eq!(findings[0].column.as_deref(), Some("created_at"));
        assert!(
            findings[0].message.contains(
                r#"ALTER TABLE "app"."outbox_event" ALTER COLUMN created_at TYPE timestamptz USING created_at AT TIME ZONE 'UTC'"#
            ),
            "{}",
            findings[0].message
        );
        let bigint = with(spec_table(), column("attempt_count", "int8", true));
        assert_eq!(check_columns(&table(), &bigint)[0].severity, Severity::Unusable);
    }

    #[test]
    fn columns_read_as_text_take_any_type() {
        let enum_type = with(spec_table(), column("event_type", "event_kind", true));
        assert_eq!(check_columns(&table(), &enum_type), vec![]);
    }

    #[test]
    fn a_nullable_required_column_puts_rows_at_risk_only() {
        let columns = with(spec_table(), column("aggregate_id", "uuid", false));
        let findings = check_columns(&table(), &columns);
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].severity, Severity::RowsAtRisk);
        assert!(findings[0].message.contains("SET NOT NULL"));
    }

    #[test]
    fn missing_columns_and_tables_are_unusable() {
        let mut columns = spec_table();
        columns.retain(|c| c.name != "attempt_count" && c.name != "payload");
        let findings = check_columns(&table(), &columns);
        assert_eq!(findings.len(), 2);
        assert!(findings.iter().all(|f| f.severity == Severity::Unusable));
        assert!(findings
            .iter()
            .any(|f| f.message.contains("outbox-relay migrate")));
        assert!(findings
            .iter()
            .any(|f| f.message.contains("ADD COLUMN payload jsonb NOT NULL")));
        let none = check_columns(&table(), &[]);
        assert_eq!(
            (none[0].severity, none[0].column.clone()),
            (Severity::Unusable, None)
        );
    }
}
