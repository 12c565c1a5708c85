//! The SQS half of the benchmark: the relay draining prefilled rows into an
//! SQS endpoint (an emulator here), next to that endpoint's own ceiling.
//!
//! Both runs keep the queue shallow with a consumer that receives and
//! deletes while messages are sent: stock moto rescans a queue on every
//! send, so a queue left to fill up would measure the queue's depth, not
//! the sender. Only the ratio of the two runs says anything about the
//! relay; an emulator's absolute speed says nothing about SQS.

use std::collections::HashSet;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;
use futures::StreamExt;
use outbox_relay::sink::sqs::IN_FLIGHT;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{proc_usage, relay_command, sample_event, BenchDb, Error, Options};

/// One SQS run's result.
pub struct SqsRun {
    pub fifo: bool,
    pub ceiling: f64,
    pub relay: f64,
    pub relay_peak_rss_mib: f64,
}

fn client(endpoint: &str) -> Client {
    Client::from_conf(
        aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "bench"))
            .endpoint_url(endpoint)
            .build(),
    )
}

fn describe(error: impl std::error::Error + 'static) -> String {
    aws_sdk_sqs::error::DisplayErrorContext(error).to_string()
}

async fn create_queue(sqs: &Client, fifo: bool) -> Result<String, Error> {
    let name = format!(
        "outbox-bench-{}{}",
        Uuid::new_v4().simple(),
        if fifo { ".fifo" } else { "" }
    );
    let mut request = sqs.create_queue().queue_name(name);
    if fifo {
        request = request.attributes(QueueAttributeName::FifoQueue, "true");
    }
    let created = request.send().await.map_err(describe)?;
    Ok(created
        .queue_url()
        .ok_or("CreateQueue returned no URL")?
        .to_owned())
}

/// Receives and deletes until cancelled, recording each `event_id`.
fn start_consumer(sqs: Client, url: String, stop: CancellationToken) -> Arc<Mutex<HashSet<String>>> {
    let received = Arc::new(Mutex::new(HashSet::new()));
    let seen = received.clone();
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            let Ok(output) = sqs
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_attribute_names("All")
                .send()
                .await
            else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let messages = output.messages();
            if messages.is_empty() {
                continue;
            }
            let deletes: Vec<DeleteMessageBatchRequestEntry> = messages
                .iter()
                .enumerate()
                .filter_map(|(n, m)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(n.to_string())
                        .receipt_handle(m.receipt_handle()?)
                        .build()
                        .ok()
                })
                .collect();
            {
                let mut seen = seen.lock().unwrap();
                for message in messages {
                    let id = message
                        .message_attributes()
                        .and_then(|a| a.get("event_id"))
                        .and_then(|v| v.string_value());
                    if let Some(id) = id {
                        seen.insert(id.to_owned());
                    }
                }
            }
            let _ = sqs
                .delete_message_batch()
                .queue_url(&url)
                .set_entries(Some(deletes))
                .send()
                .await;
        }
    });
    received
}

async fn wait_for(received: &Mutex<HashSet<String>>, count: usize, what: &str) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(900);
    while received.lock().unwrap().len() < count {
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: only {} of {count} messages arrived",
                received.lock().unwrap().len()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Events/s of a bare `SendMessageBatch` loop: 10 entries a request, the
/// sink's number of requests in flight, the relay's messages.
async fn ceiling(sqs: &Client, fifo: bool, rows: usize) -> Result<f64, Error> {
    let url = create_queue(sqs, fifo).await?;
    let stop = CancellationToken::new();
    let received = start_consumer(sqs.clone(), url.clone(), stop.clone());
    let attribute = |value: &str| {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .expect("data type is set")
    };
    let requests: Vec<Vec<SendMessageBatchRequestEntry>> = (0..rows)
        .map(sample_event)
        .collect::<Vec<_>>()
        .chunks(10)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .map(|(position, event)| {
                    let mut entry = SendMessageBatchRequestEntry::builder()
                        .id(position.to_string())
                        .message_body(&event.payload)
                        .message_attributes("event_id", attribute(&event.id.to_string()))
                        .message_attributes("event_type", attribute(&event.event_type))
                        .message_attributes("aggregate_id", attribute(&event.aggregate_id));
                    if fifo {
                        entry = entry
                            .message_group_id(&event.aggregate_id)
                            .message_deduplication_id(event.id.to_string());
                    }
                    entry.build().expect("id and body are set")
                })
                .collect()
        })
        .collect();
    let started = Instant::now();
    let results: Vec<Result<(), String>> = futures::stream::iter(requests)
        .map(|entries| {
            let (sqs, url) = (sqs.clone(), url.clone());
            async move {
                let output = sqs
                    .send_message_batch()
                    .queue_url(url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(describe)?;
                match output.failed().len() {
                    0 => Ok(()),
                    failed => Err(format!("{failed} entries failed")),
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    wait_for(&received, rows, "ceiling").await?;
    let rate = rows as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    let _ = sqs.delete_queue().queue_url(&url).send().await;
    Ok(rate)
}

/// Events/s of the relay process, from its start to the last message
/// received.
async fn relay(sqs: &Client, endpoint: &str, options: &Options, fifo: bool) -> Result<(f64, f64), Error> {
    let url = create_queue(sqs, fifo).await?;
    let db = BenchDb::create(options).await?;
    db.prefill(options.sqs_rows).await?;
    let stop = CancellationToken::new();
    let received = start_consumer(sqs.clone(), url.clone(), stop.clone());
    let started = Instant::now();
    let mut relay: Child = relay_command(&db.url, options, "unused")
        .env("OUTBOX_SINK", "sqs")
        .env("OUTBOX_SQS_QUEUE_URL", &url)
        .env("OUTBOX_SQS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .stderr(Stdio::inherit())
        .spawn()?;
    let outcome = wait_for(&received, options.sqs_rows, "relay").await;
    let rate = options.sqs_rows as f64 / started.elapsed().as_secs_f64();
    let (peak_kib, _) = proc_usage(relay.id());
    let _ = relay.kill();
    let _ = relay.wait();
    stop.cancel();
    let _ = sqs.delete_queue().queue_url(&url).send().await;
    db.drop().await?;
    outcome?;
    Ok((rate, peak_kib as f64 / 1024.0))
}

/// Standard and FIFO queues, each: ceiling, then the relay.
pub async fn run(options: &Options, endpoint: &str) -> Result<Vec<SqsRun>, Error> {
    let sqs = client(endpoint);
    sqs.list_queues().send().await.map_err(|e| {
        format!(
            "no SQS endpoint answers at {endpoint} ({}); start one (scripts/bench does) or pass --sqs-endpoint",
            describe(e)
        )
    })?;
    let mut runs = Vec::new();
    for fifo in [false, true] {
        let ceiling = ceiling(&sqs, fifo, options.sqs_rows).await?;
        let (relay, relay_peak_rss_mib) = relay(&sqs, endpoint, options, fifo).await?;
        eprintln!(
            "SQS {}: ceiling {ceiling:.0}/s, relay {relay:.0}/s",
            if fifo { "FIFO" } else { "standard" }
        );
        runs.push(SqsRun {
            fifo,
            ceiling,
            relay,
            relay_peak_rss_mib,
        });
    }
    Ok(runs)
}
