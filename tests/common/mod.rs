//! Test support: an isolated database per test, a RabbitMQ exchange and
//! queue per test, the relay binary as a child process, a cuttable TCP
//! proxy, and polling helpers that wait on conditions instead of sleeping.
#![allow(dead_code)]

pub mod proxy;
pub mod rows;
pub mod servers;
pub mod sqs;

use std::collections::HashMap;
use std::future::Future;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

/// Where the tests find PostgreSQL (an admin connection that may create
/// databases).
pub fn pg_admin_url() -> String {
    std::env::var("OUTBOX_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Where the tests find RabbitMQ.
pub fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The relay binary built for this test run.
pub fn relay_bin() -> &'static str {
    env!("CARGO_BIN_EXE_outbox-relay")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::new_v4().simple())
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
    /// URL the relay connects with.
    pub url: String,
    /// A connection for the test's own queries.
    pub client: Client,
}

impl TestDb {
    /// Creates an empty database.
    pub async fn create() -> Self {
        let admin = connect_pg(&pg_admin_url()).await;
        let name = unique("outbox_test");
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

    /// Creates a database and runs `outbox-relay migrate` on it.
    pub async fn migrated() -> Self {
        let db = Self::create().await;
        let out = db.relay_command(&["migrate"], &[]).output().expect("run migrate");
        assert!(
            out.status.success(),
            "migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        db
    }

    /// The relay binary with this database configured.
    pub fn relay_command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut command = Command::new(relay_bin());
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("OUTBOX_DATABASE_URL", &self.url)
            .env("OUTBOX_AMQP_URL", amqp_url())
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_TEST_RUST_LOG").unwrap_or_else(|_| "info".into()),
            );
        for (key, value) in env {
            command.env(key, value);
        }
        command
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
    pub async fn ids_where(&self, condition: &str) -> std::collections::HashSet<Uuid> {
        self.client
            .query(&format!("SELECT id FROM outbox_event WHERE {condition}"), &[])
            .await
            .expect("select ids")
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

/// A message as a consumer received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub message_id: String,
    pub kind: Option<String>,
    pub content_type: Option<String>,
    pub delivery_mode: Option<u8>,
    pub timestamp: Option<u64>,
    pub headers: HashMap<String, String>,
    pub routing_key: String,
    pub body: Vec<u8>,
}

/// A topic exchange and a queue of their own for one test, deleted at the end.
pub struct TestBroker {
    pub exchange: String,
    pub queue: String,
    connection: Connection,
    channel: lapin::Channel,
}

impl TestBroker {
    /// Declares an exchange and a queue bound with `binding_key`.
    pub async fn create(binding_key: &str) -> Self {
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach RabbitMQ at {}: {e}\nstart it with: rabbitmq-server -detached \
                     (or set OUTBOX_TEST_AMQP_URL)",
                    amqp_url()
                )
            });
        let channel = connection.create_channel().await.expect("channel");
        let exchange = unique("outbox-test-x");
        let queue = unique("outbox-test-q");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                // Goes with its queue's binding, so a test that panics
                // before cleanup() leaves nothing behind for long.
                ExchangeDeclareOptions {
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare exchange");
        // Unused for 15 minutes (no consumer, no declare), the broker deletes
        // the queue: far longer than any test, short enough to reclaim what
        // a failed test left.
        let mut queue_arguments = FieldTable::default();
        queue_arguments.insert("x-expires".into(), lapin::types::AMQPValue::LongLongInt(900_000));
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                queue_arguments,
            )
            .await
            .expect("declare queue");
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                binding_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind queue");
        Self {
            exchange,
            queue,
            connection,
            channel,
        }
    }

    /// Receives messages until `count` arrived or `within` passed; returns
    /// what arrived (acknowledged).
    pub async fn receive(&self, count: usize, within: Duration) -> Vec<Received> {
        // A channel per call: closing it hands any message delivered past
        // `count` (prefetched, never acked) back to the queue.
        let channel = self.connection.create_channel().await.expect("consumer channel");
        let mut consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                unique("consumer").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let deadline = tokio::time::Instant::now() + within;
        let mut received = Vec::new();
        while received.len() < count {
            let next = tokio::time::timeout_at(deadline, consumer.next()).await;
            let Ok(Some(Ok(delivery))) = next else { break };
            delivery.ack(BasicAckOptions::default()).await.expect("ack");
            let properties = &delivery.properties;
            let headers = properties
                .headers()
                .as_ref()
                .map(|table| {
                    table
                        .inner()
                        .iter()
                        .map(|(key, value)| {
                            let text = match value {
                                lapin::types::AMQPValue::LongString(s) => s.to_string(),
                                other => format!("{other:?}"),
                            };
                            (key.to_string(), text)
                        })
                        .collect()
                })
                .unwrap_or_default();
            received.push(Received {
                message_id: properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                kind: properties.kind().as_ref().map(|s| s.to_string()),
                content_type: properties.content_type().as_ref().map(|s| s.to_string()),
                delivery_mode: *properties.delivery_mode(),
                timestamp: *properties.timestamp(),
                headers,
                routing_key: delivery.routing_key.to_string(),
                body: delivery.data.clone(),
            });
        }
        let _ = channel.close(200, "done".into()).await;
        received
    }

    /// The relay settings that publish to this test's exchange.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("OUTBOX_AMQP_EXCHANGE", self.exchange.clone())]
    }

    /// Deletes the queue and exchange.
    pub async fn cleanup(self) {
        let _ = self
            .channel
            .queue_delete(self.queue.as_str().into(), Default::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(self.exchange.as_str().into(), Default::default())
            .await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// A relay child process, killed when dropped.
pub struct RelayProcess {
    pub child: Child,
}

impl RelayProcess {
    /// Starts `outbox-relay run` with the given settings; output goes to the
    /// test's stderr so failures are readable.
    pub fn start(db: &TestDb, env: &[(&str, String)]) -> Self {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut command = db.relay_command(&["run"], &env);
        if !env.iter().any(|(k, _)| *k == "OUTBOX_HTTP_ADDR") {
            command.env("OUTBOX_HTTP_ADDR", "127.0.0.1:0");
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start relay");
        Self { child }
    }

    /// Sends a signal (`libc`-free: through the `kill` command).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit, at most `within`.
    pub async fn wait(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Holds every "mark published" statement of the test database forever, so
/// the relay can be killed exactly between the broker's confirm and the
/// commit of the outcome.
pub async fn hang_marks(db: &TestDb) {
    db.client
        .batch_execute(
            "CREATE FUNCTION hang_mark() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.published_at IS NOT NULL AND OLD.published_at IS NULL THEN
                     PERFORM pg_sleep(600);
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER hang_mark BEFORE UPDATE ON outbox_event
                 FOR EACH ROW EXECUTE FUNCTION hang_mark();",
        )
        .await
        .unwrap();
}

/// Removes what [`hang_marks`] installed; marks go through again.
pub async fn release_marks(db: &TestDb) {
    db.client
        .batch_execute("DROP TRIGGER hang_mark ON outbox_event; DROP FUNCTION hang_mark();")
        .await
        .unwrap();
}

/// Settings that make a test relay react quickly: a short poll and short
/// backoff.
pub fn quick_settings() -> Vec<(&'static str, String)> {
    vec![
        ("OUTBOX_POLL_INTERVAL", "50ms".to_owned()),
        ("OUTBOX_BACKOFF_BASE", "100ms".to_owned()),
        ("OUTBOX_BACKOFF_MAX", "500ms".to_owned()),
    ]
}

/// `env` with `extra` settings added, replacing earlier values of the same
/// variables.
pub fn with(
    mut env: Vec<(&'static str, String)>,
    extra: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    for (key, value) in extra {
        env.retain(|(k, _)| k != key);
        env.push((key, (*value).to_owned()));
    }
    env
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

/// Runs the relay binary to completion.
pub fn run_to_end(mut command: Command) -> Output {
    command.output().expect("run relay binary")
}
