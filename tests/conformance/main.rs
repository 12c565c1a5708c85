//! The sink conformance suite: every class of broker answer, for every
//! sink, with the same assertions (see `kit.rs`): whose fault it is, which
//! attempts are charged, what is quarantined, what `/readyz` says, how
//! often the relay asks while it lasts, and that everything arrives once it
//! ends. Each sink's file only causes its broker's answers; the tables in
//! docs/rabbitmq.md, docs/sqs.md, docs/nats.md and docs/kafka.md list them
//! with the case that covers each.
//!
//! Every case has a database, a destination (exchange and queue, SQS
//! queue, JetStream stream, a Kafka mock cluster) and, where it cuts or
//! stalls connections, a proxy of its own; a case that needs a server set up otherwise starts a
//! private one. So they run in parallel.

#[path = "../common/mod.rs"]
mod common;
mod kit;

mod kafka;
mod nats;
mod rabbitmq;
mod sqs;
