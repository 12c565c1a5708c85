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
//! - [`settings`] — what every part's settings share: each variable's name written once
//!   ([`settings::var`]), the error naming one, duration and choice parsing. A leaf that imports
//!   nothing of ours, so each part can own its settings (flags, environment, validation) without
//!   importing the assembler.
//! - [`config`] — the validated [`config::Config`] of `run`, assembled from what each part
//!   validated; it imports the parts and no part imports it, so imports flow one way, as data does.
//!   [`config::file`] reads the configuration file (`OUTBOX_CONFIG`) into the same settings, and
//!   the destinations, routes and sources only the file can hold: a [`config::SourceConfig`] per
//!   database the relay serves (`[[source]]`), or the environment's one.
//! - [`route`] — which destination an event goes to: globs on `event_type`, first match wins.
//! - [`app`] — wiring of `outbox-relay run`: per source its own pool, loop, LISTEN and
//!   maintenance, the destinations they share, HTTP, shutdown.
//! - [`event`] — [`event::Event`], one outbox row as the relay reads it; [`headers`], the
//!   producer's optional headers column and the W3C trace context in it.
//! - [`cloudevents`] — the message format: plain, or CloudEvents (binary mode on RabbitMQ and
//!   Kafka, structured on SQS).
//! - [`relay`] — the loop, claim → publish → record outcomes; `relay::decide` maps outcomes to
//!   published / retry / quarantine; [`relay::Destination`], one sink with its own readiness,
//!   deferral outage and metrics, so one broker's outage holds back only its own rows.
//! - [`store`] — every SQL statement (files in `src/store/sql/`), the table and database
//!   settings, the embedded migrations, LISTEN.
//! - [`sink`] — the [`sink::Sink`] contract and one folder per broker, each a cargo feature:
//!   `sink::amqp` (`rabbitmq`), `sink::sqs`, `sink::nats`, `sink::kafka`; the destination
//!   template they share, [`sink::template`].
//! - [`retry`] — a row's backoff between attempts, a pure function of the attempt.
//! - [`outage`] — a dependency outage, logged once, waited out with the one in-process retry
//!   policy.
//! - [`liveness`] — the relay workers' heartbeat behind `/healthz`.
//! - [`metrics`], [`http`] — Prometheus metrics and the health endpoints.
//! - [`maintenance`] — the backlog gauges' refresher and retention of published rows.
//! - [`cli`] — the command line and the admin commands.
//! - [`tls`] — TLS for PostgreSQL, RabbitMQ and NATS alike (Kafka's is librdkafka's own): certificate files, trust levels, and
//!   certificate failures in words.
//! - [`telemetry`] — logging.
//! - [`otel`] — publish spans over OTLP, when the `OTEL_*` variables ask.
//!
//! The consumer's half (deduplicating on the message id) is the separate
//! `outbox-consumer` crate, so consumers do not depend on this one.

pub mod app;
pub mod cli;
pub mod cloudevents;
pub mod config;
pub mod event;
pub mod headers;
pub mod http;
pub mod liveness;
pub mod maintenance;
pub mod metrics;
pub mod otel;
pub mod outage;
pub mod relay;
pub mod retry;
pub mod route;
pub mod settings;
pub mod sink;
pub mod store;
pub mod telemetry;
pub mod tls;
