//! The SQS half of the benchmark: the relay draining prefilled rows into an
//! SQS endpoint (an emulator here), next to that endpoint's own ceiling.
//!
//! Both runs start from an empty queue and send the same number of
//! messages, so they see the same queue depths: stock moto rescans a queue
//! on every send and slows as it fills, and a consumer draining the queue
//! during the run slowed it down further still (its receives hold the
//! queue). Only the ratio of the two runs says anything about the relay; an
//! emulator's absolute speed says nothing about SQS.

use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use futures::StreamExt;
use outbox_relay::sink::sqs::IN_FLIGHT;
use outbox_test_support::sqs::{client, TestQueue};
use outbox_test_support::RelayProcess;

use crate::fixture::{database, prefill, relay_settings, sample_event, until_published};
use crate::meter::proc_usage;
use crate::{Error, Options};

/// One SQS run's result.
pub struct SqsRun {
    pub fifo: bool,
    pub ceiling: f64,
    pub relay: f64,
    pub relay_peak_rss_mib: f64,
}

fn describe(error: impl std::error::Error + 'static) -> String {
    aws_sdk_sqs::error::DisplayErrorContext(error).to_string()
}

/// Events/s of a bare `SendMessageBatch` loop: 10 entries a request, the
/// sink's number of requests in flight, the relay's messages.
async fn ceiling(endpoint: &str, fifo: bool, rows: usize) -> Result<f64, Error> {
    let queue = TestQueue::create_at(endpoint, fifo, None).await;
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
            let (sqs, url) = (queue.client.clone(), queue.url.clone());
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
    let rate = rows as f64 / started.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    queue.cleanup().await;
    Ok(rate)
}

/// Events/s of the relay process, from its start to the last row marked
/// published (the relay marks a row only after SQS accepted it).
async fn relay(endpoint: &str, options: &Options, fifo: bool) -> Result<(f64, f64), Error> {
    let queue = TestQueue::create_at(endpoint, fifo, None).await;
    let db = database(options).await;
    prefill(&db, options.sqs_rows).await?;
    let started = Instant::now();
    let mut settings = relay_settings(options, "unused");
    settings.extend(queue.env_via(endpoint));
    let relay = RelayProcess::start(&db, &settings);
    let outcome = until_published(&db, Duration::from_millis(50)).await;
    let rate = options.sqs_rows as f64 / started.elapsed().as_secs_f64();
    let (peak_kib, _) = proc_usage(relay.child.id());
    drop(relay);
    queue.cleanup().await;
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
        let ceiling = ceiling(endpoint, fifo, options.sqs_rows).await?;
        let (relay, relay_peak_rss_mib) = relay(endpoint, options, fifo).await?;
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
