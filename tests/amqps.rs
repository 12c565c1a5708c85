//! `amqps://` to RabbitMQ: stunnel of the test's own terminates TLS (with
//! a CA and certificates the test generates) in front of the shared broker.

mod common;

use std::process::Output;
use std::time::Duration;

use common::servers::{free_port, Certs, Stunnel};
use common::{eventually, quick_settings, RelayProcess, TestBroker, TestDb};

/// `host:port` of the shared RabbitMQ.
fn broker_address() -> String {
    let url = url::Url::parse(&common::amqp_url()).expect("OUTBOX_TEST_AMQP_URL is a URL");
    format!(
        "{}:{}",
        url.host_str().expect("a host"),
        url.port().unwrap_or(5672)
    )
}

/// The shared broker's URL, through the tunnel, by the name its
/// certificate carries.
fn amqps_url(tunnel: &Stunnel) -> String {
    let mut url = url::Url::parse(&common::amqp_url()).expect("OUTBOX_TEST_AMQP_URL is a URL");
    url.set_scheme("amqps").expect("amqps scheme");
    url.set_host(Some("localhost")).expect("a host");
    url.set_port(Some(tunnel.port)).expect("a port");
    url.to_string()
}

fn check(db: &TestDb, env: &[(&str, &str)]) -> Output {
    db.relay_command(&["check"], env)
        .output()
        .expect("run outbox-relay check")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts that `check` failed with exit status `code`, saying `reason`.
#[track_caller]
fn assert_refused(output: &Output, code: i32, reason: &str) {
    let text = stderr(output);
    assert_eq!(output.status.code(), Some(code), "{text}");
    assert!(text.contains(reason), "check should say {reason:?}, said: {text}");
    assert!(!text.contains("guest:guest"), "the password is echoed: {text}");
    eprintln!(
        "refused, as it should be: {}",
        text.lines().last().unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn amqps_with_the_ca_file_delivers_and_without_it_names_the_certificate_problem() {
    let certs = Certs::generate("relay");
    let tunnel = Stunnel::start(&certs, &broker_address(), false);
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("amqps.#").await;
    let url = amqps_url(&tunnel);
    let ca = certs.path("ca.pem");

    let output = check(&db, &[("OUTBOX_AMQP_URL", &url), ("OUTBOX_AMQP_CA_FILE", &ca)]);
    assert!(output.status.success(), "check over amqps: {}", stderr(&output));

    // The system's CAs do not know the test CA.
    assert_refused(&check(&db, &[("OUTBOX_AMQP_URL", &url)]), 1, "unknown CA");

    // A running relay names the problem in /readyz.
    let http = format!("127.0.0.1:{}", free_port());
    let relay = RelayProcess::start(
        &db,
        &[
            ("OUTBOX_AMQP_URL", url.clone()),
            ("OUTBOX_HTTP_ADDR", http.clone()),
        ],
    );
    let readyz = format!("http://{http}/readyz");
    eventually(Duration::from_secs(30), "/readyz names the unknown CA", || {
        let readyz = readyz.clone();
        async move {
            match reqwest::get(&readyz).await {
                Ok(response) if response.status() == 503 => {
                    response.text().await.unwrap_or_default().contains("unknown CA")
                }
                _ => false,
            }
        }
    })
    .await;
    drop(relay);

    // Another CA's file: refused too.
    let output = check(
        &db,
        &[
            ("OUTBOX_AMQP_URL", &url),
            ("OUTBOX_AMQP_CA_FILE", &certs.path("other-ca.pem")),
        ],
    );
    assert_refused(&output, 1, "unknown CA");

    // The certificate names `localhost`, not 127.0.0.1.
    let by_address = url.replace("localhost", "127.0.0.1");
    let output = check(
        &db,
        &[("OUTBOX_AMQP_URL", &by_address), ("OUTBOX_AMQP_CA_FILE", &ca)],
    );
    assert_refused(&output, 1, "name mismatch");

    // A missing CA file is a configuration error.
    let output = check(
        &db,
        &[
            ("OUTBOX_AMQP_URL", &url),
            ("OUTBOX_AMQP_CA_FILE", "/nonexistent/ca.pem"),
        ],
    );
    assert_refused(&output, 2, "OUTBOX_AMQP_CA_FILE: cannot read /nonexistent/ca.pem");

    let ids = db.insert_events(200, "amqps.created").await;
    let mut env = quick_settings();
    env.extend(broker.env());
    env.push(("OUTBOX_AMQP_URL", url.clone()));
    env.push(("OUTBOX_AMQP_CA_FILE", ca.clone()));
    let relay = RelayProcess::start(&db, &env);
    let received = broker.receive(ids.len(), Duration::from_secs(60)).await;
    assert_eq!(received.len(), ids.len(), "events delivered over amqps");
    drop(relay);
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_presents_the_client_certificate_the_broker_requires() {
    let certs = Certs::generate("relay");
    let tunnel = Stunnel::start(&certs, &broker_address(), true);
    let db = TestDb::migrated().await;
    let broker = TestBroker::create("mtls.#").await;
    let url = amqps_url(&tunnel);
    let ca = certs.path("ca.pem");
    let (cert, key) = (certs.path("client.pem"), certs.path("client.key"));

    let output = check(
        &db,
        &[
            ("OUTBOX_AMQP_URL", &url),
            ("OUTBOX_AMQP_CA_FILE", &ca),
            ("OUTBOX_AMQP_CLIENT_CERT_FILE", &cert),
            ("OUTBOX_AMQP_CLIENT_KEY_FILE", &key),
        ],
    );
    assert!(
        output.status.success(),
        "check with a client certificate: {}",
        stderr(&output)
    );

    let output = check(&db, &[("OUTBOX_AMQP_URL", &url), ("OUTBOX_AMQP_CA_FILE", &ca)]);
    assert_refused(&output, 1, "requires a client certificate");

    let output = check(
        &db,
        &[
            ("OUTBOX_AMQP_URL", &url),
            ("OUTBOX_AMQP_CA_FILE", &ca),
            ("OUTBOX_AMQP_CLIENT_CERT_FILE", &certs.path("other-client.pem")),
            ("OUTBOX_AMQP_CLIENT_KEY_FILE", &certs.path("other-client.key")),
        ],
    );
    assert_refused(&output, 1, "rejected the client certificate");

    let ids = db.insert_events(50, "mtls.created").await;
    let mut env = quick_settings();
    env.extend(broker.env());
    env.push(("OUTBOX_AMQP_URL", url));
    env.push(("OUTBOX_AMQP_CA_FILE", ca));
    env.push(("OUTBOX_AMQP_CLIENT_CERT_FILE", cert));
    env.push(("OUTBOX_AMQP_CLIENT_KEY_FILE", key));
    let relay = RelayProcess::start(&db, &env);
    let received = broker.receive(ids.len(), Duration::from_secs(60)).await;
    assert_eq!(received.len(), ids.len(), "events delivered over mutual TLS");
    drop(relay);
    broker.cleanup().await;
}
