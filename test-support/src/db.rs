//! A database of its own per test (or benchmark run) on the shared
//! PostgreSQL, dropped with its connections at the end.

use std::collections::HashSet;
use std::marker::PhantomData;

use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

/// Where the tests find PostgreSQL (an admin connection that may create
/// databases).
pub fn pg_admin_url() -> String {
    std::env::var("OUTBOX_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A connection to `url`; panics with how to start PostgreSQL if it does
/// not answer: these tests never skip.
pub async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap_or_else(|e| {
        panic!(
            "cannot reach PostgreSQL at {url}: {e}\n\
             start it with: pg_ctlcluster --skip-systemctl-redirect 15 main start \
             (or set OUTBOX_TEST_PG_URL)"
        )
    });
    tokio::spawn(connection);
    client
}

/// The relay of a [`TestDb`] that no relay runs against: the relay's
/// methods (`migrated`, `relay_command`) are not there.
#[derive(Debug)]
pub enum NoRelay {}

/// A database of its own for one test, dropped (with its connections) at
/// the end. `R` names the relay binary that may run against it (see
/// [`crate::RelayBinary`]).
pub struct TestDb<R = NoRelay> {
    /// Database name.
    pub name: String,
    /// URL the relay connects with.
    pub url: String,
    /// A connection for the test's own queries.
    pub client: Client,
    /// The admin connection that created the database drops it.
    admin_url: String,
    relay: PhantomData<R>,
}

impl<R> TestDb<R> {
    /// Creates an empty database on the tests' PostgreSQL.
    pub async fn create() -> Self {
        Self::create_at(&pg_admin_url()).await
    }

    /// Creates an empty database through `admin_url`, a connection that may
    /// create databases.
    pub async fn create_at(admin_url: &str) -> Self {
        let admin = connect(admin_url).await;
        let name = crate::unique("outbox_test");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        let mut url = url::Url::parse(admin_url).expect("the PostgreSQL admin URL is a URL");
        url.set_path(&format!("/{name}"));
        let url = url.to_string();
        let client = connect(&url).await;
        Self {
            name,
            url,
            client,
            admin_url: admin_url.to_owned(),
            relay: PhantomData,
        }
    }

    /// Another connection to this database.
    pub async fn connect(&self) -> Client {
        connect(&self.url).await
    }

    /// Replaces the test's own connection, after its server restarted.
    pub async fn reconnect(&mut self) {
        self.client = connect(&self.url).await;
    }

    /// Inserts `count` events as a producer would; returns their ids in
    /// insertion order.
    pub async fn insert_events(&self, count: usize, event_type: &str) -> Vec<Uuid> {
        let ids: Vec<Uuid> = (0..count).map(|_| Uuid::new_v4()).collect();
        for chunk in ids.chunks(5_000) {
            self.client
                .execute(
                    "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
                     SELECT id, $2, 'agg-' || (ord % 50), jsonb_build_object('n', ord, 'note', 'test event'),
                            clock_timestamp()
                     FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, ord)",
                    &[&chunk, &event_type],
                )
                .await
                .expect("insert events");
        }
        ids
    }

    /// Index entries of the outbox's fresh index read so far, as
    /// PostgreSQL's statistics count them: a backend reports its reads
    /// within about ten seconds of going idle.
    pub async fn fresh_index_reads(&self) -> i64 {
        self.client
            .query_one(
                "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'outbox_event_fresh_idx'",
                &[],
            )
            .await
            .expect("read the fresh index's statistics")
            .get(0)
    }

    /// Count of rows matching a WHERE clause.
    pub async fn count(&self, condition: &str) -> i64 {
        self.client
            .query_one(
                &format!("SELECT count(*) FROM outbox_event WHERE {condition}"),
                &[],
            )
            .await
            .expect("count rows")
            .get(0)
    }

    /// Ids of the rows matching a WHERE clause.
    pub async fn ids_where(&self, condition: &str) -> HashSet<Uuid> {
        self.column(&format!("SELECT id FROM outbox_event WHERE {condition}"), &[])
            .await
            .into_iter()
            .collect()
    }

    /// The first column of every row `sql` returns.
    pub async fn column<T>(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<T>
    where
        T: for<'a> FromSql<'a>,
    {
        self.client
            .query(sql, params)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    /// Terminates this database's backends that belong to the relay.
    pub async fn terminate_relay_backends(&self) -> i64 {
        self.client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = $1 AND application_name = 'outbox-relay' AND pid <> pg_backend_pid()",
                &[&self.name],
            )
            .await
            .expect("terminate backends")
            .get(0)
    }
}

impl<R> Drop for TestDb<R> {
    fn drop(&mut self) {
        let (name, admin_url) = (self.name.clone(), self.admin_url.clone());
        // Drop runs inside the test's runtime; a plain thread with its own
        // runtime can still block on the cleanup.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    if let Ok((client, connection)) = tokio_postgres::connect(&admin_url, NoTls).await {
                        tokio::spawn(connection);
                        let _ = client
                            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

/// Holds every "mark published" statement of the test database forever, so
/// the relay can be killed exactly between the broker's confirm and the
/// commit of the outcome.
pub async fn hang_marks<R>(db: &TestDb<R>) {
    hang_marks_after(db, 0).await;
}

/// Like [`hang_marks`], once `marked` rows are marked published: marks go
/// through until then. Installed before a relay starts, it catches the
/// relay mid-drain however fast the drain runs; installed during one, a
/// fast relay may have marked every row before it is in place.
pub async fn hang_marks_after<R>(db: &TestDb<R>, marked: i64) {
    db.client
        .batch_execute(&format!(
            "CREATE FUNCTION hang_mark() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.published_at IS NOT NULL AND OLD.published_at IS NULL
                    AND (SELECT count(*) FROM outbox_event WHERE published_at IS NOT NULL) >= {marked} THEN
                     PERFORM pg_sleep(600);
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER hang_mark BEFORE UPDATE ON outbox_event
                 FOR EACH ROW EXECUTE FUNCTION hang_mark();"
        ))
        .await
        .unwrap();
}

/// Removes what [`hang_marks`] installed; marks go through again.
pub async fn release_marks<R>(db: &TestDb<R>) {
    db.client
        .batch_execute("DROP TRIGGER hang_mark ON outbox_event; DROP FUNCTION hang_mark();")
        .await
        .unwrap();
}
