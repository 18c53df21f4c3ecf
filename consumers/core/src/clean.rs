//! The CLEAN rate of a run: of the follow-up calls (a call whose prompt goes
//! on from an earlier call's whole prompt), the share whose prompt holds that
//! call's prompt *and* the tokens it sampled, exactly. Below 1 the history
//! was re-tokenized somewhere (drift): those turns train as separate
//! fragments. Read from the recorded ids alone, whoever made the prompts.
//!
//! A harness's side calls (aux: OpenCode's title call, a summary) are told
//! apart from its conversation here, from the whole session: such a call
//! offers no tools while the session's other calls do, and opens with a
//! system message none of them has. It may come first (OpenCode asks for a
//! title beside its first turn), so the proxy, seeing one call at a time,
//! cannot tell; the session's events can.

use forgelog_schemas::compact::expand_finished;
use forgelog_schemas::{CallFinished, CallStatus, Event};
use std::collections::{BTreeMap, BTreeSet};

/// Follow-up calls and the clean ones among them, and the side calls beside
/// the conversations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CleanRate {
    pub follow_ups: usize,
    pub clean: usize,
    pub aux: usize,
}

/// What a call's request (its recorded OpenAI Chat form) offers and opens with.
fn tools_and_system(call: &CallFinished) -> (bool, Option<String>) {
    let request: serde_json::Value = serde_json::from_str(&call.chat_request).unwrap_or_default();
    let tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
    let first = &request["messages"][0];
    let system = (first["role"] == "system").then(|| first["content"].to_string());
    (tools, system)
}

/// The call indexes of a session's side calls (aux): answered, no tools
/// offered where the session's other calls offer some, and a system message
/// none of those opens with. A call refused before it was asked (past the
/// session's call budget, say) records no request: never a side call.
pub fn aux_calls(calls: &[CallFinished]) -> BTreeSet<i64> {
    let shapes: Vec<(i64, bool, Option<String>)> = calls
        .iter()
        .filter(|c| c.status == CallStatus::Ok)
        .map(|c| {
            let (tools, system) = tools_and_system(c);
            (c.call_index, tools, system)
        })
        .collect();
    let main_systems: BTreeSet<&Option<String>> = shapes
        .iter()
        .filter(|(_, tools, _)| *tools)
        .map(|(_, _, system)| system)
        .collect();
    if main_systems.is_empty() {
        return BTreeSet::new(); // a conversation without tools: all of it main
    }
    shapes
        .iter()
        .filter(|(_, tools, system)| !tools && !main_systems.contains(system))
        .map(|(index, _, _)| *index)
        .collect()
}

impl CleanRate {
    pub fn rate(&self) -> Option<f64> {
        (self.follow_ups > 0).then(|| self.clean as f64 / self.follow_ups as f64)
    }
}

