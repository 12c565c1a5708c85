//! The outbox table and the database it lives in: a validated table name
//! (quoted for SQL, with the names of the objects derived from it) and the
//! connection settings.

use std::fmt;

use super::connect::{self, PgTls};
use super::Pooler;
use crate::settings::{var, ConfigError};

/// A validated, possibly schema-qualified table name, quoted for SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    /// Parses `table` or `schema.table`; each part must be a plain SQL
    /// identifier, so the quoted form can be spliced into SQL safely.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let parts: Vec<&str> = raw.split('.').collect();
        let (schema, name) = match parts.as_slice() {
            [name] => (None, *name),
            [schema, name] => (Some(*schema), *name),
            _ => return Err(format!("'{raw}' is not `table` or `schema.table`")),
        };
        for part in schema.iter().chain(std::iter::once(&name)) {
            validate_identifier(part).map_err(|why| format!("'{raw}' is not a valid table name: {why}"))?;
        }
        Ok(Self {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
        })
    }

    /// The unqualified table name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema, when the name was qualified.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The quoted, qualified form for SQL text, e.g. `"app"."outbox_event"`.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{}\"", self.name),
            None => format!("\"{}\"", self.name),
        }
    }

    /// A quoted name for an object (index, trigger) that belongs to this
    /// table, unqualified: indexes live in the table's schema anyway. See
    /// [`derive_name`] for how a name too long for PostgreSQL is shortened.
    pub fn derived(&self, suffix: &str) -> String {
        format!("\"{}\"", derive_name(&self.name, suffix))
    }
}

impl TableName {
    /// Like [`TableName::derived`], qualified with the table's schema (for
    /// functions, which are not implicitly in the table's schema).
    pub fn qualified_derived(&self, suffix: &str) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".{}", self.derived(suffix)),
            None => self.derived(suffix),
        }
    }

    /// The quoted name of a relay table (`name`, shared by every outbox
    /// table in the schema) beside this table, qualified like it.
    pub fn beside(&self, name: &str) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{name}\""),
            None => format!("\"{name}\""),
        }
    }

    /// The LISTEN/NOTIFY channel announcing new rows of this table. Only
    /// identifier characters (validated), '_' and hex digits go in, so it
    /// needs no escaping as a literal or a quoted identifier.
    ///
    /// A channel name is an identifier too: PostgreSQL cuts a longer one
    /// at 63 bytes, which would let two long table names share a channel.
    /// Past 63 bytes it is a prefix plus a hash of the schema and table.
    pub fn notify_channel(&self) -> String {
        let channel = match &self.schema {
            Some(schema) => format!("outbox_relay_{schema}_{}", self.name),
            None => format!("outbox_relay_{}", self.name),
        };
        if channel.len() <= MAX_IDENTIFIER_BYTES {
            return channel;
        }
        let qualified = match &self.schema {
            Some(schema) => format!("{schema}.{}", self.name),
            None => self.name.clone(),
        };
        shortened(&channel, &fnv1a(qualified.as_bytes()), "")
    }
}

/// PostgreSQL's identifier limit (NAMEDATALEN - 1); it silently cuts
/// longer names, so two names that differ only past it become one.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// Every suffix [`TableName::derived`] is called with, in the order the
/// migrations first created those objects (indexes, then the NOTIFY
/// function and trigger). The order decides which suffix kept a name that
/// earlier versions cut short and shared (see [`derive_name`]); a new
/// suffix goes at the end.
const DERIVED_SUFFIXES: [&str; 9] = [
    "pending_idx",
    "quarantined_idx",
    "published_idx",
    "aggregate_idx",
    "relay_notify",
    "untried_idx",
    "tried_idx",
    "fresh_idx",
    "retry_idx",
];

