//! The consumers, RabbitMQ and SQS, that deduplicate with
//! `outbox_consumer` and "crash" on some deliveries, and the [`Ledger`] of
//! what they saw and did.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, QueueAttributeName};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use outbox_consumer::{self as consumer, Claim, Deduplicator};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::common::sqs::TestQueue;
use crate::common::{TestBroker, TestDb};
use crate::{producer, Run};

/// The chance, per first delivery, that the consumer "crashes" before its
/// commit, and, separately, after its commit but before the ack.
const CONSUMER_CRASH: f64 = 0.01;

/// What the consumer saw and did.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Every delivery of an event, in the order received: the id and
    /// whether it came back because the consumer itself did not ack it.
    pub deliveries: Vec<(Uuid, bool)>,
    /// The routing key of every RabbitMQ delivery, in the order received.
    pub routing_keys: Vec<(Uuid, String)>,
    /// Messages whose id is not a UUID.
    pub malformed: Vec<String>,
    /// Deliveries whose `traceparent` is not the one the producer wrote:
    /// the id and what came instead.
    pub wrong_trace: Vec<(Uuid, Option<String>)>,
    /// Claims that were `First` and committed: effects applied.
    pub applied: usize,
    /// Claims that were `Duplicate`: effects skipped.
    pub skipped: usize,
    /// Claims that were `First` but rolled back by a simulated crash.
    pub rolled_back: usize,
    /// Simulated consumer crashes before the commit (rolled back, not acked).
    pub crashed_before_commit: usize,
    /// Simulated consumer crashes after the commit, before the ack.
    pub crashed_after_commit: usize,
    /// Messages the consumer left unacknowledged that have not come back yet.
    pub awaiting_redelivery: usize,
    /// Deliveries received and not yet acknowledged or handed back.
    pub in_flight: usize,
    /// The end-of-stream fence arrived (RabbitMQ).
    pub fence_seen: bool,
}

/// What the consumer does with a first delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Claim, apply, commit, ack.
    Normal,
    /// Claim, apply, then die before the commit: everything rolls back and
    /// the message comes again.
    CrashBeforeCommit,
    /// Claim, apply, commit, then die before the ack: the message comes
    /// again and must be a duplicate.
    CrashAfterCommit,
}

impl Fate {
    fn draw(rng: &mut StdRng, redelivered: bool) -> Self {
        // A redelivery is processed normally, so every crash is followed by
        // exactly one redelivery.
        if redelivered {
            return Fate::Normal;
        }
        let roll: f64 = rng.random();
        if roll < CONSUMER_CRASH {
            Fate::CrashBeforeCommit
        } else if roll < 2.0 * CONSUMER_CRASH {
            Fate::CrashAfterCommit
        } else {
            Fate::Normal
        }
    }
}

/// The consumer's database: `processed_message` and the effect table.
pub async fn consumer_database() -> TestDb {
    let db = TestDb::create().await;
    consumer::migrate(&db.client).await.expect("consumer migrate");
    // No constraint on message_id: a duplicate effect must be visible.
    db.client
        .batch_execute("CREATE TABLE effect (message_id UUID NOT NULL, applied_at TIMESTAMPTZ DEFAULT now())")
        .await
        .expect("create effect table");
    db
}

async fn consumer_connection(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("consumer connects");
    tokio::spawn(connection);
    // The consumer database is not what is under test; skipping the WAL
    // flush per commit keeps the consumer ahead of three relays.
    client
        .batch_execute("SET synchronous_commit = off")
        .await
        .expect("consumer session settings");
    client
}

/// The consumer's unit of work: claim and effect in one transaction.
async fn apply(client: &mut Client, dedup: &Deduplicator, id: Uuid, fate: Fate, ledger: &Mutex<Ledger>) {
    let tx = client.transaction().await.expect("begin");
    let claim = dedup.claim(&tx, id).await.expect("claim");
    if claim == Claim::First {
        tx.execute_typed(
            "INSERT INTO effect (message_id) VALUES ($1)",
            &[(&id, Type::UUID)],
        )
        .await
        .expect("apply effect");
    }
    if fate == Fate::CrashBeforeCommit {
        tx.rollback().await.expect("rollback");
    } else {
        tx.commit().await.expect("commit");
    }
    let mut ledger = ledger.lock().unwrap();
    match (claim, fate) {
        (Claim::Duplicate, _) => ledger.skipped += 1,
        (Claim::First, Fate::CrashBeforeCommit) => ledger.rolled_back += 1,
        (Claim::First, _) => ledger.applied += 1,
    }
    match fate {
        Fate::Normal => {}
        Fate::CrashBeforeCommit => ledger.crashed_before_commit += 1,
        Fate::CrashAfterCommit => ledger.crashed_after_commit += 1,
    }
    if fate != Fate::Normal {
        ledger.awaiting_redelivery += 1;
    }
}

