//! A run as its pages show it: runs → groups → rollouts, and one rollout's
//! trajectory tree with its calls' messages and sampled tokens. Numbers are
//! formatted here so the templates stay plain.

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

/// One line of the runs page.
#[derive(Debug, Clone, Serialize)]
pub struct RunLine {
    pub run_id: String,
    pub rollouts: usize,
    pub groups: usize,
    pub harnesses: Vec<String>,
    pub model_calls: usize,
    pub versions_published: usize,
    pub mean_reward: String,
}

/// One rollout as a row of its run's page.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RolloutRow {
    pub rollout_id: String,
    pub session_id: String,
    pub harness: String,
    pub task_id: String,
    pub group_id: String,
    /// The reward, or "not scored".
    pub reward: String,
    pub scored: bool,
    /// Where the rollout is: "scored", "running", "verifier pending", or why it has no reward.
    pub status: String,
    pub advantage: String,
    /// The policy version that served its first call (else the one it started under).
    pub version: String,
    pub model_calls: i64,
    pub tool_calls: i64,
    pub duration: String,
    pub exit_status: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupView {
    pub group_id: String,
    pub task_id: String,
    /// The group's batch said its rewards do not vary (no learning signal).
    pub no_reward_variance: bool,
    pub rollouts: Vec<RolloutRow>,
}

