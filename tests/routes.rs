//! Routes: a configuration file (`OUTBOX_CONFIG`, or `--config`) with
//! `[[destination]]`s and `[[route]]`s, against the real PostgreSQL,
//! RabbitMQ and SQS emulator (moto, started by `scripts/test`).
//!
//! - A file that cannot be used stops `check` and `run` with exit status 2
//!   and one line naming the file, the line and the key; `${VAR}` takes
//!   the environment's value. Without a file, or with one without
//!   destinations, the relay is today's; with one destination and no
//!   route, every event goes to it and the environment's sink settings
//!   are not used.
//! - Each event goes where the first matching route sends it, and nowhere
//!   else; an event no route matches is quarantined on its first attempt.
//! - A destination that is down (its queue full, its broker unreachable,
//!   every request denied) holds back only its own rows, charges them nothing and is probed
//!   gently, while the other destinations drain; once back, it gets every
//!   row.
//! - With `OUTBOX_ORDERING=aggregate`, an aggregate's events are published
//!   in order whichever destination each goes to, and a destination that
//!   is down holds back only the aggregates that have a row for it.
//!
//! Each test has its own database, queues and exchanges, so they run in
//! parallel.

mod common;

use std::collections::HashSet;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::config_file::{destination, route, toml_string, ConfigFile};
use common::proxy::Proxy;
use common::rows::Rows;
use common::sqs::{aws_env, endpoint as sqs_endpoint, SqsReceived, TestQueue};
use common::sqs_faults::{Fault, SqsProxy};
use common::system::free_port;
use common::{eventually, http_get, metrics_show, quick_settings, with, RelayProcess, TestBroker, TestDb};
use uuid::Uuid;

/// Deadline of every wait; a passing test never waits this long.
const WAIT: Duration = Duration::from_secs(120);

/// How long the rate of row updates is measured while a destination is
/// down.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// The most outbox rows the relay may update over [`RATE_WINDOW`] while
/// one destination is down and the others have nothing left: a probe is
/// at most 10 rows, claimed and given back (two updates each), spaced up
/// to 5 s once the outage has lasted; a relay that kept claiming the down
/// destination's rows at its poll interval would update thousands.
const MAX_ROW_UPDATES_IN_WINDOW: i64 = 500;

/// PostgreSQL's backends flush their table statistics at most once a
/// second, and an idle one within 10 s: a count read from
/// `pg_stat_user_tables` is that late at most.
const STATISTICS_DELAY: Duration = Duration::from_secs(11);

// ------------------------------------------------------------------ files

/// Top-level settings that make a relay react quickly, written in the
/// file (as the relay's variables in lower case without `OUTBOX_`), with
/// the HTTP endpoints on `http_port`.
fn quick_top_level(http_port: u16) -> String {
    format!(
        "poll_interval = \"50ms\"\nbackoff_base = \"100ms\"\nbackoff_max = \"500ms\"\nhttp_addr = {}\n",
        toml_string(&format!("127.0.0.1:{http_port}"))
    )
}

/// Runs the relay binary with `args`, an environment of `env` only (and
/// `PATH`), and returns its output.
fn relay_output(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(common::relay_bin());
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run outbox-relay")
}

/// Starts `outbox-relay run` on `db` with `file` as its configuration,
/// the emulator's credentials and `env` (which wins over the file), and
/// no sink variable `env` does not name: the file's destinations are then
/// the relay's only sinks.
fn start_relay(db: &TestDb, file: &ConfigFile, env: &[(&'static str, String)]) -> RelayProcess {
    let mut command = db.relay_command(&["run"], &[]);
    command.env_remove("OUTBOX_AMQP_URL");
    command.env("OUTBOX_CONFIG", file.path_str());
    for (key, value) in aws_env().iter().chain(env) {
        command.env(key, value);
    }
    RelayProcess::spawn(command)
}

// ------------------------------------------------------------------- rows

/// Inserts one row per `(event_type, aggregate_id)`, in that order, each
/// created after every row already in the table (1 ms apart), so that
/// (created_at, id) order is the order given; returns their ids.
async fn insert_sequence(db: &TestDb, rows: &[(&str, String)]) -> Vec<Uuid> {
    let ids: Vec<Uuid> = rows.iter().map(|_| Uuid::new_v4()).collect();
    let types: Vec<&str> = rows.iter().map(|(event_type, _)| *event_type).collect();
    let aggregates: Vec<&str> = rows.iter().map(|(_, aggregate)| aggregate.as_str()).collect();
    db.client
        .execute(
            "INSERT INTO outbox_event (id, event_type, aggregate_id, payload, created_at)
             SELECT id, event_type, aggregate_id, jsonb_build_object('n', n),
                    (SELECT coalesce(max(created_at), now() - interval '1 hour') FROM outbox_event)
                        + n * interval '1 millisecond'
             FROM unnest($1::uuid[], $2::text[], $3::text[]) WITH ORDINALITY
                  AS u(id, event_type, aggregate_id, n)",
            &[&ids, &types, &aggregates],
        )
        .await
        .expect("insert rows");
    ids
}

/// How many of `ids` satisfy `condition`.
async fn count_of(db: &TestDb, ids: &[Uuid], condition: &str) -> i64 {
    db.client
        .query_one(
            &format!("SELECT count(*) FROM outbox_event WHERE id = ANY($1) AND ({condition})"),
            &[&ids],
        )
        .await
        .unwrap_or_else(|e| panic!("count rows where {condition}: {e}"))
        .get(0)
}

/// The rows of `ids` that satisfy `condition`, with their attempts and
/// last error, for a failure message.
async fn rows_where(db: &TestDb, ids: &[Uuid], condition: &str) -> Vec<(Uuid, i64, Option<String>)> {
    db.client
        .query(
            &format!(
                "SELECT id, attempt_count::bigint, last_error FROM outbox_event
                 WHERE id = ANY($1) AND ({condition}) ORDER BY created_at, id"
            ),
            &[&ids],
        )
        .await
        .unwrap_or_else(|e| panic!("read rows where {condition}: {e}"))
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

/// Waits until every row of `ids` is published.
async fn all_published(db: &TestDb, ids: &[Uuid], what: &str) {
    let total = i64::try_from(ids.len()).expect("a test's rows fit an i64");
    eventually(WAIT, &format!("every row of {what} marked published"), || async {
        count_of(db, ids, "published_at IS NOT NULL").await == total
    })
    .await;
}

/// Waits until no row is waiting any more (each published or quarantined).
async fn settled(db: &TestDb) {
    eventually(WAIT, "every row published or quarantined", || async {
        db.count("published_at IS NULL AND quarantined_at IS NULL").await == 0
    })
    .await;
}

/// Rows of the outbox table updated so far, as PostgreSQL's statistics
/// count them (up to [`STATISTICS_DELAY`] late).
async fn row_updates(db: &TestDb) -> i64 {
    db.client
        .query_one(
            "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'outbox_event'::regclass",
            &[],
        )
        .await
        .expect("read the table's statistics")
        .get(0)
}

/// Each aggregate of `ids` whose rows were not all published in
/// (created_at, id) order, with its rows' publish times (microseconds
/// since the epoch, `None` while unpublished) in that order.
async fn published_out_of_order(db: &TestDb, ids: &[Uuid]) -> Vec<(String, Vec<Option<i64>>)> {
    let rows = db
        .client
        .query(
            "SELECT aggregate_id, (extract(epoch FROM published_at) * 1000000)::bigint FROM outbox_event
             WHERE id = ANY($1) ORDER BY aggregate_id, created_at, id",
            &[&ids],
        )
        .await
        .expect("read publish times");
    let mut by_aggregate: Vec<(String, Vec<Option<i64>>)> = Vec::new();
    for row in rows {
        let aggregate: String = row.get(0);
        let published: Option<i64> = row.get(1);
        match by_aggregate.last_mut() {
            Some((last, times)) if *last == aggregate => times.push(published),
            _ => by_aggregate.push((aggregate, vec![published])),
        }
    }
    by_aggregate
        .into_iter()
        .filter(|(_, times)| {
            times.windows(2).any(|pair| match pair {
                [Some(earlier), Some(later)] => earlier >= later,
                _ => true,
            }) || times.contains(&None)
        })
        .collect()
}

// ------------------------------------------------------------------- HTTP

/// The `/readyz` line about destination `name`, if any.
fn readiness_of<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    let prefix = format!("destination {name} (");
    body.lines().find(|line| line.starts_with(&prefix))
}

/// Whether a `/readyz` answer is 200 with destination `down` not ready and
/// destination `up` ready, each given as (name, sink).
fn ready_without(answer: &Option<(u16, String)>, down: (&str, &str), up: (&str, &str)) -> bool {
    let Some((200, body)) = answer else {
        return false;
    };
    let down_line = format!("destination {} ({}): not ready", down.0, down.1);
    let up_line = format!("destination {} ({}): ready", up.0, up.1);
    readiness_of(body, down.0).is_some_and(|line| line.starts_with(&down_line))
        && readiness_of(body, up.0) == Some(up_line.as_str())
}

/// Waits until `/readyz` answers 200 listing `down` as not ready and `up`
/// as ready, printing each other answer it gets meanwhile.
async fn ready_without_eventually(port: u16, down: (&str, &str), up: (&str, &str)) {
    let last = std::sync::Mutex::new(None);
    eventually(
        WAIT,
        &format!(
            "/readyz answering 200 with destination {} not ready and {} ready",
            down.0, up.0
        ),
        || async {
            let answer = http_get(port, "/readyz").await;
            let hit = ready_without(&answer, down, up);
            let mut last = last.lock().expect("last answer");
            if !hit && *last != answer {
                eprintln!("/readyz: {answer:?}");
                *last = answer;
            }
            hit
        },
    )
    .await;
}

/// Waits until `/readyz` answers 200 listing `down` as not ready and `up`
/// as ready, then checks it keeps saying so over [`RATE_WINDOW`] while
/// counting the outbox rows the relay updates meanwhile; returns that
/// count.
async fn down_while_others_ready(db: &TestDb, port: u16, down: (&str, &str), up: (&str, &str)) -> i64 {
    ready_without_eventually(port, down, up).await;
    // The window starts once the statistics include every update made
    // before it (the other destinations' drain above all), and readiness
    // is sampled all along it.
    tokio::time::sleep(STATISTICS_DELAY).await;
    let before = row_updates(db).await;
    let started = Instant::now();
    while started.elapsed() < RATE_WINDOW {
        let answer = http_get(port, "/readyz").await;
        assert!(
            ready_without(&answer, down, up),
            "/readyz changed while destination {} stayed down: {answer:?}",
            down.0
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let updates = row_updates(db).await - before;
    eprintln!(
        "destination {} down: {updates} outbox rows updated in {:.1?}",
        down.0,
        started.elapsed()
    );
    updates
}

// --------------------------------------------------------------- receiving

/// Receives from `queue` until `count` messages arrived; their event ids.
async fn sqs_ids(queue: &TestQueue, count: usize) -> Vec<String> {
    queue
        .receive(count, WAIT)
        .await
        .iter()
        .map(SqsReceived::event_id)
        .collect()
}

/// Receives from `broker` until every id of `expected` arrived (each at
/// least once) or [`WAIT`] passed; asserts none is missing and nothing
/// else arrived; returns every message id received.
async fn rabbit_receive_all(broker: &TestBroker, expected: &HashSet<String>) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    let mut received: Vec<String> = Vec::new();
    let mut distinct: HashSet<String> = HashSet::new();
    while !expected.is_subset(&distinct) && Instant::now() < deadline {
        let missing = expected.difference(&distinct).count();
        let batch = broker.receive_ids(missing, Duration::from_secs(2)).await;
        distinct.extend(batch.iter().cloned());
        received.extend(batch);
    }
    let missing = expected.difference(&distinct).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} rows never reached the queue {} within {WAIT:?}",
        expected.len(),
        broker.queue
    );
    let unexpected: Vec<&String> = distinct.difference(expected).collect();
    assert!(
        unexpected.is_empty(),
        "messages in {} that are none of its rows: {unexpected:?}",
        broker.queue
    );
    received
}

fn id_set(ids: &[Uuid]) -> HashSet<String> {
    ids.iter().map(Uuid::to_string).collect()
}

fn distinct(ids: &[String]) -> HashSet<String> {
    ids.iter().cloned().collect()
}

// ------------------------------------------------------- configuration

/// A database URL nothing listens on, with a password: a binary that
/// connected before validating would fail with status 1, not 2, and the
/// password must never be printed.
const UNREACHABLE_DATABASE: &str = "postgres://postgres:s3cret-pw@127.0.0.1:1/none";

/// A file the relay must refuse, and what its one line of stderr says:
/// `outbox-relay: <path>:<line>: <context>`, then what `says` lists.
struct Refused {
    what: &'static str,
    file: String,
    /// Text of the line the error is about (its first line containing it).
    at: &'static str,
    /// For an error about a whole table rather than one key: how many
    /// lines before `at` (up to the table's header) may be named instead.
    or_before: usize,
    /// Where the message goes on after `<path>:<line>: `: the key, with its
    /// destination or route before it.
    context: &'static str,
    /// Further text the message contains: the problem, a suggestion, the
    /// variable's name.
    says: &'static [&'static str],
}

