//! The trajectory tree of one session: its calls merged by longest common token
//! prefix. Pure: the same calls give the same
//! tree, whatever order other sessions' events arrived in.
//!
//! Each call becomes a node whose tokens are its prompt followed by what it
//! sampled. A new call attaches under the deepest node whose tokens are a prefix
//! of its prompt (the harness continued that branch), or as a root when there is
//! none (a sub-agent's different system prompt, a compacted history). Then:
//! - if its prompt diverges inside a sibling's *sampled* tokens, that is drift:
//!   the model's output was re-tokenized. The tree reports it and does not
//!   repair it (the re-sent tokens are context, the originals keep their
//!   path): the repair is upstream, where a token-in proxy splices follow-up
//!   prompts onto the sampled ids (`forgelog_dialects::splice`), so drift is
//!   left to engine-rendered calls;
//! - otherwise earlier siblings were abandoned (the session went back to the
//!   same point: a retry) and their branches are discarded. At the top level
//!   only a root re-sent with its whole prompt counts as a retry.

pub use forgelog_schemas::compact::common_prefix;
use forgelog_schemas::{
    CallFinished, CallStatus, Finding, FindingKind, Sequence, UNKNOWN_POLICY_VERSION,
};

#[derive(Debug, Clone)]
struct Node {
    call_index: i64,
    parent: Option<usize>,
    root: usize,
    /// Prompt then completion.
    tokens: Vec<u32>,
    prompt_len: usize,
    logprobs: Vec<f32>,
    /// The completion may be trained on (trainable, consistent ids and logprobs).
    sampled: bool,
    policy_version: u32,
    tool_call: bool,
    children: Vec<usize>,
    discarded: bool,
}

/// A session's calls as a forest of token-prefix trees.
#[derive(Debug, Clone, Default)]
pub struct TrajectoryTree {
    nodes: Vec<Node>,
    roots: usize,
    findings: Vec<Finding>,
}

