//! `forgelog export atif`: each rollout as an ATIF trajectory (Harbor's Agent
//! Trajectory Interchange Format, v1.7), so Harbor's and ATIF's tools open
//! forgelog runs.
//!
//! One document per rollout. Its steps are the conversation of the main
//! path's last call (root 0's last path that is not a discarded retry): the
//! system and user messages, and each assistant message as an agent step
//! whose tool results are its observation. An assistant message a call of
//! the path sampled carries that call's metrics: the exact prompt and
//! completion token ids and the sampling logprobs; one the harness sent
//! without sampling it here (a few-shot example, a rewritten history) is
//! marked `is_copied_context`. Sub-agents and compactions (other roots and
//! branches) are embedded as `subagent_trajectories`; discarded retries are
//! counted, not exported. Pure: events in, JSON out.

use super::RolloutScore;
use forgelog_dialects::hf::hf_message;
use forgelog_schemas::{CallFinished, Sequence, TrajectoryBuilt};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

pub const SCHEMA_VERSION: &str = "ATIF-v1.7";

/// One rollout's ATIF document: (its file name under the export, the document).
pub fn trajectories(
    trajectories: &[TrajectoryBuilt],
    calls: &[CallFinished],
    scores: &BTreeMap<String, RolloutScore>,
) -> Vec<(String, Value)> {
    let by_call: BTreeMap<(&str, i64), &CallFinished> = calls
        .iter()
        .map(|c| ((c.session_id.as_str(), c.call_index), c))
        .collect();
    let mut out = Vec::new();
    for t in trajectories {
        let live: Vec<(usize, &Sequence)> = t
            .sequences
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.discarded)
            .collect();
        // The main path: the first root's last live path (a later branch
        // supersedes an earlier one). A tree of discarded retries only has none.
        let Some(root) = live.first().map(|(_, s)| s.root) else {
            continue;
        };
        let Some(&(main, _)) = live.iter().rfind(|(_, s)| s.root == root) else {
            continue;
        };
        let calls_of = |s: &Sequence| -> Vec<&CallFinished> {
            s.call_indices
                .iter()
                .filter_map(|i| by_call.get(&(t.session_id.as_str(), *i)).copied())
                .collect()
        };
        let score = scores.get(&t.rollout_id).copied().unwrap_or_default();
        let all: Vec<&CallFinished> = calls
            .iter()
            .filter(|c| c.session_id == t.session_id)
            .collect();
        let mut doc = path_document(t, main, &calls_of(&t.sequences[main]), &all);
        let subagents: Vec<Value> = live
            .iter()
            .filter(|(i, _)| *i != main)
            .map(|&(i, s)| {
                let mut sub = path_document(t, i, &calls_of(s), &all);
                sub["trajectory_id"] = json!(format!("{}#path{i}", t.rollout_id));
                sub
            })
            .collect();
        if !subagents.is_empty() {
            doc["subagent_trajectories"] = Value::Array(subagents);
        }
        doc["trajectory_id"] = json!(t.rollout_id);
        let extra = doc["extra"].as_object_mut().expect("extra is an object");
        extra.insert("run_id".into(), json!(t.run_id));
        extra.insert("task_id".into(), json!(t.task_id));
        extra.insert("group_id".into(), json!(t.group_id));
        extra.insert("rollout_id".into(), json!(t.rollout_id));
        extra.insert("reward".into(), json!(score.reward));
        extra.insert("advantage".into(), json!(score.advantage));
        extra.insert(
            "discarded_paths".into(),
            json!(t.sequences.len() - live.len()),
        );
        let file = format!("{}/{}.json", t.harness, t.rollout_id);
        out.push((file, doc));
    }
    out
}

/// A step's text: a string content, the text parts of a list, or nothing.
fn text_of(message: &Value) -> String {
    match hf_message(message).get("content") {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    }
}

fn request_messages(c: &CallFinished) -> Vec<Value> {
    c.chat_view().map(|v| v.messages).unwrap_or_default()
}

