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
    /// Whether an input event only ever meets events with the same message
    /// key. Then partition `n` of every input topic is a task of its own, with
    /// its own state, and instances can share the partitions out
    /// (`forgelog consume --scale-out`); otherwise the consumer is one task.
    const CO_PARTITIONED: bool = false;

    /// Feeds one input event; appends what it completes to `out`.
    fn process(&mut self, event: Event, out: &mut Vec<Event>);

    /// Settings that must match between a saved state and this run (serialized).
    fn settings(&self) -> String {
        String::new()
    }
}
