//! How the relay reads the outbox columns whose values it decodes: one cast
//! per column, to the type the Rust side decodes it as, shared by the claim
//! and the admin commands so that both read every supported table shape
//! alike. The older shapes `columns.rs` tolerates (an `attempt_count` of
//! `smallint` or `bigint`, times without time zone, an `event_type` or
//! `aggregate_id` of any type, a `json` or `text` payload) work only
//! because every read goes through these casts.
//!
//! A statement names a column it reads as `{read:column}`, or qualified,
//! `{read:t.column}`; rendering writes `column::type` (`t.column::type`).
//! A placeholder naming a column not listed here is left as it is, for the
//! tests that check every statement is fully rendered to catch.
//!
//! Only values are cast. Filters and sort keys use the bare column, so
//! that they match the partial indexes; PostgreSQL compares the older
//! types with the relay's parameters through the same implicit
//! conversions (a `timestamp` with a `timestamptz` in the session's time
//! zone).

/// Each column read through a cast, and the type it is read as.
const READ_AS: &[(&str, &str)] = &[
    // The claim casts it to uuid: `columns.rs` refuses any other type, as
    // one value that is not a UUID would fail every claim.
    ("causation_id", "uuid"),
    ("event_type", "text"),
    ("aggregate_id", "text"),
    // Its JSON text is the message body, whatever the column's type.
    ("payload", "text"),
    ("headers", "text"),
    ("created_at", "timestamptz"),
    ("quarantined_at", "timestamptz"),
    // Matched as int[] when an outcome is recorded, so read as int4 too.
    ("attempt_count", "int4"),
    ("last_error", "text"),
];

const OPEN: &str = "{read:";

/// The type `column` is read as, if it is read through a cast.
pub(super) fn read_as(column: &str) -> Option<&'static str> {
    READ_AS
        .iter()
        .find(|(name, _)| *name == column)
        .map(|(_, cast)| *cast)
}

/// Every column read through a cast.
#[cfg(test)]
pub(super) fn columns() -> impl Iterator<Item = &'static str> {
    READ_AS.iter().map(|(name, _)| *name)
}

/// `sql` with each `{read:[alias.]column}` replaced by the column's cast.
pub fn render(sql: &str) -> String {
    let mut rendered = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(start) = rest.find(OPEN) {
        let inner = &rest[start + OPEN.len()..];
        let Some(end) = inner.find('}') else {
            break;
        };
        let reference = &inner[..end];
        let column = reference.rsplit('.').next().unwrap_or(reference);
        rendered.push_str(&rest[..start]);
        match read_as(column) {
            Some(cast) => {
                rendered.push_str(reference);
                rendered.push_str("::");
                rendered.push_str(cast);
            }
            None => rendered.push_str(&rest[start..start + OPEN.len() + end + 1]),
        }
        rest = &inner[end + 1..];
    }
    rendered.push_str(rest);
    rendered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_the_columns_casts() {
        assert_eq!(
            render("SELECT id, {read:attempt_count}, {read:t.quarantined_at} FROM x"),
            "SELECT id, attempt_count::int4, t.quarantined_at::timestamptz FROM x"
        );
        assert_eq!(
            render("WHERE {read:event_type} = $1::text"),
            "WHERE event_type::text = $1::text"
        );
        assert_eq!(render("no placeholder {table}"), "no placeholder {table}");
    }

    #[test]
    fn an_unknown_column_is_left_for_the_rendering_tests_to_catch() {
        assert_eq!(
            render("SELECT {read:nope}, {read:id}"),
            "SELECT {read:nope}, {read:id}"
        );
        assert_eq!(render("SELECT {read:attempt_count"), "SELECT {read:attempt_count");
    }
}