fn refused_files() -> Vec<Refused> {
    let orders = destination("orders", "rabbitmq", &[("amqp_exchange", "orders".to_owned())]);
    let payments = destination(
        "payments",
        "rabbitmq",
        &[("amqp_exchange", "payments".to_owned())],
    );
    vec![
        Refused {
            what: "an unknown top-level key close to a known one",
            file: format!("# the relay's settings\nbatch_size = 100\nbatsh_size = 1\n\n{orders}"),
            at: "batsh_size",
            or_before: 0,
            context: "batsh_size: ",
            says: &["unknown key", "batch_size"],
        },
        Refused {
            what: "a destination named like the environment's",
            file: "[[destination]]\nname = \"default\"\nsink = \"rabbitmq\"\n".to_owned(),
            at: "name = \"default\"",
            or_before: 0,
            context: "destination 1: name: ",
            says: &["environment"],
        },
        Refused {
            what: "an unknown key in a destination",
            file: "batch_size = 100\n\n[[destination]]\nname = \"orders\"\nsink = \"rabbitmq\"\n\
                   amqp_exchnage = \"orders\"\n"
                .to_owned(),
            at: "amqp_exchnage",
            or_before: 0,
            context: "destination \"orders\": amqp_exchnage: ",
            says: &["unknown key", "amqp_exchange"],
        },
        Refused {
            what: "${VAR} of an unset variable in a destination",
            file: format!(
                "{orders}\n[[destination]]\nname = \"payments\"\nsink = \"rabbitmq\"\n\
                 amqp_url = \"${{ROUTES_TEST_UNSET_AMQP_URL}}\"\namqp_exchange = \"payments\"\n\n{}{}",
                route("order.*", "orders"),
                route("payment.*", "payments")
            ),
            at: "ROUTES_TEST_UNSET_AMQP_URL",
            or_before: 0,
            context: "destination \"payments\": amqp_url: ",
            says: &["ROUTES_TEST_UNSET_AMQP_URL"],
        },
        Refused {
            what: "${VAR} of an unset variable at the top level",
            file: format!("table = \"${{ROUTES_TEST_UNSET_TABLE}}\"\n\n{orders}"),
            at: "ROUTES_TEST_UNSET_TABLE",
            or_before: 0,
            context: "table: ",
            says: &["ROUTES_TEST_UNSET_TABLE"],
        },
        Refused {
            what: "a route naming an unknown destination",
            file: format!(
                "{orders}\n{payments}\n{}\n{}",
                route("order.*", "orders"),
                route("payment.*", "paymnets")
            ),
            at: "\"paymnets\"",
            or_before: 0,
            context: "route 2: destination: ",
            says: &["paymnets"],
        },
        Refused {
            what: "a destination that no route names",
            file: format!("{orders}\n{payments}\n{}", route("order.*", "orders")),
            at: "name = \"payments\"",
            or_before: 1,
            context: "destination \"payments\": ",
            says: &[],
        },
        Refused {
            what: "a sink setting at the top level beside destinations",
            file: format!("amqp_exchange = \"orders\"\n\n{orders}"),
            at: "amqp_exchange = \"orders\"",
            or_before: 0,
            context: "amqp_exchange: ",
            says: &[],
        },
        Refused {
            what: "a TOML syntax error",
            file: format!("batch_size = 100\npoll_interval = \"50ms\"\nworkers 4\n\n{orders}"),
            at: "workers 4",
            or_before: 0,
            context: "",
            says: &[],
        },
    ]
}

