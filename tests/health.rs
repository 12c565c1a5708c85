//! Staying honest about health: a relay whose loop dies takes the process
//! down with a non-zero status, `/healthz` names a stalled worker, no HTTP
//! client can hold the process up after SIGTERM or take every connection,
//! and no credential or payload reaches the logs at any level.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::system::free_addr;
use common::{eventually, http_get_at, quick_settings, RelayProcess, TestBroker, TestDb};
use futures::future::BoxFuture;
use outbox_relay::cli::{Cli, Command};
use outbox_relay::event::Event;
use outbox_relay::http::{HttpState, SourceState, MAX_CONNECTIONS};
use outbox_relay::liveness::Liveness;
use outbox_relay::metrics::Metrics;
use outbox_relay::relay::{Destination, Destinations};
use outbox_relay::sink::{Outcome, Sink, SinkError};
use outbox_relay::store::{DatabaseSettings, Store};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// `(status, body)` of `GET http://addr/path`, or `None` when nothing
/// answered within `timeout`.
async fn healthy(addr: SocketAddr) -> bool {
    http_get_at(addr, "/healthz", Duration::from_secs(10))
        .await
        .is_some_and(|(status, _)| status == 200)
}

// ------------------------------------------------------------- liveness

/// Publishing makes the worker panic.
struct PanickingSink;

impl Sink for PanickingSink {
    fn publish<'a>(
        &'a self,
        _events: &'a [Event],
        _deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(async { panic!("a sink bug") })
    }

    fn max_payload_bytes(&self) -> usize {
        usize::MAX
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async { Ok(()) })
    }

    fn kind(&self) -> &'static str {
        "panicking"
    }

    fn destination_of(&self, _event: &Event) -> String {
        "nowhere".to_owned()
    }
}

/// A worker that panics (here its sink; it could be any bug) ends `serve`
/// with an error, which the binary turns into exit status 1, instead of
/// leaving the endpoints up over a dead loop. (Through the binary, the
/// same path is taken by a `run` that refuses an unusable table: see
/// `migrate.rs`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_worker_ends_the_service_with_an_error() {
    let db = TestDb::migrated().await;
    db.insert_events(1, "order.created").await;
    let cli = <Cli as clap::Parser>::try_parse_from([
        "outbox-relay",
        "run",
        "--database-url",
        &db.url,
        "--http-addr",
        "127.0.0.1:0",
        "--poll-interval",
        "50ms",
    ])
    .expect("valid arguments");
    let Some(Command::Run(args)) = cli.command else {
        panic!("`run` parses as the run command")
    };
    let config = args
        .validate(&outbox_relay::config::Layers::default())
        .expect("valid settings");
    let shutdown = CancellationToken::new();

    let ended = tokio::time::timeout(
        WAIT,
        outbox_relay::app::serve_with_sink(config, Arc::new(PanickingSink), shutdown.clone()),
    )
    .await
    .expect("serve returns once a worker has panicked");
    let error = ended.expect_err("a dead loop is a failure");
    assert!(format!("{error:#}").contains("a sink bug"), "{error:#}");
    assert!(shutdown.is_cancelled(), "the other tasks were told to stop");
}

