//! Synthetic events for tests and benchmarks across the workspace.

use crate::{
    event_id, CallFinished, CallStatus, Event, GroupMember, SamplingParams, Sequence,
    TrainingBatch, Usage,
};

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
        chat_request: String::new(),
        chat_response: String::new(),
        latency_ms: 50,
        finished_at_ms: 1_790_000_000_000 + call_index,
        unparsed_tool_calls: 0,
        prompt_splice: None,
        chat_request_splice: None,
        prompt_made: None,
        stand_in: None,
    }
}

/// A complete recorded run: `groups` GRPO groups of `group_size` rollouts, each a
/// multi-turn session of `turns` calls (every fifth session retries a turn, every
/// seventh has one untrainable call), with rollout events and verifier results
/// (every ninth rollout's verifier did not run). Events come in the order a proxy
/// would write them; everything depends only on the arguments.
pub fn recorded_run(
    run_id: &str,
    groups: usize,
    group_size: usize,
    turns: usize,
    tokens_per_turn: usize,
) -> Vec<crate::Event> {
    use crate::{Event, RolloutFinished, RolloutStarted, VerifierResult};
    let mut events: Vec<Event> = Vec::new();
    let mut n = 0usize;
    for g in 0..groups {
        for m in 0..group_size {
            let rollout = format!("{run_id}-g{g}-r{m}");
            let session = format!("session-{rollout}");
            events.push(
                RolloutStarted {
                    run_id: run_id.into(),
                    event_id: event_id("RolloutStarted", &[run_id, &rollout]),
                    rollout_id: rollout.clone(),
                    session_id: session.clone(),
                    task_id: format!("task-{g}"),
                    harness: if m % 2 == 0 {
                        "opencode"
                    } else {
                        "claude-code"
                    }
                    .into(),
                    group_id: format!("group-{g}"),
                    group_size: group_size as i64,
                    policy_version: Some(0),
                    started_at_ms: 1_790_000_000_000 + n as i64,
                    max_model_calls: None,
                    max_tokens: None,
                    api_key_sha256: None,
                }
                .into(),
            );
            let mut context: Vec<u32> = (0..tokens_per_turn as u32)
                .map(|t| (t * 31 + g as u32) % 49_152)
                .collect();
            let mut index = 0i64;
            for turn in 0..turns {
                let attempts = if n.is_multiple_of(5) && turn == 1 {
                    2
                } else {
                    1
                };
                for attempt in 0..attempts {
                    let mut c = call_finished(run_id, &session, index, 0, 0);
                    c.event_id = event_id("CallFinished", &[run_id, &session, &index.to_string()]);
                    c.rollout_id = rollout.clone();
                    c.prompt_token_ids = context.clone();
                    c.completion_token_ids = (0..tokens_per_turn as u32 / 4 + 1)
                        .map(|t| (t * 17 + (n * 7 + turn * 3 + attempt) as u32) % 49_152)
                        .collect();
                    c.completion_logprobs = c
                        .completion_token_ids
                        .iter()
                        .map(|&t| -((t % 97) as f32) / 40.0)
                        .collect();
                    c.finish_reason = Some(
                        if turn + 1 < turns {
                            "tool_calls"
                        } else {
                            "stop"
                        }
                        .into(),
                    );
                    c.trainable = !(n % 7 == 3 && turn == 0);
                    if attempt + 1 == attempts {
                        context.extend_from_slice(&c.completion_token_ids);
                        context.extend(
                            (0..tokens_per_turn as u32)
                                .map(|t| (t * 13 + turn as u32 * 5 + 1) % 49_152),
                        );
                    }
                    events.push(c.into());
                    index += 1;
                }
            }
            events.push(
                RolloutFinished {
                    run_id: run_id.into(),
                    event_id: event_id("RolloutFinished", &[run_id, &rollout]),
                    rollout_id: rollout.clone(),
                    session_id: session,
                    exit_status: Some(0),
                    model_calls: index,
                    started_at_ms: 1_790_000_000_000 + n as i64,
                    finished_at_ms: 1_790_000_001_000 + n as i64,
                }
                .into(),
            );
            let ran = n % 9 != 4;
            events.push(
                VerifierResult {
                    run_id: run_id.into(),
                    event_id: event_id("VerifierResult", &[run_id, &rollout]),
                    rollout_id: rollout,
                    ok: ran,
                    reward: ran.then_some(((n * 7 + m) % 3) as f64 / 2.0),
                    details: String::new(),
                    abandoned: false,
                }
                .into(),
            );
            n += 1;
        }
    }
    events
}

