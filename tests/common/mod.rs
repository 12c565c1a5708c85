//! The shared test support (`outbox-test-support`), with the one thing it
//! cannot know: the relay binary cargo built for this package's tests.
//! `use common::{...}` reaches everything the support crate exports; its
//! `TestDb` here is the one that can run this binary.
// Every test includes this module and uses a part of it.
#![allow(dead_code)]

pub use outbox_test_support::*;

/// The relay binary under test.
pub struct OutboxRelay;

impl RelayBinary for OutboxRelay {
    const PATH: &'static str = env!("CARGO_BIN_EXE_outbox-relay");
}

/// A database of its own for one test, which the relay binary can run against.
pub type TestDb = outbox_test_support::TestDb<OutboxRelay>;

/// The relay binary built for this test run.
pub fn relay_bin() -> &'static str {
    OutboxRelay::PATH
}
