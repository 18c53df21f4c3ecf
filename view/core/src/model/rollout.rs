//! A rollout's page (its tree, calls, messages and sampled tokens) and a path's, token by token.

use super::*;

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
        .map(|c| call_view(c, &conversations, &predecessor, &findings, text))
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

/// One call as its rollout page shows it: what is new in its prompt against
/// the call before it (on its tree path, else in the session), whether it
/// rewrote what that call saw, its answer and sampled tokens.
fn call_view(
    c: &CallFinished,
    conversations: &BTreeMap<i64, (Vec<MessageView>, Option<MessageView>)>,
    predecessor: &BTreeMap<i64, i64>,
    findings: &[FindingView],
    text: &dyn TokenText,
) -> CallView {
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
