//! The committed fixture is a real recording: calls made with the official
//! openai and anthropic SDKs through the capture proxy to `forgelog engine`
//! on SmolLM2, each trainable, in two GRPO groups with verifier verdicts.
//! `cargo run -p forgelog-replay-tests --example record-fixture` records it
//! again (see the README).

use forgelog_replay_tests::{decode, fixture_dir, FIXTURE_ROLLOUTS, RUN};
use forgelog_schemas::{CallStatus, Dialect, Event};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fixture_is_a_trainable_smollm2_recording_in_two_dialects() {
    let bytes = std::fs::read(fixture_dir().join("events.bin")).expect("committed fixture");
    assert!(bytes.len() < 512 << 10, "fixture is {} bytes", bytes.len());
    let events = decode(&bytes).unwrap();
    assert!(events.iter().all(|e| e.run_id() == RUN));
    let dialects: std::collections::BTreeSet<Dialect> = events
        .iter()
        .filter_map(|e| match e {
            Event::CallStarted(c) => Some(c.dialect),
            _ => None,
        })
        .collect();
    assert_eq!(
        dialects.into_iter().collect::<Vec<_>>(),
        [Dialect::OpenaiChat, Dialect::AnthropicMessages]
    );
    let finished: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 3 * FIXTURE_ROLLOUTS.len());
    for c in finished {
        assert_eq!(c.status, CallStatus::Ok, "{:?}", c.error);
        assert!(c.trainable, "{:?}", c.untrainable_reason);
        assert!(c.model.to_lowercase().contains("smollm2"), "{}", c.model);
        assert_eq!(c.completion_token_ids.len(), c.completion_logprobs.len());
        assert!(!c.completion_token_ids.is_empty());
    }
    let verdicts: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::VerifierResult(v) => Some((v.ok, v.reward)),
            _ => None,
        })
        .collect();
    assert_eq!(verdicts.len(), FIXTURE_ROLLOUTS.len());
    assert_eq!(verdicts.iter().filter(|v| v.1.is_none()).count(), 1);
}