/// The CLEAN rate per harness of one run's events (any order).
pub fn clean_rates(events: &[Event]) -> BTreeMap<String, CleanRate> {
    let mut harness_of: BTreeMap<&str, &str> = BTreeMap::new();
    let mut sessions: BTreeMap<&str, Vec<CallFinished>> = BTreeMap::new();
    for e in events {
        match e {
            Event::RolloutStarted(s) => {
                harness_of.insert(&s.rollout_id, &s.harness);
            }
            Event::CallFinished(c) => sessions.entry(&c.session_id).or_default().push(c.clone()),
            _ => {}
        }
    }
    let mut rates: BTreeMap<String, CleanRate> = BTreeMap::new();
    for calls in sessions.values_mut() {
        // Calls stored as splices of earlier ones are made whole; one whose
        // base is missing stays empty and counts for nothing.
        expand_finished(calls);
        calls.sort_by_key(|c| c.call_index);
        calls.dedup_by_key(|c| c.call_index);
        let harness = harness_of
            .get(calls[0].rollout_id.as_str())
            .copied()
            .unwrap_or_default();
        let rate = rates.entry(harness.to_string()).or_default();
        let aux = aux_calls(calls);
        rate.aux += aux.len();
        let answered: Vec<&CallFinished> = calls
            .iter()
            .filter(|c| c.status == CallStatus::Ok && !c.prompt_token_ids.is_empty())
            .filter(|c| !aux.contains(&c.call_index))
            .collect();
        for (k, call) in answered.iter().enumerate() {
            let prompt = &call.prompt_token_ids;
            // The earlier call it goes on from: the longest whole prompt it starts with.
            let base = answered[..k]
                .iter()
                .filter(|b| {
                    prompt.len() > b.prompt_token_ids.len()
                        && prompt.starts_with(&b.prompt_token_ids)
                })
                .max_by_key(|b| b.prompt_token_ids.len());
            if let Some(base) = base {
                rate.follow_ups += 1;
                let sampled = &prompt[base.prompt_token_ids.len()..];
                rate.clean += usize::from(sampled.starts_with(&base.completion_token_ids));
            }
        }
    }
    rates
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_schemas::testing::call_finished;

    fn call(index: i64, prompt: &[u32], completion: &[u32]) -> Event {
        let mut c = call_finished("run", "s", index, 0, 0);
        c.prompt_token_ids = prompt.to_vec();
        c.completion_token_ids = completion.to_vec();
        c.completion_logprobs = vec![-0.5; completion.len()];
        c.into()
    }

    #[test]
    fn follow_ups_are_clean_when_they_hold_the_sampled_ids() {
        let events = vec![
            call(0, &[1, 2], &[3, 4]),
            // Goes on from call 0 with its sampled ids: clean.
            call(1, &[1, 2, 3, 4, 5], &[6]),
            // Goes on from call 1 with its sampled id re-tokenized: drift.
            call(2, &[1, 2, 3, 4, 5, 7, 8], &[9]),
            // A title call with another prompt: no follow-up.
            call(3, &[10], &[11]),
            // A retry of call 0's prompt: no follow-up either.
            call(4, &[1, 2], &[3]),
        ];
        let rates = clean_rates(&events);
        assert_eq!(
            rates[""],
            CleanRate {
                follow_ups: 2,
                clean: 1,
                aux: 0
            }
        );
        assert_eq!(rates[""].rate(), Some(0.5));
        assert_eq!(clean_rates(&events[..1])[""].rate(), None);
    }

    fn asking(index: i64, system: &str, tools: bool) -> CallFinished {
        let mut c = call_finished("run", "s", index, 0, 0);
        let tools = if tools {
            serde_json::json!([{"type": "function", "function": {"name": "bash"}}])
        } else {
            serde_json::json!([])
        };
        c.chat_request = serde_json::json!({
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "go"}],
            "tools": tools,
        })
        .to_string();
        c
    }

    #[test]
    fn a_toolless_call_with_its_own_system_prompt_beside_a_tool_using_session_is_aux() {
        // The title call first, as OpenCode makes it.
        let calls = [
            asking(0, "You are a title generator.", false),
            asking(1, "You are opencode.", true),
            asking(2, "You are opencode.", true),
            // The conversation's own last turn may offer no tools: still main.
            asking(3, "You are opencode.", false),
        ];
        assert_eq!(aux_calls(&calls), BTreeSet::from([0]));
        // Calls refused past the budget record no request: not side calls.
        let mut refused = asking(4, "", false);
        refused.status = CallStatus::BudgetStop;
        refused.chat_request.clear();
        let with_refused = [calls.as_slice(), &[refused]].concat();
        assert_eq!(aux_calls(&with_refused), BTreeSet::from([0]));
        // Without tools anywhere, nothing stands out: all main.
        let plain = [asking(0, "A", false), asking(1, "B", false)];
        assert!(aux_calls(&plain).is_empty());
        let events: Vec<Event> = calls.iter().cloned().map(Event::from).collect();
        assert_eq!(clean_rates(&events)[""].aux, 1);
    }
}
