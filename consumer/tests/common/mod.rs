//! Test support for the consumer library: an isolated database per test on
//! the local PostgreSQL, and a polling helper that waits on a condition
//! instead of sleeping. The relay's tests have their own (tests/common at the
//! repository root), which needs RabbitMQ and the relay binary; this one
//! needs PostgreSQL only.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

/// Where the tests find PostgreSQL (an admin connection that may create
/// databases); the same variable as the relay's tests.
pub fn pg_admin_url() -> String {
    std::env::var("OUTBOX_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn connect_pg(url: &str) -> Client {
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

/// A database of its own for one test, dropped (with its connections) at the end.
pub struct TestDb {
    /// Database name.
    pub name: String,
    /// URL of the database, for further connections.
    pub url: String,
    /// A connection for the test's own queries.
    pub client: Client,
}

impl TestDb {
    /// Creates an empty database.
    pub async fn create() -> Self {
        let admin = connect_pg(&pg_admin_url()).await;
        let name = format!("outbox_consumer_test_{}", Uuid::new_v4().simple());
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        let mut url = url::Url::parse(&pg_admin_url()).expect("OUTBOX_TEST_PG_URL is a URL");
        url.set_path(&format!("/{name}"));
        let url = url.to_string();
        let client = connect_pg(&url).await;
        Self { name, url, client }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside the test's runtime; a plain thread with its own
        // runtime can still block on the cleanup.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    if let Ok((client, connection)) = tokio_postgres::connect(&pg_admin_url(), NoTls).await {
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

/// Polls `condition` every 50 ms until it holds; panics with `what` after
/// `within`. Waiting on a condition, not a fixed sleep, keeps tests fast on
/// a quiet machine and correct on a busy one.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if condition().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