/// What a consumer task takes from the run: its database's URL, the
/// seed, the ledger and the token that stops it.
fn consumer_of(run: &Run) -> (String, u64, Arc<Mutex<Ledger>>, CancellationToken) {
    (
        run.consumer_db.url.clone(),
        run.seed,
        run.ledger.clone(),
        run.stop.clone(),
    )
}

const FENCE: &str = "end-of-test-fence";

/// Consumer workers, each with its own database connection. Deliveries go
/// to them round robin, so a duplicate can be claimed while its original
/// is still in another worker's transaction: the race `claim` settles.
const AMQP_WORKERS: usize = 8;

/// A RabbitMQ consumer with manual acks: begin → claim → effect → commit →
/// ack. Some first deliveries "crash" and are handed back with a nack; the
/// broker redelivers them flagged `redelivered`. Deliveries are recorded
/// in the order the broker hands them out, then processed by
/// [`AMQP_WORKERS`] workers, into `run`'s ledger. Runs until `run` stops
/// it.
pub fn start_amqp_consumer(broker: &TestBroker, run: &Run) -> tokio::task::JoinHandle<()> {
    let (queue, broker_url) = (broker.queue.clone(), broker.url.clone());
    let (url, seed, ledger, stop) = consumer_of(run);
    tokio::spawn(async move {
        let mut workers = Vec::new();
        let mut senders = Vec::new();
        for worker in 0..AMQP_WORKERS {
            let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<lapin::message::Delivery>();
            senders.push(sender);
            let mut client = consumer_connection(&url).await;
            let ledger = ledger.clone();
            workers.push(tokio::spawn(async move {
                let dedup = Deduplicator::new("crash-suite");
                let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed ^ worker as u64);
                while let Some(delivery) = receiver.recv().await {
                    let id = delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .and_then(|id| Uuid::parse_str(id.as_str()).ok())
                        .expect("checked on receipt");
                    let fate = Fate::draw(&mut rng, delivery.redelivered);
                    apply(&mut client, &dedup, id, fate, &ledger).await;
                    if fate == Fate::Normal {
                        delivery.ack(BasicAckOptions::default()).await.expect("ack");
                    } else {
                        delivery
                            .nack(BasicNackOptions {
                                requeue: true,
                                ..BasicNackOptions::default()
                            })
                            .await
                            .expect("nack");
                    }
                    ledger.lock().unwrap().in_flight -= 1;
                }
            }));
        }
        let connection = Connection::connect(&broker_url, ConnectionProperties::default())
            .await
            .expect("consumer reaches RabbitMQ");
        let channel = connection.create_channel().await.expect("consumer channel");
        channel
            .basic_qos(500, BasicQosOptions::default())
            .await
            .expect("prefetch");
        let mut deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                "crash-suite".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let mut next_worker = 0;
        loop {
            let delivery = tokio::select! {
                next = deliveries.next() => match next {
                    Some(delivery) => delivery.expect("delivery"),
                    None => break,
                },
                _ = stop.cancelled() => break,
            };
            let message_id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .unwrap_or_default();
            if message_id == FENCE {
                delivery.ack(BasicAckOptions::default()).await.expect("ack");
                ledger.lock().unwrap().fence_seen = true;
                continue;
            }
            let Ok(id) = Uuid::parse_str(&message_id) else {
                ledger.lock().unwrap().malformed.push(message_id);
                delivery.ack(BasicAckOptions::default()).await.expect("ack");
                continue;
            };
            let traceparent = delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|headers| headers.inner().get("traceparent").cloned())
                .map(|value| match value {
                    lapin::types::AMQPValue::LongString(text) => text.to_string(),
                    other => format!("{other:?}"),
                });
            {
                let mut ledger = ledger.lock().unwrap();
                if traceparent.as_deref() != Some(producer::traceparent(&id).as_str()) {
                    ledger.wrong_trace.push((id, traceparent));
                }
                ledger.deliveries.push((id, delivery.redelivered));
                ledger.routing_keys.push((id, delivery.routing_key.to_string()));
                ledger.in_flight += 1;
                if delivery.redelivered {
                    ledger.awaiting_redelivery -= 1;
                }
            }
            senders[next_worker].send(delivery).expect("worker running");
            next_worker = (next_worker + 1) % senders.len();
        }
        drop(senders);
        for worker in workers {
            worker.await.expect("consumer worker");
        }
        let _ = connection.close(200, "done".into()).await;
    })
}