/// The name of `table`'s object `suffix`, at most 63 bytes, distinct from
/// the table's other derived names and from the table itself:
///
/// 1. `{table}_{suffix}` when it fits — every table named up to 47
///    characters, so existing installs keep their names;
/// 2. else the first 63 bytes, as earlier versions cut it, when no suffix
///    earlier in [`DERIVED_SUFFIXES`] cuts to the same name and it is not
///    the table's own name: the objects an earlier `migrate` created under
///    those names are found again (tables named 48 to 60 characters);
/// 3. else a cut prefix, a hash of the full name, and the whole suffix,
///    e.g. `…_9f4c2a1e_published_idx`: where earlier versions created one
///    object for several names, or none (61 to 63 characters).
fn derive_name(table: &str, suffix: &str) -> String {
    let full = format!("{table}_{suffix}");
    if full.len() <= MAX_IDENTIFIER_BYTES {
        return full;
    }
    // Validated identifiers are ASCII, so a byte cut never splits a character.
    let cut = |name: &str| name[..MAX_IDENTIFIER_BYTES].to_owned();
    let legacy = cut(&full);
    let taken_earlier = DERIVED_SUFFIXES
        .iter()
        .take_while(|earlier| **earlier != suffix)
        .any(|earlier| {
            let other = format!("{table}_{earlier}");
            other.len() > MAX_IDENTIFIER_BYTES && cut(&other) == legacy
        });
    if !taken_earlier && legacy != table {
        return legacy;
    }
    shortened(table, &fnv1a(full.as_bytes()), suffix)
}

/// `{prefix of base}_{hash}` or `{prefix of base}_{hash}_{suffix}`, cut to
/// exactly fit 63 bytes. The suffix stays whole so the object's role is
/// still readable in `\d` and `pg_indexes`.
fn shortened(base: &str, hash: &str, suffix: &str) -> String {
    let tail = if suffix.is_empty() {
        format!("_{hash}")
    } else {
        format!("_{hash}_{suffix}")
    };
    let keep = MAX_IDENTIFIER_BYTES.saturating_sub(tail.len()).min(base.len());
    format!("{}{tail}", &base[..keep])
}

/// 32-bit FNV-1a as 8 hex digits: stable across versions and platforms
/// (unlike `std`'s hasher), which names stored in a database need.
fn fnv1a(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:08x}")
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

fn validate_identifier(part: &str) -> Result<(), &'static str> {
    let mut chars = part.chars();
    match chars.next() {
        None => return Err("empty identifier"),
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        Some(_) => return Err("an identifier must start with a letter or '_'"),
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("only ASCII letters, digits and '_' are allowed");
    }
    if part.len() > 63 {
        return Err("an identifier is at most 63 characters");
    }
    Ok(())
}

/// The database half of the configuration.
#[derive(Clone)]
pub struct DatabaseConfig {
    /// Parsed connection settings (the password stays inside).
    pub pg: tokio_postgres::Config,
    /// TLS as the URL's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` ask.
    pub tls: PgTls,
    /// The outbox table.
    pub table: TableName,
    /// Whether the URL goes through a transaction-pooling proxy.
    pub pooler: Pooler,
}

impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("target", &describe_pg(&self.pg))
            .field("tls", &self.tls)
            .field("table", &self.table)
            .field("pooler", &self.pooler)
            .finish()
    }
}

/// A server the relay connects to: its settings and how to secure them
/// (the LISTEN connection's may differ from the pool's).
#[derive(Clone)]
pub struct Endpoint {
    /// Parsed connection settings (the password stays inside).
    pub pg: tokio_postgres::Config,
    /// TLS for it.
    pub tls: PgTls,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("target", &describe_pg(&self.pg))
            .field("tls", &self.tls)
            .finish()
    }
}

impl Endpoint {
    /// Validates a connection URL (or key=value string) given in `variable`.
    pub fn parse(variable: &'static str, raw: &str) -> Result<Self, ConfigError> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(ConfigError::new(variable, "is empty"));
        }
        if raw.contains("://") && url::Url::parse(raw).is_err() {
            return Err(ConfigError::new(variable, "is not a valid URL"));
        }
        let (pg, tls) = connect::parse(variable, raw)?;
        Ok(Self { pg, tls })
    }
}

/// `host:port/dbname` of a PostgreSQL config, for logs; never the password.
pub fn describe_pg(pg: &tokio_postgres::Config) -> String {
    let host = pg
        .get_hosts()
        .first()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".to_owned());
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let db = pg.get_dbname().or(pg.get_user()).unwrap_or("postgres");
    format!("{host}:{port}/{db}")
}

impl DatabaseConfig {
    /// Validates `OUTBOX_DATABASE_URL` and `OUTBOX_TABLE`, for a database
    /// reached the way `pooler` says.
    pub fn parse(database_url: &str, table: &str, pooler: Pooler) -> Result<Self, ConfigError> {
        let Endpoint { pg, tls } = Endpoint::parse(var::DATABASE_URL, database_url)?;
        let table = TableName::parse(table.trim()).map_err(|e| ConfigError::new(var::TABLE, e))?;
        Ok(Self {
            pg,
            tls,
            table,
            pooler,
        })
    }

