//! Synthetic events for tests and benchmarks across the workspace.

use crate::{event_id, CallFinished, CallStatus, SamplingParams, Usage};

/// A successful, trainable call with `prompt` prompt tokens and `completion`
/// sampled tokens; ids and logprobs depend only on the arguments.
pub fn call_finished(
    run_id: &str,
    session_id: &str,
    call_index: i64,
    prompt: usize,
    completion: usize,
) -> CallFinished {
    let index = call_index.to_string();
    CallFinished {
        run_id: run_id.into(),
        event_id: event_id("CallFinished", &[run_id, session_id, &index]),
        session_id: session_id.into(),
        rollout_id: format!("rollout-{session_id}"),
        call_index,
        status: CallStatus::Ok,
        error: None,
        model: "smollm2".into(),
        prompt_token_ids: (0..prompt as u32)
            .map(|i| (i * 7 + call_index as u32) % 49_152)
            .collect(),
        completion_token_ids: (0..completion as u32)
            .map(|i| (i * 13 + 5) % 49_152)
            .collect(),
        completion_logprobs: (0..completion).map(|i| -((i % 17) as f32) / 8.0).collect(),
        finish_reason: Some("stop".into()),
        sampling_requested: SamplingParams {
            temperature: Some(0.7),
            ..Default::default()
        },
        sampling_sent: SamplingParams {
            temperature: Some(0.7),
            top_p: Some(1.0),
            top_k: Some(-1),
            ..Default::default()
        },
        policy_version: Some(0),
        usage: Usage {
            prompt_tokens: prompt as i64,
            completion_tokens: completion as i64,
        },
        trainable: true,
        untrainable_reason: None,
        response_body: Vec::new(),
        latency_ms: 50,
        finished_at_ms: 1_790_000_000_000 + call_index,
    }
}
