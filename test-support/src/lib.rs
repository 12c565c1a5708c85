//! Test support shared by the workspace's integration tests and the
//! benchmark: a database of its own per test, a RabbitMQ exchange and queue
//! of their own ([`broker`]), an SQS queue of its own ([`sqs`]), a NATS
//! JetStream stream of its own ([`nats`]), a Kafka cluster of its own
//! (librdkafka's mock cluster, [`kafka`]), the relay
//! binary as a child process ([`relay_process`]) and a configuration file
//! of its own ([`config_file`]), a cuttable TCP proxy
//! ([`proxy`]), an HTTP proxy that answers for SQS with the faults a test
//! chooses ([`sqs_faults`]), a factory of outbox rows in a given state
//! ([`rows`]), what the relay's `/metrics` shows ([`metrics`]),
//! servers a test starts for itself — a RabbitMQ node ([`private_rabbit`])
//! and a PostgreSQL cluster ([`private_postgres`]) to disturb (alarms,
//! restarts) or set up otherwise (TLS, `pg_hba.conf`), on what [`system`]
//! gives; PgBouncer, stunnel, and the certificates TLS needs
//! ([`servers`]) — and [`eventually`], which waits on a condition instead
//! of sleeping.
//!
//! The brokers' clients come with features, `amqp` (lapin), `sqs`
//! (aws-sdk-sqs, and axum and reqwest for the fault proxy), `nats`
//! (async-nats) and `kafka` (rdkafka, for the `kafka-mock` binary), all on
//! by default: a crate whose tests need PostgreSQL only turns them off and
//! pulls in none of them.
//!
//! Only the package that builds the relay knows where its binary is (cargo
//! sets `CARGO_BIN_EXE_outbox-relay` for that package's own tests and
//! benches, not for this crate), so that package names it: a marker type
//! implementing [`RelayBinary`], and `TestDb<Marker>`, which can then run
//! the relay against itself.

#[cfg(feature = "amqp")]
pub mod broker;
pub mod config_file;
pub mod db;
pub mod http;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod metrics;
#[cfg(feature = "nats")]
pub mod nats;
pub mod private_postgres;
#[cfg(feature = "amqp")]
pub mod private_rabbit;
pub mod proxy;
pub mod relay_process;
pub mod rows;
pub mod servers;
#[cfg(feature = "sqs")]
pub mod sqs;
#[cfg(feature = "sqs")]
pub mod sqs_faults;
pub mod system;

use std::future::Future;
use std::time::{Duration, Instant};

#[cfg(feature = "amqp")]
pub use broker::{amqp_url, Received, TestBroker};
pub use db::{hang_marks, hang_marks_after, pg_admin_url, release_marks, NoRelay, TestDb};
pub use http::{http_get, http_get_at};
#[cfg(feature = "kafka")]
pub use kafka::{unique_topic, KafkaApi, KafkaMock, KafkaRecord};
pub use metrics::{metrics_show, series};
#[cfg(feature = "nats")]
pub use nats::{nats_url, Stored, StreamLimits, TestStream};
pub use relay_process::{quick_settings, run_to_end, with, RelayBinary, RelayProcess};
pub use rows::{produce, produce_varied, produce_with_headers, ProducedRow};

/// A name no other test uses, for a database, an exchange or a queue.
fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
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
