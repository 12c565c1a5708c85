//! The relay's own runs: a prefilled table drained by 1, 2, 4 … relay
//! processes (the release binary).

use std::time::Duration;

use outbox_test_support::RelayProcess;

use crate::fixture::{
    arrivals, broker, checkpoint, database, prefill_for_drain, prefill_spread, relay_settings, unpublished,
    TestDb,
};
use crate::meter::{proc_usage, Meter, Run};
use crate::{Error, Options};

pub struct Drain {
    pub replicas: usize,
    pub rows: usize,
    pub run: Run,
    pub peak_rss_mib: f64,
    /// CPU of all replicas together, in % of a core.
    pub relay_percent: f64,
    /// Share of row updates that were HOT (no new index entries).
    pub hot_share: f64,
    /// Dead row versions in the table when the drain ended (no VACUUM ran
    /// during the run unless autovacuum did).
    pub dead_tuples: i64,
    /// Rows deleted while the relays ran besides the drained ones
    /// (retention's).
    pub retention_deleted: i64,
    /// Whether confirmed rows were deleted (OUTBOX_ON_PUBLISH=delete).
    pub deletes: bool,
    /// Whether each aggregate's rows were published in order
    /// (OUTBOX_ORDERING=aggregate).
    pub ordered: bool,
}

/// What a drain starts from besides its `rows` pending rows, and how the
/// relays are set up.
#[derive(Debug, Clone, Copy, Default)]
pub struct Setup {
    /// Old published rows, for retention to delete during the drain
    /// (OUTBOX_RETENTION=1d, the rows published two days ago).
    pub retained: usize,
    /// OUTBOX_ON_PUBLISH=delete instead of mark.
    pub delete: bool,
    /// OUTBOX_ORDERING=aggregate.
    pub ordered: bool,
    /// The one destination from a configuration file (OUTBOX_CONFIG)
    /// instead of the environment's sink variables.
    pub config_file: bool,
    /// Rows carry a producer's `traceparent` (a `headers` column).
    pub traced: bool,
    /// More variables for the relays.
    pub environment: &'static [(&'static str, &'static str)],
    /// A daily-partitioned table (`migrate --partitioned daily`) with a
    /// partition for each day the rows were created on.
    pub partitioned: bool,
    /// The rows created from midnight UTC this many days ago up to now,
    /// rather than all now; `--fillfactor` does not apply then (a
    /// partitioned parent refuses storage parameters).
    pub spread_days: u32,
}

pub async fn drain(options: &Options, replicas: usize) -> Result<Drain, Error> {
    drain_with(options, replicas, options.rows, Setup::default()).await
}

