//! forgelog's Kafka layer: the spool-backed [`EventProducer`], the group
//! [`EventConsumer`], the [`ReplayReader`], topic admin and the local broker.

pub mod admin;
pub mod broker;
mod config;
mod consumer;
pub mod producer;
pub mod spool;
pub mod testing;

pub use config::{
    env_properties, parse_properties, PropertiesError, StreamConfig, MAX_MESSAGE_BYTES,
    PROPERTIES_ENV,
};
pub use consumer::{ConsumeError, EventConsumer, Received, ReplayReader, StartAt};
pub use producer::{EventProducer, FlushTimeout, SendError};
pub use spool::{FsyncPolicy, Spool, SpoolError, SpoolOptions};

/// `FORGELOG_BROKERS`, else the local broker's default address.
pub fn default_brokers() -> String {
    std::env::var("FORGELOG_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_string())
}