/// Publishes a fence behind everything the relays published: the queue
/// hands messages out in order, so once the consumer has seen the fence
/// (and got back what it handed back itself), it has seen everything.
pub async fn publish_fence(broker: &TestBroker) {
    let connection = Connection::connect(&broker.url, ConnectionProperties::default())
        .await
        .expect("fence publisher reaches RabbitMQ");
    let channel = connection.create_channel().await.expect("fence channel");
    channel
        .basic_publish(
            broker.exchange.as_str().into(),
            "chaos.fence".into(),
            BasicPublishOptions::default(),
            b"{}",
            BasicProperties::default().with_message_id(FENCE.into()),
        )
        .await
        .expect("publish fence")
        .await
        .expect("fence sent");
    let _ = connection.close(200, "done".into()).await;
}

/// An SQS consumer: receive → (claim → effect → commit) per message →
/// delete. Some first deliveries "crash": the message is made visible
/// again at once instead of being deleted. Runs until `run` stops it.
pub fn start_sqs_consumer(queue: &TestQueue, run: &Run) -> tokio::task::JoinHandle<()> {
    let (sqs, queue_url) = (queue.client.clone(), queue.url.clone());
    let (url, seed, ledger, stop) = consumer_of(run);
    tokio::spawn(async move {
        let mut client = consumer_connection(&url).await;
        let dedup = Deduplicator::new("crash-suite");
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        // Ids this consumer handed back and has not received again yet.
        let mut handed_back: HashSet<Uuid> = HashSet::new();
        while !stop.is_cancelled() {
            let answer = sqs
                .receive_message()
                .queue_url(&queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .visibility_timeout(120)
                .message_attribute_names("All")
                .send()
                .await
                .expect("ReceiveMessage");
            let mut done = Vec::new();
            for message in answer.messages() {
                let receipt = message.receipt_handle().unwrap_or_default().to_owned();
                let event_id = message
                    .message_attributes()
                    .and_then(|attributes| attributes.get("event_id"))
                    .and_then(|value| value.string_value())
                    .unwrap_or_default()
                    .to_owned();
                let Ok(id) = Uuid::parse_str(&event_id) else {
                    ledger.lock().unwrap().malformed.push(event_id);
                    done.push(receipt);
                    continue;
                };
                let redelivered = handed_back.remove(&id);
                let traceparent = message
                    .message_attributes()
                    .and_then(|attributes| attributes.get("traceparent"))
                    .and_then(|value| value.string_value())
                    .map(str::to_owned);
                {
                    let mut ledger = ledger.lock().unwrap();
                    if traceparent.as_deref() != Some(producer::traceparent(&id).as_str()) {
                        ledger.wrong_trace.push((id, traceparent));
                    }
                    ledger.deliveries.push((id, redelivered));
                    if redelivered {
                        ledger.awaiting_redelivery -= 1;
                    }
                }
                let fate = Fate::draw(&mut rng, redelivered);
                apply(&mut client, &dedup, id, fate, &ledger).await;
                if fate == Fate::Normal {
                    done.push(receipt);
                } else {
                    handed_back.insert(id);
                    sqs.change_message_visibility()
                        .queue_url(&queue_url)
                        .receipt_handle(receipt)
                        .visibility_timeout(0)
                        .send()
                        .await
                        .expect("ChangeMessageVisibility");
                }
            }
            if !done.is_empty() {
                let entries = done
                    .into_iter()
                    .enumerate()
                    .map(|(n, receipt)| {
                        DeleteMessageBatchRequestEntry::builder()
                            .id(n.to_string())
                            .receipt_handle(receipt)
                            .build()
                            .expect("entry has an id and a receipt")
                    })
                    .collect();
                let deleted = sqs
                    .delete_message_batch()
                    .queue_url(&queue_url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .expect("DeleteMessageBatch");
                assert!(
                    deleted.failed().is_empty(),
                    "delete failed: {:?}",
                    deleted.failed()
                );
            }
        }
    })
}

/// Whether the queue holds nothing, visible or in flight.
pub async fn sqs_queue_empty(queue: &TestQueue) -> bool {
    let answer = queue
        .client
        .get_queue_attributes()
        .queue_url(&queue.url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("GetQueueAttributes");
    let count = |name: QueueAttributeName| {
        answer
            .attributes()
            .and_then(|attributes| attributes.get(&name))
            .map(String::as_str)
            .unwrap_or("?")
            .to_owned()
    };
    count(QueueAttributeName::ApproximateNumberOfMessages) == "0"
        && count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible) == "0"
}
