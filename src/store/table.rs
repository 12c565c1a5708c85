//! The outbox table and the database it lives in: a validated table name
//! (quoted for SQL, with the names of the objects derived from it) and the
//! connection settings.

use std::fmt;

use super::connect::{self, PgTls};
use super::Pooler;
use crate::config::{var, ConfigError};

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
    /// table, unqualified: indexes live in the table's schema anyway.
    pub fn derived(&self, suffix: &str) -> String {
        // Identifiers are limited to 63 bytes; validation keeps the table
        // name ASCII, so byte truncation cannot split a character.
        let mut base = format!("{}_{suffix}", self.name);
        base.truncate(63);
        format!("\"{base}\"")
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

    /// The LISTEN/NOTIFY channel announcing new rows of this table. Only
    /// identifier characters (validated) and '_' go in, so it needs no
    /// escaping as a literal or a quoted identifier.
    pub fn notify_channel(&self) -> String {
        let mut channel = match &self.schema {
            Some(schema) => format!("outbox_relay_{schema}_{}", self.name),
            None => format!("outbox_relay_{}", self.name),
        };
        channel.truncate(63);
        channel
    }
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
}
