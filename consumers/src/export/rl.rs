//! `forgelog export rl`: a run's groups for offline RL and preference tuning.
//!
//! Every path (the same rows as the SFT export, unfiltered: a failed rollout
//! is a training signal here) with its group, reward, advantage, sampling
//! logprobs and policy versions per token; and from each group whose rewards
//! differ, preference data in TRL's conversational shapes: a DPO pair (the
//! best rollout chosen, the worst rejected) and KTO examples (each scored
//! rollout desirable when its reward is above its group's mean).

use super::SftRow;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// One DPO example: the messages both rollouts share, then each one's own.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreferencePair {
    pub group_id: String,
    pub task_id: String,
    pub harness: String,
    pub prompt: Vec<Value>,
    pub chosen: Vec<Value>,
    pub rejected: Vec<Value>,
    pub chosen_rollout: String,
    pub rejected_rollout: String,
    pub chosen_reward: f64,
    pub rejected_reward: f64,
}

/// One KTO example.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KtoExample {
    pub group_id: String,
    pub task_id: String,
    pub harness: String,
    pub rollout_id: String,
    pub prompt: Vec<Value>,
    pub completion: Vec<Value>,
    /// The reward is above the group's mean.
    pub label: bool,
    pub reward: f64,
}

/// A rollout's main path, its reward and its conversation.
type Scored<'a> = (&'a SftRow, f64, &'a Vec<Value>);

/// The path of a rollout's rows that ends with its last call (the first such).
fn main_path<'a>(rows: impl IntoIterator<Item = &'a SftRow>) -> Option<&'a SftRow> {
    let last = |r: &SftRow| r.call_indices.last().copied().unwrap_or(-1);
    rows.into_iter()
        .fold(None, |main: Option<&SftRow>, r| match main {
            Some(m) if last(r) <= last(m) => Some(m),
            _ => Some(r),
        })
}

/// Each scored rollout's main path with its conversation, by group, in row order.
fn scored_by_group<'a>(rows: &[&'a SftRow]) -> BTreeMap<&'a str, Vec<Scored<'a>>> {
    let mut by_rollout: BTreeMap<&str, Vec<&SftRow>> = BTreeMap::new();
    for &r in rows {
        by_rollout.entry(&r.rollout_id).or_default().push(r);
    }
    let main: BTreeMap<&str, &SftRow> = by_rollout
        .into_iter()
        .filter_map(|(id, rows)| Some((id, main_path(rows)?)))
        .collect();
    let mut groups: BTreeMap<&str, Vec<Scored>> = BTreeMap::new();
    for &r in rows {
        if !main
            .get(r.rollout_id.as_str())
            .is_some_and(|m| std::ptr::eq(*m, r))
        {
            continue;
        }
        if let (Some(reward), Some(Value::Array(messages))) = (r.reward, &r.messages) {
            groups
                .entry(&r.group_id)
                .or_default()
                .push((r, reward, messages));
        }
    }
    groups
}

/// Preference data a group at a time, for an export that reads a rollout at a
/// time: a group's scored main paths are held until all its members are in.
#[derive(Debug, Default)]
pub struct GroupPreferences {
    /// Group → members not yet in.
    waiting: BTreeMap<String, usize>,
    /// Group → the main paths of its members so far.
    held: BTreeMap<String, Vec<SftRow>>,
}

impl GroupPreferences {
    /// For the groups of the run's batches: group → its members.
    pub fn new(groups: &BTreeMap<String, Vec<String>>) -> GroupPreferences {
        GroupPreferences {
            waiting: groups.iter().map(|(g, m)| (g.clone(), m.len())).collect(),
            held: BTreeMap::new(),
        }
    }

    /// One rollout of `group` and its rows; once its group is complete, the
    /// group's DPO pair and KTO examples.
    pub fn add(
        &mut self,
        group: &str,
        rows: &[SftRow],
    ) -> Option<(Vec<PreferencePair>, Vec<KtoExample>)> {
        let waiting = self.waiting.get_mut(group)?; // no batch: never scored
        if let Some(main) = main_path(rows) {
            self.held
                .entry(group.into())
                .or_default()
                .push(main.clone());
        }
        *waiting = waiting.saturating_sub(1);
        if *waiting > 0 {
            return None;
        }
        self.waiting.remove(group);
        let rows = self.held.remove(group).unwrap_or_default();
        let refs: Vec<&SftRow> = rows.iter().collect();
        Some((preference_pairs(&refs), kto_examples(&refs)))
    }

    /// What the groups with members never read give (their trees are not in the log).
    pub fn rest(self) -> (Vec<PreferencePair>, Vec<KtoExample>) {
        let rows: Vec<SftRow> = self.held.into_values().flatten().collect();
        let refs: Vec<&SftRow> = rows.iter().collect();
        (preference_pairs(&refs), kto_examples(&refs))
    }
}

