//! Wake-ups from the NOTIFY trigger: a dedicated connection LISTENs on the
//! table's channel and turns each notification into a wake-up of one idle
//! relay worker. Polling stays the fallback, so this connection failing only
//! costs latency; it reconnects with backoff and logs the outage once.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_util::sync::CancellationToken;

use super::StoreError;
use crate::config::DatabaseConfig;
use crate::outage::Outage;

/// Listens until `shutdown`, calling `wake.notify_one()` per notification.
pub async fn listen(config: DatabaseConfig, wake: Arc<Notify>, shutdown: CancellationToken) {
    let mut outage = Outage::new("database (LISTEN)");
    let mut delays = backoff();
    while !shutdown.is_cancelled() {
        match listen_once(&config, &wake, &shutdown, &mut outage).await {
            Ok(()) => delays = backoff(),
            Err(e) => {
                outage.failed(&e);
                let delay = delays.next().unwrap_or(Duration::from_secs(5));
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => {}
                }
            }
        }
    }
}

fn backoff() -> backon::ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build()
}

/// One connection's life: returns `Ok` on shutdown, `Err` when it breaks.
async fn listen_once(
    config: &DatabaseConfig,
    wake: &Notify,
    shutdown: &CancellationToken,
    outage: &mut Outage,
) -> Result<(), StoreError> {
    let mut pg = config.pg.clone();
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_secs(5));
    }
    pg.application_name("outbox-relay");
    let (client, mut connection) = pg.connect(NoTls).await?;
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    let channel = config.table.notify_channel();
    let listen = format!("LISTEN \"{channel}\"");
    let subscribe = client.batch_execute(&listen);
    // The connection must be polled for LISTEN to complete.
    tokio::pin!(subscribe);
    loop {
        tokio::select! {
            done = &mut subscribe => { done?; break; }
            message = messages.next() => match message {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(()),
            },
        }
    }
    outage.succeeded();
    // Rows inserted while this connection was down were not announced.
    wake.notify_one();
    loop {
        tokio::select! {
            message = messages.next() => match message {
                Some(Ok(AsyncMessage::Notification(_))) => wake.notify_one(),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Err(StoreError::Closed),
            },
            _ = shutdown.cancelled() => return Ok(()),
        }
    }
}
