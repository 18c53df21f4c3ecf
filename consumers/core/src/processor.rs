//! What every consumer's pure core is.

use forgelog_schemas::{Event, Topic};
use serde::{de::DeserializeOwned, Serialize};

/// A deterministic state machine from input events to output events: no I/O,
/// no clock, no randomness, no hash-map order. Its state is serializable so the
/// shell can checkpoint it beside the input positions it reflects.
pub trait Processor: Serialize + DeserializeOwned + Send + 'static {
    /// Stable name: the state directory and the consumer group.
    const NAME: &'static str;
    /// Input topics, in the order the shell sweeps them.
    const INPUTS: &'static [Topic];
    const OUTPUT: Topic;

    /// Feeds one input event; appends what it completes to `out`.
    fn process(&mut self, event: Event, out: &mut Vec<Event>);

    /// Settings that must match between a saved state and this run (serialized).
    fn settings(&self) -> String {
        String::new()
    }
}
