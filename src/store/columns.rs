//! The start-up check of the outbox table: each column the relay reads or
//! writes, compared with the type and nullability the relay's statements
//! need, so that a table that cannot work is reported once, by column,
//! with the fix, instead of failing row by row.
//!
//! Two severities, because they call for different reactions:
//!
//! - [`Severity::Unusable`]: a missing column, or a type the relay's
//!   statements cannot work with (`id bigint`, `causation_id text`, which
//!   the claim casts to uuid, so that one value that is not a UUID would
//!   fail every claim). `migrate` exits 1 and `run` refuses to start: a
//!   relay on such a table would fail on, or quarantine, every row.
//! - [`Severity::Tolerated`]: something the claim copes with, at a cost
//!   worth fixing: a type it casts (`created_at timestamp without time
//!   zone` is read in the session's time zone), or a nullable column a row
//!   needs a value in (such a row is quarantined, naming the column). Both
//!   commands log the error with its fix and carry on.
//!
//! A little over 500 lines only because of its tests (about 140 lines, one
//! case per column rule), kept beside the rules they pin down.

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
    /// The relay copes; the finding says at what cost, and how to fix it.
    Tolerated,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Unusable => "unusable",
            Severity::Tolerated => "tolerated",
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
    /// Base type names that work as they are; empty: any type (the column
    /// is only ever read through a cast to text).
    types: &'static [&'static str],
    /// Base type names the claim's casts cope with, and at what cost.
    tolerated: &'static [&'static str],
    cost: &'static str,
    /// The type to convert to, as DDL writes it.
    expected: &'static str,
    /// What depends on the type, for the message about any other type.
    why: &'static str,
    /// What NULL in the column does.
    null: Null,
    /// Who provides the column when it is missing.
    source: Source,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Null {
    /// NULL is a legitimate value.
    Allowed,
    /// A row with NULL there is that row's problem alone: this happens.
    Tolerated(&'static str),
    /// A row with NULL there would harm more than itself: this happens.
    Unusable(&'static str),
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

const QUARANTINED: &str = "is quarantined, naming the column";
const TIMESTAMP_COST: &str = "it is read as timestamptz in the relay's session time zone, so its \
     times shift if that differs from the producer's";

/// Every column the relay uses, as the claim and the admin commands (which
/// read each value through its cast in `casts.rs`, to the type they
/// decode) and the recording statements (which match rows on `uuid[]` ids
/// and `int[]` attempts) use them.
const NEEDS: &[Need] = &[
    Need {
        column: "id",
        types: &["uuid"],
        tolerated: &[],
        cost: "",
        expected: "uuid",
        why: "the relay matches rows on UUID ids, and the id is the message id",
        null: Null::Tolerated("is never claimed"),
        source: Source::Producer,
    },
    Need {
        column: "causation_id",
        types: &["uuid"],
        tolerated: &[],
        cost: "",
        expected: "uuid",
        why: "the claim casts it to uuid, so a single value that is not a UUID would fail every claim",
        null: Null::Allowed,
        source: Source::Migrate,
    },
    Need {
        column: "event_type",
        types: &[],
        tolerated: &[],
        cost: "",
        expected: "text",
        why: "",
        null: Null::Tolerated(QUARANTINED),
        source: Source::Producer,
    },
    Need {
        column: "aggregate_id",
        types: &[],
        tolerated: &[],
        cost: "",
        expected: "text",
        why: "",
        null: Null::Tolerated(QUARANTINED),
        source: Source::Producer,
    },
    Need {
        column: "payload",
        types: &["jsonb", "json", "text", "varchar"],
        tolerated: &[],
        cost: "",
        expected: "jsonb",
        why: "its JSON text is the message body",
        null: Null::Tolerated(QUARANTINED),
        source: Source::Producer,
    },
    Need {
        column: "created_at",
        types: &["timestamptz"],
        tolerated: &["timestamp"],
        cost: TIMESTAMP_COST,
        expected: "timestamptz",
        why: "the claim orders rows by it and reads it as a point in time",
        null: Null::Tolerated(QUARANTINED),
        source: Source::Migrate,
    },
    Need {
        column: "published_at",
        types: &["timestamptz"],
        tolerated: &["timestamp"],
        cost: TIMESTAMP_COST,
        expected: "timestamptz",
        why: "the relay sets it to now() and replay and retention compare it with points in time",
        null: Null::Allowed,
        source: Source::Migrate,
    },
    Need {
        column: "attempt_count",
        types: &["int4"],
        tolerated: &["int2", "int8"],
        cost: "the relay reads and matches it as a 32-bit integer",
        expected: "integer",
        why: "the relay counts attempts in it and matches outcomes on it as an integer",
        null: Null::Unusable(
            "could never have its outcome recorded, and would be published again after every lease",
        ),
        source: Source::Migrate,
    },
    Need {
        column: "next_attempt_at",
        types: &["timestamptz"],
        tolerated: &["timestamp"],
        cost: TIMESTAMP_COST,
        expected: "timestamptz",
        why: "the claim compares it with now() and sets it to a point in time",
        null: Null::Tolerated("is never claimed"),
        source: Source::Migrate,
    },
    Need {
        column: "leased_until",
        types: &["timestamptz"],
        tolerated: &["timestamp"],
        cost: TIMESTAMP_COST,
        expected: "timestamptz",
        why: "the claim leases rows until a point in time and compares it with now()",
        null: Null::Allowed,
        source: Source::Migrate,
    },
    Need {
        column: "last_error",
        types: &["text", "varchar"],
        tolerated: &[],
        cost: "",
        expected: "text",
        why: "the relay writes error texts into it",
        null: Null::Allowed,
        source: Source::Migrate,
    },
    Need {
        column: "quarantined_at",
        types: &["timestamptz"],
        tolerated: &["timestamp"],
        cost: TIMESTAMP_COST,
        expected: "timestamptz",
        why: "the relay sets it to now() and `quarantine list` reads it as a point in time",
        null: Null::Allowed,
        source: Source::Migrate,
    },
    Need {
        column: "sequence_number",
        types: &["int2", "int4", "int8"],
        tolerated: &[],
        cost: "",
        expected: "bigint",
        why: "OUTBOX_ORDERING=aggregate orders an aggregate's rows by it as an integer",
        null: Null::Allowed,
        source: Source::Optional,
    },
    Need {
        column: "headers",
        types: &["jsonb", "json", "text", "varchar"],
        tolerated: &[],
        cost: "",
        expected: "jsonb",
        why: "its JSON text, an object of string values, is carried as message headers",
        null: Null::Allowed,
        source: Source::Optional,
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
                    if need.null == Null::Allowed {
                        ""
                    } else {
                        " NOT NULL"
                    }
                ),
            };
            findings.push(Finding {
                severity: Severity::Unusable,
                column: Some(need.column.to_owned()),
                message: format!("{table}.{} is missing; {fix}", need.column),
            });
            continue;
        };
        let base = column.base.as_str();
        let fits = need.types.is_empty() || need.types.contains(&base);
        if !fits {
            let tolerated = need.tolerated.contains(&base);
            let (using, caveat) = if base == "timestamp" && need.expected == "timestamptz" {
                (
                    format!("{} AT TIME ZONE 'UTC'", need.column),
                    "; the USING clause takes the stored times as UTC",
                )
            } else {
                (format!("{}::{}", need.column, need.expected), "")
            };
            let (severity, consequence) = if tolerated {
                (Severity::Tolerated, need.cost)
            } else {
                (Severity::Unusable, need.why)
            };
            findings.push(Finding {
                severity,
                column: Some(need.column.to_owned()),
                message: format!(
                    "{table}.{} is {}, expected {}: {consequence}; convert it (this rewrites the table \
                     under an exclusive lock{caveat}): ALTER TABLE {quoted} ALTER COLUMN {} TYPE {} \
                     USING {using}",
                    need.column, column.declared, need.expected, need.column, need.expected
                ),
            });
        }
        let null_severity = match need.null {
            _ if column.not_null => None,
            Null::Allowed => None,
            Null::Tolerated(consequence) => Some((Severity::Tolerated, consequence)),
            Null::Unusable(consequence) => Some((Severity::Unusable, consequence)),
        };
        if let Some((severity, consequence)) = null_severity {
            findings.push(Finding {
                severity,
                column: Some(need.column.to_owned()),
                message: format!(
                    "{table}.{} is nullable, expected NOT NULL: a row with NULL there {consequence}; \
                     give such rows a value, then: ALTER TABLE {quoted} ALTER COLUMN {} SET NOT NULL",
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
///
/// Sent unnamed with its parameter type, so that it also runs through a
/// transaction-pooling proxy (see `pooler.rs`); it runs once per start.
pub async fn check_table(client: &Client, table: &TableName) -> Result<Vec<Finding>, StoreError> {
    let columns = client
        .query_typed(
            include_str!("sql/table_columns.sql"),
            &[(&table.quoted(), tokio_postgres::types::Type::TEXT)],
        )
        .await?
        .iter()
        .map(|row| {
            Ok(Column {
                name: row.try_get(0)?,
                declared: row.try_get(1)?,
                base: row.try_get(2)?,
                not_null: row.try_get(3)?,
            })
        })
        .collect::<Result<Vec<Column>, tokio_postgres::Error>>()?;
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
            column("leased_until", "timestamptz", false),
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
        let with_headers = with(spec_table(), column("headers", "jsonb", false));
        assert_eq!(check_columns(&table(), &with_headers), vec![]);
        let bad_headers = with(spec_table(), column("headers", "int4", false));
        assert_eq!(
            check_columns(&table(), &bad_headers)[0].severity,
            Severity::Unusable
        );
    }

    #[test]
    fn a_type_no_row_can_work_with_is_unusable_with_the_conversion() {
        let columns = with(spec_table(), column("causation_id", "text", false));
        let findings = check_columns(&table(), &columns);
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].severity, Severity::Unusable);
        assert_eq!(findings[0].column.as_deref(), Some("causation_id"));
        assert!(
            findings[0].message.contains(
                r#"ALTER TABLE "app"."outbox_event" ALTER COLUMN causation_id TYPE uuid USING causation_id::uuid"#
            ),
            "{}",
            findings[0].message
        );
        let bigint_id = with(spec_table(), column("id", "int8", true));
        assert_eq!(
            check_columns(&table(), &bigint_id)[0].severity,
            Severity::Unusable
        );
    }

    #[test]
    fn a_type_the_claim_casts_is_tolerated_with_its_cost_and_conversion() {
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
        assert_eq!(findings[0].severity, Severity::Tolerated);
        assert!(
            findings[0].message.contains("session time zone")
                && findings[0]
                    .message
                    .contains("TYPE timestamptz USING created_at AT TIME ZONE 'UTC'"),
            "{}",
            findings[0].message
        );
        let bigint = with(spec_table(), column("attempt_count", "int8", true));
        assert_eq!(check_columns(&table(), &bigint)[0].severity, Severity::Tolerated);
    }

    #[test]
    fn every_column_read_through_a_cast_is_checked_and_read_as_a_type_that_works() {
        for column in crate::store::casts::columns() {
            let need = NEEDS
                .iter()
                .find(|need| need.column == column)
                .unwrap_or_else(|| panic!("{column} is read but not checked"));
            let cast = crate::store::casts::read_as(column).expect("listed");
            assert!(
                need.types.contains(&cast) || (need.types.is_empty() && cast == "text"),
                "{column} is read as {cast}, which the check does not take as working"
            );
        }
        // A column the check lets have any type is one read as text.
        for need in NEEDS.iter().filter(|need| need.types.is_empty()) {
            assert_eq!(
                crate::store::casts::read_as(need.column),
                Some("text"),
                "{}",
                need.column
            );
        }
    }

    #[test]
    fn columns_read_as_text_take_any_type() {
        let enum_type = with(spec_table(), column("event_type", "event_kind", true));
        assert_eq!(check_columns(&table(), &enum_type), vec![]);
    }

    #[test]
    fn null_is_tolerated_where_it_only_harms_its_own_row() {
        let columns = with(spec_table(), column("aggregate_id", "uuid", false));
        let findings = check_columns(&table(), &columns);
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].severity, Severity::Tolerated);
        assert!(findings[0].message.contains("quarantined"));
        assert!(findings[0].message.contains("SET NOT NULL"));
        // An attempt count of NULL could never be matched when recording.
        let counter = with(spec_table(), column("attempt_count", "int4", false));
        assert_eq!(check_columns(&table(), &counter)[0].severity, Severity::Unusable);
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
