//! The kit's real harnesses (eleven agent CLIs, and agents of ours on the OpenAI Agents SDK and the
//! Claude Agent SDK),
//! installed by `deploy/harnesses/install.sh` and run unmodified by
//! `deploy/harnesses/run.sh` in a network namespace whose only way out is the
//! proxy: each runs once through `forgelog proxy` (in front of the fake
//! vLLM-compatible upstream, playing an agent that never stops calling its
//! shell tool) with a budget of 6 model calls. Each must exit 0 after the
//! budget stop; the log must hold every call with its token ids and logprobs;
//! the trajectory core must build each harness's tree; and the calls the
//! harness itself reports must match what the proxy recorded.

mod support;

use forgelog_consumers::{Processor, TrajectoryBuilder};
use forgelog_producers::fake_upstream;
use forgelog_schemas::compact::expand_events;
use forgelog_schemas::{CallFinished, CallStatus, Event, TrajectoryBuilt};
use serde_json::Value;
use std::path::Path;
use support::kit::{harnesses, require_installed, volume_of, KitProxy, TASK, TEXT_ONLY};
use support::sandboxes::assert_tool_results_hold_their_output;

const BUDGET: usize = 6;

/// What a harness's own transcript says of its run.
#[derive(Debug, Clone, Copy)]
struct Reported {
    /// Model calls of the main agent.
    calls: usize,
    /// Sub-agents it started.
    sub_agents: usize,
}

/// The harness's own account, where it writes a transcript.
fn reported(harness: &str, out: &Path) -> Option<Reported> {
    let stdout = std::fs::read_to_string(out.join("stdout")).unwrap_or_default();
    let count = |v: &Value| v.as_u64().map(|n| n as usize);
    // A transcript of JSON lines: every line that parses, and how many are `kind`.
    let events: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let events_where = |kind: &dyn Fn(&Value) -> bool| events.iter().filter(|e| kind(e)).count();
    // An SDK agent's one JSON line, its last.
    let agent_line = || -> Value {
        serde_json::from_str(stdout.lines().last().unwrap_or_default())
            .expect("the agent prints one JSON line")
    };
    let main_calls = |calls| {
        Some(Reported {
            calls,
            sub_agents: 0,
        })
    };
    match harness {
        // --output-format json: one result object; num_turns counts the main
        // agent's model turns, subagent_stats the sub-agents.
        "claude-code" => {
            let v: Value = serde_json::from_str(&stdout).expect("claude -p prints JSON");
            assert_eq!(v["is_error"], false, "{v}");
            Some(Reported {
                calls: count(&v["num_turns"])?,
                sub_agents: count(&v["subagent_stats"]["spawned"]).unwrap_or(0),
            })
        }
        // --format json events: a step_start per model call of the main session;
        // a `task` tool use per sub-agent.
        "opencode" => Some(Reported {
            calls: events_where(&|e| e["type"] == "step_start"),
            sub_agents: events_where(&|e| e["type"] == "tool_use" && e["part"]["tool"] == "task"),
        }),
        // --json events: every answer of this upstream carries text, one agent_message each.
        "codex" => main_calls(events_where(&|e| {
            e["type"] == "item.completed" && e["item"]["type"] == "agent_message"
        })),
        // The trajectory file counts API calls (format-error retries included).
        "mini-swe-agent" => {
            let t: Value = serde_json::from_str(
                &std::fs::read_to_string(out.join("trajectory.json")).unwrap(),
            )
            .unwrap();
            main_calls(count(&t["info"]["model_stats"]["api_calls"])?)
        }
        "qwen-code" => {
            // One JSON array of messages, the last the result with per-source stats.
            let events: Vec<Value> =
                serde_json::from_str(&stdout).expect("qwen -o json prints JSON");
            let result = events.last()?;
            assert_eq!(result["is_error"], false, "{result}");
            let models = result["stats"]["models"].as_object()?;
            Some(Reported {
                calls: models
                    .values()
                    .filter_map(|m| count(&m["bySource"]["main"]["api"]["totalRequests"]))
                    .sum(),
                sub_agents: events
                    .iter()
                    .filter(|e| e["type"] == "assistant" && e["parent_tool_use_id"].is_null())
                    .flat_map(|e| {
                        e["message"]["content"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                    })
                    .filter(|c| c["type"] == "tool_use" && c["name"] == "agent")
                    .count(),
            })
        }
        "gemini-cli" => {
            let v: Value = serde_json::from_str(&stdout).expect("gemini -o json prints JSON");
            let models = v["stats"]["models"].as_object()?;
            main_calls(
                models
                    .values()
                    .filter_map(|m| count(&m["roles"]["main"]["totalRequests"]))
                    .sum(),
            )
        }
        // One turn per model call (`--mode json` events).
        "pi" => main_calls(events_where(&|e| e["type"] == "turn_start")),
        // A "Tokens: N sent, M received." line per model call.
        "aider" => main_calls(stdout.lines().filter(|l| l.starts_with("Tokens: ")).count()),
        // Its saved session (copied out by the launch script): one assistant
        // message per model call in `history`, tool results on the message.
        "continue-cli" => {
            let dir = out.join("continue-sessions");
            let session = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|e| e.unwrap().path())
                .find(|p| p.file_name().is_some_and(|n| n != "sessions.json"))
                .expect("a saved session");
            let v: Value =
                serde_json::from_str(&std::fs::read_to_string(session).unwrap()).unwrap();
            main_calls(
                v["history"]
                    .as_array()?
                    .iter()
                    .filter(|h| h["message"]["role"] == "assistant")
                    .count(),
            )
        }
        // Its one JSON line: the SDK's result, the main agent's turns.
        "claude-agent-sdk" => {
            let v = agent_line();
            assert_eq!(v["is_error"], false, "{v}");
            main_calls(count(&v["num_turns"])?)
        }
        // --json events: an iteration per model call of its agent.
        "cline" => main_calls(events_where(&|e| {
            e["type"] == "agent_event" && e["event"]["type"] == "iteration_start"
        })),
        // Every message as a JSON line: one assistant message per model call.
        "grok-cli" => main_calls(events_where(&|m| m["role"] == "assistant")),
        // Its one JSON line: the model requests the agent made.
        "pydantic-ai" => main_calls(count(&agent_line()["model_requests"])?),
        // Every message as a JSON line: one assistant message per model call
        // of the conversation (its title call is not one).
        "gptme" => main_calls(events_where(&|m| {
            m["type"] == "message" && m["role"] == "assistant"
        })),
        // Its one JSON line: the model calls the SDK's runner made (ADK's:
        // its before-model callback's count).
        "openai-agents" | "google-adk" => main_calls(count(&agent_line()["model_calls"])?),
        _ => None,
    }
}

