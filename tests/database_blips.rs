//! The database going away while a batch is in flight: the broker's
//! confirmations are kept and recorded once the database is back (the rows'
//! lease still holds), so a blip charges no attempt and republishes no
//! confirmed row.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::proxy::Proxy;
use common::system::free_port;
use common::{amqp_url, eventually, quick_settings, RelayProcess, TestBroker, TestDb};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(120);

/// A proxy in front of the server `url` names, and `url` through it.
async fn behind_proxy(url: &str) -> (Proxy, String) {
    let mut url = url::Url::parse(url).expect("a URL");
    let port = url.port().unwrap_or(match url.scheme() {
        "amqp" => 5672,
        _ => 5432,
    });
    let target = tokio::net::lookup_host((url.host_str().expect("host"), port))
        .await
        .expect("resolve")
        .next()
        .expect("an address");
    let proxy = Proxy::start(target).await;
    url.set_host(Some("127.0.0.1")).expect("host");
    url.set_port(Some(proxy.addr.port())).expect("port");
    (proxy, url.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn confirmations_that_arrive_while_the_database_is_away_are_recorded_when_it_is_back() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let (database, database_url) = behind_proxy(&db.url).await;
    let (rabbit, rabbit_url) = behind_proxy(&amqp_url()).await;
    let mut env = quick_settings();
    env.extend(broker.env());
    env.extend([
        ("OUTBOX_DATABASE_URL", database_url),
        ("OUTBOX_AMQP_URL", rabbit_url),
        // A lease of 45 s: far longer than the blip.
        ("OUTBOX_PUBLISH_TIMEOUT", "20s".to_owned()),
        ("OUTBOX_HTTP_ADDR", format!("127.0.0.1:{}", free_port())),
    ]);
    let _relay = RelayProcess::start(&db, &env);
    let warm_up = db.insert_events(10, "blip.before").await;
    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut receive = |batch: Vec<String>| {
        for id in batch {
            *counts.entry(id).or_default() += 1;
        }
    };
    receive(broker.receive_ids(warm_up.len(), WAIT).await);

    // The broker holds its confirmations while the batch is claimed...
    rabbit.stall(true);
    let ids = db.insert_events(50, "blip.during").await;
    eventually(WAIT, "the batch is claimed and in flight", || async {
        db.client
            .query_one(
                "SELECT count(*) FROM outbox_event WHERE id = ANY($1) AND attempt_count = 1",
                &[&ids],
            )
            .await
            .expect("count claimed")
            .get::<_, i64>(0)
            == ids.len() as i64
    })
    .await;
    // ...then the database goes away, and the confirmations come.
    database.refuse(true);
    database.cut();
    rabbit.stall(false);
    receive(broker.receive_ids(ids.len(), WAIT).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        db.count("published_at IS NOT NULL AND event_type = 'blip.during'")
            .await,
        0,
        "nothing could be recorded while the database was away"
    );
    database.refuse(false);

    eventually(
        WAIT,
        "the confirmed rows are recorded once the database is back",
        || async { db.count("published_at IS NULL").await == 0 },
    )
    .await;
    let charged: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM outbox_event WHERE id = ANY($1) AND (attempt_count <> 1 OR last_error IS NOT NULL)",
            &[&ids],
        )
        .await
        .expect("count charged")
        .get(0);
    assert_eq!(charged, 0, "no row was charged for the blip");
    // Anything published twice would have arrived by now.
    receive(broker.receive_ids(1, Duration::from_secs(3)).await);
    let twice: Vec<&String> = ids
        .iter()
        .map(Uuid::to_string)
        .filter_map(|id| {
            counts
                .get_key_value(&id)
                .filter(|(_, n)| **n > 1)
                .map(|(id, _)| id)
        })
        .collect();
    assert!(twice.is_empty(), "confirmed rows were published again: {twice:?}");
    let missing = ids
        .iter()
        .filter(|id| !counts.contains_key(&id.to_string()))
        .count();
    assert_eq!(missing, 0, "every row arrived");
    broker.cleanup().await;
}
