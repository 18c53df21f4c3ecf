//! Derives the fixture's golden trajectories and batches again with today's
//! pure cores and writes them into `fixtures/smollm2-run/golden/` (after an
//! intended change to the cores; the tests only compare).
//!
//! `cargo run -p forgelog-replay-tests --example write-golden`

use forgelog_consumers::{rebuild::rebuild, RewardConfig};
use forgelog_replay_tests::{by_topic, fixture, fixture_dir, write_golden};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let events = fixture()?;
    write_golden(&rebuild(&by_topic(&events), RewardConfig::default()))?;
    eprintln!("wrote {}", fixture_dir().join("golden").display());
    Ok(())
}
