//! Recorded-looking runs for the viewer's tests and benchmarks.

use forgelog_consumers_core::rebuild::rebuild;
use forgelog_consumers_core::RewardConfig;
use forgelog_schemas::testing::recorded_run;
use forgelog_schemas::{Event, Topic};
use serde_json::json;
use std::collections::BTreeMap;

/// [`recorded_run`] with a chat view on every call (a conversation that grows
/// by the previous answer and a tool result per call, as an agent's does) and
/// the trajectories and batches the consumers derive from it, in log order.
pub fn recorded_run_with_trees(
    run: &str,
    groups: usize,
    group_size: usize,
    turns: usize,
    tokens_per_turn: usize,
) -> Vec<Event> {
    let mut inputs = recorded_run(run, groups, group_size, turns, tokens_per_turn);
    for e in inputs.iter_mut() {
        if let Event::CallFinished(c) = e {
            let mut messages = vec![
                json!({"role": "system", "content": "You are an agent."}),
                json!({"role": "user", "content": format!("task of {}", c.session_id)}),
            ];
            for i in 0..c.call_index {
                messages.push(json!({"role": "assistant", "content": format!("answer {i}")}));
                messages.push(json!({"role": "tool", "tool_call_id": format!("t{i}"), "content": format!("result {i}")}));
            }
            c.chat_request = json!({ "messages": messages }).to_string();
            c.chat_response =
                json!({"role": "assistant", "content": format!("answer {}", c.call_index)})
                    .to_string();
        }
    }
    let mut by_topic: BTreeMap<Topic, Vec<Event>> = BTreeMap::new();
    for e in &inputs {
        by_topic.entry(e.topic()).or_default().push(e.clone());
    }
    let derived = rebuild(&by_topic, RewardConfig::default());
    [inputs, derived.trajectories, derived.batches].concat()
}
