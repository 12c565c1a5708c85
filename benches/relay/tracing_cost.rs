//! What publish spans cost: the same drain of rows that carry a producer's
//! `traceparent`, with export off (no `OTEL_*` variables), with every span
//! exported over OTLP/HTTP to a receiver in this process, and with export
//! on but nothing sampled (the spans made and dropped). Runs alternate, so
//! that each kind sees the same machine.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;

use crate::drain::{self, Drain, Setup};
use crate::{Error, Options};

/// The kinds of run, in the order they alternate.
const KINDS: [&str; 3] = ["off", "exported", "on, nothing sampled"];

/// Spans the receiver decoded.
#[derive(Clone, Default)]
struct Counted {
    spans: Arc<AtomicU64>,
}

async fn traces(State(counted): State<Counted>, body: Bytes) -> Vec<u8> {
    if let Ok(request) = ExportTraceServiceRequest::decode(body) {
        let spans: usize = request
            .resource_spans
            .iter()
            .flat_map(|resource| &resource.scope_spans)
            .map(|scope| scope.spans.len())
            .sum();
        counted.spans.fetch_add(spans as u64, Ordering::Relaxed);
    }
    ExportTraceServiceResponse::default().encode_to_vec()
}

async fn receiver() -> Result<(SocketAddr, Counted), Error> {
    let counted = Counted::default();
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .with_state(counted.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((addr, counted))
}

/// One kind's variables; leaked, as a drain's setup holds only statics.
fn variables(kind: &str, endpoint: &'static str) -> &'static [(&'static str, &'static str)] {
    let variables: Vec<(&'static str, &'static str)> = match kind {
        "off" => Vec::new(),
        "exported" => vec![("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)],
        _ => vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_TRACES_SAMPLER", "always_off"),
        ],
    };
    Vec::leak(variables)
}

pub async fn run(options: &Options) -> Result<(), Error> {
    let (addr, counted) = receiver().await?;
    let endpoint: &'static str = String::leak(format!("http://{addr}"));
    let mut runs: Vec<Vec<(Drain, u64)>> = KINDS.iter().map(|_| Vec::new()).collect();
    for _ in 0..options.repeat.max(1) {
        for (kind, kept) in KINDS.iter().zip(runs.iter_mut()) {
            let before = counted.spans.load(Ordering::Relaxed);
            let setup = Setup {
                traced: true,
                environment: variables(kind, endpoint),
                ..Default::default()
            };
            let run = drain::drain_with(options, 1, options.rows, setup).await?;
            // A relay killed at the end of a drain may not have sent its
            // last batch of spans; what came is what the table shows.
            let spans = counted.spans.load(Ordering::Relaxed) - before;
            eprintln!(
                "drain, tracing {kind}: {:.0} events/s, relay CPU {:.0}%, {spans} spans received",
                run.run.events_per_second, run.relay_percent
            );
            kept.push((run, spans));
        }
    }
    println!(
        "\n| drain of {} rows with a traceparent (1 relay, batch {} × {} workers; median of {}) | events/s | vs off | relay CPU | relay CPU µs per event | relay peak RSS | spans received |",
        options.rows,
        options.batch_size,
        options.workers,
        options.repeat.max(1)
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut off_rate = None;
    for (kind, mut kept) in KINDS.iter().zip(runs) {
        kept.sort_by(|a, b| a.0.run.events_per_second.total_cmp(&b.0.run.events_per_second));
        let (run, spans) = &kept[kept.len() / 2];
        let rate = run.run.events_per_second;
        let off = *off_rate.get_or_insert(rate);
        let cpu_us = run.relay_percent / 100.0 * run.run.seconds / run.rows as f64 * 1e6;
        println!(
            "| tracing {kind} | {rate:.0} | {:.2}× | {:.0}% | {cpu_us:.1} µs | {:.1} MiB | {spans} |",
            rate / off,
            run.relay_percent,
            run.peak_rss_mib
        );
    }
    Ok(())
}