    /// The database URL's server, as an [`Endpoint`].
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            pg: self.pg.clone(),
            tls: self.tls.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_identifiers() {
        assert_eq!(
            TableName::parse("outbox_event").unwrap().quoted(),
            "\"outbox_event\""
        );
        assert_eq!(
            TableName::parse("app.outbox").unwrap().quoted(),
            "\"app\".\"outbox\""
        );
        for bad in ["", "a.b.c", "x; drop table y", "1abc", "out\"box", "a.", ".a"] {
            assert!(TableName::parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    fn unquoted(name: String) -> String {
        name.trim_matches('"').to_owned()
    }

    fn names_of(table: &TableName) -> Vec<String> {
        DERIVED_SUFFIXES
            .iter()
            .map(|suffix| unquoted(table.derived(suffix)))
            .collect()
    }

    #[test]
    fn derived_names_that_fit_are_unchanged() {
        let table = TableName::parse("app.outbox_event").unwrap();
        assert_eq!(table.derived("pending_idx"), "\"outbox_event_pending_idx\"");
        assert_eq!(
            table.qualified_derived("relay_notify"),
            "\"app\".\"outbox_event_relay_notify\""
        );
        assert_eq!(table.notify_channel(), "outbox_relay_app_outbox_event");
        // The longest name with every derived name as before: 47 + 1 + 15.
        let name = "t".repeat(47);
        let table = TableName::parse(&name).unwrap();
        assert_eq!(
            names_of(&table),
            DERIVED_SUFFIXES.map(|suffix| format!("{name}_{suffix}"))
        );
    }

    #[test]
    fn names_cut_by_earlier_versions_are_kept_where_they_were_distinct() {
        for length in 48..=60 {
            let name = "n".repeat(length);
            let table = TableName::parse(&name).unwrap();
            // The suffixes older versions knew; later ones were never cut.
            let known_before = 7;
            let legacy: Vec<String> = DERIVED_SUFFIXES[..known_before]
                .iter()
                .map(|suffix| {
                    let mut cut = format!("{name}_{suffix}");
                    cut.truncate(63);
                    cut
                })
                .collect();
            assert_eq!(names_of(&table)[..known_before], legacy, "length {length}");
        }
    }

    #[test]
    fn derived_names_never_collide_and_fit_for_any_legal_name() {
        for length in 1..=63 {
            for schema in [None, Some("s".repeat(63))] {
                let raw = match &schema {
                    Some(schema) => format!("{schema}.{}", "x".repeat(length)),
                    None => "x".repeat(length),
                };
                let table = TableName::parse(&raw).unwrap();
                let names = names_of(&table);
                for name in &names {
                    assert!(name.len() <= 63, "{name} is {} bytes", name.len());
                    assert_ne!(name, table.name(), "an object named like its table");
                }
                let distinct: std::collections::HashSet<&String> = names.iter().collect();
                assert_eq!(distinct.len(), names.len(), "collision among {names:?}");
                assert!(table.notify_channel().len() <= 63);
            }
        }
        // Where cutting used to merge names, the suffix is kept whole.
        let table = TableName::parse(&"y".repeat(62)).unwrap();
        let published = unquoted(table.derived("published_idx"));
        assert_eq!(published.len(), 63);
        assert!(published.ends_with("_published_idx"), "{published}");
        assert!(published.starts_with("yyyy"), "{published}");
    }

    #[test]
    fn long_names_differing_only_at_the_end_get_different_objects_and_channels() {
        let a = TableName::parse(&format!("{}a", "z".repeat(62))).unwrap();
        let b = TableName::parse(&format!("{}b", "z".repeat(62))).unwrap();
        for suffix in DERIVED_SUFFIXES {
            assert_ne!(a.derived(suffix), b.derived(suffix), "{suffix}");
        }
        assert_ne!(a.notify_channel(), b.notify_channel());
        // The schema is part of the channel: `a_b.c` and `a.b_c` differ.
        let long = "q".repeat(50);
        let one = TableName::parse(&format!("a_b.{long}")).unwrap();
        let two = TableName::parse(&format!("a.b_{long}")).unwrap();
        assert_ne!(one.notify_channel(), two.notify_channel());
    }

    #[test]
    fn the_hash_is_stable() {
        // FNV-1a reference values: the names in existing databases depend
        // on them never changing.
        assert_eq!(fnv1a(b""), "811c9dc5");
        assert_eq!(fnv1a(b"a"), "e40c292c");
        assert_eq!(fnv1a(b"foobar"), "bf9cf968");
    }
}
