//! A run as its pages show it: runs → groups → rollouts, and one rollout's
//! trajectory tree with its calls' messages and sampled tokens. Numbers are
//! formatted here so the templates stay plain.
//!
//! - [`run`]: the runs page's lines and a run's page (versions, groups, rollouts);
//! - [`rollout`]: a rollout's page (tree, calls, messages, tokens) and a path's.

mod rollout;
mod run;

pub use rollout::*;
pub use run::*;

use crate::TokenText;
use forgelog_consumers_core::report::Report;
use forgelog_consumers_core::show::spans_text;
use forgelog_dialects::hf::hf_message;
use forgelog_schemas::compact::expand_finished;
use forgelog_schemas::{
    CallFinished, CallStatus, Event, GroupMember, RolloutFinished, RolloutStarted, Sequence,
    TrajectoryBuilt, VerifierResult, UNKNOWN_POLICY_VERSION,
};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// What the log says of each rollout of a run, gathered in one pass.
#[derive(Default)]
struct Rollouts<'a> {
    started: BTreeMap<&'a str, &'a RolloutStarted>,
    finished: BTreeMap<&'a str, &'a RolloutFinished>,
    verdicts: BTreeMap<&'a str, &'a VerifierResult>,
    trees: BTreeMap<&'a str, &'a TrajectoryBuilt>,
    members: BTreeMap<&'a str, &'a GroupMember>,
    /// Group → no reward variance, from its latest batch.
    flat_groups: BTreeMap<&'a str, bool>,
    /// Rollout → (first call index, its version).
    first_call: BTreeMap<&'a str, (i64, Option<i64>)>,
    calls: BTreeMap<&'a str, usize>,
    /// Rollouts in the order the log first names them.
    order: Vec<&'a str>,
    published: usize,
}

impl<'a> Rollouts<'a> {
    fn of(events: &'a [Event]) -> Rollouts<'a> {
        let mut r = Rollouts::default();
        let mut seen = BTreeSet::new();
        let mut name = |id: &'a str, order: &mut Vec<&'a str>| {
            if seen.insert(id) {
                order.push(id);
            }
        };
        for e in events {
            match e {
                Event::RolloutStarted(s) => {
                    name(&s.rollout_id, &mut r.order);
                    r.started.insert(&s.rollout_id, s);
                }
                Event::RolloutFinished(f) => {
                    name(&f.rollout_id, &mut r.order);
                    r.finished.insert(&f.rollout_id, f);
                }
                Event::VerifierResult(v) => {
                    r.verdicts.insert(&v.rollout_id, v);
                }
                Event::TrajectoryBuilt(t) => {
                    name(&t.rollout_id, &mut r.order);
                    r.trees.insert(&t.rollout_id, t);
                }
                Event::TrainingBatch(b) => {
                    r.flat_groups.insert(&b.group_id, b.no_reward_variance);
                    for m in &b.members {
                        r.members.insert(&m.rollout_id, m);
                    }
                }
                Event::CallFinished(c) => {
                    name(&c.rollout_id, &mut r.order);
                    *r.calls.entry(&c.rollout_id).or_default() += 1;
                    let first = r
                        .first_call
                        .entry(&c.rollout_id)
                        .or_insert((i64::MAX, None));
                    if c.call_index < first.0 {
                        *first = (c.call_index, c.policy_version);
                    }
                }
                Event::PolicyPublished(_) => r.published += 1,
                Event::CallStarted(_) | Event::DeadLetter(_) => {}
            }
        }
        r
    }

    fn row(&self, id: &str) -> RolloutRow {
        let started = self.started.get(id);
        let finished = self.finished.get(id);
        let tree = self.trees.get(id);
        let member = self.members.get(id);
        let verdict = self.verdicts.get(id);
        let reward = member
            .and_then(|m| m.reward)
            .or_else(|| verdict.and_then(|v| v.reward));
        let status = match (reward, verdict, finished) {
            (Some(_), _, _) => "scored".to_string(),
            (None, Some(v), _) if v.abandoned => format!("abandoned: {}", v.details),
            (None, Some(v), _) if !v.ok => format!("verifier failed: {}", v.details),
            (None, Some(v), _) => format!("no reward: {}", v.details),
            (None, None, Some(_)) => "verifier pending".to_string(),
            (None, None, None) => "running".to_string(),
        };
        let version = self
            .first_call
            .get(id)
            .and_then(|(_, v)| *v)
            .or_else(|| started.and_then(|s| s.policy_version));
        RolloutRow {
            rollout_id: id.to_string(),
            session_id: pick(started.map(|s| &s.session_id), tree.map(|t| &t.session_id)),
            harness: pick(started.map(|s| &s.harness), tree.map(|t| &t.harness)),
            task_id: pick(started.map(|s| &s.task_id), tree.map(|t| &t.task_id)),
            group_id: pick(started.map(|s| &s.group_id), tree.map(|t| &t.group_id)),
            reward: reward.map_or("not scored".into(), |r| format!("{r:.3}")),
            scored: reward.is_some(),
            status,
            advantage: member
                .and_then(|m| m.advantage)
                .map_or("-".into(), |a| format!("{a:+.3}")),
            version: version_text(version),
            model_calls: finished
                .map(|f| f.model_calls)
                .unwrap_or_else(|| self.calls.get(id).copied().unwrap_or(0) as i64),
            tool_calls: tree.map_or(0, |t| t.tool_calls),
            duration: finished.map_or("-".into(), |f| {
                format!(
                    "{:.1} s",
                    (f.finished_at_ms - f.started_at_ms).max(0) as f64 / 1000.0
                )
            }),
            exit_status: finished
                .and_then(|f| f.exit_status)
                .map_or("-".into(), |s| s.to_string()),
        }
    }
}

fn pick(a: Option<&String>, b: Option<&String>) -> String {
    a.or(b).cloned().unwrap_or_default()
}

fn version_text(v: Option<i64>) -> String {
    v.map_or("-".into(), |v| format!("v{v}"))
}

fn mean(xs: impl Iterator<Item = f64>) -> String {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        "-".into()
    } else {
        format!("{:.3}", sum / n as f64)
    }
}