/// ATIF's tool call: arguments must be an object (a string that is not one
/// is kept under `raw`).
fn tool_calls(message: &Value) -> Option<Value> {
    let calls = hf_message(message).get("tool_calls")?.as_array()?.clone();
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let arguments = match c.pointer("/function/arguments") {
                Some(Value::Object(o)) => Value::Object(o.clone()),
                Some(Value::String(s)) => json!({ "raw": s }),
                Some(Value::Null) | None => json!({}),
                Some(other) => json!({ "raw": other }),
            };
            json!({
                "tool_call_id": c.get("id").and_then(Value::as_str).map_or_else(|| format!("call-{i}"), String::from),
                "function_name": c.pointer("/function/name").and_then(Value::as_str).unwrap_or(""),
                "arguments": arguments,
            })
        })
        .collect();
    (!calls.is_empty()).then_some(Value::Array(calls))
}

/// One path as an ATIF trajectory: the steps of its last call's conversation.
/// `session` has every call of the rollout: an assistant message another path
/// sampled is context here, and says which call sampled it.
fn path_document(
    t: &TrajectoryBuilt,
    path: usize,
    calls: &[&CallFinished],
    session: &[&CallFinished],
) -> Value {
    let last = calls.last();
    let mut conversation = last.map(|c| request_messages(c)).unwrap_or_default();
    if let Some(answer) = last.and_then(|c| serde_json::from_str::<Value>(&c.chat_response).ok()) {
        if answer.is_object() {
            conversation.push(answer);
        }
    }
    // Call j's answer sits right after the messages it was sent.
    let sampled_at: BTreeMap<usize, &CallFinished> = calls
        .iter()
        .map(|c| (request_messages(c).len(), *c))
        .collect();

    let mut steps = steps_of(&conversation, &sampled_at, session);
    // Calls recorded without a chat view (an unknown dialect): their turns
    // as agent steps with the tokens and no text.
    if steps.is_empty() {
        for c in calls {
            let mut step = json!({ "step_id": steps.len() + 1, "source": "agent", "message": "" });
            sampled_by(&mut step, c);
            steps.push(step);
        }
    }
    let agent = agent_of(t, last.copied());
    let s = &t.sequences[path];
    json!({
        "schema_version": SCHEMA_VERSION,
        "session_id": t.session_id,
        "agent": agent,
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": calls.iter().map(|c| c.prompt_token_ids.len()).sum::<usize>(),
            "total_completion_tokens": calls.iter().map(|c| c.completion_token_ids.len()).sum::<usize>(),
            "total_steps": steps.len(),
        },
        "extra": {
            "path_index": path,
            "root": s.root,
            "call_indices": s.call_indices,
            "recorded_by": format!("forgelog {}", env!("CARGO_PKG_VERSION")),
        },
    })
}

/// The conversation as ATIF steps: each assistant message an agent step
/// (with the call that sampled it, or marked as copied context), each tool
/// result the observation of the agent step before it, the rest system or
/// user steps.
fn steps_of(
    conversation: &[Value],
    sampled_at: &BTreeMap<usize, &CallFinished>,
    session: &[&CallFinished],
) -> Vec<Value> {
    let mut steps: Vec<Value> = Vec::new();
    for (at, message) in conversation.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        let id = steps.len() + 1;
        match role {
            "assistant" => {
                let mut step = json!({
                    "step_id": id,
                    "source": "agent",
                    "message": text_of(message),
                });
                if let Some(calls) = tool_calls(message) {
                    step["tool_calls"] = calls;
                }
                match sampled_at.get(&at) {
                    Some(c) => sampled_by(&mut step, c),
                    None => {
                        step["is_copied_context"] = json!(true);
                        let answer = |c: &&&CallFinished| {
                            serde_json::from_str::<Value>(&c.chat_response)
                                .is_ok_and(|a| text_of(&a) == text_of(message))
                        };
                        if let Some(c) = session
                            .iter()
                            .filter(|c| request_messages(c).len() == at)
                            .find(answer)
                        {
                            step["extra"] = json!({ "sampled_by_call": c.call_index });
                        }
                    }
                }
                steps.push(step);
            }
            "tool" if steps.last().is_some_and(|s| s["source"] == "agent") => {
                // A tool result is the observation of the agent step before it;
                // one answering no call of that step is kept without a link.
                let step = steps.last_mut().expect("checked");
                let id = message.get("tool_call_id").and_then(Value::as_str);
                let known = step["tool_calls"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["tool_call_id"].as_str() == id));
                let mut result = json!({ "content": text_of(message) });
                if known {
                    result["source_call_id"] = json!(id);
                }
                if step.get("observation").is_none() {
                    step["observation"] = json!({ "results": [] });
                }
                step["observation"]["results"]
                    .as_array_mut()
                    .expect("results")
                    .push(result);
            }
            _ => {
                let source = if role == "system" || role == "developer" {
                    "system"
                } else {
                    "user"
                };
                let mut step = json!({
                    "step_id": id,
                    "source": source,
                    "message": text_of(message),
                });
                if role != source {
                    step["extra"] = json!({ "role": role });
                }
                steps.push(step);
            }
        }
    }
    steps
}