/// How many leading messages `a` and `b` share.
fn shared(a: &[Value], b: &[Value]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A DPO pair per group with reward variance: best against worst (ties by rollout id).
pub fn preference_pairs(rows: &[&SftRow]) -> Vec<PreferencePair> {
    let mut out = Vec::new();
    for members in scored_by_group(rows).into_values() {
        let by_reward = |a: &&Scored, b: &&Scored| {
            a.1.total_cmp(&b.1)
                .then_with(|| b.0.rollout_id.cmp(&a.0.rollout_id))
        };
        let (Some(best), Some(worst)) = (
            members.iter().max_by(by_reward),
            members.iter().min_by(by_reward),
        ) else {
            continue;
        };
        if best.1 <= worst.1 {
            continue;
        }
        let n = shared(best.2, worst.2);
        out.push(PreferencePair {
            group_id: best.0.group_id.clone(),
            task_id: best.0.task_id.clone(),
            harness: best.0.harness.clone(),
            prompt: best.2[..n].to_vec(),
            chosen: best.2[n..].to_vec(),
            rejected: worst.2[n..].to_vec(),
            chosen_rollout: best.0.rollout_id.clone(),
            rejected_rollout: worst.0.rollout_id.clone(),
            chosen_reward: best.1,
            rejected_reward: worst.1,
        });
    }
    out
}

/// KTO examples from every group with reward variance: each scored rollout,
/// its prompt the messages its whole group shares.
pub fn kto_examples(rows: &[&SftRow]) -> Vec<KtoExample> {
    let mut out = Vec::new();
    for members in scored_by_group(rows).into_values() {
        let mean = members.iter().map(|m| m.1).sum::<f64>() / members.len() as f64;
        if members.iter().all(|m| m.1 == mean) {
            continue;
        }
        let n = members
            .iter()
            .map(|m| shared(members[0].2, m.2))
            .min()
            .unwrap_or(0);
        for (row, reward, messages) in &members {
            out.push(KtoExample {
                group_id: row.group_id.clone(),
                task_id: row.task_id.clone(),
                harness: row.harness.clone(),
                rollout_id: row.rollout_id.clone(),
                prompt: messages[..n].to_vec(),
                completion: messages[n..].to_vec(),
                label: *reward > mean,
                reward: *reward,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(role: &str, content: &str) -> Value {
        json!({"role": role, "content": content})
    }

    /// A path of `rollout` in `group` ending with call `last`, its
    /// conversation the task then `turns`.
    fn row(rollout: &str, group: &str, reward: Option<f64>, last: i64, turns: &[&str]) -> SftRow {
        let mut messages = vec![
            text("system", "You are an agent."),
            text("user", "Fix the bug."),
        ];
        messages.extend(turns.iter().map(|t| text("assistant", t)));
        SftRow {
            row_id: format!("{rollout}/{last}"),
            run_id: "r".into(),
            task_id: "t".into(),
            group_id: group.into(),
            harness: "codex".into(),
            rollout_id: rollout.into(),
            path_index: last as usize,
            call_indices: (0..=last).collect(),
            reward,
            advantage: None,
            input_ids: vec![1, 2],
            loss_mask: vec![0, 1],
            sampling_logprobs: vec![0.0, -0.5],
            policy_versions: vec![-1, 0],
            finish_reasons: vec![Some("stop".into())],
            messages: Some(Value::Array(messages)),
            tools: None,
            images: Vec::new(),
        }
    }

    #[test]
    fn the_best_and_worst_main_paths_of_a_group_make_its_pair() {
        let rows = [
            row("a", "g", Some(1.0), 3, &["fixed"]),
            // a's sub-agent: a path of its own, not a's conversation.
            row("a", "g", Some(1.0), 1, &["sub-agent"]),
            row("b", "g", Some(0.0), 2, &["gave up"]),
            row("c", "g", Some(0.5), 2, &["half"]),
            row("d", "g", None, 2, &["not scored"]),
            // No variance: nothing to prefer.
            row("e", "h", Some(1.0), 1, &["x"]),
            row("f", "h", Some(1.0), 1, &["y"]),
        ];
        let refs: Vec<&SftRow> = rows.iter().collect();
        let pairs = preference_pairs(&refs);
        assert_eq!(pairs.len(), 1);
        let p = &pairs[0];
        assert_eq!(
            (p.chosen_rollout.as_str(), p.rejected_rollout.as_str()),
            ("a", "b")
        );
        assert_eq!(p.prompt.len(), 2, "the system prompt and the task");
        assert_eq!(p.chosen, [text("assistant", "fixed")]);
        assert_eq!(p.rejected, [text("assistant", "gave up")]);
        assert_eq!((p.chosen_reward, p.rejected_reward), (1.0, 0.0));

        let kto = kto_examples(&refs);
        let labels: Vec<(&str, bool)> = kto
            .iter()
            .map(|k| (k.rollout_id.as_str(), k.label))
            .collect();
        assert_eq!(
            labels,
            [("a", true), ("b", false), ("c", false)],
            "mean 0.5"
        );
        assert!(kto
            .iter()
            .all(|k| k.prompt.len() == 2 && k.completion.len() == 1));
    }

    #[test]
    fn ties_break_by_rollout_id_whatever_the_row_order() {
        let rows = [
            row("b", "g", Some(1.0), 1, &["b"]),
            row("a", "g", Some(1.0), 1, &["a"]),
            row("c", "g", Some(0.0), 1, &["c"]),
        ];
        let forward: Vec<&SftRow> = rows.iter().collect();
        let backward: Vec<&SftRow> = rows.iter().rev().collect();
        assert_eq!(preference_pairs(&forward), preference_pairs(&backward));
        assert_eq!(preference_pairs(&forward)[0].chosen_rollout, "a");
    }
}
