//! The NATS JetStream half of the benchmark: the relay draining prefilled
//! rows into a stream, next to a bare async-nats JetStream publisher that
//! sends the same messages (the relay's headers, `Nats-Msg-Id` included)
//! with the same number of acknowledgements in flight as the relay keeps
//! (batch size × workers).
//!
//! Each run has a fresh stream, so both meet the same (empty) stream and
//! the same deduplication work.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use outbox_relay::sink::nats::headers;
use outbox_test_support::nats::TestStream;
use outbox_test_support::RelayProcess;

use crate::fixture::{database, prefill, relay_settings, sample_event, until_published};
use crate::meter::proc_usage;
use crate::{Error, Options};

/// One NATS run's result.
pub struct NatsRun {
    pub bare: f64,
    pub relay: f64,
    pub relay_peak_rss_mib: f64,
    pub in_flight: usize,
}

/// Events/s of a bare JetStream publisher: the relay's messages, at most
/// `in_flight` acknowledgements outstanding, each awaited.
async fn bare(rows: usize, in_flight: usize) -> Result<f64, Error> {
    let stream = TestStream::create().await;
    let events: Vec<_> = (0..rows).map(sample_event).collect();
    let subject = format!("{}.order.created", stream.prefix);
    let context = stream.context().clone();
    let started = Instant::now();
    let mut waiting = FuturesUnordered::new();
    let mut stored = 0;
    for event in &events {
        if waiting.len() >= in_flight {
            if let Some(ack) = waiting.next().await {
                ack?;
                stored += 1;
            }
        }
        let ack = context
            .publish_with_headers(subject.clone(), headers(event), event.payload.clone().into())
            .await?;
        waiting.push(ack.into_future());
    }
    while let Some(ack) = waiting.next().await {
        ack?;
        stored += 1;
    }
    let rate = rows as f64 / started.elapsed().as_secs_f64();
    let count = stream.count().await;
    stream.cleanup().await;
    if stored != rows || count != rows as u64 {
        return Err(format!("bare publisher: {stored} acknowledged, {count} stored of {rows}").into());
    }
    Ok(rate)
}

/// Events/s of the relay process, from its start to the last row marked
/// published (marked only after JetStream acknowledged it), and its peak RSS.
async fn relay(options: &Options) -> Result<(f64, f64), Error> {
    let stream = TestStream::create().await;
    let db = database(options).await;
    prefill(&db, options.nats_rows).await?;
    let started = Instant::now();
    let mut settings = relay_settings(options, "unused");
    settings.extend(stream.env());
    let relay = RelayProcess::start(&db, &settings);
    let outcome = until_published(&db, Duration::from_millis(20)).await;
    let rate = options.nats_rows as f64 / started.elapsed().as_secs_f64();
    let (peak_kib, _) = proc_usage(relay.child.id());
    drop(relay);
    let count = stream.count().await;
    stream.cleanup().await;
    outcome?;
    if count != options.nats_rows as u64 {
        return Err(format!("relay: {count} messages stored of {}", options.nats_rows).into());
    }
    Ok((rate, peak_kib as f64 / 1024.0))
}

/// The bare publisher, then the relay, on the same number of rows.
pub async fn run(options: &Options) -> Result<NatsRun, Error> {
    let in_flight = options.batch_size * options.workers;
    let bare = bare(options.nats_rows, in_flight).await?;
    eprintln!("NATS bare publisher: {bare:.0} msg/s");
    let (relay, relay_peak_rss_mib) = relay(options).await?;
    eprintln!("NATS relay: {relay:.0} events/s");
    Ok(NatsRun {
        bare,
        relay,
        relay_peak_rss_mib,
        in_flight,
    })
}