#[test]
fn each_unusable_file_exits_2_with_one_line_naming_file_line_and_key() {
    for case in refused_files() {
        let file = ConfigFile::write(&case.file);
        let path = file.path_str();
        let at = file.line_of(case.at);
        let starts: Vec<String> = (at - case.or_before..=at)
            .map(|line| format!("outbox-relay: {path}:{line}: {}", case.context))
            .collect();
        let by_variable = [
            ("OUTBOX_CONFIG", path),
            ("OUTBOX_DATABASE_URL", UNREACHABLE_DATABASE),
        ];
        let by_flag = [("OUTBOX_DATABASE_URL", UNREACHABLE_DATABASE)];
        for command in ["check", "run"] {
            for (how, args, env) in [
                ("OUTBOX_CONFIG", vec![command], &by_variable[..]),
                ("--config", vec![command, "--config", path], &by_flag[..]),
            ] {
                let out = relay_output(&args, env);
                let stderr = String::from_utf8_lossy(&out.stderr);
                let context = format!("{} ({command}, file by {how})", case.what);
                assert_eq!(
                    out.status.code(),
                    Some(2),
                    "{context}: exit status 2\nfile:\n{}\nstderr: {stderr}",
                    case.file
                );
                let lines: Vec<&str> = stderr.trim().lines().collect();
                assert_eq!(lines.len(), 1, "{context}: one line on stderr: {stderr}");
                let start = starts.iter().find(|start| lines[0].starts_with(start.as_str()));
                let Some(start) = start else {
                    panic!(
                        "{context}: the line starts with {}\nfile:\n{}\nstderr: {stderr}",
                        starts.join(" or "),
                        case.file
                    );
                };
                let problem = &lines[0][start.len()..];
                assert!(
                    !problem.trim().is_empty(),
                    "{context}: the line says what is wrong: {stderr}"
                );
                for said in case.says {
                    assert!(
                        problem.contains(said),
                        "{context}: the problem mentions {said:?}: {stderr}"
                    );
                }
                assert!(
                    !stderr.contains("s3cret-pw"),
                    "{context}: secret leaked: {stderr}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn variables_in_the_file_are_replaced_by_the_environment_values() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let queue = TestQueue::create(false, None).await;
    let file = ConfigFile::write(&format!(
        "database_url = \"${{ROUTES_TEST_DATABASE_URL}}\"\n\n{}\n{}\n{}\n{}",
        destination(
            "orders",
            "rabbitmq",
            &[
                ("amqp_url", "${ROUTES_TEST_AMQP_URL}".to_owned()),
                ("amqp_exchange", broker.exchange.clone()),
            ],
        ),
        destination("ledger", "sqs", &queue.destination_settings()),
        route("order.*", "orders"),
        route("*", "ledger"),
    ));
    let aws = aws_env();
    let run_check = |database_url: &str| {
        let mut env: Vec<(&str, &str)> = aws.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.extend([
            ("OUTBOX_CONFIG", file.path_str()),
            ("ROUTES_TEST_DATABASE_URL", database_url),
            ("ROUTES_TEST_AMQP_URL", broker.url.as_str()),
        ]);
        relay_output(&["check"], &env)
    };

    let out = run_check(&db.url);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "check succeeds with both variables set\nstdout: {stdout}\nstderr: {stderr}"
    );
    for name in ["orders", "ledger"] {
        assert_eq!(
            stdout.lines().filter(|line| line.contains(name)).count(),
            1,
            "check prints one line about destination {name}: {stdout}"
        );
    }

    // The database check uses the substituted value, not a default: an
    // unreachable one fails the check (status 1: a failure, not a
    // configuration error).
    let out = run_check(UNREACHABLE_DATABASE);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "check fails on the database the variable names: {stderr}"
    );
    assert!(!stderr.contains("s3cret-pw"), "secret leaked: {stderr}");
    broker.cleanup().await;
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_file_the_environment_makes_one_default_destination_as_before() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let ids = db.insert_events(20, "order.created").await;
    let port = free_port();
    let mut env = broker.env();
    env.extend(with(
        quick_settings(),
        &[("OUTBOX_HTTP_ADDR", &format!("127.0.0.1:{port}"))],
    ));
    let _relay = RelayProcess::start(&db, &env);

    let received = broker.receive_ids(ids.len(), WAIT).await;
    assert_eq!(distinct(&received), id_set(&ids), "every row arrived");
    all_published(&db, &ids, "the environment-configured relay").await;
    assert_eq!(
        http_get(port, "/readyz").await,
        Some((200, "ready\n".to_owned())),
        "/readyz says what it said before routes"
    );
    // Without destinations, the series carry no label, as before destinations existed.
    metrics_show(
        port,
        WAIT,
        &[
            ("outbox_events_published_total", &[], 20.0),
            ("outbox_destination_ready", &[], 1.0),
        ],
    )
    .await;
    let text = http_get(port, "/metrics")
        .await
        .map(|(_, text)| text)
        .unwrap_or_default();
    assert!(
        !text.contains("destination="),
        "no destination label without a file, as before routes:\n{text}"
    );
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_without_destinations_leaves_the_sink_to_the_environment() {
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("#").await;
    let ids = db.insert_events(20, "order.created").await;
    let port = free_port();
    // Only top-level settings in the file, the sink in the environment.
    let file = ConfigFile::write(&quick_top_level(port));
    let _relay = start_relay(&db, &file, &with(broker.env(), &[("OUTBOX_SINK", "rabbitmq")]));

    let received = broker.receive_ids(ids.len(), WAIT).await;
    assert_eq!(distinct(&received), id_set(&ids), "every row arrived");
    all_published(&db, &ids, "the relay with a file of top-level settings").await;
    assert_eq!(
        http_get(port, "/readyz").await,
        Some((200, "ready\n".to_owned())),
        "/readyz (on the file's http_addr) says what it says without a file"
    );
    metrics_show(port, WAIT, &[("outbox_events_published_total", &[], 20.0)]).await;
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_destination_without_routes_gets_every_event_and_the_environment_sink_is_not_used() {
    let db = TestDb::migrated().await;
    let configured = TestBroker::create("#").await;
    let ignored = TestBroker::create("#").await;
    let port = free_port();
    let file = ConfigFile::write(&format!(
        "{}\n{}",
        quick_top_level(port),
        destination("events", "rabbitmq", &configured.destination_settings()),
    ));
    let mut ids = db.insert_events(10, "order.created").await;
    ids.extend(db.insert_events(10, "payment.captured").await);
    // The environment names another exchange: with [[destination]] in the
    // file, the environment's sink settings are not used.
    let _relay = start_relay(&db, &file, &ignored.env());

    let received = configured.receive_ids(ids.len(), WAIT).await;
    assert_eq!(
        distinct(&received),
        id_set(&ids),
        "the one destination gets every event, whatever its type"
    );
    assert_eq!(received.len(), ids.len(), "each once");
    settled(&db).await;
    assert_eq!(
        ignored.message_count().await,
        0,
        "nothing went to the environment's exchange"
    );
    metrics_show(
        port,
        WAIT,
        &[
            (
                "outbox_events_published_total",
                &[("destination", "events")],
                20.0,
            ),
            ("outbox_destination_ready", &[("destination", "events")], 1.0),
        ],
    )
    .await;
    configured.cleanup().await;
    ignored.cleanup().await;
}

// ---------------------------------------------------------------- routing

#[tokio::test(flavor = "multi_thread")]
async fn each_event_goes_only_where_its_first_matching_route_sends_it() {
    let db = TestDb::migrated().await;
    let orders = TestQueue::create(false, None).await;
    let payments = TestQueue::create(false, None).await;
    let shipments = TestBroker::create("#").await;
    let port = free_port();
    let file = ConfigFile::write(&format!(
        "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
        quick_top_level(port),
        destination("orders", "sqs", &orders.destination_settings()),
        destination("payments", "sqs", &payments.destination_settings()),
        destination("shipments", "rabbitmq", &shipments.destination_settings()),
        // Refunds are orders' events that the first matching route sends
        // to payments.
        route("order.refund*", "payments"),
        route("order.*", "orders"),
        // `*` spans dots.
        route("payment.*", "payments"),
        route("shipment.?ent", "shipments"),
    ));
    let mut order_ids = Vec::new();
    let mut payment_ids = Vec::new();
    let mut shipment_ids = Vec::new();
    let mut unrouted = Vec::new();
    // Interleaved, so that batches mix destinations.
    for _ in 0..5 {
        order_ids.extend(db.insert_events(6, "order.created").await);
        payment_ids.extend(db.insert_events(2, "order.refunded").await);
        payment_ids.extend(db.insert_events(4, "payment.card.captured").await);
        shipment_ids.extend(db.insert_events(5, "shipment.sent").await);
    }
    for (count, event_type) in [(3, "audit.logged"), (2, "preorder.created")] {
        let ids = db.insert_events(count, event_type).await;
        unrouted.extend(ids.into_iter().map(|id| (id, event_type)));
    }
    let _relay = start_relay(&db, &file, &[]);

    let got_orders = sqs_ids(&orders, order_ids.len()).await;
    let got_payments = sqs_ids(&payments, payment_ids.len()).await;
    let got_shipments = shipments.receive_ids(shipment_ids.len(), WAIT).await;
    settled(&db).await;
    for (name, got, want) in [
        ("orders", &got_orders, &order_ids),
        ("payments", &got_payments, &payment_ids),
        ("shipments", &got_shipments, &shipment_ids),
    ] {
        assert_eq!(
            distinct(got),
            id_set(want),
            "destination {name} received exactly the events routed to it"
        );
        assert_eq!(got.len(), want.len(), "destination {name}: each event once");
    }
    // Every message was in its queue before its row was marked, so once
    // every row is settled nothing more can come.
    for (name, queue) in [("orders", &orders), ("payments", &payments)] {
        let extra: Vec<String> = queue
            .receive_once(30)
            .await
            .iter()
            .map(SqsReceived::event_id)
            .collect();
        assert!(extra.is_empty(), "destination {name} got more: {extra:?}");
    }
    assert_eq!(
        shipments.message_count().await,
        0,
        "destination shipments got more"
    );

    let routed: Vec<Uuid> = order_ids
        .iter()
        .chain(&payment_ids)
        .chain(&shipment_ids)
        .copied()
        .collect();
    let charged = rows_where(&db, &routed, "published_at IS NULL OR attempt_count <> 1").await;
    assert!(
        charged.is_empty(),
        "every routed row published on its first attempt: {charged:?}"
    );
    for (id, event_type) in &unrouted {
        let row = db
            .client
            .query_one(
                "SELECT attempt_count::bigint, last_error, quarantined_at IS NOT NULL, published_at IS NULL
                 FROM outbox_event WHERE id = $1",
                &[id],
            )
            .await
            .expect("read an unrouted row");
        let (attempts, last_error, quarantined, unpublished): (i64, Option<String>, bool, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        assert!(
            quarantined && unpublished,
            "{event_type} row {id} is quarantined, not published"
        );
        assert_eq!(
            last_error.as_deref(),
            Some(format!("no route for event type \"{event_type}\"").as_str()),
            "the reason of {event_type} row {id}"
        );
        assert_eq!(
            attempts, 1,
            "{event_type} row {id} quarantined on its first attempt"
        );
    }

    metrics_show(
        port,
        WAIT,
        &[
            (
                "outbox_events_published_total",
                &[("destination", "orders")],
                30.0,
            ),
            (
                "outbox_events_published_total",
                &[("destination", "payments")],
                30.0,
            ),
            (
                "outbox_events_published_total",
                &[("destination", "shipments")],
                25.0,
            ),
            ("outbox_events_quarantined_total", &[("destination", "")], 5.0),
            ("outbox_destination_ready", &[("destination", "orders")], 1.0),
            ("outbox_destination_ready", &[("destination", "payments")], 1.0),
            ("outbox_destination_ready", &[("destination", "shipments")], 1.0),
        ],
    )
    .await;
    orders.cleanup().await;
    payments.cleanup().await;
    shipments.cleanup().await;
}

// --------------------------------------------------------------- outages

/// A file with an SQS destination `orders` (`order.*`) reached at
/// `orders_url` and a RabbitMQ destination `ledger` (`ledger.*`) reached
/// at `ledger_url`.
fn orders_and_ledger(
    port: u16,
    orders: &TestQueue,
    orders_url: &str,
    ledger: &TestBroker,
    ledger_url: &str,
) -> ConfigFile {
    ConfigFile::write(&format!(
        "{}\n{}\n{}\n{}\n{}",
        quick_top_level(port),
        destination("orders", "sqs", &orders.destination_settings_via(orders_url)),
        destination("ledger", "rabbitmq", &ledger.destination_settings_via(ledger_url)),
        route("order.*", "orders"),
        route("ledger.*", "ledger"),
    ))
}

/// While their destination is down, none of `down_ids` still unpublished
/// carries an attempt (those claimed meanwhile were given back) or an
/// error, none was charged twice, and nothing is quarantined.
async fn nothing_charged_while_down(db: &TestDb, down_ids: &[Uuid]) {
    let deadline = Instant::now() + WAIT;
    loop {
        let charged = rows_where(
            db,
            down_ids,
            "published_at IS NULL AND (attempt_count <> 0 OR last_error IS NOT NULL)",
        )
        .await;
        if charged.is_empty() {
            break;
        }
        // A probe's rows carry its claim's attempt until given back.
        assert!(
            Instant::now() < deadline,
            "{} unpublished rows of the down destination still carry an attempt or an error after {WAIT:?}; \
             first (id, attempts, last_error): {:?}",
            charged.len(),
            charged.first()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A claim counts one attempt, which giving the row back refunds: a
    // second one would be an outage charged.
    let twice = rows_where(db, down_ids, "attempt_count > 1").await;
    assert!(
        twice.is_empty(),
        "rows charged more than the attempt a claim counts: {twice:?}"
    );
    assert_eq!(
        db.count("quarantined_at IS NOT NULL").await,
        0,
        "an outage quarantines nothing"
    );
}

/// Once destination `back` (name, sink) is back: every row of `ids` is
/// published, each on its first counted attempt, and `/readyz` says so.
async fn recovered(db: &TestDb, port: u16, back: (&str, &str), ids: &[Uuid]) {
    let (name, sink) = back;
    all_published(db, ids, &format!("destination {name} after its outage")).await;
    let charged = rows_where(db, ids, "attempt_count <> 1 OR last_error IS NOT NULL").await;
    assert!(
        charged.is_empty(),
        "{} rows of destination {name} were charged for its outage; first (id, attempts, last_error): {:?}",
        charged.len(),
        charged.first()
    );
    assert_eq!(db.count("quarantined_at IS NOT NULL").await, 0);
    let ready = format!("destination {name} ({sink}): ready");
    eventually(
        WAIT,
        &format!("/readyz lists destination {name} as ready again"),
        || async {
            matches!(http_get(port, "/readyz").await,
            Some((200, body)) if readiness_of(&body, name) == Some(ready.as_str()))
        },
    )
    .await;
}

/// The end of an outage test: the relay lived through it; the queues go.
async fn still_running_then_clean_up(mut relay: RelayProcess, orders: TestQueue, ledger: TestBroker) {
    assert!(
        relay.child.try_wait().expect("relay status").is_none(),
        "the relay exited"
    );
    orders.cleanup().await;
    ledger.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_destination_whose_queue_is_full_holds_back_only_its_rows() {
    // Room for more than the test's ledger rows once purged, so that they
    // all fit then; full now, so the broker nacks each of them.
    const ROOM: usize = 100;
    let db = TestDb::migrated().await;
    let orders = TestQueue::create(false, None).await;
    let ledger = TestBroker::create_rejecting_beyond("#", ROOM as i64).await;
    ledger.fill(ROOM).await;
    let port = free_port();
    let file = orders_and_ledger(port, &orders, &sqs_endpoint(), &ledger, &ledger.url);
    let mut order_ids = Vec::new();
    let mut ledger_ids = Vec::new();
    for _ in 0..5 {
        order_ids.extend(db.insert_events(30, "order.created").await);
        ledger_ids.extend(db.insert_events(12, "ledger.entry").await);
    }
    let relay = start_relay(&db, &file, &[]);

    let got = sqs_ids(&orders, order_ids.len()).await;
    assert_eq!(
        distinct(&got),
        id_set(&order_ids),
        "destination orders drains while ledger nacks"
    );
    all_published(&db, &order_ids, "destination orders").await;
    assert_eq!(
        count_of(&db, &ledger_ids, "published_at IS NOT NULL").await,
        0,
        "nothing of ledger is published while its queue is full"
    );
    let updates = down_while_others_ready(&db, port, ("ledger", "rabbitmq"), ("orders", "sqs")).await;
    assert!(
        updates < MAX_ROW_UPDATES_IN_WINDOW,
        "the relay updated {updates} outbox rows in {RATE_WINDOW:?} while only the full destination had \
         rows (fewer than {MAX_ROW_UPDATES_IN_WINDOW} expected)"
    );
    nothing_charged_while_down(&db, &ledger_ids).await;
    metrics_show(
        port,
        WAIT,
        &[
            ("outbox_destination_ready", &[("destination", "ledger")], 0.0),
            ("outbox_destination_ready", &[("destination", "orders")], 1.0),
            (
                "outbox_events_published_total",
                &[("destination", "orders")],
                order_ids.len() as f64,
            ),
        ],
    )
    .await;

    let purged = ledger.purge().await;
    assert_eq!(purged as usize, ROOM, "only the filler was in the queue");
    let received = rabbit_receive_all(&ledger, &id_set(&ledger_ids)).await;
    eprintln!(
        "full queue: {} messages for {} ledger rows after the purge",
        received.len(),
        ledger_ids.len()
    );
    recovered(&db, port, ("ledger", "rabbitmq"), &ledger_ids).await;
    still_running_then_clean_up(relay, orders, ledger).await;
}

/// While one destination is cut off with a long backlog and another's
/// queue is full, the relay probes the full one with a few of its rows
/// every few seconds. Each probe reads on from where the last found its
/// rows, a window or two of the fresh index, rather than every waiting row
/// of the other destination from the oldest on: with millions waiting, a
/// probe from the oldest row takes seconds of the database's time, and
/// past `statement_timeout` it fails every time and the full destination
/// never gets its rows out. Once the queue has room, they are published.
#[tokio::test(flavor = "multi_thread")]
async fn probes_of_a_full_destination_do_not_step_over_the_backlog_of_one_that_is_cut_off() {
    // Rows of the cut-off destination, all older than the full one's.
    const WAITING: usize = 50_000;
    const ROOM: usize = 100;
    // Fewer than a probe takes, so each probe takes every one.
    const LEDGER_ROWS: usize = 8;
    // A claim counts an attempt on each row, and giving it back refunds it.
    const UPDATES_PER_PROBE: i64 = 2 * LEDGER_ROWS as i64;
    // A probe from where the last found its rows measures and claims a
    // window or two of 2,000 entries; one from the oldest reads the whole
    // backlog.
    const MAX_READS_PER_PROBE: i64 = WAITING as i64 / 5;
    let db = TestDb::migrated().await;
    let orders = TestQueue::create(false, None).await;
    let (orders_proxy, orders_url) = Proxy::in_front_of(&sqs_endpoint()).await;
    let ledger = TestBroker::create_rejecting_beyond("#", ROOM as i64).await;
    ledger.fill(ROOM).await;
    let port = free_port();
    let file = orders_and_ledger(port, &orders, &orders_url, &ledger, &ledger.url);
    orders_proxy.refuse(true);
    let waiting = db.insert_events(WAITING, "order.created").await;
    let ledger_ids = db.insert_events(LEDGER_ROWS, "ledger.entry").await;
    let relay = start_relay(&db, &file, &[]);
    metrics_show(
        port,
        WAIT,
        &[
            ("outbox_destination_ready", &[("destination", "orders")], 0.0),
            ("outbox_destination_ready", &[("destination", "ledger")], 0.0),
        ],
    )
    .await;

    // The probes' spacing grows to its cap of 5 s meanwhile, and the
    // statistics catch up with the reads before it.
    tokio::time::sleep(STATISTICS_DELAY).await;
    let reads_before = db.fresh_index_reads().await;
    let updates_before = row_updates(&db).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let reads = db.fresh_index_reads().await - reads_before;
    let probes = (row_updates(&db).await - updates_before) / UPDATES_PER_PROBE;
    eprintln!(
        "{WAITING} rows of a cut-off destination waiting: {probes} probes of a full one read {reads} \
         fresh-index entries"
    );
    assert!(probes >= 1, "the full destination was probed in 20 s");
    assert!(
        reads <= MAX_READS_PER_PROBE * probes,
        "{probes} probes read {reads} entries of the fresh index, {} each (at most {MAX_READS_PER_PROBE} \
         expected, {WAITING} rows of the other destination waiting before the probed rows)",
        reads / probes
    );
    assert_eq!(
        count_of(&db, &ledger_ids, "published_at IS NOT NULL").await,
        0,
        "nothing of ledger is published while its queue is full"
    );
    nothing_charged_while_down(&db, &ledger_ids).await;

    ledger.purge().await;
    let received = rabbit_receive_all(&ledger, &id_set(&ledger_ids)).await;
    assert_eq!(
        distinct(&received),
        id_set(&ledger_ids),
        "every ledger row once its queue has room"
    );
    recovered(&db, port, ("ledger", "rabbitmq"), &ledger_ids).await;
    assert_eq!(
        count_of(&db, &waiting, "published_at IS NOT NULL").await,
        0,
        "nothing of orders is published while it is cut off"
    );
    still_running_then_clean_up(relay, orders, ledger).await;
}

/// Rows of a destination that is up are published while another, with
/// nothing to publish, is checked again every few seconds (an SQS sink
/// asks its queue after 5 s without an answer), and a third, cut off,
/// has a long backlog. Each check used to leave the checked destination
/// out of the claims until it answered, and back in after: two changes of
/// the destinations served, each starting the claims' windows over from a
/// first sweep from the oldest row (windows.rs). Behind a backlog whose
/// sweep takes longer than the checks are apart, that sweep never reached
/// the newest rows, and no new row was published.
#[tokio::test(flavor = "multi_thread")]
async fn rows_of_a_destination_that_is_up_flow_while_an_idle_one_is_checked_behind_a_long_backlog() {
    let idle = TestQueue::create(false, None).await;
    // Each check then lasts two seconds at least.
    let (_slow_sqs, idle_url) =
        Proxy::in_front_of_with_latency(&sqs_endpoint(), Duration::from_secs(1)).await;
    let orders = destination("orders", "sqs", &idle.destination_settings_via(&idle_url));
    flow_behind_a_long_backlog_while(&orders, std::future::pending()).await;
    idle.cleanup().await;
}

/// The same while the other destination's connection is cut every other
/// second and comes back: the claims' windows go on where they got to for
/// each set of destinations, rather than from the oldest row at each
/// change (which never reached the new rows within two minutes).
#[tokio::test(flavor = "multi_thread")]
async fn rows_of_a_destination_that_is_up_flow_while_another_comes_and_goes_behind_a_long_backlog() {
    let flapping = TestBroker::create("#").await;
    let (proxy, flapping_url) = Proxy::in_front_of(&flapping.url).await;
    let orders = destination(
        "orders",
        "rabbitmq",
        &flapping.destination_settings_via(&flapping_url),
    );
    let comes_and_goes = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            proxy.refuse(true);
            proxy.cut();
            tokio::time::sleep(Duration::from_secs(1)).await;
            proxy.refuse(false);
        }
    };
    flow_behind_a_long_backlog_while(&orders, comes_and_goes).await;
    flapping.cleanup().await;
}

/// Rows of destination `ledger` (RabbitMQ), inserted one by one, are
/// published while 100,000 rows of destination `audit` (SQS, cut off) wait
/// before them, destination `orders` (given as `orders`, routed `order.*`,
/// no rows) is there too, and `meanwhile` runs. The database is 100 ms a
/// round trip away, so that a sweep over the backlog takes over ten
/// seconds (on a real server, a few million waiting rows), longer than
/// the destinations stay the same in either test.
async fn flow_behind_a_long_backlog_while(orders: &str, meanwhile: impl std::future::Future<Output = ()>) {
    const WAITING: usize = 100_000;
    const NEW_ROWS: usize = 10;
    let db = TestDb::migrated().await;
    let (_slow_database, database_url) =
        Proxy::in_front_of_with_latency(&db.url, Duration::from_millis(50)).await;
    let cut_off = TestQueue::create(false, None).await;
    let (cut_off_proxy, cut_off_url) = Proxy::in_front_of(&sqs_endpoint()).await;
    cut_off_proxy.refuse(true);
    let ledger = TestBroker::create("#").await;
    let port = free_port();
    let file = ConfigFile::write(&format!(
        "{}\n{orders}\n{}\n{}\n{}\n{}\n{}",
        quick_top_level(port),
        destination("audit", "sqs", &cut_off.destination_settings_via(&cut_off_url)),
        destination("ledger", "rabbitmq", &ledger.destination_settings()),
        route("order.*", "orders"),
        route("audit.*", "audit"),
        route("ledger.*", "ledger"),
    ));
    let waiting = db.insert_events(WAITING, "audit.recorded").await;
    let relay = start_relay(&db, &file, &[("OUTBOX_DATABASE_URL", database_url)]);
    ready_without_eventually(port, ("audit", "sqs"), ("ledger", "rabbitmq")).await;

    let flowing = async {
        let mut new_rows = Vec::new();
        for _ in 0..NEW_ROWS {
            new_rows.extend(db.insert_events(1, "ledger.entry").await);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let received = rabbit_receive_all(&ledger, &id_set(&new_rows)).await;
        assert_eq!(distinct(&received), id_set(&new_rows), "every new ledger row");
        all_published(&db, &new_rows, "the ledger rows inserted after the backlog").await;
        let slowest: f64 = db
            .client
            .query_one(
                "SELECT extract(epoch FROM max(published_at - created_at))::float8 FROM outbox_event
                 WHERE id = ANY($1)",
                &[&new_rows],
            )
            .await
            .expect("read publish delays")
            .get(0);
        eprintln!("{NEW_ROWS} ledger rows behind {WAITING} waiting: each published within {slowest:.1} s");
    };
    tokio::select! {
        () = flowing => {}
        () = meanwhile => unreachable!("runs until the rows are published"),
    }
    assert_eq!(
        count_of(&db, &waiting, "published_at IS NOT NULL").await,
        0,
        "nothing of audit is published while it is cut off"
    );
    still_running_then_clean_up(relay, cut_off, ledger).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_destination_cut_off_mid_drain_holds_back_only_its_rows() {
    const LEDGER_ROWS: usize = 5_000;
    let db = TestDb::migrated().await;
    let orders = TestQueue::create(false, None).await;
    let ledger = TestBroker::create("#").await;
    // The relay reaches this destination's broker only through the proxy.
    let (proxy, ledger_url) = Proxy::in_front_of(&ledger.url).await;
    let port = free_port();
    let file = orders_and_ledger(port, &orders, &sqs_endpoint(), &ledger, &ledger_url);
    let first_orders = db.insert_events(10, "order.created").await;
    let first_ledger = db.insert_events(10, "ledger.entry").await;
    let relay = start_relay(&db, &file, &[]);
    assert_eq!(
        distinct(&sqs_ids(&orders, 10).await),
        id_set(&first_orders),
        "destination orders receives the first rows"
    );
    rabbit_receive_all(&ledger, &id_set(&first_ledger)).await;
    all_published(&db, &first_ledger, "the first ledger rows").await;

    // Cut while the relay publishes to it: some rows are in flight.
    let ledger_ids = db.insert_events(LEDGER_ROWS, "ledger.entry").await;
    eventually(WAIT, "the relay publishing the ledger rows", || async {
        count_of(&db, &ledger_ids, "published_at IS NOT NULL").await > 0
    })
    .await;
    proxy.refuse(true);
    proxy.cut();
    let published_at_cut = count_of(&db, &ledger_ids, "published_at IS NOT NULL").await;
    assert!(
        published_at_cut < LEDGER_ROWS as i64,
        "every ledger row was published before the cut: the test proved nothing"
    );
    let order_ids = db.insert_events(100, "order.created").await;

    let got = sqs_ids(&orders, order_ids.len()).await;
    assert_eq!(
        distinct(&got),
        id_set(&order_ids),
        "destination orders drains while ledger is cut off"
    );
    all_published(&db, &order_ids, "destination orders").await;
    let updates = down_while_others_ready(&db, port, ("ledger", "rabbitmq"), ("orders", "sqs")).await;
    assert!(
        updates < MAX_ROW_UPDATES_IN_WINDOW,
        "the relay updated {updates} outbox rows in {RATE_WINDOW:?} while only the unreachable destination \
         had rows (fewer than {MAX_ROW_UPDATES_IN_WINDOW} expected)"
    );
    nothing_charged_while_down(&db, &ledger_ids).await;
    let published_while_down = count_of(&db, &ledger_ids, "published_at IS NOT NULL").await;
    metrics_show(
        port,
        WAIT,
        &[
            ("outbox_destination_ready", &[("destination", "ledger")], 0.0),
            ("outbox_destination_ready", &[("destination", "orders")], 1.0),
        ],
    )
    .await;

    proxy.refuse(false);
    // Rows whose confirm the cut lost may arrive twice (at least once).
    let received = rabbit_receive_all(&ledger, &id_set(&ledger_ids)).await;
    eprintln!(
        "cut destination: {published_at_cut} of {LEDGER_ROWS} ledger rows published at the cut, \
         {published_while_down} before it was back; {} messages for them",
        received.len()
    );
    recovered(&db, port, ("ledger", "rabbitmq"), &ledger_ids).await;
    still_running_then_clean_up(relay, orders, ledger).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_destination_denying_every_request_holds_back_only_its_rows() {
    /// The most `SendMessageBatch` requests a second the relay may send to
    /// a destination that denies every one: its probes, spaced 250 ms
    /// doubling to 5 s ("a few a second" at most, as the conformance kit
    /// allows).
    const MAX_REQUESTS_PER_SECOND: f64 = 5.0;
    let db = TestDb::migrated().await;
    let orders = TestQueue::create(false, None).await;
    // The relay reaches this destination's queue only through the proxy,
    // which denies every send as SQS does after a policy change; the
    // health check's own request still passes.
    let denier = SqsProxy::start().await;
    denier.set(Fault::RequestError {
        status: 400,
        code: "AccessDenied",
    });
    let ledger = TestBroker::create("#").await;
    let port = free_port();
    let file = orders_and_ledger(port, &orders, &denier.url(), &ledger, &ledger.url);
    let mut order_ids = Vec::new();
    let mut ledger_ids = Vec::new();
    for _ in 0..5 {
        order_ids.extend(db.insert_events(60, "order.created").await);
        ledger_ids.extend(db.insert_events(400, "ledger.entry").await);
    }
    let relay = start_relay(&db, &file, &[]);

    let received = rabbit_receive_all(&ledger, &id_set(&ledger_ids)).await;
    assert_eq!(
        distinct(&received),
        id_set(&ledger_ids),
        "destination ledger drains while orders is denied"
    );
    all_published(&db, &ledger_ids, "destination ledger").await;
    assert_eq!(
        count_of(&db, &order_ids, "published_at IS NOT NULL").await,
        0,
        "nothing of orders is published while every request is denied"
    );
    let (requests_before, started) = (denier.requests(), Instant::now());
    let updates = down_while_others_ready(&db, port, ("orders", "sqs"), ("ledger", "rabbitmq")).await;
    let requests_per_second = (denier.requests() - requests_before) as f64 / started.elapsed().as_secs_f64();
    eprintln!("denied destination: {requests_per_second:.1} SendMessageBatch requests/s");
    assert!(
        updates < MAX_ROW_UPDATES_IN_WINDOW,
        "the relay updated {updates} outbox rows in {RATE_WINDOW:?} while only the denied destination had \
         rows (fewer than {MAX_ROW_UPDATES_IN_WINDOW} expected)"
    );
    assert!(
        requests_per_second <= MAX_REQUESTS_PER_SECOND,
        "the relay sent {requests_per_second:.1} requests a second to a destination denying every one \
         (at most {MAX_REQUESTS_PER_SECOND})"
    );
    let readiness = http_get(port, "/readyz").await;
    assert!(
        matches!(&readiness, Some((200, body))
            if readiness_of(body, "orders").is_some_and(|line| line.contains("AccessDenied"))),
        "/readyz names the denial as destination orders' reason: {readiness:?}"
    );
    nothing_charged_while_down(&db, &order_ids).await;
    metrics_show(
        port,
        WAIT,
        &[
            ("outbox_destination_ready", &[("destination", "orders")], 0.0),
            ("outbox_destination_ready", &[("destination", "ledger")], 1.0),
            (
                "outbox_events_published_total",
                &[("destination", "ledger")],
                ledger_ids.len() as f64,
            ),
        ],
    )
    .await;

    denier.set(Fault::None);
    let got = sqs_ids(&orders, order_ids.len()).await;
    assert_eq!(
        distinct(&got),
        id_set(&order_ids),
        "destination orders gets every row once requests are allowed again"
    );
    recovered(&db, port, ("orders", "sqs"), &order_ids).await;
    still_running_then_clean_up(relay, orders, ledger).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_of_a_destination_that_is_up_are_found_past_a_long_backlog_of_one_that_is_down() {
    found_past_a_long_backlog_of_a_destination_that_is_down(false).await;
}

/// With `OUTBOX_ORDERING=aggregate`, each aggregate's rows in order: the
/// claims read the same windows, and a row that becomes its aggregate's
/// head behind them is found without stepping over the backlog either.
#[tokio::test(flavor = "multi_thread")]
async fn ordered_rows_of_a_destination_that_is_up_are_found_past_a_long_backlog_of_one_that_is_down() {
    found_past_a_long_backlog_of_a_destination_that_is_down(true).await;
}

/// Rows of a destination that is up are published, one by one as they are
/// inserted, while 20,000 rows of one that is down wait in the fresh
/// index, and the claims do not step over those for each row; `ordered`:
/// with `OUTBOX_ORDERING=aggregate`, the rows inserted in aggregates of
/// three, two aggregates at a time.
async fn found_past_a_long_backlog_of_a_destination_that_is_down(ordered_relay: bool) {
    // Enough waiting rows that a relay whose claims each step over all of
    // them reads millions of index entries in the window below.
    const WAITING: usize = 20_000;
    // A sweep from the oldest row a second (the measure and the claim of
    // each window read its entries once each), four times over; claims
    // that each step over the backlog read it scores of times a second.
    const MAX_BACKLOG_READS_PER_SECOND: f64 = 4.0 * 2.0;
    let db = TestDb::migrated().await;
    let orders = TestQueue::create(false, None).await;
    let ledger = TestBroker::create("#").await;
    let (proxy, ledger_url) = Proxy::in_front_of(&ledger.url).await;
    let port = free_port();
    let file = orders_and_ledger(port, &orders, &sqs_endpoint(), &ledger, &ledger_url);
    let first_ledger = db.insert_events(1, "ledger.entry").await;
    let settings = if ordered_relay { ordered(port) } else { Vec::new() };
    let relay = start_relay(&db, &file, &settings);
    rabbit_receive_all(&ledger, &id_set(&first_ledger)).await;
    all_published(&db, &first_ledger, "the first ledger row").await;

    proxy.refuse(true);
    proxy.cut();
    let waiting = db.insert_events(WAITING, "ledger.entry").await;
    ready_without_eventually(port, ("ledger", "rabbitmq"), ("orders", "sqs")).await;

    // One at a time, as a producer commits them: each is found past the
    // backlog, which is not read again for each claim.
    tokio::time::sleep(STATISTICS_DELAY).await;
    let reads_before = db.fresh_index_reads().await;
    let started = Instant::now();
    let mut one_by_one = Vec::new();
    let mut aggregates = 0;
    while started.elapsed() < RATE_WINDOW {
        if ordered_relay {
            // a1 a2 a3 b1 b2 b3: a claim that takes the heads a1 and b1
            // reads past a2 and a3, which become heads after it.
            let mut rows = Vec::new();
            for aggregate in [aggregates, aggregates + 1] {
                for event_type in ["order.created", "order.paid", "order.shipped"] {
                    rows.push((event_type, format!("order-{aggregate}")));
                }
            }
            aggregates += 2;
            one_by_one.extend(insert_sequence(&db, &rows).await);
        } else {
            one_by_one.extend(db.insert_events(1, "order.created").await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(STATISTICS_DELAY).await;
    let reads = db.fresh_index_reads().await - reads_before;
    // The relay went on claiming while the statistics caught up: the
    // count covers the time between the two readings.
    let window = started.elapsed();
    assert_eq!(
        distinct(&sqs_ids(&orders, one_by_one.len()).await),
        id_set(&one_by_one),
        "every order row inserted one by one"
    );
    all_published(&db, &one_by_one, "the order rows inserted one by one").await;
    if ordered_relay {
        let disorder = published_out_of_order(&db, &one_by_one).await;
        assert!(
            disorder.is_empty(),
            "aggregates published out of order (publish times in (created_at, id) order): {disorder:?}"
        );
        let (median, slowest) = successor_delays(&db, &one_by_one).await;
        eprintln!(
            "{aggregates} aggregates of three: each row published {median:.3} s after its predecessor \
             (median), {slowest:.3} s at most"
        );
    }
    let backlog_reads = reads as f64 / WAITING as f64;
    eprintln!(
        "{WAITING} rows of a down destination waiting: {reads} fresh-index entries read in {window:.1?} \
         ({backlog_reads:.1} times the backlog), {} rows of the other published one by one meanwhile",
        one_by_one.len()
    );
    assert!(
        backlog_reads <= MAX_BACKLOG_READS_PER_SECOND * window.as_secs_f64(),
        "the claims read {reads} entries of the fresh index in {window:?}, {backlog_reads:.1} times the \
         {WAITING} waiting rows (at most {MAX_BACKLOG_READS_PER_SECOND} times a second expected)"
    );

    // Behind every row claimed so far, as a row committed late or given
    // back after an outage is: a sweep from the oldest row finds it.
    let behind = Rows::pending(1).created_ago(3_600).insert(&db).await;
    assert_eq!(
        distinct(&sqs_ids(&orders, 1).await),
        id_set(&behind),
        "an order row older than every row claimed"
    );
    all_published(&db, &behind, "an order row older than every row claimed").await;

    assert_eq!(
        count_of(&db, &waiting, "published_at IS NOT NULL").await,
        0,
        "nothing of ledger is published while it is cut off"
    );
    nothing_charged_while_down(&db, &waiting).await;
    proxy.refuse(false);
    let back = Instant::now();
    let received = rabbit_receive_all(&ledger, &id_set(&waiting)).await;
    assert_eq!(
        distinct(&received),
        id_set(&waiting),
        "every ledger row once it is back"
    );
    recovered(&db, port, ("ledger", "rabbitmq"), &waiting).await;
    eprintln!(
        "{WAITING} waiting rows published in {:.1?} once their destination was back",
        back.elapsed()
    );
    still_running_then_clean_up(relay, orders, ledger).await;
}

/// The median and the longest time between the publishes of two
/// successive rows of an aggregate among `ids`, in seconds.
async fn successor_delays(db: &TestDb, ids: &[Uuid]) -> (f64, f64) {
    let row = db
        .client
        .query_one(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY delay), max(delay)
             FROM (SELECT extract(epoch FROM published_at - lag(published_at)
                                       OVER (PARTITION BY aggregate_id ORDER BY created_at, id))::float8 AS delay
                   FROM outbox_event WHERE id = ANY($1)) AS delays
             WHERE delay IS NOT NULL",
            &[&ids],
        )
        .await
        .expect("read the publish times");
    (row.get(0), row.get(1))
}

// -------------------------------------------------------------- ordering

/// A file with an SQS destination `alpha` (`alpha.*`) and a RabbitMQ
/// destination `beta` (`beta.*`) reached at `beta_url`, and the HTTP
/// endpoints on `http_port` when given (which `OUTBOX_HTTP_ADDR`
/// overrides).
fn alpha_and_beta(
    alpha: &TestQueue,
    beta: &TestBroker,
    beta_url: &str,
    http_port: Option<u16>,
) -> ConfigFile {
    let top_level = http_port
        .map(|port| format!("http_addr = {}\n", toml_string(&format!("127.0.0.1:{port}"))))
        .unwrap_or_default();
    ConfigFile::write(&format!(
        "{top_level}\n{}\n{}\n{}\n{}",
        destination("alpha", "sqs", &alpha.destination_settings()),
        destination("beta", "rabbitmq", &beta.destination_settings_via(beta_url)),
        route("alpha.*", "alpha"),
        route("beta.*", "beta"),
    ))
}

/// Ordered relays' settings: `OUTBOX_ORDERING=aggregate`, quick, and the
/// HTTP endpoints on `http_port` (0: any free port).
fn ordered(http_port: u16) -> Vec<(&'static str, String)> {
    with(
        quick_settings(),
        &[
            ("OUTBOX_ORDERING", "aggregate"),
            ("OUTBOX_HTTP_ADDR", &format!("127.0.0.1:{http_port}")),
        ],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_aggregate_is_published_in_order_across_two_destinations() {
    const AGGREGATES: usize = 12;
    const PER_AGGREGATE: usize = 8;
    let db = TestDb::migrated().await;
    let alpha = TestQueue::create(false, None).await;
    let beta = TestBroker::create("#").await;
    let file = alpha_and_beta(&alpha, &beta, &beta.url, None);
    // Each aggregate's events alternate between the destinations, half of
    // the aggregates starting with each; the aggregates interleave.
    let mut rows = Vec::new();
    for k in 0..PER_AGGREGATE {
        for a in 0..AGGREGATES {
            let event_type = if (k + a) % 2 == 0 {
                "alpha.event"
            } else {
                "beta.event"
            };
            rows.push((event_type, format!("agg-{a}")));
        }
    }
    let ids = insert_sequence(&db, &rows).await;
    let (alpha_ids, beta_ids): (Vec<Uuid>, Vec<Uuid>) = {
        let (a, b): (Vec<_>, Vec<_>) = ids
            .iter()
            .zip(&rows)
            .partition(|(_, (event_type, _))| *event_type == "alpha.event");
        (
            a.into_iter().map(|(id, _)| *id).collect(),
            b.into_iter().map(|(id, _)| *id).collect(),
        )
    };
    // Two replicas, so that an aggregate's successive rows may be claimed
    // by either.
    let _first = start_relay(&db, &file, &ordered(0));
    let _second = start_relay(&db, &file, &ordered(0));

    let got_alpha = sqs_ids(&alpha, alpha_ids.len()).await;
    assert_eq!(
        distinct(&got_alpha),
        id_set(&alpha_ids),
        "alpha received its rows"
    );
    rabbit_receive_all(&beta, &id_set(&beta_ids)).await;
    all_published(&db, &ids, "both destinations").await;
    let disorder = published_out_of_order(&db, &ids).await;
    assert!(
        disorder.is_empty(),
        "aggregates whose rows were not published in (created_at, id) order (publish times in that order): \
         {disorder:?}"
    );
    alpha.cleanup().await;
    beta.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_destination_holds_back_only_the_aggregates_with_a_row_for_it() {
    let db = TestDb::migrated().await;
    let alpha = TestQueue::create(false, None).await;
    let beta = TestBroker::create("#").await;
    let (proxy, beta_url) = Proxy::in_front_of(&beta.url).await;
    // The environment's OUTBOX_HTTP_ADDR wins over the file's http_addr:
    // the endpoints are on `port`.
    let port = free_port();
    let file = alpha_and_beta(&alpha, &beta, &beta_url, Some(free_port()));
    let warm_up = insert_sequence(
        &db,
        &[
            ("alpha.event", "warm-up".to_owned()),
            ("beta.event", "warm-up".to_owned()),
        ],
    )
    .await;
    let _relay = start_relay(&db, &file, &ordered(port));
    assert_eq!(
        distinct(&sqs_ids(&alpha, 1).await),
        id_set(&warm_up[..1]),
        "destination alpha receives the warm-up row"
    );
    rabbit_receive_all(&beta, &id_set(&warm_up[1..])).await;
    all_published(&db, &warm_up, "the warm-up rows").await;

    proxy.refuse(true);
    proxy.cut();
    // free-*: only alpha rows. mixed-*: alpha, alpha, beta, alpha, alpha.
    // beta-first-*: beta, alpha, alpha. Interleaved.
    let shapes: [(&str, &[&str]); 3] = [
        ("free", &["alpha.event"; 4]),
        (
            "mixed",
            &[
                "alpha.event",
                "alpha.event",
                "beta.event",
                "alpha.event",
                "alpha.event",
            ],
        ),
        ("beta-first", &["beta.event", "alpha.event", "alpha.event"]),
    ];
    let mut rows: Vec<(&str, String)> = Vec::new();
    // (aggregate shape, position in its aggregate) of each row.
    let mut positions: Vec<(&str, usize)> = Vec::new();
    for k in 0..5 {
        for n in 0..4 {
            for (shape, types) in &shapes {
                if let Some(event_type) = types.get(k) {
                    rows.push((event_type, format!("{shape}-{n}")));
                    positions.push((shape, k));
                }
            }
        }
    }
    let ids = insert_sequence(&db, &rows).await;
    let row = |i: usize| (ids[i], rows[i].0, positions[i]);
    let all: Vec<(Uuid, &str, (&str, usize))> = (0..ids.len()).map(row).collect();
    // What alpha may get now: every row of the free aggregates and the
    // rows of the mixed ones ahead of their beta row.
    let deliverable: Vec<Uuid> = all
        .iter()
        .filter(|(_, _, (shape, k))| *shape == "free" || (*shape == "mixed" && *k < 2))
        .map(|(id, _, _)| *id)
        .collect();
    let held_alpha: Vec<Uuid> = all
        .iter()
        .filter(|(id, event_type, _)| *event_type == "alpha.event" && !deliverable.contains(id))
        .map(|(id, _, _)| *id)
        .collect();
    let beta_ids: Vec<Uuid> = all
        .iter()
        .filter(|(_, event_type, _)| *event_type == "beta.event")
        .map(|(id, _, _)| *id)
        .collect();
    assert_eq!(
        (deliverable.len(), held_alpha.len(), beta_ids.len()),
        (24, 16, 8),
        "the rows of the test's aggregate shapes"
    );

    let got = sqs_ids(&alpha, deliverable.len()).await;
    assert_eq!(
        distinct(&got),
        id_set(&deliverable),
        "alpha receives the aggregates that have no row waiting for beta"
    );
    all_published(&db, &deliverable, "the aggregates without a row for beta").await;
    // A row inserted now, published only by a claim made after it: the
    // held-back rows, all older, were candidates of that claim too.
    let sentinel = insert_sequence(&db, &[("alpha.event", "sentinel".to_owned())]).await;
    assert_eq!(
        distinct(&sqs_ids(&alpha, 1).await),
        id_set(&sentinel),
        "destination alpha receives the sentinel"
    );
    all_published(&db, &sentinel, "the sentinel").await;
    let early = rows_where(&db, &held_alpha, "published_at IS NOT NULL OR attempt_count <> 0").await;
    assert!(
        early.is_empty(),
        "successors of a row held back for beta were claimed or published: {early:?}"
    );
    let extra: Vec<String> = alpha
        .receive_once(30)
        .await
        .iter()
        .map(SqsReceived::event_id)
        .collect();
    assert!(
        extra.is_empty(),
        "alpha got rows it should not have yet: {extra:?}"
    );
    ready_without_eventually(port, ("beta", "rabbitmq"), ("alpha", "sqs")).await;
    nothing_charged_while_down(&db, &beta_ids).await;

    proxy.refuse(false);
    rabbit_receive_all(&beta, &id_set(&beta_ids)).await;
    let rest = sqs_ids(&alpha, held_alpha.len()).await;
    assert_eq!(
        distinct(&rest),
        id_set(&held_alpha),
        "alpha receives the held-back rows once beta is back"
    );
    all_published(&db, &ids, "every row once beta is back").await;
    let disorder = published_out_of_order(&db, &ids).await;
    assert!(
        disorder.is_empty(),
        "aggregates whose rows were not published in (created_at, id) order (publish times in that order): \
         {disorder:?}"
    );
    alpha.cleanup().await;
    beta.cleanup().await;
}
