//! Many sources: one relay process serving several databases
//! (`[[source]]` tables of its configuration file).
//!
//! - Drain: `--source-rows` rows of source `a` drained by a relay serving
//!   `a` alone, then `a` and `b` (as many rows) at once, then `a` beside a
//!   faulty neighbour: a database that refuses connections, one that
//!   accepts them and then never answers (a stalled server, through a
//!   proxy), and one without its outbox table. Each run reports `a`'s own
//!   rate (its rows over the time its last message arrived) against the
//!   rate alone.
//! - Idle: the resident memory of a relay serving 1, 10 and 50 idle sources
//!   (`--idle-sources`), each a table of its own on a private PostgreSQL
//!   cluster with room for their connections, and the connections each
//!   source holds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_test_support::private_postgres::PrivatePostgres;
use outbox_test_support::proxy::Proxy;
use outbox_test_support::{RelayProcess, TestBroker};

use crate::fixture::{arrivals, broker, database, prefill, relay_settings, unpublished, OutboxRelay, TestDb};
use crate::meter::Meter;
use crate::{Error, Options};

/// What stands beside source `a` in a drain run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Neighbour {
    /// Nothing: `a` alone.
    None,
    /// Source `b`, as many rows as `a`, drained at the same time.
    Draining,
    /// A database URL nothing listens on: every connection refused.
    Refused,
    /// A database that accepts connections and never answers (a proxy
    /// holding everything): each attempt waits for its timeout.
    Stalled,
    /// A database without the outbox table.
    NoTable,
}

impl Neighbour {
    pub fn label(self) -> &'static str {
        match self {
            Neighbour::None => "a alone",
            Neighbour::Draining => "a and b draining at once",
            Neighbour::Refused => "a beside a database refusing connections",
            Neighbour::Stalled => "a beside a stalled database",
            Neighbour::NoTable => "a beside a database without its table",
        }
    }
}

/// One drain run.
pub struct SourcesDrain {
    pub neighbour: Neighbour,
    /// `a`'s rows over the time until its last message arrived.
    pub a_events_per_second: f64,
    /// `b`'s, when it drained too.
    pub b_events_per_second: Option<f64>,
    /// Every drained row over the time the whole run took.
    pub total_events_per_second: f64,
}

/// A relay serving the idle sources.
pub struct Idle {
    pub sources: usize,
    pub rss_mib: f64,
    /// The relay's connections to the cluster, all sources together.
    pub connections: i64,
}

