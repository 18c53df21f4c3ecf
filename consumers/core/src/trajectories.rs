//! `forgelog.calls` + `forgelog.rollouts` → `forgelog.trajectories`.

use crate::{Processor, RecentKeys, TrajectoryTree};
use forgelog_schemas::{
    event_id, CallFinished, Event, RolloutFinished, RolloutStarted, Topic, TrajectoryBuilt,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Collects each rollout's calls and emits its trajectory once the rollout has
/// started, finished, and every call it made (`RolloutFinished.model_calls`) has
/// arrived: whatever order the topics interleave in, the output is the same.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TrajectoryBuilder {
    /// By `run_id \t rollout_id`.
    pending: BTreeMap<String, PendingRollout>,
    emitted: RecentKeys,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct PendingRollout {
    started: Option<RolloutStarted>,
    finished: Option<RolloutFinished>,
    calls: BTreeMap<i64, CallFinished>,
}

fn rollout_key(run_id: &str, rollout_id: &str) -> String {
    format!("{run_id}\t{rollout_id}")
}

impl Processor for TrajectoryBuilder {
    const NAME: &'static str = "trajectories";
    const INPUTS: &'static [Topic] = &[Topic::Calls, Topic::Rollouts];
    const OUTPUT: Topic = Topic::Trajectories;
    /// A rollout's calls, start and finish are all keyed by its id.
    const CO_PARTITIONED: bool = true;

    fn process(&mut self, event: Event, out: &mut Vec<Event>) {
        let key = match &event {
            Event::CallFinished(e) => rollout_key(&e.run_id, &e.rollout_id),
            Event::RolloutStarted(e) => rollout_key(&e.run_id, &e.rollout_id),
            Event::RolloutFinished(e) => rollout_key(&e.run_id, &e.rollout_id),
            _ => return,
        };
        if self.emitted.contains(&key) {
            return;
        }
        let pending = self.pending.entry(key.clone()).or_default();
        match event {
            Event::CallFinished(c) => {
                pending.calls.entry(c.call_index).or_insert(c);
            }
            Event::RolloutStarted(e) => pending.started = Some(e),
            Event::RolloutFinished(e) => pending.finished = Some(e),
            _ => unreachable!("filtered above"),
        }
        let complete = match (&pending.started, &pending.finished) {
            (Some(_), Some(f)) => pending.calls.len() as i64 >= f.model_calls,
            _ => false,
        };
        if complete {
            let pending = self.pending.remove(&key).expect("present");
            self.emitted.insert(key);
            out.push(build(pending).into());
        }
    }
}

fn build(p: PendingRollout) -> TrajectoryBuilt {
    let started = p.started.expect("complete rollouts have started");
    // Calls are stored relative to earlier ones of the session (schema v5):
    // whole again here, where all of the rollout's calls are at hand. What
    // cannot be made whole is left empty and shows as a failed call.
    let mut calls: Vec<CallFinished> = p.calls.into_values().collect();
    forgelog_schemas::compact::expand_finished(&mut calls);
    let tree = TrajectoryTree::build(&calls);
    TrajectoryBuilt {
        event_id: event_id("TrajectoryBuilt", &[&started.run_id, &started.rollout_id]),
        run_id: started.run_id,
        rollout_id: started.rollout_id,
        session_id: started.session_id,
        task_id: started.task_id,
        group_id: started.group_id,
        harness: started.harness,
        calls: calls.len() as i64,
        tool_calls: tree.tool_calls(),
        sequences: tree.sequences(),
        findings: tree.findings().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_schemas::testing::recorded_run;

    fn run_all(events: impl IntoIterator<Item = Event>) -> Vec<Event> {
        let mut b = TrajectoryBuilder::default();
        let mut out = Vec::new();
        for e in events {
            b.process(e, &mut out);
        }
        out
    }

    #[test]
    fn one_trajectory_per_finished_rollout_whatever_the_interleaving() {
        let events = recorded_run("r", 3, 4, 3, 20);
        let clean = run_all(events.clone());
        assert_eq!(clean.len(), 12);
        // Rollout events before any call, calls reversed: same trajectories.
        let (rollouts, calls): (Vec<Event>, Vec<Event>) = events
            .into_iter()
            .partition(|e| e.topic() == Topic::Rollouts);
        let mut shuffled = run_all(rollouts.into_iter().chain(calls.into_iter().rev()));
        let key = |e: &Event| e.event_id().to_string();
        let mut clean_sorted = clean.clone();
        clean_sorted.sort_by_key(key);
        shuffled.sort_by_key(key);
        assert_eq!(clean_sorted, shuffled);
    }

    #[test]
    fn waits_for_every_call_the_rollout_reported() {
        let events = recorded_run("r", 1, 1, 3, 10);
        let last_call = events
            .iter()
            .rposition(|e| matches!(e, Event::CallFinished(_)))
            .unwrap();
        let mut without_last: Vec<Event> = events.clone();
        let late = without_last.remove(last_call);
        let mut b = TrajectoryBuilder::default();
        let mut out = Vec::new();
        for e in without_last {
            b.process(e, &mut out);
        }
        assert!(out.is_empty(), "emitted before all calls arrived");
        b.process(late.clone(), &mut out);
        assert_eq!(out.len(), 1);
        b.process(late, &mut out);
        assert_eq!(out.len(), 1, "a duplicate after emission is ignored");
    }

    /// A call whose event the log refused is there as its stand-in: the
    /// rollout's trajectory is built with the same paths and tokens, the
    /// stand-in's sampled tokens as context (mask 0); the report counts it.
    #[test]
    fn a_stand_in_call_is_context_in_its_rollouts_trajectory() {
        let mut events = recorded_run("r", 1, 1, 3, 10);
        let whole = run_all(events.clone());
        let mut stood_in = 0;
        for e in events.iter_mut() {
            if let Event::CallFinished(c) = e {
                if c.call_index == 2 {
                    stood_in = c.completion_token_ids.len();
                    *c = c.clone().stand_in_for("refused by the broker: too large");
                }
            }
        }
        assert!(stood_in > 0);
        let out = run_all(events.clone());
        let ([Event::TrajectoryBuilt(t)], [Event::TrajectoryBuilt(w)]) = (&out[..], &whole[..])
        else {
            panic!("one trajectory expected: {out:?}")
        };
        assert_eq!(t.sequences.len(), w.sequences.len());
        let sampled =
            |s: &forgelog_schemas::Sequence| s.loss_mask.iter().filter(|&&m| m == 1).count();
        for (s, ws) in t.sequences.iter().zip(&w.sequences) {
            assert_eq!(
                (&s.call_indices, &s.token_ids),
                (&ws.call_indices, &ws.token_ids)
            );
            let context = if s.call_indices.contains(&2) {
                stood_in
            } else {
                0
            };
            assert_eq!(sampled(s), sampled(ws) - context, "{:?}", s.call_indices);
        }
        let report = crate::report::Report::of(&events);
        assert_eq!(report.rows.iter().map(|r| r.stand_ins).sum::<i64>(), 1);
        assert!(
            report.to_string().contains("STAND-INS: 1 calls"),
            "{report}"
        );
    }
}