impl TrajectoryTree {
    /// Builds the tree from a session's calls, in `call_index` order (duplicates
    /// of an index are ignored: at-least-once input is fine).
    pub fn build<'a>(calls: impl IntoIterator<Item = &'a CallFinished>) -> TrajectoryTree {
        let mut calls: Vec<&CallFinished> = calls.into_iter().collect();
        calls.sort_by_key(|c| c.call_index);
        calls.dedup_by_key(|c| c.call_index);
        let mut tree = TrajectoryTree::default();
        for call in calls {
            tree.insert(call);
        }
        tree
    }

    fn finding(&mut self, kind: FindingKind, call_index: i64, detail: String) {
        self.findings.push(Finding {
            kind,
            call_index,
            detail,
        });
    }

    fn insert(&mut self, call: &CallFinished) {
        let index = call.call_index;
        if call.status != CallStatus::Ok || call.prompt_token_ids.is_empty() {
            let why = call
                .error
                .clone()
                .unwrap_or_else(|| format!("status {:?}, no prompt tokens", call.status));
            self.finding(FindingKind::FailedCall, index, why);
            return;
        }
        let consistent = call.completion_token_ids.len() == call.completion_logprobs.len();
        if !call.trainable {
            let why = call
                .untrainable_reason
                .clone()
                .unwrap_or_else(|| "recorded trainable=false".into());
            self.finding(FindingKind::NotTrainable, index, why);
        } else if !consistent {
            let detail = format!(
                "{} sampled ids but {} logprobs",
                call.completion_token_ids.len(),
                call.completion_logprobs.len()
            );
            self.finding(FindingKind::InconsistentTokens, index, detail);
        }
        let prompt = &call.prompt_token_ids;
        let (parent, root) = self.place(index, prompt);
        let mut tokens = Vec::with_capacity(prompt.len() + call.completion_token_ids.len());
        tokens.extend_from_slice(prompt);
        tokens.extend_from_slice(&call.completion_token_ids);
        let id = self.nodes.len();
        self.nodes.push(Node {
            call_index: index,
            parent,
            root,
            tokens,
            prompt_len: prompt.len(),
            logprobs: call.completion_logprobs.clone(),
            sampled: call.trainable && consistent,
            policy_version: call
                .policy_version
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(UNKNOWN_POLICY_VERSION),
            tool_call: call.finish_reason.as_deref() == Some("tool_calls"),
            children: Vec::new(),
            discarded: false,
        });
        if let Some(p) = parent {
            self.nodes[p].children.push(id);
        }
    }

    /// Decides where a call with `prompt` attaches: (parent, root index).
    fn place(&mut self, index: i64, prompt: &[u32]) -> (Option<usize>, usize) {
        // The deepest node that is a prefix of the prompt (latest on ties).
        // (`max_by_key` keeps the last maximum: iterate oldest first.)
        let parent = (0..self.nodes.len())
            .filter(|&n| prompt.starts_with(&self.nodes[n].tokens))
            .max_by_key(|&n| self.nodes[n].tokens.len());
        let siblings: Vec<usize> = match parent {
            Some(p) => self.nodes[p].children.clone(),
            None => (0..self.nodes.len())
                .filter(|&n| self.nodes[n].parent.is_none())
                .collect(),
        };
        // The sibling sharing the longest prefix decides (latest on ties).
        let best = siblings
            .iter()
            .map(|&c| (common_prefix(prompt, &self.nodes[c].tokens), c))
            .max_by_key(|&(lcp, _)| lcp);
        if let Some((lcp, c)) = best {
            let node = &self.nodes[c];
            if lcp > node.prompt_len {
                // Drift: the prompt re-sent this sibling's sampled tokens, differently.
                let detail = format!(
                    "prompt re-tokenized call {}'s sampled tokens: diverges at token {lcp}",
                    node.call_index
                );
                let root = node.root;
                self.finding(FindingKind::Drift, index, detail);
                return (parent, root);
            }
        }
        if let Some(p) = parent {
            // Back at a point the session had already moved on from: the earlier
            // turns from here were abandoned (a retry).
            for c in siblings {
                self.discard(c);
            }
            return (Some(p), self.nodes[p].root);
        }
        // A root re-sent with its whole prompt is a retry of that root.
        if let Some((lcp, r)) = best {
            if lcp >= self.nodes[r].prompt_len {
                self.discard(r);
                return (None, self.nodes[r].root);
            }
        }
        self.roots += 1;
        (None, self.roots - 1)
    }

    fn discard(&mut self, n: usize) {
        let mut stack = vec![n];
        while let Some(n) = stack.pop() {
            self.nodes[n].discarded = true;
            stack.extend_from_slice(&self.nodes[n].children);
        }
    }

    /// One sequence per root-to-leaf path, leaves in creation order.
    pub fn sequences(&self) -> Vec<Sequence> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.children.is_empty())
            .map(|(leaf, _)| self.path_sequence(leaf))
            .collect()
    }

    fn path_sequence(&self, leaf: usize) -> Sequence {
        let tokens = self.nodes[leaf].tokens.clone();
        let len = tokens.len();
        let mut seq = Sequence {
            root: self.nodes[leaf].root as i64,
            call_indices: Vec::new(),
            discarded: false,
            token_ids: tokens,
            loss_mask: vec![0; len],
            sampling_logprobs: vec![0.0; len],
            policy_versions: vec![UNKNOWN_POLICY_VERSION; len],
            tool_calls: 0,
        };
        let mut at = Some(leaf);
        while let Some(n) = at {
            let node = &self.nodes[n];
            seq.call_indices.push(node.call_index);
            seq.discarded |= node.discarded;
            seq.tool_calls += node.tool_call as i64;
            if node.sampled {
                let span = node.prompt_len..node.tokens.len();
                seq.loss_mask[span.clone()].fill(1);
                seq.sampling_logprobs[span.clone()].copy_from_slice(&node.logprobs);
                seq.policy_versions[span].fill(node.policy_version);
            }
            at = node.parent;
        }
        seq.call_indices.reverse();
        seq
    }

    /// Calls outside discarded branches that ended in tool calls.
    pub fn tool_calls(&self) -> i64 {
        self.nodes
            .iter()
            .filter(|n| n.tool_call && !n.discarded)
            .count() as i64
    }

    /// Calls placed in the tree.
    pub fn calls(&self) -> usize {
        self.nodes.len()
    }

    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }
}

#[cfg(test)]
mod tests;