#[test]
fn the_kits_real_harnesses_run_through_the_proxy_within_a_call_budget() {
    require_installed();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = KitProxy::start(&rt, "harnesses");
    let outs = tempfile::tempdir().unwrap();
    let mut transcripts = std::collections::BTreeMap::new();
    for h in harnesses() {
        let out = outs.path().join(h);
        let status = proxy.run_harness(&rt, h, BUDGET as u32, TASK, &out);
        let stderr = std::fs::read_to_string(out.join("stderr")).unwrap_or_default();
        let tail = &stderr[stderr.len().saturating_sub(3000)..];
        assert!(
            status.success(),
            "{h} exited {status}; its stderr ends:\n{tail}"
        );
        transcripts.insert(h, reported(h, &out));
    }
    let answers = proxy.fake.answers.lock().unwrap().clone();
    let mut events = proxy.stop();
    // As stored, each session's calls are what is new in them (schema v5).
    for h in harnesses() {
        let v = volume_of(&events, h);
        eprintln!("{h}: {v}");
        // The target: at most 2× the final transcript (5–6× stored whole).
        // A single exchange has nothing earlier to be stored relative to.
        let compacts = TEXT_ONLY.contains(&h) || v.whole_ratio() > 3.0;
        assert!(v.ratio() <= 2.0 && compacts, "{h}: {v}");
    }
    let errors = expand_events(&mut events);
    assert!(errors.is_empty(), "{errors:?}");
    assert_tool_results_hold_their_output(&events);
    let mut trajectories = TrajectoryBuilder::default();
    let mut built = Vec::new();
    for e in events.iter().cloned() {
        trajectories.process(e, &mut built);
    }
    for h in harnesses() {
        let started = events
            .iter()
            .filter(|e| matches!(e, Event::CallStarted(s) if s.rollout_id == h))
            .count();
        let calls: Vec<&CallFinished> = events
            .iter()
            .filter_map(|e| match e {
                Event::CallFinished(c) if c.rollout_id == h => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(
            started,
            calls.len(),
            "{h}: every call started also finished"
        );
        let (ok, stops): (Vec<&CallFinished>, Vec<&CallFinished>) =
            calls.iter().partition(|c| c.status == CallStatus::Ok);
        let text_only = TEXT_ONLY.contains(&h);
        if text_only {
            assert!(
                !ok.is_empty() && stops.is_empty(),
                "{h}: {} calls",
                calls.len()
            );
        } else {
            assert_eq!(
                ok.len(),
                BUDGET,
                "{h}: the budget's calls all reached the upstream"
            );
            assert!(!stops.is_empty(), "{h}: ended by the budget stop");
        }
        for c in &stops {
            assert_eq!(
                c.status,
                CallStatus::BudgetStop,
                "{h} call {}: {:?}",
                c.call_index,
                c.error
            );
            assert!(!c.trainable);
            assert_eq!(c.untrainable_reason.as_deref(), Some("budget exhausted"));
            assert!(
                c.call_index >= BUDGET as i64,
                "budget stops come after the budget"
            );
        }
        for c in &ok {
            assert!(!c.prompt_token_ids.is_empty() && !c.completion_token_ids.is_empty());
        }
        // Trainable, with exactly the ids and logprobs the upstream answered.
        let ok_calls: Vec<CallFinished> = ok.iter().map(|c| (*c).clone()).collect();
        fake_upstream::assert_calls_match(&ok_calls, &answers, fake_upstream::POLICY_VERSION);
        let tree: &TrajectoryBuilt = built
            .iter()
            .find_map(|e| match e {
                Event::TrajectoryBuilt(t) if t.rollout_id == h => Some(t),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{h}: no trajectory built"));
        assert_eq!(tree.calls, calls.len() as i64, "{h}");
        let roots: std::collections::BTreeSet<i64> =
            tree.sequences.iter().map(|s| s.root).collect();
        eprintln!(
            "{h}: {} calls, {} sequences, {} roots, {} tool calls, findings {:?}",
            tree.calls,
            tree.sequences.len(),
            roots.len(),
            tree.tool_calls,
            tree.findings.iter().map(|f| f.kind).collect::<Vec<_>>()
        );
        // Every sampled token of every trainable call is on a path, with its logprob.
        for c in &ok {
            let on = tree
                .sequences
                .iter()
                .find(|s| s.call_indices.contains(&c.call_index))
                .unwrap_or_else(|| panic!("{h}: call {} is on no path", c.call_index));
            assert!(!on.discarded, "{h}: call {} was discarded", c.call_index);
        }
        for s in &tree.sequences {
            let sampled: usize = s.loss_mask.iter().map(|&m| m as usize).sum();
            let expected: usize = ok
                .iter()
                .filter(|c| s.call_indices.contains(&c.call_index))
                .map(|c| c.completion_token_ids.len())
                .sum();
            assert_eq!(
                sampled, expected,
                "{h}: sampled tokens of path {:?}",
                s.call_indices
            );
        }
        assert!(
            tree.tool_calls >= 1 || text_only,
            "{h}: the agent's tool calls are counted"
        );
        // The harness's own count: the main agent's calls are those on the root
        // with the most calls, and the budget stops; sub-agents' and auxiliary
        // calls (OpenCode's title) are on roots of their own.
        if let Some(said) = transcripts[h] {
            let root_of = |i: i64| {
                tree.sequences
                    .iter()
                    .find(|s| s.call_indices.contains(&i))
                    .map(|s| s.root)
            };
            let main = roots
                .iter()
                .copied()
                .max_by_key(|r| {
                    ok.iter()
                        .filter(|c| root_of(c.call_index) == Some(*r))
                        .count()
                })
                .expect("a root");
            let off_main_calls = ok
                .iter()
                .filter(|c| root_of(c.call_index) != Some(main))
                .count();
            assert_eq!(
                said.calls,
                calls.len() - off_main_calls,
                "{h} reports {said:?}; the proxy recorded {} calls, {off_main_calls} of them off the main root",
                calls.len()
            );
            assert!(
                roots.len() > said.sub_agents,
                "{h}: {} sub-agents, {} roots",
                said.sub_agents,
                roots.len()
            );
            assert!(
                said.sub_agents == 0 || off_main_calls > 0,
                "{h}: {said:?}, yet every call is on the main root"
            );
        }
    }
}