/// The harness and the model, as ATIF's `agent`.
fn agent_of(t: &TrajectoryBuilt, last: Option<&CallFinished>) -> Map<String, Value> {
    let mut agent = Map::new();
    agent.insert("name".into(), json!(t.harness));
    // The log does not record the harness's own version.
    agent.insert("version".into(), json!("unknown"));
    if let Some(c) = last {
        agent.insert("model_name".into(), json!(c.model));
    }
    if let Some(tools) = last
        .and_then(|c| c.chat_view())
        .map(|v| v.tools)
        .filter(|t| !t.is_empty())
    {
        agent.insert("tool_definitions".into(), Value::Array(tools));
    }
    agent
}

/// What call `c` sampled, on the agent step that shows its answer.
fn sampled_by(step: &mut Value, c: &CallFinished) {
    step["model_name"] = json!(c.model);
    step["timestamp"] = json!(iso8601(c.finished_at_ms));
    step["llm_call_count"] = json!(1);
    step["metrics"] = json!({
        "prompt_tokens": c.prompt_token_ids.len(),
        "completion_tokens": c.completion_token_ids.len(),
        "prompt_token_ids": c.prompt_token_ids,
        "completion_token_ids": c.completion_token_ids,
        "logprobs": c.completion_logprobs,
        "extra": {
            "call_index": c.call_index,
            "policy_version": c.policy_version,
            "finish_reason": c.finish_reason,
            "trainable": c.trainable,
        },
    });
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn iso8601(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    use forgelog_consumers_core::rebuild::rebuild;
    use forgelog_schemas::{Event, Topic};

    fn recorded() -> (Vec<TrajectoryBuilt>, Vec<CallFinished>) {
        let inputs = forgelog_schemas::testing::recorded_run("r", 2, 4, 3, 8);
        let mut by_topic: BTreeMap<Topic, Vec<Event>> = BTreeMap::new();
        for e in &inputs {
            by_topic.entry(e.topic()).or_default().push(e.clone());
        }
        let derived = rebuild(&by_topic, Default::default());
        let trees = derived
            .trajectories
            .into_iter()
            .filter_map(|e| match e {
                Event::TrajectoryBuilt(t) => Some(t),
                _ => None,
            })
            .collect();
        let calls = inputs
            .into_iter()
            .filter_map(|e| match e {
                Event::CallFinished(c) => Some(c),
                _ => None,
            })
            .collect();
        (trees, calls)
    }

    #[test]
    fn every_rollout_is_one_document_with_steps_numbered_from_one() {
        let (trees, calls) = recorded();
        let docs = trajectories(&trees, &calls, &BTreeMap::new());
        assert_eq!(docs.len(), trees.len());
        for ((name, doc), t) in docs.iter().zip(&trees) {
            assert_eq!(name, &format!("{}/{}.json", t.harness, t.rollout_id));
            let steps = doc["steps"].as_array().unwrap();
            let ids: Vec<u64> = steps
                .iter()
                .map(|s| s["step_id"].as_u64().unwrap())
                .collect();
            assert_eq!(ids, (1..=steps.len() as u64).collect::<Vec<_>>());
            assert_eq!(doc["final_metrics"]["total_steps"], steps.len());
            // Retried sessions keep their discarded attempt out, and say so.
            let discarded = t.sequences.iter().filter(|s| s.discarded).count();
            assert_eq!(doc["extra"]["discarded_paths"], discarded);
        }
    }

    #[test]
    fn a_tree_of_discarded_retries_only_has_no_document() {
        let (mut trees, calls) = recorded();
        trees.truncate(1);
        trees[0]
            .sequences
            .iter_mut()
            .for_each(|s| s.discarded = true);
        assert!(trajectories(&trees, &calls, &BTreeMap::new()).is_empty());
        trees[0].sequences.clear();
        assert!(trajectories(&trees, &calls, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn timestamps_are_iso8601_utc() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(iso8601(1_796_102_989_315), "2026-12-01T05:29:49.315Z");
        assert_eq!(iso8601(-1), "1969-12-31T23:59:59.999Z");
    }
}
