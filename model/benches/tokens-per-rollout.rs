//! What token in saves a learner, on a 20-call tool-using session through
//! SmolLM2's own tokenizer and chat template, and what the splice costs.
//!
//! The session is made here, deterministically: a system prompt, a task, 19
//! bash tool calls, each answered by ~40 lines of output, and a final answer.
//! The model writes its calls as Hermes-trained models do (`name` after
//! `arguments`, spaced JSON), so rendering them again from the structured
//! messages a harness sends back gives other tokens: with the engine
//! rendering each chat, every call drifts and trains as its own sequence
//! (its whole prompt again); spliced, the session is one sequence.
//!
//! `cargo bench -p forgelog-model --bench tokens-per-rollout`

use forgelog_dialects::splice::{self, AnsweredCall, ChatRenderer, Made};
use serde_json::{json, Value};
use std::time::Instant;

const CALLS: usize = 20;

fn tool_output(turn: usize) -> String {
    (0..40)
        .map(|i| {
            format!(
                "-rw-r--r-- 1 dev dev {:>6} Nov {:>2} 10:{:02} src/module_{turn}/file_{i}.rs",
                1000 + 37 * i * (turn + 1),
                1 + i % 28,
                i
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn main() {
    let codec = forgelog_model::load_chat_codec("smollm2", &forgelog_stream::models_dir())
        .unwrap_or_else(|e| panic!("{e}"));
    let tools = json!([{"type": "function", "function": {"name": "bash", "description": "Runs a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]);
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent. Use the bash tool to inspect and change the repository, then answer."}),
        json!({"role": "user", "content": "Find where the retry budget is set and double it."}),
    ];
    let mut history: Vec<AnsweredCall> = Vec::new();
    let (mut per_call, mut spliced_calls, mut final_len) = (0usize, 0usize, 0usize);
    let mut splice_time = std::time::Duration::ZERO;
    let mut timings = Vec::new();
    for call in 0..CALLS {
        // The fastest of a few runs: this machine's noise is not the splice's.
        let mut fastest = std::time::Duration::MAX;
        let mut prompt = None;
        for _ in 0..5 {
            let started = Instant::now();
            prompt = Some(splice::prompt(&history, &messages, Some(&tools), &codec).unwrap());
            fastest = fastest.min(started.elapsed());
        }
        let prompt = prompt.expect("made");
        splice_time += fastest;
        timings.push((prompt.ids.len(), fastest));
        spliced_calls += usize::from(matches!(prompt.made, Made::Spliced { .. }));
        // The engine rendering the chat itself: this call's own prompt.
        let fresh = codec
            .encode(&codec.render(&messages, Some(&tools), true).unwrap())
            .unwrap();
        let (answer, sampled_text) = if call + 1 < CALLS {
            let command =
                format!("ls -la src/module_{call} && grep -n retry src/module_{call}/*.rs");
            let id = format!("call_{call}");
            (
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
                    "function": {"name": "bash", "arguments": json!({"command": command}).to_string()}}]}),
                format!("<tool_call>\n{{\"arguments\": {{\"command\": {}}}, \"name\": \"bash\"}}\n</tool_call>", Value::from(command)),
            )
        } else {
            let text =
                "The retry budget is set in src/module_7/config.rs; it is now 6.".to_string();
            (json!({"role": "assistant", "content": text}), text)
        };
        let mut sampled = codec.encode(&sampled_text).unwrap();
        sampled.push(codec.tokenizer.token_to_id("<|im_end|>").unwrap());
        per_call += fresh.len() + sampled.len();
        final_len = prompt.ids.len() + sampled.len();
        history.push(AnsweredCall::new(
            call as i64,
            prompt,
            Some(tools.clone()),
            answer.clone(),
            sampled,
        ));
        // The harness sends the call back with its own id.
        let mut resent = answer;
        if let Some(c) = resent["tool_calls"].get_mut(0) {
            c["id"] = json!(format!("toolu_{call}"));
        }
        messages.push(resent);
        messages.push(json!({"role": "tool", "tool_call_id": format!("toolu_{call}"), "content": tool_output(call)}));
    }
    for (tokens, took) in &timings {
        println!(
            "prompt {tokens:>6} tokens: made in {:>6.0} µs",
            took.as_secs_f64() * 1e6
        );
    }
    println!(
        "{CALLS} calls, {spliced_calls} spliced; final sequence {final_len} tokens; splice per call {:.0} µs (two renders of the whole conversation, one suffix tokenized)",
        splice_time.as_secs_f64() * 1e6 / CALLS as f64
    );
    println!("training tokens per rollout: per-call {per_call}, spliced {final_len}");
}
