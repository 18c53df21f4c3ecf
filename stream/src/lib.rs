//! forgelog's Kafka layer: the spool-backed [`EventProducer`], the group
//! [`EventConsumer`], the [`ReplayReader`], topic admin and the local broker;
//! and the object-store [`store`] that checkpoints and exports go to.

pub mod admin;
pub mod broker;
pub mod bundle;
pub mod claims;
mod config;
mod consumer;
mod log;
mod process;
pub mod producer;
pub mod run_index;
mod run_log;
pub mod spool;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use bundle::{Bundle, BundleError, BundleManifest};
pub use config::{
    env_properties, parse_properties, PropertiesError, StreamConfig, MAX_EVENT_BYTES,
    MAX_MESSAGE_BYTES, PROPERTIES_ENV,
};
pub use consumer::{ConsumeError, EventConsumer, ReplayReader, StartAt, Unreachable};
pub use forgelog_schemas::Received;
pub use log::{newest_policy, policy_version, published_policies, EventSink, LogReader, MemoryLog};
pub use process::{default_brokers, forgelog_home, models_dir, shutdown_signal, DEFAULT_BROKERS};
pub use producer::{EventProducer, FlushTimeout, SendError};
pub use run_log::{RunLog, RunLogError};
pub use spool::{FsyncPolicy, ParkedRecord, Spool, SpoolError, SpoolOptions, SpoolStatus};
