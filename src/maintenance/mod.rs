//! Background upkeep every replica runs beside the relay loop: the backlog
//! gauges ([`gauges`]) and the deletion of old published rows
//! ([`retention`]).
//!
//! Both are small services in the same shape: a ticker, a bounded unit of
//! work per tick, a shutdown token checked between units, and a database
//! outage that is logged once when it starts and once when it ends, never
//! on every tick.

pub mod gauges;
pub mod retention;

pub(crate) use crate::outage::Outage;
