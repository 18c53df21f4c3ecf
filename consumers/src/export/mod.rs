//! `forgelog export sft`: a run's trajectories as supervised fine-tuning data.
//!
//! The pure part ([`rows`]) picks the rows: one per non-discarded root-to-leaf
//! path, with its tokens, loss mask and the reward of its rollout, and its
//! conversation in OpenAI Chat form (the path's last call's `chat_request`
//! messages plus its `chat_response`). [`write`] turns them into files: per
//! harness a JSONL with a `messages` column (what HF `datasets` and TRL's
//! SFTTrainer load) and a Parquet with `input_ids`, `loss_mask`, `labels`, plus
//! a manifest with counts and the source offsets.

mod files;

pub use files::{jsonl, parquet, write, ExportError};

use forgelog_schemas::{CallFinished, TrajectoryBuilt};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Which rows to keep.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ExportFilter {
    /// The verifier ran and gave a reward above 0.
    pub only_successful: bool,
    /// Keep rollouts with at least this reward (which also requires a reward).
    pub min_reward: Option<f64>,
}

impl ExportFilter {
    fn keeps(&self, reward: Option<f64>) -> bool {
        (!self.only_successful || reward.is_some_and(|r| r > 0.0))
            && self
                .min_reward
                .is_none_or(|m| reward.is_some_and(|r| r >= m))
    }
}

/// One training example.
#[derive(Debug, Clone, PartialEq)]
pub struct SftRow {
    pub harness: String,
    pub rollout_id: String,
    pub reward: Option<f64>,
    pub input_ids: Vec<u32>,
    pub loss_mask: Vec<u8>,
    /// The conversation in OpenAI Chat form; `None` when the calls carry no chat view.
    pub messages: Option<Value>,
    pub tools: Option<Value>,
}

impl SftRow {
    /// `input_ids` where the model sampled, -100 (ignored by the loss) elsewhere.
    pub fn labels(&self) -> Vec<i64> {
        self.input_ids
            .iter()
            .zip(&self.loss_mask)
            .map(|(&t, &m)| if m == 1 { t as i64 } else { -100 })
            .collect()
    }
}

/// What an export wrote, and from where.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Manifest {
    pub run_id: String,
    pub filter: ExportFilter,
    /// Harness → rows in its Parquet file.
    pub rows: BTreeMap<String, usize>,
    /// Harness → rows in its JSONL file (those with a chat view).
    pub jsonl_rows: BTreeMap<String, usize>,
    pub filtered_out: usize,
    /// topic → partition → offset after the last message read.
    pub source_offsets: BTreeMap<String, BTreeMap<i32, i64>>,
}

/// Rows for `trajectories` (in log order), rewards by rollout id (absent: no verdict yet).
pub fn rows(
    trajectories: &[TrajectoryBuilt],
    calls: &[CallFinished],
    rewards: &BTreeMap<String, Option<f64>>,
    filter: &ExportFilter,
) -> (Vec<SftRow>, usize) {
    let by_call: BTreeMap<(&str, i64), &CallFinished> = calls
        .iter()
        .map(|c| ((c.session_id.as_str(), c.call_index), c))
        .collect();
    let mut out = Vec::new();
    let mut filtered_out = 0;
    for t in trajectories {
        let reward = rewards.get(&t.rollout_id).copied().flatten();
        if !filter.keeps(reward) {
            filtered_out += t.sequences.iter().filter(|s| !s.discarded).count();
            continue;
        }
        for s in t.sequences.iter().filter(|s| !s.discarded) {
            let last = s
                .call_indices
                .last()
                .and_then(|&i| by_call.get(&(t.session_id.as_str(), i)));
            let (messages, tools) = last.and_then(|c| conversation(c)).unzip();
            out.push(SftRow {
                harness: t.harness.clone(),
                rollout_id: t.rollout_id.clone(),
                reward,
                input_ids: s.token_ids.clone(),
                loss_mask: s.loss_mask.clone(),
                messages,
                tools: tools.flatten(),
            });
        }
    }
    (out, filtered_out)
}

/// The call's request messages followed by its answer; its tools, if any.
fn conversation(call: &CallFinished) -> Option<(Value, Option<Value>)> {
    let request: Value = serde_json::from_str(&call.chat_request).ok()?;
    let answer: Value = serde_json::from_str(&call.chat_response).ok()?;
    let mut messages = request.get("messages")?.as_array()?.clone();
    messages.push(answer);
    let tools = request
        .get("tools")
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
        .cloned();
    Some((Value::Array(messages), tools))
}

#[cfg(test)]
mod tests;

/// Reads run `run` from the log (calls, trajectories, batches) and exports it to `to`.
pub async fn export_run(
    reader: &forgelog_stream::ReplayReader,
    run: &str,
    to: &str,
    filter: ExportFilter,
) -> Result<(Manifest, Vec<String>), Box<dyn std::error::Error + Send + Sync>> {
    use forgelog_schemas::{Event, Topic};
    let mut manifest = Manifest {
        run_id: run.into(),
        filter: filter.clone(),
        ..Default::default()
    };
    let mut read = |topic: Topic| -> Result<Vec<Event>, forgelog_stream::ConsumeError> {
        let got = crate::rebuild::read_run(reader, topic, run)?;
        let offsets = manifest
            .source_offsets
            .entry(topic.name().to_string())
            .or_default();
        for r in &got {
            let o = offsets.entry(r.partition).or_default();
            *o = (*o).max(r.offset + 1);
        }
        Ok(got.into_iter().filter_map(|r| r.event.ok()).collect())
    };
    let mut calls: Vec<CallFinished> = read(Topic::Calls)?
        .into_iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) => Some(c),
            _ => None,
        })
        .collect();
    // Each call's chat form whole again (stored relative to earlier calls, v5).
    forgelog_schemas::compact::expand_finished(&mut calls);
    let trajectories: Vec<TrajectoryBuilt> = read(Topic::Trajectories)?
        .into_iter()
        .filter_map(|e| match e {
            Event::TrajectoryBuilt(t) => Some(t),
            _ => None,
        })
        .collect();
    let mut rewards = BTreeMap::new();
    for e in read(Topic::Batches)? {
        if let Event::TrainingBatch(b) = e {
            for m in b.members {
                rewards.insert(m.rollout_id, m.reward);
            }
        }
    }
    let (rows, filtered_out) = rows(&trajectories, &calls, &rewards, &filter);
    manifest.filtered_out = filtered_out;
    let written = write(to, &rows, &mut manifest).await?;
    Ok((manifest, written))
}
