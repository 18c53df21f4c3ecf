//! `forgelog replay show`: a trajectory tree as text for the terminal.

use forgelog_schemas::{Event, GroupMember, Sequence, TrajectoryBuilt};
use std::fmt::Write;

/// Runs of equal mask values as `[start..end)` spans of sampled tokens.
pub fn sampled_spans(mask: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut spans = Vec::new();
    let mut start = None;
    for (i, &m) in mask.iter().chain(std::iter::once(&0)).enumerate() {
        match (m, start) {
            (1, None) => start = Some(i),
            (0, Some(s)) => {
                spans.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    spans
}

/// The sampled spans as `146..178, 190..193`.
pub fn spans_text(mask: &[u8]) -> String {
    sampled_spans(mask)
        .iter()
        .map(|r| format!("{}..{}", r.start, r.end))
        .collect::<Vec<_>>()
        .join(", ")
}

fn sequence_line(out: &mut String, i: usize, s: &Sequence) {
    let calls: Vec<String> = s.call_indices.iter().map(|c| c.to_string()).collect();
    let sampled: usize = s.loss_mask.iter().map(|&m| m as usize).sum();
    let _ = writeln!(
        out,
        "  {} path {i}: calls {} | {} tokens, {sampled} sampled in [{}]{}",
        if s.discarded { "✗" } else { "•" },
        calls.join(" → "),
        s.token_ids.len(),
        spans_text(&s.loss_mask),
        if s.discarded {
            " (discarded retry)"
        } else {
            ""
        }
    );
}

/// One rollout's tree: roots, paths, mask spans, findings, and its reward when known.
pub fn render(t: &TrajectoryBuilt, member: Option<&GroupMember>) -> String {
    let mut out = String::new();
    let reward = match member {
        Some(m) => format!(
            "reward {}, advantage {}",
            m.reward
                .map_or("none (verifier did not run)".into(), |r| format!("{r:.3}")),
            m.advantage.map_or("-".into(), |a| format!("{a:+.3}"))
        ),
        None => "no batch yet".into(),
    };
    let _ = writeln!(
        out,
        "rollout {} ({}, task {}, group {}): {} calls, {} tool calls; {reward}",
        t.rollout_id, t.harness, t.task_id, t.group_id, t.calls, t.tool_calls
    );
    let mut roots: Vec<i64> = t.sequences.iter().map(|s| s.root).collect();
    roots.dedup();
    for root in roots {
        let kind = if root == 0 {
            "main"
        } else {
            "sub-agent / compaction"
        };
        let _ = writeln!(out, " root {root} ({kind})");
        for (i, s) in t
            .sequences
            .iter()
            .enumerate()
            .filter(|(_, s)| s.root == root)
        {
            sequence_line(&mut out, i, s);
        }
    }
    for f in &t.findings {
        let _ = writeln!(out, "  ! call {}: {:?}: {}", f.call_index, f.kind, f.detail);
    }
    out
}

/// A run's trees (its `TrajectoryBuilt` events, or one rollout's), each with
/// its group member from the run's `TrainingBatch` events when it has one.
/// Returns the text and how many trees it shows.
pub fn render_run(events: &[Event], rollout: Option<&str>) -> (String, usize) {
    let members: Vec<&GroupMember> = events
        .iter()
        .filter_map(|e| match e {
            Event::TrainingBatch(b) => Some(&b.members),
            _ => None,
        })
        .flatten()
        .collect();
    let mut out = String::new();
    let mut shown = 0;
    for e in events {
        let Event::TrajectoryBuilt(t) = e else {
            continue;
        };
        if rollout.is_some_and(|r| r != t.rollout_id) {
            continue;
        }
        let member = members.iter().find(|m| m.rollout_id == t.rollout_id);
        out.push_str(&render(t, member.copied()));
        shown += 1;
    }
    (out, shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_render() {
        assert_eq!(sampled_spans(&[0, 1, 1, 0, 1]), vec![1..3, 4..5]);
        assert!(sampled_spans(&[0, 0]).is_empty());
        let seq = |root, discarded| Sequence {
            root,
            call_indices: vec![0, 1],
            discarded,
            token_ids: vec![1, 2, 3, 4],
            loss_mask: vec![0, 1, 0, 1],
            sampling_logprobs: vec![0.0; 4],
            policy_versions: vec![0; 4],
            tool_calls: 1,
        };
        let t = TrajectoryBuilt {
            run_id: "r".into(),
            event_id: "e".into(),
            rollout_id: "ro".into(),
            session_id: "s".into(),
            task_id: "t".into(),
            group_id: "g".into(),
            harness: "claude-code".into(),
            calls: 2,
            tool_calls: 1,
            sequences: vec![seq(0, true), seq(0, false), seq(1, false)],
            findings: vec![],
        };
        let text = render(&t, None);
        assert!(text.contains("root 1 (sub-agent / compaction)"), "{text}");
        assert!(
            text.contains(
                "✗ path 0: calls 0 → 1 | 4 tokens, 2 sampled in [1..2, 3..4] (discarded retry)"
            ),
            "{text}"
        );
        assert!(text.contains("no batch yet"));
    }

    #[test]
    fn a_run_shows_each_tree_with_its_group_member() {
        let inputs = forgelog_schemas::testing::recorded_run("r", 2, 2, 2, 8);
        let mut by_topic = std::collections::BTreeMap::new();
        for e in inputs {
            by_topic.entry(e.topic()).or_insert_with(Vec::new).push(e);
        }
        let rebuilt = crate::rebuild::rebuild(&by_topic, Default::default());
        let events: Vec<Event> = [rebuilt.trajectories, rebuilt.batches].concat();
        let (text, shown) = render_run(&events, None);
        assert_eq!(shown, 4);
        assert_eq!(text.matches("reward ").count(), 4, "{text}");
        assert!(!text.contains("no batch yet"), "{text}");
        let Event::TrajectoryBuilt(first) = &events[0] else {
            panic!("trajectories first")
        };
        let (one, shown) = render_run(&events, Some(&first.rollout_id));
        assert_eq!(shown, 1);
        assert!(one.contains(&first.rollout_id), "{one}");
        assert_eq!(render_run(&events, Some("nope")).1, 0);
    }
}
