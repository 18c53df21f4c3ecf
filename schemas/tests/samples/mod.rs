//! One fixed, fully populated event of every kind (the fixtures' contents).

use forgelog_schemas::*;
use std::collections::BTreeMap;

fn sampling(t: f64) -> SamplingParams {
    SamplingParams {
        temperature: Some(t),
        top_p: Some(1.0),
        top_k: Some(-1),
        min_p: Some(0.0),
        max_tokens: Some(256),
        seed: Some(7),
        presence_penalty: None,
        frequency_penalty: Some(0.0),
        stop: vec!["</s>".into()],
    }
}

fn sequence() -> Sequence {
    Sequence {
        root: 0,
        call_indices: vec![0, 1],
        discarded: false,
        token_ids: vec![1, 9, 2, 42, 43],
        loss_mask: vec![0, 0, 0, 1, 1],
        sampling_logprobs: vec![0.0, 0.0, 0.0, -0.25, -1.5],
        policy_versions: vec![
            UNKNOWN_POLICY_VERSION,
            UNKNOWN_POLICY_VERSION,
            UNKNOWN_POLICY_VERSION,
            3,
            3,
        ],
        tool_calls: 1,
    }
}

pub fn all() -> Vec<Event> {
    vec![
        CallStarted {
            run_id: "run-1".into(),
            event_id: event_id("CallStarted", &["run-1", "s-1", "0"]),
            session_id: "s-1".into(),
            rollout_id: "r-1".into(),
            call_index: 0,
            dialect: Dialect::AnthropicMessages,
            harness: "claude-code".into(),
            path: "/v1/messages".into(),
            raw_request: br#"{"model":"m","messages":[]}"#.to_vec(),
            received_at_ms: 1_790_000_000_000,
            raw_request_splice: None,
        }
        .into(),
        CallFinished {
            run_id: "run-1".into(),
            event_id: event_id("CallFinished", &["run-1", "s-1", "0"]),
            session_id: "s-1".into(),
            rollout_id: "r-1".into(),
            call_index: 0,
            status: CallStatus::Ok,
            error: None,
            model: "smollm2".into(),
            prompt_token_ids: vec![1, 9, 2],
            completion_token_ids: vec![42, 43],
            completion_logprobs: vec![-0.25, -1.5],
            finish_reason: Some("stop".into()),
            sampling_requested: sampling(0.7),
            sampling_sent: sampling(1.0),
            policy_version: Some(3),
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
            },
            trainable: true,
            untrainable_reason: None,
            response_body: br#"{"id":"x"}"#.to_vec(),
            chat_request: r#"{"messages":[{"role":"user","content":"2+2?"}]}"#.into(),
            chat_response: r#"{"role":"assistant","content":"4"}"#.into(),
            latency_ms: 12,
            finished_at_ms: 1_790_000_000_012,
            unparsed_tool_calls: 0,
            prompt_splice: None,
            chat_request_splice: None,
            prompt_made: None,
            stand_in: None,
        }
        .into(),
        RolloutStarted {
            run_id: "run-1".into(),
            event_id: event_id("RolloutStarted", &["run-1", "r-1"]),
            rollout_id: "r-1".into(),
            session_id: "s-1".into(),
            task_id: "t-1".into(),
            harness: "claude-code".into(),
            group_id: "g-1".into(),
            group_size: 8,
            policy_version: Some(3),
            started_at_ms: 1_790_000_000_000,
            max_model_calls: None,
            max_tokens: None,
            api_key_sha256: None,
        }
        .into(),
        RolloutFinished {
            run_id: "run-1".into(),
            event_id: event_id("RolloutFinished", &["run-1", "r-1"]),
            rollout_id: "r-1".into(),
            session_id: "s-1".into(),
            exit_status: Some(0),
            model_calls: 1,
            started_at_ms: 1_790_000_000_000,
            finished_at_ms: 1_790_000_001_000,
        }
        .into(),
        VerifierResult {
            run_id: "run-1".into(),
            event_id: event_id("VerifierResult", &["run-1", "r-1"]),
            rollout_id: "r-1".into(),
            ok: true,
            reward: Some(1.0),
            details: r#"{"answer":"4"}"#.into(),
            abandoned: false,
        }
        .into(),
        TrajectoryBuilt {
            run_id: "run-1".into(),
            event_id: event_id("TrajectoryBuilt", &["run-1", "r-1"]),
            rollout_id: "r-1".into(),
            session_id: "s-1".into(),
            task_id: "t-1".into(),
            group_id: "g-1".into(),
            harness: "claude-code".into(),
            calls: 2,
            tool_calls: 1,
            sequences: vec![sequence()],
            findings: vec![Finding {
                kind: FindingKind::Drift,
                call_index: 1,
                detail: "token 3".into(),
            }],
        }
        .into(),
        TrainingBatch {
            run_id: "run-1".into(),
            event_id: event_id("TrainingBatch", &["run-1", "g-1"]),
            group_id: "g-1".into(),
            task_id: "t-1".into(),
            no_reward_variance: false,
            members: vec![GroupMember {
                rollout_id: "r-1".into(),
                harness: "claude-code".into(),
                reward: Some(1.0),
                advantage: Some(0.7),
                sequences: vec![sequence()],
            }],
        }
        .into(),
        PolicyPublished {
            run_id: "run-1".into(),
            event_id: event_id("PolicyPublished", &["run-1", "4"]),
            version: 4,
            step: 4,
            checkpoint_uri: "file:///tmp/ckpt/4".into(),
            metrics: BTreeMap::from([("loss".to_string(), 0.5)]),
        }
        .into(),
        DeadLetter {
            run_id: String::new(),
            event_id: event_id("DeadLetter", &["trajectories", "forgelog.calls", "3", "17"]),
            consumer: "trajectories".into(),
            topic: "forgelog.calls".into(),
            partition: 3,
            offset: 17,
            key: b"s1".to_vec(),
            value: b"not avro".to_vec(),
            reason: "not a forgelog event: no single-object marker".into(),
        }
        .into(),
    ]
}
