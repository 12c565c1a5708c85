//! One case per variable: each invalid value names its variable.

use super::*;

fn relay_settings() -> RelaySettings {
    RelaySettings {
        batch_size: "100".into(),
        poll_interval: "500ms".into(),
        max_attempts: "10".into(),
        publish_timeout: "30s".into(),
        backoff_base: "1s".into(),
        backoff_max: "5m".into(),
        on_publish: "mark".into(),
        ordering: "none".into(),
        workers: "4".into(),
        max_batch_bytes: "16777216".into(),
    }
}

fn service_settings() -> ServiceSettings {
    ServiceSettings {
        retention: "7d".into(),
        http_addr: "0.0.0.0:9090".into(),
    }
}

fn sink_settings() -> SinkSettings {
    SinkSettings {
        sink: "rabbitmq".into(),
        amqp_url: "amqp://guest:guest@localhost:5672/%2f".into(),
        amqp_exchange: "amq.topic".into(),
        amqp_routing_key: "{event_type}".into(),
        amqp_max_message_bytes: "16777216".into(),
        amqp_ca_file: None,
        amqp_client_cert_file: None,
        amqp_client_key_file: None,
        sqs_queue_url: None,
        sqs_endpoint_url: None,
        nats_url: "nats://localhost:4222".into(),
        nats_subject: "outbox.{event_type}".into(),
        nats_creds_file: None,
        nats_ca_file: None,
        nats_max_control_line: "4096".into(),
        kafka_brokers: None,
        kafka_topic: "outbox.{event_type}".into(),
        kafka_security_protocol: "plaintext".into(),
        kafka_sasl_mechanism: None,
        kafka_sasl_username: None,
        kafka_sasl_password: None,
        kafka_ca_file: None,
        kafka_client_cert_file: None,
        kafka_client_key_file: None,
        kafka_properties: None,
        message_format: "plain".into(),
        cloudevents_source: None,
    }
}

#[test]
fn durations_accept_the_documented_forms() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
    assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
    assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
}

#[test]
fn durations_reject_malformed_values() {
    for bad in ["", "5", "ms", "5x", "-1s", "1.5s", "5 s", "99999999999999999999d"] {
        assert!(parse_duration(bad).is_err(), "{bad} should be rejected");
    }
}

#[test]
fn defaults_are_valid() {
    let relay = relay_settings().validate().unwrap();
    assert_eq!(relay.batch_size, 100);
    let retention = service_settings().retention().unwrap();
    assert_eq!(retention, Some(Duration::from_secs(7 * 86_400)));
    assert!(matches!(
        sink_settings().validate().unwrap(),
        SinkConfig::RabbitMq(_)
    ));
}

#[test]
fn invalid_values_name_their_variable() {
    let cases: Vec<(RelaySettings, &str)> = vec![
        (
            RelaySettings {
                batch_size: "0".into(),
                ..relay_settings()
            },
            "OUTBOX_BATCH_SIZE",
        ),
        (
            RelaySettings {
                batch_size: "many".into(),
                ..relay_settings()
            },
            "OUTBOX_BATCH_SIZE",
        ),
        (
            RelaySettings {
                poll_interval: "fast".into(),
                ..relay_settings()
            },
            "OUTBOX_POLL_INTERVAL",
        ),
        (
            RelaySettings {
                max_attempts: "0".into(),
                ..relay_settings()
            },
            "OUTBOX_MAX_ATTEMPTS",
        ),
        (
            RelaySettings {
                publish_timeout: "0".into(),
                ..relay_settings()
            },
            "OUTBOX_PUBLISH_TIMEOUT",
        ),
        (
            RelaySettings {
                backoff_max: "1ms".into(),
                ..relay_settings()
            },
            "OUTBOX_BACKOFF_MAX",
        ),
        (
            RelaySettings {
                on_publish: "archive".into(),
                ..relay_settings()
            },
            "OUTBOX_ON_PUBLISH",
        ),
        (
            RelaySettings {
                ordering: "global".into(),
                ..relay_settings()
            },
            "OUTBOX_ORDERING",
        ),
    ];
    for (settings, variable) in cases {
        assert_eq!(settings.validate().unwrap_err().variable, variable);
    }
    let retention = ServiceSettings {
        retention: "a week".into(),
        ..service_settings()
    };
    assert_eq!(retention.retention().unwrap_err().variable, "OUTBOX_RETENTION");
    let http = ServiceSettings {
        http_addr: "nowhere".into(),
        ..service_settings()
    };
    assert_eq!(http.http_addr().unwrap_err().variable, "OUTBOX_HTTP_ADDR");
}

#[test]
fn choices_name_the_accepted_words() {
    let error = parse_log_format("xml").unwrap_err();
    assert_eq!(
        error.to_string(),
        "OUTBOX_LOG_FORMAT: 'xml' is not one of text, json"
    );
    let settings = MigrateSettings {
        database: DatabaseSettings {
            database_url: "postgres://localhost/db".into(),
            table: "outbox_event".into(),
            database_pooler: "none".into(),
        },
        notify_trigger: "maybe".into(),
    };
    assert_eq!(
        settings.validate().unwrap_err().to_string(),
        "OUTBOX_NOTIFY_TRIGGER: 'maybe' is not one of on, off"
    );
}