/// `/healthz` answers 503 with the reason once a worker has been silent
/// for longer than its limit, and the heartbeat is on `/metrics`.
#[tokio::test(flavor = "multi_thread")]
async fn healthz_names_a_worker_that_stopped_making_progress() {
    let database = DatabaseSettings {
        database_url: common::pg_admin_url(),
        table: "outbox_event".to_owned(),
        database_pooler: "none".to_owned(),
    }
    .validate()
    .expect("valid settings");
    let liveness = Arc::new(Liveness::new(2, Duration::from_millis(300)));
    let metrics = Arc::new(Metrics::new());
    let destination = Destination::new(
        "default".to_owned(),
        Arc::new(PanickingSink),
        metrics.destination_ready(None),
        Duration::from_secs(1),
    );
    let state = HttpState {
        sources: vec![SourceState {
            name: None,
            // Neither is used by /healthz; the pool connects lazily.
            probe: Arc::new(Store::new(&database, 1)),
            liveness: liveness.clone(),
            health: Default::default(),
            metrics: metrics.source(None),
        }]
        .into(),
        destinations: Destinations::new(vec![destination]),
        metrics,
        readiness_log: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(outbox_relay::http::serve(listener, state, shutdown.clone()));

    // Worker 0 keeps beating; worker 1 never does.
    let beating = {
        let liveness = liveness.clone();
        tokio::spawn(async move {
            loop {
                liveness.beat(0);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    eventually(WAIT, "/healthz answers 503", || async {
        http_get_at(addr, "/healthz", Duration::from_secs(10))
            .await
            .is_some_and(|(status, _)| status == 503)
    })
    .await;
    let (_, reason) = http_get_at(addr, "/healthz", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(reason.contains("relay worker 1"), "{reason}");
    let (_, metrics) = http_get_at(addr, "/metrics", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        metrics.contains("outbox_relay_last_progress_timestamp_seconds "),
        "{metrics}"
    );

    beating.abort();
    shutdown.cancel();
    server.await.unwrap().unwrap();
}

// ---------------------------------------------------------- HTTP server

/// A relay serving on a known address, once `/healthz` answers.
async fn serving_relay(db: &TestDb, broker: &TestBroker) -> (RelayProcess, SocketAddr) {
    let http = free_addr();
    let mut env = quick_settings();
    env.extend(broker.env());
    env.push(("OUTBOX_HTTP_ADDR", http.to_string()));
    let relay = RelayProcess::start(db, &env);
    eventually(WAIT, "the relay answers /healthz", || healthy(http)).await;
    (relay, http)
}

/// A client that sends half a request line and keeps its socket open
/// cannot keep a stopping relay alive: SIGTERM ends the process with
/// status 0 in a few seconds (15 s allowed here, for a busy machine; the
/// chart's grace period before SIGKILL is 60 s by default).
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_the_process_despite_a_client_sending_half_a_request() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let (mut relay, http) = serving_relay(&db, &broker).await;

    let mut half_open = TcpStream::connect(http).expect("connect");
    half_open
        .write_all(b"GET /healthz HT")
        .expect("send half a request line");
    // The server is reading this request when the signal comes.
    let started = Instant::now();
    relay.signal("TERM");
    let status = relay
        .wait(Duration::from_secs(15))
        .await
        .expect("the relay exits although a client holds a half-sent request");
    eprintln!(
        "exited {:?} after SIGTERM with a half-open client",
        started.elapsed()
    );
    assert!(status.success(), "a requested shutdown exits 0, got {status}");
    drop(half_open);
    broker.cleanup().await;
}

/// Idle connections beyond the limit wait instead of being served, and the
/// header read timeout frees their slots, so `/healthz` is answered again
/// without any of them closing.
#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_beyond_the_limit_cannot_lock_out_the_probes() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let (_relay, http) = serving_relay(&db, &broker).await;

    let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS + 8)
        .map(|_| TcpStream::connect(http).expect("connect"))
        .collect();
    // Every slot is held by a connection that sends nothing: a probe waits
    // (well under the header read timeout that frees them).
    assert_eq!(
        http_get_at(http, "/healthz", Duration::from_secs(1)).await,
        None,
        "a connection beyond the limit is not served while every slot is held"
    );
    // The server drops the silent connections; the probe gets through.
    let started = Instant::now();
    eventually(
        WAIT,
        "/healthz answered while the idle clients keep their sockets",
        || healthy(http),
    )
    .await;
    eprintln!(
        "/healthz answered {:?} after the slots were taken",
        started.elapsed()
    );
    let mut first = &idle[0];
    first
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let mut answer = Vec::new();
    assert!(
        first.read_to_end(&mut answer).is_ok(),
        "the server closed the first idle connection"
    );
    drop(idle);
    broker.cleanup().await;
}

// ------------------------------------------------------------------ logs

/// Output of a child process, read on threads so that a chatty child
/// never blocks on a full pipe.
fn capture(child: &mut std::process::Child) -> impl FnOnce() -> String {
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    move || out.join().unwrap_or_default() + &err.join().unwrap_or_default()
}

/// `rabbitmqctl` with `args`, for a broker user of the test's own.
fn rabbitmqctl(args: &[&str]) {
    let output = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "this test creates a RabbitMQ user with rabbitmqctl, which did not run: {e}\n\
                 run it where the broker's rabbitmqctl is on PATH (start the broker with: \
                 rabbitmq-server -detached)"
            )
        });
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// At `RUST_LOG=trace`, with a password on both URLs and rows whose
/// payload carries a marker (published, and returned as unroutable), none
/// of the three appears in the output, neither as text nor as the bytes a
/// library's Debug output would print.
#[tokio::test(flavor = "multi_thread")]
async fn no_credential_or_payload_reaches_the_logs_at_trace() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("routed.#").await;
    let user = format!("outbox_test_{}", Uuid::new_v4().simple());
    let amqp_password = format!("amqpsecret{}", Uuid::new_v4().simple());
    let pg_password = format!("pgsecret{}", Uuid::new_v4().simple());
    let marker = format!("payloadmarker{}", Uuid::new_v4().simple());
    rabbitmqctl(&["add_user", &user, &amqp_password]);
    rabbitmqctl(&["set_permissions", "-p", "/", &user, ".*", ".*", ".*"]);

    let mut amqp_url = url::Url::parse(&common::amqp_url()).expect("AMQP URL");
    amqp_url.set_username(&user).expect("user");
    amqp_url.set_password(Some(&amqp_password)).expect("password");
    // The test server trusts local connections, so any password works; the
    // relay still holds it and must not print it.
    let mut pg_url = url::Url::parse(&db.url).expect("database URL");
    pg_url.set_password(Some(&pg_password)).expect("password");

    let payload = serde_json::json!({ "note": marker });
    let routed: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    let unroutable = Uuid::new_v4();
    for (id, event_type) in routed
        .iter()
        .map(|id| (id, "routed.event"))
        .chain([(&unroutable, "unrouted.event")])
    {
        db.client
            .execute(
                "INSERT INTO outbox_event (id, event_type, aggregate_id, payload) VALUES ($1, $2, 'a', $3)",
                &[id, &event_type, &payload],
            )
            .await
            .unwrap();
    }

    let mut env: Vec<(&str, String)> = quick_settings();
    env.extend(broker.env());
    env.extend([
        ("OUTBOX_AMQP_URL", amqp_url.to_string()),
        ("OUTBOX_DATABASE_URL", pg_url.to_string()),
        ("OUTBOX_HTTP_ADDR", "127.0.0.1:0".to_owned()),
        ("OUTBOX_LOG_FORMAT", "json".to_owned()),
        ("RUST_LOG", "trace".to_owned()),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let child = db
        .relay_command(&["run"], &env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start relay");
    let mut relay = RelayProcess { child };
    let output = capture(&mut relay.child);

    let received = broker.receive(routed.len(), WAIT).await;
    assert_eq!(received.len(), routed.len(), "the marked rows were published");
    assert!(
        String::from_utf8_lossy(&received[0].body).contains(&marker),
        "the marker is in the payload the broker carried"
    );
    eventually(WAIT, "the unroutable row came back from the broker", || async {
        db.count(&format!(
            "id = '{unroutable}' AND attempt_count >= 1 AND last_error IS NOT NULL"
        ))
        .await
            == 1
    })
    .await;
    relay.signal("TERM");
    let status = relay.wait(WAIT).await.expect("the relay stops on SIGTERM");
    assert!(status.success(), "{status}");
    let logs = output();
    rabbitmqctl(&["delete_user", &user]);
    broker.cleanup().await;

    assert!(
        logs.contains(r#""level":"TRACE""#),
        "RUST_LOG=trace took effect (output: {} bytes)",
        logs.len()
    );
    // A byte slice's Debug form, e.g. `112, 97, 121`, without brackets.
    let as_bytes = |text: &str| {
        let debug = format!("{:?}", text.as_bytes());
        debug[1..debug.len() - 1].to_owned()
    };
    for (what, secret) in [
        ("the AMQP password", &amqp_password),
        ("the database password", &pg_password),
        ("the payload", &marker),
    ] {
        for form in [secret.clone(), as_bytes(secret)] {
            if let Some(at) = logs.find(&form) {
                let line_start = logs[..at].rfind('\n').map_or(0, |i| i + 1);
                let line_end = logs[at..].find('\n').map_or(logs.len(), |i| at + i);
                panic!("{what} is in the logs: {}", &logs[line_start..line_end]);
            }
        }
    }
}
