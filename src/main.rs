//! The `outbox-relay` binary: parse the command line, hand over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = outbox_relay::cli::Cli::parse();
    outbox_relay::cli::execute(cli)
}