#[test]
fn sink_errors_name_their_variable() {
    let unknown = SinkSettings {
        sink: "pulsar".into(),
        ..sink_settings()
    };
    assert_eq!(
        unknown.validate().unwrap_err().to_string(),
        "OUTBOX_SINK: 'pulsar' is not one of rabbitmq, sqs, nats, kafka"
    );
    let kafka_without_brokers = SinkSettings {
        sink: "kafka".into(),
        ..sink_settings()
    };
    assert_eq!(
        kafka_without_brokers.validate().unwrap_err().variable,
        "OUTBOX_KAFKA_BROKERS"
    );
    let sqs_without_queue = SinkSettings {
        sink: "sqs".into(),
        ..sink_settings()
    };
    assert_eq!(
        sqs_without_queue.validate().unwrap_err().variable,
        "OUTBOX_SQS_QUEUE_URL"
    );
    let bad_amqp = SinkSettings {
        amqp_url: "not a url".into(),
        ..sink_settings()
    };
    assert_eq!(bad_amqp.validate().unwrap_err().variable, "OUTBOX_AMQP_URL");
    let bad_key = SinkSettings {
        amqp_routing_key: "{tenant}".into(),
        ..sink_settings()
    };
    assert_eq!(
        bad_key.validate().unwrap_err().variable,
        "OUTBOX_AMQP_ROUTING_KEY"
    );
    let nats = SinkSettings {
        sink: "nats".into(),
        ..sink_settings()
    };
    assert!(matches!(nats.validate(), Ok(crate::sink::SinkConfig::Nats(_))));
    let bad_subject = SinkSettings {
        sink: "nats".into(),
        nats_subject: "outbox.>".into(),
        ..sink_settings()
    };
    assert_eq!(
        bad_subject.validate().unwrap_err().variable,
        "OUTBOX_NATS_SUBJECT"
    );
    let bad_nats = SinkSettings {
        sink: "nats".into(),
        nats_url: "nats://user:hunter2@".into(),
        ..sink_settings()
    };
    let error = bad_nats.validate().unwrap_err();
    assert_eq!(error.variable, "OUTBOX_NATS_URL");
    assert!(!error.to_string().contains("hunter2"), "{error}");
    for bad in ["4k", "100", ""] {
        let bad_line = SinkSettings {
            sink: "nats".into(),
            nats_max_control_line: bad.into(),
            ..sink_settings()
        };
        assert_eq!(
            bad_line.validate().unwrap_err().variable,
            "OUTBOX_NATS_MAX_CONTROL_LINE",
            "{bad}"
        );
    }
    let lowered = SinkSettings {
        sink: "nats".into(),
        nats_max_control_line: "1024".into(),
        ..sink_settings()
    };
    match lowered.validate() {
        Ok(crate::sink::SinkConfig::Nats(nats)) => assert_eq!(nats.max_control_line, 1024),
        other => panic!("expected a NATS sink, got {other:?}"),
    }
}

#[test]
fn errors_never_echo_passwords() {
    let bad = SinkSettings {
        amqp_url: "http://user:hunter2@host/".into(),
        ..sink_settings()
    };
    assert!(!bad.validate().unwrap_err().to_string().contains("hunter2"));
    let db = DatabaseSettings {
        database_url: "postgres://u:hunter2@h:notaport/db".into(),
        table: "outbox_event".into(),
        database_pooler: "none".into(),
    };
    assert!(!db.validate().unwrap_err().to_string().contains("hunter2"));
}

#[test]
fn a_transaction_pooler_listens_only_on_a_direct_url() {
    let database = |pooler: &str| DatabaseSettings {
        database_url: "postgres://relay@pgbouncer:6432/shop".into(),
        table: "outbox_event".into(),
        database_pooler: pooler.into(),
    };
    let none = database("none").validate().unwrap();
    let listen = ListenSettings {
        listen_database_url: None,
    };
    let endpoint = listen
        .validate(&none)
        .unwrap()
        .expect("listens on the database URL");
    assert_eq!(endpoint.pg.get_ports(), &[6432]);
    let pooled = database("transaction").validate().unwrap();
    assert!(listen.validate(&pooled).unwrap().is_none());
    let direct = ListenSettings {
        listen_database_url: Some("postgres://relay@db:5432/shop".into()),
    };
    let endpoint = direct
        .validate(&pooled)
        .unwrap()
        .expect("listens on the direct URL");
    assert_eq!(endpoint.pg.get_ports(), &[5432]);
    assert_eq!(
        database("session").validate().unwrap_err().to_string(),
        "OUTBOX_DATABASE_POOLER: 'session' is not one of none, transaction"
    );
    let bad = ListenSettings {
        listen_database_url: Some("postgres://u:hunter2@db/shop?sslmode=nope".into()),
    };
    let error = bad.validate(&pooled).unwrap_err();
    assert_eq!(error.variable, "OUTBOX_LISTEN_DATABASE_URL");
    assert!(!error.to_string().contains("hunter2"));
}

#[test]
fn the_message_format_names_its_variables() {
    assert_eq!(sink_settings().format(), Ok(MessageFormat::Plain));
    let cloudevents = SinkSettings {
        message_format: "cloudevents".into(),
        ..sink_settings()
    };
    assert_eq!(
        cloudevents.format().unwrap_err().variable,
        "OUTBOX_CLOUDEVENTS_SOURCE"
    );
    let with_source = SinkSettings {
        cloudevents_source: Some("https://shop.example.com/orders".into()),
        ..cloudevents
    };
    assert!(matches!(
        with_source.format(),
        Ok(MessageFormat::CloudEvents { .. })
    ));
    let unknown = SinkSettings {
        message_format: "avro".into(),
        ..sink_settings()
    };
    assert_eq!(unknown.format().unwrap_err().variable, "OUTBOX_MESSAGE_FORMAT");
}
