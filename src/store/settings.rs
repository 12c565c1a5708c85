//! The store's settings as the user gives them: the database, the table,
//! where to LISTEN, and `migrate`'s. They become a [`DatabaseConfig`] and an
//! [`Endpoint`], the types every query works from.

use clap::Args;

use super::{DatabaseConfig, Endpoint, Pooler};
use crate::settings::{parse_choice, var, ConfigError};

/// Connection settings every command needs: the database and the table.
#[derive(Debug, Clone, Args)]
pub struct DatabaseSettings {
    /// PostgreSQL connection URL (or key=value string) of the producer
    /// database; `sslmode`, `sslrootcert`, `sslcert` and `sslkey` as for psql.
    #[arg(
        long,
        env = var::DATABASE_URL,
        default_value = "postgres://postgres@localhost:5432/postgres",
        hide_env_values = true
    )]
    pub database_url: String,

    /// Outbox table, optionally schema-qualified (`schema.table`).
    #[arg(long, env = var::TABLE, default_value = "outbox_event")]
    pub table: String,

    /// `none`, or `transaction` when the database URL goes through a
    /// transaction-pooling proxy (PgBouncer in transaction mode, RDS Proxy).
    #[arg(long, env = var::DATABASE_POOLER, default_value = "none")]
    pub database_pooler: String,
}

impl DatabaseSettings {
    /// Validates the database settings.
    pub fn validate(&self) -> Result<DatabaseConfig, ConfigError> {
        let pooler = parse_choice(
            var::DATABASE_POOLER,
            &self.database_pooler,
            &[("none", Pooler::None), ("transaction", Pooler::Transaction)],
        )?;
        DatabaseConfig::parse(&self.database_url, &self.table, pooler)
    }
}

/// Where the relay LISTENs for new rows.
#[derive(Debug, Clone, Args)]
pub struct ListenSettings {
    /// A direct connection used only for LISTEN. Default: the database URL,
    /// or none (polling) with `OUTBOX_DATABASE_POOLER=transaction`.
    #[arg(long, env = var::LISTEN_DATABASE_URL, hide_env_values = true)]
    pub listen_database_url: Option<String>,
}

impl ListenSettings {
    /// The server to LISTEN on, if any: a transaction pooler cannot carry
    /// LISTEN (the session it runs in is handed to other clients), so
    /// behind one there is none unless a direct URL is given.
    pub fn validate(&self, database: &DatabaseConfig) -> Result<Option<Endpoint>, ConfigError> {
        match self.listen_database_url.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => Endpoint::parse(var::LISTEN_DATABASE_URL, url).map(Some),
            _ => Ok(match database.pooler {
                Pooler::None => Some(database.endpoint()),
                Pooler::Transaction => None,
            }),
        }
    }
}

/// Settings of `migrate`.
#[derive(Debug, Clone, Args)]
pub struct MigrateSettings {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub database: DatabaseSettings,

    /// `on` installs the trigger that NOTIFYs relays of new rows (low idle
    /// latency, a cost for concurrent producers); `off` removes it.
    #[arg(long, env = var::NOTIFY_TRIGGER, default_value = "on")]
    pub notify_trigger: String,
}

impl MigrateSettings {
    /// Validated settings: the database, and whether to install the trigger.
    pub fn validate(&self) -> Result<(DatabaseConfig, bool), ConfigError> {
        let database = self.database.validate()?;
        let notify_trigger = parse_choice(
            var::NOTIFY_TRIGGER,
            &self.notify_trigger,
            &[("on", true), ("true", true), ("off", false), ("false", false)],
        )?;
        Ok((database, notify_trigger))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(pooler: &str) -> DatabaseSettings {
        DatabaseSettings {
            database_url: "postgres://relay@pgbouncer:6432/shop".into(),
            table: "outbox_event".into(),
            database_pooler: pooler.into(),
        }
    }

    #[test]
    fn the_notify_trigger_names_the_accepted_words() {
        let settings = MigrateSettings {
            database: DatabaseSettings {
                database_url: "postgres://localhost/db".into(),
                table: "outbox_event".into(),
                database_pooler: "none".into(),
            },
            notify_trigger: "maybe".into(),
        };
        assert_eq!(
            settings.validate().unwrap_err().to_string(),
            "OUTBOX_NOTIFY_TRIGGER: 'maybe' is not one of on, off"
        );
    }

    #[test]
    fn errors_never_echo_passwords() {
        let db = DatabaseSettings {
            database_url: "postgres://u:hunter2@h:notaport/db".into(),
            table: "outbox_event".into(),
            database_pooler: "none".into(),
        };
        assert!(!db.validate().unwrap_err().to_string().contains("hunter2"));
    }

    #[test]
    fn a_transaction_pooler_listens_only_on_a_direct_url() {
        let none = database("none").validate().unwrap();
        let listen = ListenSettings {
            listen_database_url: None,
        };
        let endpoint = listen
            .validate(&none)
            .unwrap()
            .expect("listens on the database URL");
        assert_eq!(endpoint.pg.get_ports(), &[6432]);
        let pooled = database("transaction").validate().unwrap();
        assert!(listen.validate(&pooled).unwrap().is_none());
        let direct = ListenSettings {
            listen_database_url: Some("postgres://relay@db:5432/shop".into()),
        };
        let endpoint = direct
            .validate(&pooled)
            .unwrap()
            .expect("listens on the direct URL");
        assert_eq!(endpoint.pg.get_ports(), &[5432]);
        assert_eq!(
            database("session").validate().unwrap_err().to_string(),
            "OUTBOX_DATABASE_POOLER: 'session' is not one of none, transaction"
        );
        let bad = ListenSettings {
            listen_database_url: Some("postgres://u:hunter2@db/shop?sslmode=nope".into()),
        };
        let error = bad.validate(&pooled).unwrap_err();
        assert_eq!(error.variable, "OUTBOX_LISTEN_DATABASE_URL");
        assert!(!error.to_string().contains("hunter2"));
    }
}