/// One (version, harness) line of the run's report.
#[derive(Debug, Clone, Serialize)]
pub struct VersionLine {
    pub version: String,
    pub harness: String,
    pub rollouts: usize,
    pub scored: usize,
    pub passed: usize,
    pub unscored: usize,
    pub mean_reward: String,
    pub model_calls: i64,
    pub tool_calls: i64,
    pub sampled_tokens: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PublishedLine {
    pub version: i64,
    pub step: i64,
    pub metrics: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunPage {
    pub run: RunLine,
    pub versions: Vec<VersionLine>,
    pub published: Vec<PublishedLine>,
    pub groups: Vec<GroupView>,
    /// What the compare form offers first: the first group's first two rollouts.
    pub default_a: String,
    pub default_b: String,
}

/// A message of a call's request or its answer, as text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageView {
    pub role: String,
    pub text: String,
    /// `name(arguments)` per tool call.
    pub tool_calls: Vec<String>,
    /// The tool call a tool result answers.
    pub tool_call_id: Option<String>,
}

/// One token of a call's completion or of a path.
#[derive(Debug, Clone, Serialize)]
pub struct TokenView {
    pub id: u32,
    /// The token's text, or `⟨id⟩` without a tokenizer.
    pub text: String,
    pub sampled: bool,
    pub logprob: String,
    pub version: String,
    /// Background colour: red for unlikely, green for likely.
    pub colour: String,
    /// What hovering shows: id, text (quoted, escapes visible), logprob, version.
    pub title: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct CallView {
    pub index: i64,
    pub status: String,
    pub error: Option<String>,
    pub model: String,
    pub version: String,
    pub latency_ms: i64,
    pub finish_reason: String,
    pub trainable: bool,
    pub untrainable_reason: Option<String>,
    /// Findings of the trajectory builder on this call (drift, failed call…).
    pub flags: Vec<String>,
    /// Messages the call's predecessor on its path did not have.
    pub new_messages: Vec<MessageView>,
    /// Messages carried over from the predecessor (not repeated).
    pub earlier_messages: usize,
    /// The call dropped or changed messages its predecessor had (a compaction, a rewrite).
    pub rewritten: bool,
    pub answer: Option<MessageView>,
    pub tokens: Vec<TokenView>,
    pub mean_logprob: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct PathLine {
    pub index: usize,
    pub calls: Vec<i64>,
    pub discarded: bool,
    pub tokens: usize,
    pub sampled: usize,
    pub spans: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RootView {
    pub root: i64,
    pub kind: &'static str,
    pub paths: Vec<PathLine>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FindingView {
    pub kind: String,
    pub call_index: i64,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RolloutPage {
    pub run_id: String,
    pub row: RolloutRow,
    /// The trajectory builder has built its tree.
    pub built: bool,
    pub roots: Vec<RootView>,
    pub findings: Vec<FindingView>,
    pub calls: Vec<CallView>,
    /// What the verifier said, when it ran.
    pub verdict: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PathPage {
    pub run_id: String,
    pub rollout_id: String,
    pub path: PathLine,
    pub tokens: Vec<TokenView>,
}

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

/// The runs page line of one run.
pub fn run_line(run_id: &str, events: &[Event]) -> RunLine {
    let r = Rollouts::of(events);
    let rows: Vec<RolloutRow> = r.order.iter().map(|id| r.row(id)).collect();
    let groups: BTreeSet<&str> = rows.iter().map(|x| x.group_id.as_str()).collect();
    let harnesses: BTreeSet<&str> = rows.iter().map(|x| x.harness.as_str()).collect();
    RunLine {
        run_id: run_id.to_string(),
        rollouts: rows.len(),
        groups: groups.len(),
        harnesses: harnesses.into_iter().map(String::from).collect(),
        model_calls: r.calls.values().sum(),
        versions_published: r.published,
        mean_reward: mean(rows.iter().filter_map(|x| x.reward.parse().ok())),
    }
}

/// A run's page: its report per version, then its groups and their rollouts.
pub fn run_page(run_id: &str, events: &[Event]) -> RunPage {
    let r = Rollouts::of(events);
    let mut groups: Vec<GroupView> = Vec::new();
    let mut group_at: BTreeMap<String, usize> = BTreeMap::new();
    for id in &r.order {
        let row = r.row(id);
        let at = *group_at.entry(row.group_id.clone()).or_insert_with(|| {
            groups.push(GroupView {
                group_id: row.group_id.clone(),
                task_id: row.task_id.clone(),
                no_reward_variance: r
                    .flat_groups
                    .get(row.group_id.as_str())
                    .copied()
                    .unwrap_or(false),
                rollouts: Vec::new(),
            });
            groups.len() - 1
        });
        groups[at].rollouts.push(row);
    }
    let report = Report::of(events);
    let first_two = |i: usize| {
        groups
            .first()
            .and_then(|g| g.rollouts.get(i).or(g.rollouts.first()))
            .map_or(String::new(), |r| r.rollout_id.clone())
    };
    let (default_a, default_b) = (first_two(0), first_two(1));
    RunPage {
        run: run_line(run_id, events),
        versions: report
            .rows
            .iter()
            .map(|v| VersionLine {
                version: version_text(v.version),
                harness: v.harness.clone(),
                rollouts: v.rollouts,
                scored: v.scored,
                passed: v.passed,
                unscored: v.unscored,
                mean_reward: v.mean_reward().map_or("-".into(), |m| format!("{m:.3}")),
                model_calls: v.model_calls,
                tool_calls: v.tool_calls,
                sampled_tokens: v.sampled_tokens,
            })
            .collect(),
        published: report
            .published
            .iter()
            .map(|p| PublishedLine {
                version: p.version,
                step: p.step,
                metrics: p
                    .metrics
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.4}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
            .collect(),
        groups,
        default_a,
        default_b,
    }
}

/// `exp(logprob)` as a colour from red (unlikely) to green (certain).
pub fn logprob_colour(logprob: f32) -> String {
    let p = (logprob as f64).exp().clamp(0.0, 1.0);
    format!("hsl({:.0},75%,82%)", 120.0 * p)
}

fn token(id: u32, sampled: Option<f32>, version: Option<i64>, text: &dyn TokenText) -> TokenView {
    let known = text.token_text(id);
    let logprob = sampled.map_or(String::new(), |l| format!("{l:.4}"));
    let version = version_text(version);
    let title = match &known {
        Some(t) if logprob.is_empty() => format!("id {id} · {t:?}"),
        Some(t) => format!("id {id} · {t:?} · logprob {logprob} · {version}"),
        None if logprob.is_empty() => format!("id {id}"),
        None => format!("id {id} · logprob {logprob} · {version}"),
    };
    TokenView {
        id,
        text: known.unwrap_or_else(|| format!("⟨{id}⟩")),
        sampled: sampled.is_some(),
        colour: sampled.map_or(String::new(), logprob_colour),
        logprob,
        version,
        title,
    }
}

fn message(m: &Value) -> MessageView {
    let m = hf_message(m);
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    MessageView {
        role: text(m.get("role")),
        text: text(m.get("content")),
        tool_calls: m
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| {
                        format!(
                            "{}({})",
                            text(c.pointer("/function/name")),
                            text(c.pointer("/function/arguments"))
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        tool_call_id: m
            .get("tool_call_id")
            .and_then(Value::as_str)
            .map(String::from),
    }
}

/// A call's request messages and answer, from its chat view (empty when unknown).
fn conversation(c: &CallFinished) -> (Vec<MessageView>, Option<MessageView>) {
    let view = c.chat_view().unwrap_or_default();
    let answer = view.answer.as_ref().map(message);
    (view.messages.iter().map(message).collect(), answer)
}

fn path_line(index: usize, s: &Sequence) -> PathLine {
    PathLine {
        index,
        calls: s.call_indices.clone(),
        discarded: s.discarded,
        tokens: s.token_ids.len(),
        sampled: s.loss_mask.iter().filter(|&&m| m == 1).count(),
        spans: spans_text(&s.loss_mask),
    }
}

/// One rollout's page, `None` when the run never names it.
pub fn rollout_page(
    run_id: &str,
    events: &[Event],
    rollout_id: &str,
    text: &dyn TokenText,
) -> Option<RolloutPage> {
    let r = Rollouts::of(events);
    if !r.order.contains(&rollout_id) {
        return None;
    }
    let row = r.row(rollout_id);
    let tree = r.trees.get(rollout_id).copied();
    let mut calls: Vec<CallFinished> = events
        .iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) if c.rollout_id == rollout_id => Some(c.clone()),
            _ => None,
        })
        .collect();
    calls.sort_by_key(|c| c.call_index);
    // Calls stored as splices of earlier ones come back whole; one whose base
    // is missing keeps what it holds.
    expand_finished(&mut calls);

    // A call's predecessor is the call before it on its tree path; before the
    // tree is built, the call before it in the session.
    let mut predecessor: BTreeMap<i64, i64> = BTreeMap::new();
    for s in tree.iter().flat_map(|t| &t.sequences) {
        for pair in s.call_indices.windows(2) {
            predecessor.entry(pair[1]).or_insert(pair[0]);
        }
    }
    let findings: Vec<FindingView> = tree
        .iter()
        .flat_map(|t| &t.findings)
        .map(|f| FindingView {
            kind: format!("{:?}", f.kind).to_lowercase(),
            call_index: f.call_index,
            detail: f.detail.clone(),
        })
        .collect();

    let conversations: BTreeMap<i64, (Vec<MessageView>, Option<MessageView>)> = calls
        .iter()
        .map(|c| (c.call_index, conversation(c)))
        .collect();
    let views = calls
        .iter()
        .map(|c| {
            let (messages, answer) = &conversations[&c.call_index];
            // A call that starts a path of its own (a drifted prompt, a
            // sub-agent) is compared with the session's previous call, but
            // only a tree predecessor it departs from is a rewrite.
            let on_path = predecessor.get(&c.call_index).copied();
            let before = on_path.or_else(|| {
                conversations
                    .range(..c.call_index)
                    .next_back()
                    .map(|(i, _)| *i)
            });
            // What the predecessor saw and said, in order: a continuation repeats it.
            let carried: Vec<&MessageView> = before
                .and_then(|b| conversations.get(&b))
                .map(|(m, a)| m.iter().chain(a.iter()).collect())
                .unwrap_or_default();
            let kept = carried
                .iter()
                .zip(messages)
                .take_while(|(a, b)| **a == *b)
                .count();
            let logprobs = &c.completion_logprobs;
            CallView {
                index: c.call_index,
                status: match c.status {
                    CallStatus::Ok => "ok".into(),
                    other => format!("{other:?}").to_lowercase(),
                },
                error: c.error.clone(),
                model: c.model.clone(),
                version: version_text(c.policy_version),
                latency_ms: c.latency_ms,
                finish_reason: c.finish_reason.clone().unwrap_or_else(|| "-".into()),
                trainable: c.trainable,
                untrainable_reason: c.untrainable_reason.clone(),
                flags: findings
                    .iter()
                    .filter(|f| f.call_index == c.call_index)
                    .map(|f| f.kind.clone())
                    .collect(),
                new_messages: messages[kept..].to_vec(),
                earlier_messages: kept,
                rewritten: on_path.is_some() && kept < carried.len(),
                answer: answer.clone(),
                tokens: c
                    .completion_token_ids
                    .iter()
                    .enumerate()
                    .map(|(i, &id)| token(id, logprobs.get(i).copied(), c.policy_version, text))
                    .collect(),
                mean_logprob: mean(logprobs.iter().map(|&l| l as f64)),
            }
        })
        .collect();

    let mut roots: Vec<RootView> = Vec::new();
    for (i, s) in tree.iter().flat_map(|t| t.sequences.iter().enumerate()) {
        if roots.last().is_none_or(|r| r.root != s.root) {
            roots.push(RootView {
                root: s.root,
                kind: if s.root == 0 {
                    "main"
                } else {
                    "sub-agent / compaction"
                },
                paths: Vec::new(),
            });
        }
        roots
            .last_mut()
            .expect("pushed")
            .paths
            .push(path_line(i, s));
    }
    Some(RolloutPage {
        run_id: run_id.to_string(),
        row,
        built: tree.is_some(),
        roots,
        findings,
        calls: views,
        verdict: r.verdicts.get(rollout_id).map(|v| {
            format!(
                "ok {}, reward {}{}",
                v.ok,
                v.reward.map_or("null".into(), |r| format!("{r:.3}")),
                if v.details.is_empty() {
                    String::new()
                } else {
                    format!(": {}", v.details)
                }
            )
        }),
    })
}

/// One path of a rollout's tree, token by token; `None` when there is none such.
pub fn path_page(
    run_id: &str,
    events: &[Event],
    rollout_id: &str,
    index: usize,
    text: &dyn TokenText,
) -> Option<PathPage> {
    let tree = events.iter().rev().find_map(|e| match e {
        Event::TrajectoryBuilt(t) if t.rollout_id == rollout_id => Some(t),
        _ => None,
    })?;
    let s = tree.sequences.get(index)?;
    let tokens = s
        .token_ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let sampled = s.loss_mask.get(i) == Some(&1);
            token(
                id,
                sampled.then(|| s.sampling_logprobs.get(i).copied().unwrap_or(0.0)),
                s.policy_versions
                    .get(i)
                    .filter(|&&v| sampled && v != UNKNOWN_POLICY_VERSION)
                    .map(|&v| v as i64),
                text,
            )
        })
        .collect();
    Some(PathPage {
        run_id: run_id.to_string(),
        rollout_id: rollout_id.to_string(),
        path: path_line(index, s),
        tokens,
    })
}