/// The configuration file of a run: `sources` as (name, URL, table), and
/// one RabbitMQ destination.
fn config(
    options: &Options,
    exchange: &str,
    sources: &[(String, String, String)],
) -> Result<std::path::PathBuf, Error> {
    let mut toml = format!(
        "[[destination]]\nname = \"bench\"\nsink = \"rabbitmq\"\namqp_url = \"{}\"\namqp_exchange = \"{exchange}\"\n\n",
        options.amqp_url
    );
    for (name, url, table) in sources {
        toml.push_str(&format!(
            "[[source]]\nname = \"{name}\"\ndatabase_url = \"{url}\"\ntable = \"{table}\"\n\n"
        ));
    }
    let path = std::env::temp_dir().join(format!(
        "outbox-bench-sources-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&path, toml)?;
    Ok(path)
}

/// The relay's environment for a run with the file at `path`.
fn settings(options: &Options, exchange: &str, path: &std::path::Path) -> Vec<(&'static str, String)> {
    let mut settings = relay_settings(options, exchange);
    settings.retain(|(name, _)| !name.starts_with("OUTBOX_AMQP_"));
    settings.push(("OUTBOX_CONFIG", path.display().to_string()));
    settings
}

/// Drains `--source-rows` rows of `a` with `neighbour` beside it.
pub async fn drain(options: &Options, neighbour: Neighbour) -> Result<SourcesDrain, Error> {
    let rows = options.source_rows;
    let a = database(options).await;
    prefill(&a, rows).await?;
    let b = match neighbour {
        Neighbour::Draining => {
            let b = database(options).await;
            prefill(&b, rows).await?;
            Some(b)
        }
        Neighbour::NoTable => Some(TestDb::create_at(&options.pg_url).await),
        _ => None,
    };
    let stalled = match neighbour {
        Neighbour::Stalled => {
            let target = outbox_test_support::db::pg_admin_url();
            let (proxy, url) = Proxy::in_front_of(&target).await;
            proxy.stall(true);
            Some((proxy, url))
        }
        _ => None,
    };
    let broker = broker(options).await;
    let arrivals = arrivals(&broker).await?;
    let mut sources = vec![("a".to_owned(), a.url.clone(), "outbox_event".to_owned())];
    let neighbour_url = match (neighbour, &b, &stalled) {
        (Neighbour::None, _, _) => None,
        (Neighbour::Refused, _, _) => Some("postgres://postgres@127.0.0.1:1/none".to_owned()),
        (Neighbour::Stalled, _, Some((_, url))) => Some(url.clone()),
        (_, Some(b), _) => Some(b.url.clone()),
        _ => unreachable!("every neighbour has a database"),
    };
    if let Some(url) = neighbour_url {
        sources.push(("b".to_owned(), url, "outbox_event".to_owned()));
    }
    let path = config(options, &broker.exchange, &sources)?;
    let drained: Vec<&TestDb> = std::iter::once(&a)
        .chain(b.iter().filter(|_| neighbour == Neighbour::Draining))
        .collect();
    let expected = rows * drained.len();

    let meter = Meter::start();
    let started = Instant::now();
    let relay = RelayProcess::start(&a, &settings(options, &broker.exchange, &path));
    loop {
        let all_arrived = arrivals.lock().unwrap().len() >= expected;
        if all_arrived {
            let mut left = 0;
            for db in &drained {
                left += unpublished(db).await?;
            }
            if left == 0 {
                break;
            }
        }
        if started.elapsed() > Duration::from_secs(900) {
            return Err(format!("{}: not drained after 15 minutes", neighbour.label()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = meter.finish(expected);
    drop(relay);
    let _ = std::fs::remove_file(&path);
    let rate_of = |arrivals: &HashMap<String, Instant>, ids: Vec<String>| {
        let last = ids
            .iter()
            .filter_map(|id| arrivals.get(id))
            .max()
            .copied()
            .unwrap_or(started);
        rows as f64 / last.duration_since(started).as_secs_f64().max(f64::EPSILON)
    };
    let ids_a = ids(&a).await?;
    let ids_b = match neighbour {
        Neighbour::Draining => Some(ids(b.as_ref().expect("b drains")).await?),
        _ => None,
    };
    let arrived = arrivals.lock().unwrap().clone();
    let a_events_per_second = rate_of(&arrived, ids_a);
    let b_events_per_second = ids_b.map(|ids| rate_of(&arrived, ids));
    broker.cleanup().await;
    Ok(SourcesDrain {
        neighbour,
        a_events_per_second,
        b_events_per_second,
        total_events_per_second: run.events_per_second,
    })
}

async fn ids(db: &TestDb) -> Result<Vec<String>, Error> {
    Ok(db
        .client
        .query("SELECT id::text FROM outbox_event", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// Resident memory (KiB) of a process now, from /proc.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A relay serving `count` idle sources, each a table (`s<i>.outbox_event`)
/// of one database on `cluster`, after `--idle-seconds` of idling.
pub async fn idle(options: &Options, cluster: &PrivatePostgres, count: usize) -> Result<Idle, Error> {
    let db: TestDb = cluster.database::<OutboxRelay>().await;
    let mut sources = Vec::with_capacity(count);
    for i in 0..count {
        db.client.batch_execute(&format!("CREATE SCHEMA s{i}")).await?;
        sources.push((format!("s{i}"), db.url.clone(), format!("s{i}.outbox_event")));
    }
    let broker: TestBroker = broker(options).await;
    let path = config(options, &broker.exchange, &sources)?;
    let env = settings(options, &broker.exchange, &path);
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let migrated = db.relay_command(&["migrate"], &env_refs).output()?;
    if !migrated.status.success() {
        return Err(format!(
            "migrate of {count} sources: {}",
            String::from_utf8_lossy(&migrated.stderr)
        )
        .into());
    }
    let relay = RelayProcess::start(&db, &env);
    tokio::time::sleep(Duration::from_secs(options.idle_seconds)).await;
    let rss = rss_kib(relay.child.id());
    let connections: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-relay' AND datname = $1",
            &[&db.name],
        )
        .await?
        .get(0);
    drop(relay);
    let _ = std::fs::remove_file(&path);
    broker.cleanup().await;
    Ok(Idle {
        sources: count,
        rss_mib: rss as f64 / 1024.0,
        connections,
    })
}

/// Every run of the module, with the tables printed.
pub async fn run(options: &Options) -> Result<(), Error> {
    let mut drains = Vec::new();
    for neighbour in [
        Neighbour::None,
        Neighbour::Draining,
        Neighbour::Refused,
        Neighbour::Stalled,
        Neighbour::NoTable,
    ] {
        let result = crate::median_of(
            options.repeat,
            || drain(options, neighbour),
            |d| d.a_events_per_second,
        )
        .await?;
        eprintln!(
            "sources: {}: a {:.0} events/s",
            neighbour.label(),
            result.a_events_per_second
        );
        drains.push(result);
    }
    let most = options.idle_sources.iter().copied().max().unwrap_or(1);
    // Each source: a pool of 2 × workers + 3 and a LISTEN connection, and
    // room for the benchmark's own.
    let max_connections = (most * (2 * options.workers + 4) + 20).to_string();
    let cluster = PrivatePostgres::builder()
        .setting("max_connections", &max_connections)
        .start()
        .await;
    let mut idles = Vec::new();
    for &count in &options.idle_sources {
        let result = idle(options, &cluster, count).await?;
        eprintln!(
            "sources: {count} idle: RSS {:.1} MiB, {} connections",
            result.rss_mib, result.connections
        );
        idles.push(result);
    }
    report(options, &drains, &idles);
    Ok(())
}

fn report(options: &Options, drains: &[SourcesDrain], idles: &[Idle]) {
    let alone = drains
        .iter()
        .find(|d| d.neighbour == Neighbour::None)
        .map_or(f64::NAN, |d| d.a_events_per_second);
    println!(
        "\n### Many sources: drain of {} rows of source a (batch {}, {} workers, one relay)\n",
        options.source_rows, options.batch_size, options.workers
    );
    println!("| run | a, events/s | a against alone | b, events/s | all, events/s |\n|---|---|---|---|---|");
    for drain in drains {
        println!(
            "| {} | {:.0} | {:.2}× | {} | {:.0} |",
            drain.neighbour.label(),
            drain.a_events_per_second,
            drain.a_events_per_second / alone,
            drain
                .b_events_per_second
                .map_or("—".to_owned(), |rate| format!("{rate:.0}")),
            drain.total_events_per_second
        );
    }
    println!(
        "\n### Many sources: a relay serving idle sources ({} workers each, after {} s)\n",
        options.workers, options.idle_seconds
    );
    println!("| sources | RSS, MiB | connections | per source |\n|---|---|---|---|");
    for idle in idles {
        println!(
            "| {} | {:.1} | {} | {:.1} |",
            idle.sources,
            idle.rss_mib,
            idle.connections,
            idle.connections as f64 / idle.sources as f64
        );
    }
    if let (Some(first), Some(last)) = (idles.first(), idles.last()) {
        if last.sources > first.sources {
            println!(
                "\nRSS per idle source: {:.2} MiB (({:.1} − {:.1}) / ({} − {}))",
                (last.rss_mib - first.rss_mib) / (last.sources - first.sources) as f64,
                last.rss_mib,
                first.rss_mib,
                last.sources,
                first.sources
            );
        }
    }
}
