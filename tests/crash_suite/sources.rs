//! Two sources under chaos: two relays, each serving the same two producer
//! databases (`[[source]]` `a` and `b` of one configuration file), each
//! source routed to a destination of its own (the run's exchange, with a
//! routing key naming the source), while a producer writes into each
//! database and the relays are killed, their broker connections cut and
//! the backends of both databases terminated at random.
//!
//! Checked: every row of both databases published, none quarantined;
//! every event in the queue, and nothing that is not a row; every delivery
//! of an event came through its own source's route; and no event was
//! delivered more often than it was claimed, but for the rows whose
//! attempt the relays gave back after a failed publish (as their logs
//! report them).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use uuid::Uuid;

use crate::chaos::{all_published, Relays};
use crate::common::proxy::Proxy;
use crate::common::system::temp_dir;
use crate::common::{TestBroker, TestDb};
use crate::producer::{start_producer_of, EVENT_TYPE};
use crate::{amqp_addr, amqp_via, relay_settings, seed, Scenario, MAIN_RUN, SETTLE};

/// The sources, each with the prefix its producer derives ids from.
const SOURCES: [(&str, &str); 2] = [("a", "source-a-"), ("b", "source-b-")];

/// Two relays: enough for two to contend for each source's rows.
const REPLICAS: usize = 2;

/// The configuration file every relay reads: the two sources, a
/// destination per source publishing to `${CHAOS_AMQP_EXCHANGE}` through
/// `${CHAOS_AMQP_URL}` (the relay's own proxy) with the routing key
/// `<source>.<event type>`, and a route per source to its destination.
fn sources_file() -> String {
    let mut toml = String::new();
    for (name, _) in SOURCES {
        let upper = name.to_uppercase();
        toml.push_str(&format!(
            "[[source]]\nname = \"{name}\"\ndatabase_url = \"${{SOURCE_{upper}_URL}}\"\n\n\
             [[destination]]\nname = \"{name}\"\nsink = \"rabbitmq\"\n\
             amqp_url = \"${{CHAOS_AMQP_URL}}\"\namqp_exchange = \"${{CHAOS_AMQP_EXCHANGE}}\"\n\
             amqp_routing_key = \"{name}.{{event_type}}\"\n\n\
             [[route]]\nsource = \"{name}\"\nevent_type = \"*\"\ndestination = \"{name}\"\n\n"
        ));
    }
    toml
}

