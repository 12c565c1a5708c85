//! What the NOTIFY trigger costs producers: single-row insert throughput
//! with and without it.

use std::time::{Duration, Instant};

use crate::fixture::{database, payload_sql};
use crate::{Error, Options};

/// Single-row insert transactions from 8 connections for a fixed time.
pub async fn producer_throughput(options: &Options, with_trigger: bool) -> Result<f64, Error> {
    let db = database(options).await;
    if !with_trigger {
        db.client
            .batch_execute("DROP TRIGGER outbox_event_relay_notify ON outbox_event")
            .await?;
    }
    let deadline = Instant::now() + Duration::from_secs(options.insert_seconds);
    let insert = format!(
        "INSERT INTO outbox_event (id, event_type, aggregate_id, payload)
         SELECT gen_random_uuid(), 'order.created', 'order-1', {} FROM (SELECT 1 AS n) AS one",
        payload_sql()
    );
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = db.connect().await;
        let insert = insert.clone();
        tasks.push(tokio::spawn(async move {
            let statement = client.prepare(&insert).await?;
            let mut count = 0u64;
            while Instant::now() < deadline {
                client.execute(&statement, &[]).await?;
                count += 1;
            }
            Ok::<u64, Error>(count)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / options.insert_seconds as f64)
}
