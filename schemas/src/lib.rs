//! forgelog's event contract: the Avro schemas in `avro/`, Rust types for them,
//! single-object encoding, deterministic event ids and topic names. No I/O.
//!
//! Every event on every topic is one of [`Event`]'s variants, encoded by [`Codec`]
//! as `C3 01` + the schema's CRC-64-AVRO fingerprint (little-endian) + the Avro body.

mod claim;
mod codec;
pub mod compact;
mod datum;
pub mod diff;
mod events;
mod ids;
pub mod packed;
mod record;
#[cfg(feature = "testing")]
pub mod testing;
mod topics;

pub use claim::{content_hash, Claim, ClaimError, MEDIA_TYPE as CLAIM_MEDIA_TYPE};
pub use codec::{
    fingerprint, legacy_fingerprint, schema_files, Codec, DecodeError, EncodeError, SchemaFile,
    HISTORY, SCHEMA_VERSION,
};
pub use datum::DatumError;
pub use events::*;
pub use ids::{event_id, hex};
pub use record::Received;
pub use topics::Topic;

use serde::{Deserialize, Serialize};

macro_rules! events {
    ($($name:ident => $topic:ident by $key:ident;)*) => {
        /// Any event of the log. Serializes to JSON as `{"type": "<Name>", ...fields}`.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "type")]
        // CallFinished is the big one (~650 bytes inline); events are built once and
        // moved to the producer, so a Box per event would buy nothing.
        #[allow(clippy::large_enum_variant)]
        pub enum Event {
            $($name($name),)*
        }

        /// The kind of an [`Event`]: its schema name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum EventKind {
            $($name,)*
        }

        impl EventKind {
            pub const ALL: &'static [EventKind] = &[$(EventKind::$name,)*];

            pub fn name(self) -> &'static str {
                match self { $(EventKind::$name => stringify!($name),)* }
            }

            /// The topic events of this kind are written to.
            pub fn topic(self) -> Topic {
                match self { $(EventKind::$name => Topic::$topic,)* }
            }

            /// The current schema text (`avro/<Name>.avsc`).
            pub fn avsc(self) -> &'static str {
                match self { $(EventKind::$name => include_str!(concat!("../avro/", stringify!($name), ".avsc")),)* }
            }

            fn decode_value(self, value: apache_avro::types::Value) -> Result<Event, apache_avro::Error> {
                match self { $(EventKind::$name => apache_avro::from_value::<$name>(&value).map(Event::$name),)* }
            }
        }

        impl Event {
            pub fn kind(&self) -> EventKind {
                match self { $(Event::$name(_) => EventKind::$name,)* }
            }

            pub fn run_id(&self) -> &str {
                match self { $(Event::$name(e) => &e.run_id,)* }
            }

            pub fn event_id(&self) -> &str {
                match self { $(Event::$name(e) => &e.event_id,)* }
            }

            /// The Kafka message key: rollout, run id or (dead letters) topic.
            pub fn key(&self) -> &str {
                match self { $(Event::$name(e) => &e.$key,)* }
            }

            pub fn topic(&self) -> Topic {
                self.kind().topic()
            }

            fn to_avro(&self) -> Result<apache_avro::types::Value, apache_avro::Error> {
                match self { $(Event::$name(e) => apache_avro::to_value(e),)* }
            }
        }

        $(impl From<$name> for Event {
            fn from(e: $name) -> Event { Event::$name(e) }
        })*
    };
}

events! {
    // By rollout, as the rollout's own events: a rollout's calls and its start
    // and finish land in partitions of the same number, so each partition can
    // be consumed apart (`forgelog consume --scale-out`).
    CallStarted => Calls by rollout_id;
    CallFinished => Calls by rollout_id;
    RolloutStarted => Rollouts by rollout_id;
    RolloutFinished => Rollouts by rollout_id;
    VerifierResult => Rewards by rollout_id;
    TrajectoryBuilt => Trajectories by rollout_id;
    TrainingBatch => Batches by run_id;
    PolicyPublished => Policy by run_id;
    DeadLetter => DeadLetters by topic;
}