#[tokio::test(flavor = "multi_thread")]
async fn two_sources_on_two_relays_under_chaos_lose_nothing_and_keep_each_source_to_its_route() {
    let scenario = Scenario {
        name: "rabbitmq, two sources",
        // Per source: the two together are half the main run.
        events: 5_000,
        // Each relay holds a pool and a LISTEN connection per source: two
        // workers keep the run's connections (2 relays × 2 sources × 8)
        // below the main run's, beside the tests running in parallel.
        workers: 2,
        unroutable_every: 0,
        ..MAIN_RUN
    };
    let seed = seed();
    eprintln!(
        "crash suite [{}]: seed {seed} (OUTBOX_CRASH_SEED={seed} replays the chaos schedule)",
        scenario.name
    );
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let (db_a, db_b) = tokio::join!(TestDb::migrated(), TestDb::migrated());
    for db in [&db_a, &db_b] {
        // The producer writes a traceparent into every row.
        db.client
            .batch_execute("ALTER TABLE outbox_event ADD COLUMN headers JSONB")
            .await
            .expect("add the headers column");
    }
    let broker = TestBroker::create("#").await;
    let dir = temp_dir("crash-suite-sources");
    let file = dir.path.join("outbox-relay.toml");
    std::fs::write(&file, sources_file()).expect("write the configuration file");
    let file = file.to_str().expect("temporary paths are UTF-8").to_owned();

    let mut proxies = Vec::new();
    let mut settings = Vec::new();
    for _ in 0..REPLICAS {
        let proxy = Proxy::start(amqp_addr(&broker.url)).await;
        let mut env = relay_settings(&scenario);
        env.extend([
            ("OUTBOX_CONFIG", file.clone()),
            ("SOURCE_A_URL", db_a.url.clone()),
            ("SOURCE_B_URL", db_b.url.clone()),
            ("CHAOS_AMQP_URL", amqp_via(&proxy, &broker.url)),
            ("CHAOS_AMQP_EXCHANGE", broker.exchange.clone()),
        ]);
        settings.push(env);
        proxies.push(proxy);
    }
    let producer_a = start_producer_of(&db_a, &scenario, SOURCES[0].1);
    let producer_b = start_producer_of(&db_b, &scenario, SOURCES[1].1);
    // The relays' own database URL (OUTBOX_DATABASE_URL, from the helper
    // that starts them) is `a`'s; with sources in the file it is unused.
    let mut relays = Relays::start(&db_a, settings, proxies);
    let until = Instant::now() + scenario.chaos_for;
    // Kills, cuts and `a`'s backends by the suite's chaos; `b`'s backends
    // terminated beside it, as often.
    let terminate_b = async {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xb0b0);
        let mut terminated = 0;
        while Instant::now() < until || !producer_b.is_finished() {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..=4_000))).await;
            terminated += usize::from(db_b.terminate_relay_backends().await > 0);
        }
        terminated
    };
    let (mut chaos, terminations_b) = tokio::join!(
        relays.chaos(&db_a, &mut rng, until, &producer_a, false),
        terminate_b
    );
    chaos.terminations += terminations_b;
    producer_a.await.expect("producer of a");
    producer_b.await.expect("producer of b");
    all_published(&db_a).await;
    all_published(&db_b).await;
    relays.stop(&mut chaos);
    eprintln!("crash suite [{}]: {chaos:?}", scenario.name);

    // Each source's rows, with their attempts.
    let mut rows: HashMap<String, (&str, i32)> = HashMap::new();
    for ((name, _), db) in SOURCES.iter().zip([&db_a, &db_b]) {
        assert_eq!(
            db.count("quarantined_at IS NOT NULL").await,
            0,
            "source {name}: nothing quarantined"
        );
        for row in db
            .client
            .query("SELECT id, attempt_count FROM outbox_event", &[])
            .await
            .expect("rows")
        {
            rows.insert(row.get::<_, Uuid>(0).to_string(), (*name, row.get(1)));
        }
    }
    let events = usize::try_from(scenario.events).unwrap();
    assert_eq!(rows.len(), 2 * events, "both producers inserted every event");

    // Every delivery, read back until every event arrived and then a
    // moment more for the late copies.
    let mut deliveries: HashMap<String, Vec<String>> = HashMap::new();
    let deadline = Instant::now() + SETTLE;
    loop {
        let all = rows.keys().all(|id| deliveries.contains_key(id));
        let batch = broker
            .receive(5_000, Duration::from_secs(if all { 3 } else { 10 }))
            .await;
        let empty = batch.is_empty();
        for message in batch {
            deliveries
                .entry(message.message_id)
                .or_default()
                .push(message.routing_key);
        }
        if (all && empty) || Instant::now() > deadline {
            break;
        }
    }
    let delivered: HashSet<&String> = deliveries.keys().collect();
    let lost: Vec<&String> = rows.keys().filter(|id| !delivered.contains(id)).take(5).collect();
    assert!(lost.is_empty(), "0 lost: events never delivered, e.g. {lost:?}");
    let strangers: Vec<&&String> = delivered
        .iter()
        .filter(|id| !rows.contains_key(**id))
        .take(5)
        .collect();
    assert!(strangers.is_empty(), "messages that are no row: {strangers:?}");
    let misrouted: Vec<(&String, &Vec<String>)> = deliveries
        .iter()
        .filter(|(id, keys)| {
            let expected = format!("{}.{EVENT_TYPE}", rows[*id].0);
            keys.iter().any(|key| *key != expected)
        })
        .take(5)
        .collect();
    assert!(
        misrouted.is_empty(),
        "deliveries through another source's route: {misrouted:?}"
    );
    let beyond_attempts: usize = deliveries
        .iter()
        .map(|(id, keys)| {
            keys.len()
                .saturating_sub(usize::try_from(rows[id].1).unwrap_or(0))
        })
        .sum();
    let duplicates: usize = deliveries.values().map(|keys| keys.len() - 1).sum();
    eprintln!(
        "crash suite [{}]: seed {seed}, {} events, {duplicates} duplicates, {beyond_attempts} beyond attempts, {:?}",
        scenario.name,
        rows.len(),
        started.elapsed()
    );
    assert!(
        beyond_attempts <= chaos.unconfirmed_rows,
        "{beyond_attempts} deliveries beyond the rows' attempts, but only {} rows had an attempt given back",
        chaos.unconfirmed_rows
    );
    broker.cleanup().await;
}