pub async fn drain_with(
    options: &Options,
    replicas: usize,
    rows: usize,
    setup: Setup,
) -> Result<Drain, Error> {
    let db = if setup.partitioned {
        let past = -i32::try_from(setup.spread_days)?..=-1;
        crate::partitioned::database(options, past).await?
    } else {
        database(options).await
    };
    let broker = broker(options).await;
    if setup.retained > 0 {
        seed_retained(&db, setup.retained).await?;
    }
    if setup.traced {
        add_trace_headers(&db).await?;
    }
    if setup.spread_days > 0 {
        prefill_spread(&db, rows, setup.spread_days).await?;
    } else {
        prefill_for_drain(&db, options, rows).await?;
    }
    if setup.traced {
        trace_rows(&db).await?;
    }
    let arrivals = arrivals(&broker).await?;
    let before = table_stats(&db).await?;
    checkpoint(&db).await?;
    let meter = Meter::start();
    let mut settings = relay_settings(options, &broker.exchange);
    if setup.retained > 0 {
        settings.retain(|(name, _)| *name != "OUTBOX_RETENTION");
        settings.push(("OUTBOX_RETENTION", "1d".to_owned()));
    }
    if setup.delete {
        settings.push(("OUTBOX_ON_PUBLISH", "delete".to_owned()));
    }
    if setup.ordered {
        settings.push(("OUTBOX_ORDERING", "aggregate".to_owned()));
    }
    settings.extend(
        setup
            .environment
            .iter()
            .map(|(name, value)| (*name, (*value).to_owned())),
    );
    let config_file = setup
        .config_file
        .then(|| std::env::temp_dir().join(format!("outbox-bench-{}.toml", uuid::Uuid::new_v4().simple())));
    if let Some(path) = &config_file {
        let url = settings
            .iter()
            .find(|(name, _)| *name == "OUTBOX_AMQP_URL")
            .map(|(_, url)| url.clone())
            .unwrap_or_default();
        std::fs::write(
            path,
            format!(
                "[[destination]]\nname = \"bench\"\nsink = \"rabbitmq\"\namqp_url = \"{url}\"\namqp_exchange = \"{}\"\n",
                broker.exchange
            ),
        )?;
        settings.retain(|(name, _)| !name.starts_with("OUTBOX_AMQP_"));
        settings.push(("OUTBOX_CONFIG", path.display().to_string()));
    }
    let relays: Vec<RelayProcess> = (0..replicas)
        .map(|_| RelayProcess::start(&db, &settings))
        .collect();
    let mut last_usage = vec![(0, 0.0); replicas];
    loop {
        for (relay, usage) in relays.iter().zip(last_usage.iter_mut()) {
            *usage = proc_usage(relay.child.id());
        }
        // Counting rows costs PostgreSQL a scan, so only once every
        // message has arrived (rows are marked after their confirms).
        let all_arrived = arrivals.lock().unwrap().len() >= rows;
        if all_arrived && unpublished(&db).await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = meter.finish(rows);
    // Dropping a RelayProcess kills it and waits for it.
    drop(relays);
    if let Some(path) = config_file {
        let _ = std::fs::remove_file(path);
    }
    // Backends report their statistics when they end.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = table_stats(&db).await?;
    broker.cleanup().await;
    let updates = after.updates - before.updates;
    Ok(Drain {
        replicas,
        rows,
        run,
        peak_rss_mib: last_usage.iter().map(|u| u.0).max().unwrap_or(0) as f64 / 1024.0,
        relay_percent: last_usage.iter().map(|u| u.1).sum::<f64>() / run.seconds * 100.0,
        hot_share: (after.hot_updates - before.hot_updates) as f64 / updates.max(1) as f64,
        dead_tuples: after.dead_tuples,
        retention_deleted: after.deletes - before.deletes - if setup.delete { rows as i64 } else { 0 },
        deletes: setup.delete,
        ordered: setup.ordered,
    })
}

/// The table's counters in pg_stat_user_tables.
struct TableStats {
    updates: i64,
    hot_updates: i64,
    deletes: i64,
    dead_tuples: i64,
}

async fn table_stats(db: &TestDb) -> Result<TableStats, Error> {
    // The statistics a backend reports when it ends, or at the latest
    // every second; the snapshot of this session is dropped first.
    db.client.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
    // A partitioned table's rows are in its partitions, so they are
    // summed; pg_partition_tree lists nothing for a plain table.
    let row = db
        .client
        .query_one(
            "SELECT sum(n_tup_upd)::bigint, sum(n_tup_hot_upd)::bigint, sum(n_tup_del)::bigint,
                    sum(n_dead_tup)::bigint
             FROM pg_stat_user_tables
             WHERE relid = 'outbox_event'::regclass
                OR relid IN (SELECT relid FROM pg_partition_tree('outbox_event'))",
            &[],
        )
        .await?;
    Ok(TableStats {
        updates: row.get(0),
        hot_updates: row.get(1),
        deletes: row.get(2),
        dead_tuples: row.get(3),
    })
}

/// The producer's `headers` column, filled with a default so that the
/// prefill writes each row's trace context with the row (no update after).
async fn add_trace_headers(db: &TestDb) -> Result<(), Error> {
    db.client
        .batch_execute(
            "ALTER TABLE outbox_event ADD COLUMN headers JSONB DEFAULT jsonb_build_object(
                 'traceparent', '00-' || md5(random()::text) || '-' || left(md5(random()::text), 16) || '-01',
                 'tracestate', 'vendor=opaque')",
        )
        .await?;
    Ok(())
}

/// Drops the default again: the relay reads the column as it is.
async fn trace_rows(db: &TestDb) -> Result<(), Error> {
    db.client
        .batch_execute("ALTER TABLE outbox_event ALTER COLUMN headers DROP DEFAULT")
        .await?;
    Ok(())
}

/// `rows` rows published two days ago, small payloads, set-based.
async fn seed_retained(db: &TestDb, rows: usize) -> Result<(), Error> {
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at,
                                       published_at, attempt_count)
             SELECT gen_random_uuid(), 'order.created', 'order-' || (n % 5000), jsonb_build_object('n', n),
                    now() - interval '3 days', now() - interval '2 days' - n * interval '1 millisecond', 1
             FROM generate_series(1, $1::bigint) AS n",
            &[&(rows as i64)],
        )
        .await?;
    Ok(())
}
