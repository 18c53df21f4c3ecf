//! The run read back from the log: trees and groups as the consumers build
//! them, each rollout's verdict, and what a clean run's paths look like.

use crate::support::sandboxes::{finished_calls, side_calls};
use forgelog_consumers::{Processor, RewardJoin, TrajectoryBuilder};
use forgelog_schemas::{Event, TrainingBatch, VerifierResult};
use std::collections::BTreeMap;

/// Trees, then GRPO groups, from the run's events, as the consumers build them.
pub fn derive(events: &[Event]) -> (Vec<Event>, Vec<TrainingBatch>) {
    let mut trees = Vec::new();
    let mut builder = TrajectoryBuilder::default();
    for e in events.iter().cloned() {
        builder.process(e, &mut trees);
    }
    let mut join = RewardJoin::new(Default::default());
    let mut batches = Vec::new();
    let inputs = events
        .iter()
        .filter(|e| !matches!(e, Event::CallFinished(_) | Event::CallStarted(_)));
    for e in inputs.cloned().chain(trees.iter().cloned()) {
        join.process(e, &mut batches);
    }
    let batches = batches
        .into_iter()
        .map(|e| match e {
            Event::TrainingBatch(b) => b,
            other => panic!("{other:?}"),
        })
        .collect();
    (trees, batches)
}

/// Token in, per harness: every follow-up call that extends its rollout's
/// history is spliced onto the ids the model sampled (CLEAN >= 99%), and a
/// rollout without sub-agents is one path: one root, one sequence, every
/// call on it. Prints the table (calls, follow-ups, clean, rendered and why).
pub fn assert_one_clean_path_per_rollout(events: &[Event], trees: &[Event]) {
    let rates = forgelog_consumers::core::clean::clean_rates(events);
    let harness_of: BTreeMap<&str, &str> = events
        .iter()
        .filter_map(|e| match e {
            Event::RolloutStarted(r) => Some((r.rollout_id.as_str(), r.harness.as_str())),
            _ => None,
        })
        .collect();
    let mut rendered: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    let mut calls: BTreeMap<&str, usize> = BTreeMap::new();
    for c in finished_calls(events).iter().filter(|c| c.trainable) {
        let h = harness_of[c.rollout_id.as_str()];
        *calls.entry(h).or_default() += 1;
        let made = c.prompt_made.as_ref().unwrap_or_else(|| {
            panic!(
                "{}: call {} was not made by the proxy",
                c.rollout_id, c.call_index
            )
        });
        if let Some(why) = &made.why_rendered {
            // The reason's kind, not the call numbers in it.
            let kind: String = why.chars().filter(|c| !c.is_ascii_digit()).collect();
            *rendered.entry(h).or_default().entry(kind).or_default() += 1;
        }
    }
    eprintln!("| harness | calls | follow-ups | clean | aux | rendered afresh (why) |");
    for (h, n) in &calls {
        let rate = rates[*h];
        eprintln!(
            "| {h} | {n} | {} | {} | {} | {:?} |",
            rate.follow_ups,
            rate.clean,
            rate.aux,
            rendered.get(h).cloned().unwrap_or_default()
        );
        // aider gives the model no tools: one exchange, nothing to follow up.
        assert!(
            rate.follow_ups > 0 || *h == "aider",
            "{h}: no follow-up calls"
        );
        assert!(
            rate.clean * 100 >= rate.follow_ups * 99,
            "{h}: CLEAN {} of {}",
            rate.clean,
            rate.follow_ups
        );
    }
    // Side calls (OpenCode's and gptme's title calls: no tools, their own
    // system prompt, beside calls with tools); every other call is the main
    // conversation's.
    let aux = side_calls(events);
    for h in calls.keys() {
        // Only OpenCode and gptme make side calls here: a title call, one
        // per rollout.
        let rollouts = harness_of.values().filter(|x| *x == h).count();
        let expected = if ["opencode", "gptme"].contains(h) {
            rollouts
        } else {
            0
        };
        assert_eq!(rates[*h].aux, expected, "{h}: aux calls");
    }
    for t in trees {
        let Event::TrajectoryBuilt(t) = t else {
            panic!("{t:?}")
        };
        if t.calls == 0 {
            continue; // the reference solutions, the intruder
        }
        let id = &t.rollout_id;
        let main_call = |i: &i64| !aux.contains(&(id.clone(), *i));
        // Paths still standing (a retry's abandoned branch is discarded).
        let standing: Vec<&Vec<i64>> = t
            .sequences
            .iter()
            .filter(|s| !s.discarded)
            .map(|s| &s.call_indices)
            .collect();
        let main: Vec<&&Vec<i64>> = standing
            .iter()
            .filter(|p| {
                p.iter().any(main_call)
                    || !t
                        .sequences
                        .iter()
                        .any(|s| s.call_indices.iter().any(main_call))
            })
            .collect();
        assert_eq!(
            main.len(),
            1,
            "{id}: one path of the main conversation: {standing:?}"
        );
        for s in &t.sequences {
            if !std::ptr::eq(&s.call_indices, *main[0]) {
                assert!(
                    s.discarded || !s.call_indices.iter().any(main_call),
                    "{id}: a call with tools off the main path: {standing:?}"
                );
            }
        }
    }
}

pub fn verdicts(events: &[Event]) -> BTreeMap<String, VerifierResult> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::VerifierResult(v) => Some((v.rollout_id.clone(), v.clone())),
            _ => None,
        })
        .collect()
}

pub fn status_of(v: &VerifierResult) -> String {
    let details: serde_json::Value = serde_json::from_str(&v.details).unwrap();
    details["status"].as_str().unwrap_or("?").to_string()
}

/// Attempt ids of the run's `RolloutStarted` events.
pub fn started(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::RolloutStarted(s) => Some(s.rollout_id.clone()),
            _ => None,
        })
        .collect()
}
