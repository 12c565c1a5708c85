//! Start-up validation: every invalid setting stops the binary with exit
//! status 2 and one line naming the variable, before anything connects.

mod common;

use std::process::Command;

fn relay(env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut command = Command::new(common::relay_bin());
    command
        .args(args)
        .env_clear()
        // Nothing listens here: a binary that connected before validating
        // would fail with status 1, not 2.
        .env(
            "OUTBOX_DATABASE_URL",
            "postgres://postgres:s3cret-pw@127.0.0.1:1/none",
        )
        .env("OUTBOX_AMQP_URL", "amqp://guest:s3cret-pw@127.0.0.1:1/%2f");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run outbox-relay")
}

#[test]
fn each_invalid_setting_exits_2_naming_it() {
    let cases: &[(&str, &str)] = &[
        ("OUTBOX_SINK", "kafka"),
        ("OUTBOX_BATCH_SIZE", "0"),
        ("OUTBOX_BATCH_SIZE", "ten"),
        ("OUTBOX_POLL_INTERVAL", "soon"),
        ("OUTBOX_PUBLISH_TIMEOUT", "30"),
        ("OUTBOX_BACKOFF_BASE", "1 s"),
        ("OUTBOX_BACKOFF_MAX", "5y"),
        ("OUTBOX_RETENTION", "forever"),
        ("OUTBOX_MAX_ATTEMPTS", "-1"),
        ("OUTBOX_ON_PUBLISH", "archive"),
        ("OUTBOX_ORDERING", "total"),
        ("OUTBOX_TABLE", "outbox; DROP TABLE users"),
        ("OUTBOX_TABLE", "a.b.c"),
        ("OUTBOX_DATABASE_URL", "postgres://host:notaport/db"),
        ("OUTBOX_AMQP_URL", "not a url"),
        ("OUTBOX_HTTP_ADDR", "everywhere"),
        ("OUTBOX_LOG_FORMAT", "xml"),
        ("OUTBOX_AMQP_ROUTING_KEY", "{tenant}.{event_type}"),
        ("OUTBOX_MESSAGE_FORMAT", "xml"),
        ("OUTBOX_MESSAGE_FORMAT", "cloudevents"),
    ];
    for (variable, value) in cases {
        for args in [&["run"][..], &[][..], &["check"][..]] {
            let out = relay(&[(variable, value)], args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{variable}={value} {args:?}: {stderr}"
            );
            assert!(
                stderr.contains(variable),
                "{variable}={value}: message does not name it: {stderr}"
            );
            assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
            assert!(!stderr.contains("s3cret-pw"), "secret leaked: {stderr}");
        }
    }
}

#[test]
fn a_nats_subject_an_event_could_steer_into_a_system_namespace_exits_2() {
    for subject in [
        "{event_type}",
        "{aggregate_id}.events",
        "$JS.API.{event_type}",
        "_INBOX.{event_type}",
    ] {
        for args in [&["run"][..], &["check"][..]] {
            let out = relay(&[("OUTBOX_SINK", "nats"), ("OUTBOX_NATS_SUBJECT", subject)], args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{subject} {args:?}: {stderr}");
            assert!(stderr.contains("OUTBOX_NATS_SUBJECT"), "{subject}: {stderr}");
            assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        }
    }
}

#[test]
fn an_amqp_routing_key_may_start_with_a_placeholder() {
    // `{event_type}` is the documented default: the exchange, fixed by the
    // operator, bounds what a routing key can reach (see RoutingKeyTemplate).
    for key in ["{event_type}", "{aggregate_id}.{event_type}"] {
        let out = relay(&[("OUTBOX_AMQP_ROUTING_KEY", key)], &["check"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "valid, then the unreachable database fails it: {stderr}"
        );
    }
}

#[test]
fn sqs_without_a_queue_url_exits_2() {
    let out = relay(&[("OUTBOX_SINK", "sqs")], &["run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("OUTBOX_SQS_QUEUE_URL"), "{stderr}");
}

#[test]
fn flags_are_validated_like_variables() {
    let out = relay(&[], &["run", "--batch-size", "0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("OUTBOX_BATCH_SIZE"), "{stderr}");
    let out = relay(&[], &["run", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn an_unreachable_database_is_a_failure_not_a_config_error_and_hides_the_password() {
    let out = relay(&[], &["check"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("s3cret-pw"), "secret leaked: {stderr}");
    let out = relay(&[], &["migrate"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("s3cret-pw"), "secret leaked: {stderr}");
}
