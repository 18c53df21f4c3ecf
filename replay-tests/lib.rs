//! Recorded logs and the tests that prove replay is deterministic.
//!
//! `fixtures/smollm2-run/events.bin` is a small run recorded through the
//! capture proxy to the real default policy (SmolLM2 on `forgelog engine`),
//! driven by the official openai and anthropic SDKs: every event of its
//! `forgelog.calls`, `forgelog.rollouts` and `forgelog.rewards` topics in log
//! order, each as a little-endian `u32` length and the event's Avro
//! single-object encoding. `golden/` holds what the pure cores derive from it
//! and what the SDKs received when it was recorded. The examples
//! `record-fixture` (records it again) and `write-golden` (derives the golden
//! outputs again, after an intended change to the cores) rewrite them.

use forgelog_consumers::rebuild::Rebuilt;
use forgelog_schemas::{Codec, DecodeError, EncodeError, Event, Topic};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The run id of the committed fixture.
pub const RUN: &str = "fixture-smollm2";

/// The fixture's rollouts: (group, rollout, sdk, seed, verifier ran).
pub const FIXTURE_ROLLOUTS: [(&str, &str, &str, &str, bool); 4] = [
    ("g0", "g0-openai", "openai", "0", true),
    ("g0", "g0-anthropic", "anthropic", "0", true),
    ("g1", "g1-openai", "openai", "10", true),
    ("g1", "g1-anthropic", "anthropic", "10", false),
];

#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error("fixture cut short at byte {0}")]
    Truncated(usize),
    #[error("event at byte {at}: {source}")]
    Decode { at: usize, source: DecodeError },
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The fixture's directory.
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/smollm2-run")
}

/// Events as length-prefixed single-object encodings, in order.
pub fn encode(events: &[Event]) -> Result<Vec<u8>, FixtureError> {
    let mut out = Vec::new();
    for e in events {
        let bytes = Codec::global().encode(e)?;
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    Ok(out)
}

/// The inverse of [`encode`].
pub fn decode(mut bytes: &[u8]) -> Result<Vec<Event>, FixtureError> {
    let total = bytes.len();
    let mut events = Vec::new();
    while !bytes.is_empty() {
        let at = total - bytes.len();
        let (len, rest) = bytes
            .split_at_checked(4)
            .ok_or(FixtureError::Truncated(at))?;
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let (body, rest) = rest
            .split_at_checked(len)
            .ok_or(FixtureError::Truncated(at))?;
        events.push(
            Codec::global()
                .decode(body)
                .map_err(|source| FixtureError::Decode { at, source })?,
        );
        bytes = rest;
    }
    Ok(events)
}

/// Events grouped by topic, each topic in the order given.
pub fn by_topic(events: &[Event]) -> BTreeMap<Topic, Vec<Event>> {
    let mut m: BTreeMap<Topic, Vec<Event>> = BTreeMap::new();
    for e in events {
        m.entry(e.topic()).or_default().push(e.clone());
    }
    m
}

/// The golden form of derived outputs: one pretty JSON document per output topic.
pub fn golden(rebuilt: &Rebuilt) -> BTreeMap<&'static str, String> {
    let doc = |events: &[Event]| {
        let mut s = serde_json::to_string_pretty(events).expect("events serialize");
        s.push('\n');
        s
    };
    BTreeMap::from([
        ("trajectories.json", doc(&rebuilt.trajectories)),
        ("batches.json", doc(&rebuilt.batches)),
    ])
}

/// The committed fixture's events.
pub fn fixture() -> Result<Vec<Event>, FixtureError> {
    let path = fixture_dir().join("events.bin");
    let bytes = std::fs::read(&path).map_err(|source| FixtureError::Read { path, source })?;
    decode(&bytes)
}

/// Writes [`golden`] of `rebuilt` into the fixture's `golden/`.
pub fn write_golden(rebuilt: &Rebuilt) -> std::io::Result<()> {
    let dir = fixture_dir().join("golden");
    std::fs::create_dir_all(&dir)?;
    for (name, text) in golden(rebuilt) {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(())
}

/// `event` (a `TrajectoryBuilt`) with one bit of token `token` of sequence
/// `sequence` flipped: one edited byte of a recorded trajectory, same event id.
pub fn edit_token(event: &Event, sequence: usize, token: usize) -> Event {
    let mut edited = event.clone();
    if let Event::TrajectoryBuilt(t) = &mut edited {
        t.sequences[sequence].token_ids[token] ^= 1;
    }
    edited
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_schemas::testing::recorded_run;

    #[test]
    fn encode_decode_round_trips_and_truncation_is_an_error() {
        let events = recorded_run("r", 1, 2, 2, 8);
        let bytes = encode(&events).unwrap();
        assert_eq!(decode(&bytes).unwrap(), events);
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1]),
            Err(FixtureError::Truncated(_))
        ));
        let grouped = by_topic(&events);
        assert_eq!(grouped.values().map(Vec::len).sum::<usize>(), events.len());
        let rebuilt = forgelog_consumers::rebuild::rebuild(&grouped, Default::default());
        let t = &rebuilt.trajectories[0];
        let edited = edit_token(t, 0, 2);
        let (Event::TrajectoryBuilt(a), Event::TrajectoryBuilt(b)) = (t, &edited) else {
            panic!("trajectories")
        };
        assert_eq!(a.event_id, b.event_id);
        assert_eq!(a.sequences[0].token_ids[2] ^ 1, b.sequences[0].token_ids[2]);
        assert_eq!(a.sequences[0].token_ids[3..], b.sequences[0].token_ids[3..]);
    }
}
