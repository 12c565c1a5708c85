//! Assembling a [`Config`](super::Config) from `run`'s arguments. Each
//! part's own settings are tested beside them.

use clap::{Args, Command, FromArgMatches};

use crate::cli::RunArgs;

/// `run`'s arguments with no flag given and, unlike the binary's, none read
/// from the environment: the defaults alone, whatever the tests run in.
fn defaults() -> RunArgs {
    let command = RunArgs::augment_args(Command::new("run")).mut_args(|arg| arg.env(None::<&'static str>));
    let matches = command.try_get_matches_from(["run"]).unwrap();
    RunArgs::from_arg_matches(&matches).unwrap()
}

#[cfg(feature = "rabbitmq")]
#[test]
fn the_defaults_assemble_into_a_config() {
    use super::*;

    let config = defaults().validate(&crate::config::Sources::default()).unwrap();
    assert_eq!(config.relay.batch_size, 100);
    assert_eq!(config.retention, Some(Duration::from_secs(7 * 86_400)));
    assert_eq!(config.http_addr, SocketAddr::from(([0, 0, 0, 0], 9090)));
    assert_eq!(config.destinations[0].format, MessageFormat::Plain);
    assert!(matches!(config.destinations[0].sink, SinkConfig::RabbitMq(_)));
    assert_eq!(config.destinations[0].name, "default");
    assert!(config.listen.is_some(), "listens on the database URL");
}

#[cfg(not(feature = "rabbitmq"))]
#[test]
fn without_rabbitmq_the_default_sink_is_refused_naming_its_feature() {
    assert_eq!(
        defaults()
            .validate(&crate::config::Sources::default())
            .unwrap_err()
            .to_string(),
        "OUTBOX_SINK: 'rabbitmq' is not built into this binary (build it with the cargo feature `rabbitmq`)"
    );
}
