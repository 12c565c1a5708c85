//! outbox-relay publishes rows of a PostgreSQL transactional outbox to a
//! message broker, at least once, under each event's stable id.
//!
//! Data flows one way:
//!
//! ```text
//! config ──► relay ──claim──► store (PostgreSQL)
//!              │                 ▲
//!              └──publish──► sink ──outcomes──┘  mark / back off / quarantine
//! ```
//!
//! Modules:
//! - [`config`] — settings from the environment and flags → validated [`config::Config`].
//! - [`store`] — every SQL statement (files in `src/store/sql/`) and the embedded migrations.
//! - [`sink`] — the [`sink::Sink`] contract and its RabbitMQ and SQS implementations.
//! - [`relay`] — the loop, claim → publish → record outcomes.
//! - [`retry`] — the backoff rule, a pure function of the attempt.
//! - [`metrics`], [`http`] — Prometheus metrics and the health endpoints.
//! - [`maintenance`] — the backlog gauges' refresher and retention of published rows.
//! - [`cli`] — the command line, and the `run` command that wires it all.
//! - [`outage`] — logging an outage once, not on every retry.
//! - [`telemetry`] — logging.

pub mod cli;
pub mod config;
pub mod http;
pub mod maintenance;
pub mod metrics;
pub mod outage;
pub mod relay;
pub mod retry;
pub mod sink;
pub mod store;
pub mod telemetry;
