//! Assembling a [`Config`](super::Config) from `run`'s arguments and the
//! configuration file. Each part's own settings are tested beside them.

use std::collections::BTreeSet;

use clap::{Args, Command, FromArgMatches};

use super::Layers;
use crate::cli::RunArgs;

/// `run`'s arguments with no flag given and, unlike the binary's, none read
/// from the environment: the defaults alone, whatever the tests run in.
fn defaults() -> RunArgs {
    let command = RunArgs::augment_args(Command::new("run")).mut_args(|arg| arg.env(None::<&'static str>));
    let matches = command.try_get_matches_from(["run"]).unwrap();
    RunArgs::from_arg_matches(&matches).unwrap()
}

/// `run`'s arguments as these flags give them, the rest defaults; the ids
/// of the flags given, as `explicit` holds them.
fn with_flags(flags: &[&str]) -> (RunArgs, BTreeSet<String>) {
    let command = RunArgs::augment_args(Command::new("run")).mut_args(|arg| arg.env(None::<&'static str>));
    let matches = command
        .try_get_matches_from(std::iter::once("run").chain(flags.iter().copied()))
        .unwrap();
    let explicit = matches
        .ids()
        .filter(|id| matches.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| id.to_string())
        .collect();
    (RunArgs::from_arg_matches(&matches).unwrap(), explicit)
}

/// The file `text` written to a file of its own, read as the binary reads
/// `OUTBOX_CONFIG`.
fn layers(text: &str, explicit: BTreeSet<String>) -> Result<Layers, String> {
    let dir = std::env::temp_dir().join(format!("outbox-config-test-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("relay.toml");
    std::fs::write(&path, text).unwrap();
    let read = Layers::read(path.to_str(), explicit).map_err(|e| format!("{}: {}", e.line, e.what));
    std::fs::remove_dir_all(&dir).unwrap();
    read
}

/// The error `text` gives `run`, without the file's path.
#[cfg(feature = "rabbitmq")]
fn error(text: &str) -> String {
    let layers = match layers(text, BTreeSet::new()) {
        Ok(layers) => layers,
        Err(what) => return what,
    };
    match defaults().validate(&layers).unwrap_err() {
        super::SettingsError::File(e) => format!("{}: {}", e.line, e.what),
        other => other.to_string(),
    }
}

#[cfg(feature = "rabbitmq")]
const TWO_SOURCES: &str = "\
workers = 2
batch_size = 200

[[source]]
name = \"orders\"
database_url = \"postgres://relay@orders-db/orders\"

[[source]]
name = \"billing\"
database_url = \"postgres://relay@billing-db/billing\"
table = \"billing.outbox\"
database_pooler = \"transaction\"
batch_size = 50
ordering = \"aggregate\"
retention = \"0\"
";

#[cfg(feature = "rabbitmq")]
#[test]
fn the_defaults_assemble_into_a_config() {
    use super::*;

    let config = defaults().validate(&Layers::default()).unwrap();
    assert!(!config.named_sources);
    let [source] = config.sources.as_slice() else {
        panic!("one source: {:?}", config.sources)
    };
    assert_eq!(source.name, DEFAULT_SOURCE);
    assert_eq!(source.relay.batch_size, 100);
    assert_eq!(source.retention, Some(Duration::from_secs(7 * 86_400)));
    assert!(source.listen.is_some(), "listens on the database URL");
    assert_eq!(config.http_addr, SocketAddr::from(([0, 0, 0, 0], 9090)));
    assert_eq!(config.publish_timeout, Duration::from_secs(30));
    assert_eq!(config.destinations[0].format, MessageFormat::Plain);
    assert!(matches!(config.destinations[0].sink, SinkConfig::RabbitMq(_)));
    assert_eq!(config.destinations[0].name, "default");
}

#[cfg(feature = "rabbitmq")]
#[test]
fn each_source_has_its_database_and_its_own_settings_over_the_shared_ones() {
    use crate::store::{Ordering, Pooler};

    let config = defaults()
        .validate(&layers(TWO_SOURCES, BTreeSet::new()).unwrap())
        .unwrap();
    assert!(config.named_sources);
    let [orders, billing] = config.sources.as_slice() else {
        panic!("two sources: {:?}", config.sources)
    };
    assert_eq!(orders.name, "orders");
    assert_eq!(orders.database.pg.get_dbname(), Some("orders"));
    assert_eq!(orders.database.table.to_string(), "outbox_event");
    assert_eq!((orders.relay.workers, orders.relay.batch_size), (2, 200));
    assert_eq!(orders.relay.ordering, Ordering::None);
    assert!(orders.listen.is_some());
    assert!(orders.retention.is_some());

    assert_eq!(billing.database.pg.get_dbname(), Some("billing"));
    assert_eq!(billing.database.table.to_string(), "billing.outbox");
    assert_eq!(billing.database.pooler, Pooler::Transaction);
    assert!(billing.listen.is_none(), "no LISTEN behind a transaction pooler");
    assert_eq!((billing.relay.workers, billing.relay.batch_size), (2, 50));
    assert_eq!(billing.relay.ordering, Ordering::Aggregate);
    assert_eq!(billing.retention, None);
}

#[cfg(feature = "rabbitmq")]
#[test]
fn a_flag_wins_over_the_top_level_and_a_source_over_the_flag() {
    let (args, explicit) = with_flags(&["--batch-size=300", "--database-url=postgres://elsewhere/db"]);
    let config = args.validate(&layers(TWO_SOURCES, explicit).unwrap()).unwrap();
    let batch_sizes: Vec<u32> = config
        .sources
        .iter()
        .map(|source| source.relay.batch_size)
        .collect();
    assert_eq!(batch_sizes, [300, 50]);
    // The environment's database is not a source's.
    assert_eq!(config.sources[0].database.pg.get_dbname(), Some("orders"));
}

#[cfg(feature = "rabbitmq")]
#[test]
fn routes_may_be_limited_to_a_source() {
    let text = format!(
        "{TWO_SOURCES}
[[destination]]
name = \"events\"
sink = \"rabbitmq\"

[[destination]]
name = \"audit\"
sink = \"rabbitmq\"
amqp_exchange = \"audit\"

[[route]]
event_type = \"invoice.*\"
destination = \"audit\"
source = \"billing\"

[[route]]
event_type = \"*\"
destination = \"events\"
source = \"billing\"

[[route]]
event_type = \"*\"
destination = \"events\"
"
    );
    let config = defaults()
        .validate(&layers(&text, BTreeSet::new()).unwrap())
        .unwrap();
    let route = |source: usize, event_type: &str| config.sources[source].router.route(event_type);
    // orders: only the route naming no source.
    assert_eq!(route(0, "invoice.paid"), Some(0));
    assert_eq!(config.sources[0].router.routes().len(), 1);
    // billing: its own two.
    assert_eq!(route(1, "invoice.paid"), Some(1));
    assert_eq!(route(1, "order.placed"), Some(0));
}

#[cfg(feature = "rabbitmq")]
#[test]
fn sources_that_cannot_be_used_are_named_with_their_line() {
    let source = "[[source]]\nname = \"orders\"\ndatabase_url = \"postgres://h/orders\"\n";
    for (text, expected) in [
        (
            format!("database_url = \"postgres://h/db\"\n{source}"),
            "1: database_url: is a source's setting: with [[source]] tables, it belongs in one of them",
        ),
        (
            "[[source]]\ndatabase_url = \"postgres://h/db\"\n".to_owned(),
            "1: source 1: name: is required",
        ),
        (
            "[[source]]\nname = \"Orders\"\ndatabase_url = \"postgres://h/db\"\n".to_owned(),
            "2: source 1: name: must be 1 to 64 lower-case letters, digits, '_' or '-' (it is a metrics label)",
        ),
        (
            format!("{source}{source}"),
            "5: source 2: name: \"orders\" is used by an earlier source",
        ),
        (
            "[[source]]\nname = \"orders\"\n".to_owned(),
            "1: source \"orders\": database_url: is required",
        ),
        (
            format!("{source}batch_size = 0\n"),
            "4: source \"orders\": batch_size: must be at least 1",
        ),
        (
            format!("{source}table = \"a;b\"\n"),
            "4: source \"orders\": table",
        ),
        (
            format!("{source}publish_timeout = \"5s\"\n"),
            "4: source \"orders\": publish_timeout: unknown key",
        ),
        (
            "[[destination]]\nname = \"events\"\nsink = \"rabbitmq\"\n[[route]]\nevent_type = \"*\"\n\
             destination = \"events\"\nsource = \"orders\"\n"
                .to_owned(),
            "7: route 1: source: names a source, but the file has no [[source]] tables",
        ),
        (
            format!(
                "{source}[[destination]]\nname = \"events\"\nsink = \"rabbitmq\"\n[[route]]\n\
                 event_type = \"*\"\ndestination = \"events\"\nsource = \"billing\"\n"
            ),
            "10: route 1: source: \"billing\" is not a source (they are: orders)",
        ),
        (
            format!(
                "{source}[[source]]\nname = \"billing\"\ndatabase_url = \"postgres://h/billing\"\n\
                 [[destination]]\nname = \"events\"\nsink = \"rabbitmq\"\n[[destination]]\nname = \"audit\"\n\
                 sink = \"rabbitmq\"\n[[route]]\nevent_type = \"*\"\ndestination = \"events\"\nsource = \"orders\"\n\
                 [[route]]\nevent_type = \"*\"\ndestination = \"audit\"\nsource = \"orders\"\n"
            ),
            "4: source \"billing\": route: no [[route]] applies to this source",
        ),
    ] {
        let message = error(&text);
        assert!(message.starts_with(expected), "for\n{text}\nexpected {expected}\n     got {message}");
    }
}

#[cfg(not(feature = "rabbitmq"))]
#[test]
fn without_rabbitmq_the_default_sink_is_refused_naming_its_feature() {
    assert_eq!(
        defaults().validate(&Layers::default()).unwrap_err().to_string(),
        "OUTBOX_SINK: 'rabbitmq' is not built into this binary (build it with the cargo feature `rabbitmq`)"
    );
}
