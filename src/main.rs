//! The `outbox-relay` binary: parse the command line, hand over to the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = outbox_relay::cli::Cli::parse_with_sources();
    outbox_relay::cli::execute(cli)
}