/// A GRPO group `id` of run `run` as the learner takes it: two members
/// (reward 1, advantage +1; reward 0, advantage -1), each one sequence of a
/// 4-token prompt and `sampled` tokens the engine sampled at `version` with
/// logprob -5.
pub fn training_batch(run: &str, id: &str, sampled: usize, version: u32) -> Event {
    let member = |i: usize, reward: f64, advantage: f64| GroupMember {
        rollout_id: format!("{id}-{i}"),
        harness: "test".into(),
        reward: Some(reward),
        advantage: Some(advantage),
        sequences: vec![Sequence {
            root: 0,
            call_indices: vec![0],
            discarded: false,
            token_ids: (0..4 + sampled as u32)
                .map(|t| (t * 17 + i as u32) % 200 + 3)
                .collect(),
            loss_mask: (0..4 + sampled).map(|t| (t >= 4) as u8).collect(),
            sampling_logprobs: (0..4 + sampled)
                .map(|t| if t >= 4 { -5.0 } else { 0.0 })
                .collect(),
            policy_versions: (0..4 + sampled)
                .map(|t| if t >= 4 { version } else { u32::MAX })
                .collect(),
            tool_calls: 0,
        }],
    };
    TrainingBatch {
        run_id: run.into(),
        event_id: format!("{run}-{id}"),
        group_id: id.into(),
        task_id: "t".into(),
        no_reward_variance: false,
        members: vec![member(0, 1.0, 1.0), member(1, 0.0, -1.0)],
    }
    .into()
}

/// An agent session as a proxy records it: `calls` calls (every tenth retried
/// once), each re-sending the whole conversation with the model's last answer
/// and a tool result of `turn` tokens (about `4 × turn` bytes of text) added.
/// The raw requests are OpenAI Chat bodies with tools after the messages;
/// everything depends only on the arguments.
pub fn growing_session(
    run_id: &str,
    session_id: &str,
    calls: usize,
    turn: usize,
) -> Vec<(crate::CallStarted, CallFinished)> {
    use crate::{CallStarted, Dialect};
    let words = |seed: usize, n: usize| -> String {
        const WORDS: [&str; 8] = [
            "grep",
            "the",
            "src/lib.rs",
            "fn",
            "error",
            "ok",
            "line",
            "test",
        ];
        (0..n)
            .map(|i| WORDS[(i * 7 + seed) % WORDS.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let tools = r#"[{"type":"function","function":{"name":"bash","description":"Run a command","parameters":{"type":"object","properties":{"command":{"type":"string"}}}}}]"#;
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": words(1, 300)}),
        serde_json::json!({"role": "user", "content": words(2, turn)}),
    ];
    let mut context: Vec<u32> = (0..turn as u32).map(|t| (t * 31) % 49_152).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < calls {
        let index = out.len() as i64;
        let messages_json = serde_json::Value::Array(messages.clone()).to_string();
        let raw =
            format!(r#"{{"model":"m","messages":{messages_json},"tools":{tools},"stream":true}}"#);
        let started = CallStarted {
            run_id: run_id.into(),
            event_id: event_id("CallStarted", &[run_id, session_id, &index.to_string()]),
            session_id: session_id.into(),
            rollout_id: format!("rollout-{session_id}"),
            call_index: index,
            dialect: Dialect::OpenaiChat,
            harness: "agent".into(),
            path: "/v1/chat/completions".into(),
            raw_request: raw.into_bytes(),
            received_at_ms: 1_790_000_000_000 + index,
            raw_request_splice: None,
        };
        let mut c = call_finished(run_id, session_id, index, 0, 0);
        c.prompt_token_ids = context.clone();
        c.completion_token_ids = (0..256).map(|t| (t * 7 + i as u32) % 49_152).collect();
        c.completion_logprobs = vec![-0.5; 256];
        c.chat_request = format!(r#"{{"messages":{messages_json},"tools":{tools}}}"#);
        let answer = words(i + 3, 60);
        c.chat_response = serde_json::json!({"role": "assistant", "content": answer}).to_string();
        c.response_body =
            format!(r#"{{"choices":[{{"message":{}}}]}}"#, c.chat_response).into_bytes();
        let retried = i % 10 == 9
            && out
                .last()
                .is_none_or(|(_, l): &(_, CallFinished)| l.prompt_token_ids != context);
        out.push((started, c.clone()));
        if retried {
            continue; // the same request again
        }
        context.extend_from_slice(&c.completion_token_ids);
        context.extend((0..turn as u32).map(|t| (t * 13 + i as u32) % 49_152));
        let id = format!("call_{i}");
        let command = serde_json::json!({"command": words(i, 3)}).to_string();
        messages.push(
            serde_json::json!({"role": "assistant", "content": answer, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "bash", "arguments": command}}]}),
        );
        messages.push(
            serde_json::json!({"role": "tool", "tool_call_id": id, "content": words(i + 5, turn)}),
        );
        i += 1;
    }
    out
}

/// `event` as `apache_avro`'s own datum writer encodes it (schema resolved and
/// value validated): what [`crate::Codec`]'s writer must equal, byte for byte.
pub fn apache_avro_datum(event: &Event) -> Vec<u8> {
    let (schema, _) = crate::Codec::global().schema(event.kind());
    apache_avro::to_avro_datum(schema, event.to_avro().expect("serializes")).expect("validates")
}
