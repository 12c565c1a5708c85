//! Wake-ups from the NOTIFY trigger: a dedicated connection LISTENs on the
//! table's channel and turns each notification into a wake-up of one idle
//! relay worker. Polling stays the fallback, so this connection failing only
//! costs latency; it reconnects with backoff and logs the outage once.
//!
//! LISTEN needs a session of its own on the server, so behind a
//! transaction-pooling proxy it takes a direct URL
//! (`OUTBOX_LISTEN_DATABASE_URL`); `app` decides whether it runs at all.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use super::{Endpoint, StoreError, TableName};
use crate::outage::{sleep_or_cancel, Availability, Outage};

/// Listens on `table`'s channel at `endpoint` until `shutdown`, calling
/// `wake.notify_one()` per notification.
pub async fn listen(endpoint: Endpoint, table: TableName, wake: Arc<Notify>, shutdown: CancellationToken) {
    let outage = Mutex::new(Outage::new("database (LISTEN)"));
    let mut availability = Availability::new(&outage);
    while !shutdown.is_cancelled() {
        if let Err(e) = listen_once(&endpoint, &table, &wake, &shutdown, &mut availability).await {
            let delay = availability.failed(&e);
            sleep_or_cancel(delay, &shutdown).await;
        }
    }
}

/// One connection's life: returns `Ok` on shutdown, `Err` when it breaks.
async fn listen_once(
    endpoint: &Endpoint,
    table: &TableName,
    wake: &Notify,
    shutdown: &CancellationToken,
    availability: &mut Availability<'_>,
) -> Result<(), StoreError> {
    let mut pg = endpoint.pg.clone();
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_secs(5));
    }
    pg.application_name("outbox-relay");
    let (client, mut connection) = endpoint.tls.connect(&pg).await?;
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    let channel = table.notify_channel();
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
    availability.succeeded();
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
