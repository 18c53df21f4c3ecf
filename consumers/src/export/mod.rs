//! `forgelog export sft`: a run's trajectories as supervised fine-tuning data.
//!
//! The pure part ([`rows`]) picks the rows: one per non-discarded root-to-leaf
//! path, with its exact tokens, loss mask, sampling logprobs and policy
//! versions, where it came from (run, task, group, harness, rollout, path),
//! its rollout's reward and advantage, and its conversation in the shape
//! Hugging Face chat templates read (the path's last call's `chat_request`
//! messages plus its `chat_response`, through [`forgelog_dialects::hf`]).
//! [`RowWriter`] turns them into files: per harness a JSONL (the conversation
//! and everything else, what TRL's SFTTrainer reads as a conversational
//! dataset) and a zstd Parquet (the tokens, masks and provenance, trainable as
//! it is), a dataset card whose `configs:` make each harness a `load_dataset`
//! config, and a manifest with counts, checksums and the source offsets.
//! [`export_run`] streams: the log is read a rollout at a time ([`source`])
//! and rows are written as they come, so neither the run nor the export is
//! ever held in memory whole.

pub mod atif;
mod files;
pub mod rl;
pub mod source;

pub use files::{
    dataset_card, jsonl, parquet, DocumentWriter, ExportError, Files, RowWriter, ROW_GROUP_ROWS,
    ROW_GROUP_TOKENS,
};

use forgelog_dialects::hf::hf_message;
use forgelog_schemas::{CallFinished, TrajectoryBuilt, UNKNOWN_POLICY_VERSION};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// What an export is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportKind {
    /// `sft.jsonl` (conversations) and `sft.parquet` (tokens) per harness.
    #[default]
    Sft,
    /// `paths.parquet` (every path, tokens, logprobs, rewards, advantages)
    /// per harness; `dpo.jsonl` and `kto.jsonl` ([`rl`]) for the run.
    Rl,
    /// One ATIF trajectory per rollout ([`atif`]): `harness/rollout.json`.
    Atif,
}

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

/// A rollout's outcome, from its training batch: both `None` before it has one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RolloutScore {
    pub reward: Option<f64>,
    pub advantage: Option<f64>,
}

/// One training example: one path of one rollout's trajectory tree.
#[derive(Debug, Clone, PartialEq)]
pub struct SftRow {
    /// `{rollout_id}/{path_index}`: joins a JSONL row to its Parquet row.
    pub row_id: String,
    pub run_id: String,
    pub task_id: String,
    pub group_id: String,
    pub harness: String,
    pub rollout_id: String,
    /// The path's index among its tree's paths (sub-agents and compactions are paths of their own).
    pub path_index: usize,
    /// The calls along the path, in order.
    pub call_indices: Vec<i64>,
    pub reward: Option<f64>,
    pub advantage: Option<f64>,
    pub input_ids: Vec<u32>,
    pub loss_mask: Vec<u8>,
    /// Sampling-time logprob per token (0 off the mask).
    pub sampling_logprobs: Vec<f32>,
    /// The policy version that sampled each token; -1 off the mask or where unknown.
    pub policy_versions: Vec<i64>,
    /// Each call's finish reason along the path (`null` where the engine gave none).
    pub finish_reasons: Vec<Option<String>>,
    /// The conversation as Hugging Face chat templates read it; `None` when the calls carry no chat view.
    pub messages: Option<Value>,
    pub tools: Option<Value>,
    /// The images the messages show, in order (URLs as the harness sent them,
    /// `data:` URLs included); each stands in its message's content as an
    /// `{"type": "image"}` part, as vision-language processors read them.
    pub images: Vec<String>,
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
    pub kind: ExportKind,
    pub filter: ExportFilter,
    /// Harness → rows in its Parquet file.
    pub rows: BTreeMap<String, usize>,
    /// Harness → rows in its JSONL file (those with a chat view).
    pub jsonl_rows: BTreeMap<String, usize>,
    /// `export rl`: the DPO pairs and KTO examples written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dpo_pairs: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kto_examples: Option<usize>,
    pub filtered_out: usize,
    /// The models that answered the exported rollouts' calls, as the engine
    /// named them, and the policy versions that sampled the exported tokens:
    /// `forgelog export model --run R --version V` writes a version's model
    /// folder, with the tokenizer and chat template that made the ids.
    pub models: BTreeSet<String>,
    pub policy_versions: BTreeSet<i64>,
    /// The forgelog that wrote the export, and the log's schema version.
    pub forgelog_version: String,
    pub schema_version: u32,
    /// File (relative to the export) → its SHA-256, hex.
    pub sha256: BTreeMap<String, String>,
    /// topic → partition → offset after the last message read.
    pub source_offsets: BTreeMap<String, BTreeMap<i32, i64>>,
}

impl Manifest {
    /// Records which models answered `calls` and which known versions sampled.
    fn note_sampling<'a>(
        &mut self,
        calls: &[CallFinished],
        versions: impl IntoIterator<Item = &'a i64>,
    ) {
        self.models.extend(
            calls
                .iter()
                .filter(|c| !c.model.is_empty())
                .map(|c| c.model.clone()),
        );
        self.policy_versions
            .extend(versions.into_iter().copied().filter(|&v| v >= 0));
    }
}

/// Rows for `trajectories` (in log order), scores by rollout id (absent: no batch yet).
pub fn rows(
    trajectories: &[TrajectoryBuilt],
    calls: &[CallFinished],
    scores: &BTreeMap<String, RolloutScore>,
    filter: &ExportFilter,
) -> (Vec<SftRow>, usize) {
    let by_call: BTreeMap<(&str, i64), &CallFinished> = calls
        .iter()
        .map(|c| ((c.session_id.as_str(), c.call_index), c))
        .collect();
    let mut out = Vec::new();
    let mut filtered_out = 0;
    for t in trajectories {
        let score = scores.get(&t.rollout_id).copied().unwrap_or_default();
        if !filter.keeps(score.reward) {
            filtered_out += t.sequences.iter().filter(|s| !s.discarded).count();
            continue;
        }
        for (path_index, s) in t.sequences.iter().enumerate().filter(|(_, s)| !s.discarded) {
            let call = |i: &i64| by_call.get(&(t.session_id.as_str(), *i)).copied();
            let last = s.call_indices.last().and_then(call);
            let (messages, tools, images) = match last.and_then(conversation) {
                Some(c) => (Some(c.messages), c.tools, c.images),
                None => (None, None, Vec::new()),
            };
            out.push(SftRow {
                row_id: format!("{}/{path_index}", t.rollout_id),
                run_id: t.run_id.clone(),
                task_id: t.task_id.clone(),
                group_id: t.group_id.clone(),
                harness: t.harness.clone(),
                rollout_id: t.rollout_id.clone(),
                path_index,
                call_indices: s.call_indices.clone(),
                reward: score.reward,
                advantage: score.advantage,
                input_ids: s.token_ids.clone(),
                loss_mask: s.loss_mask.clone(),
                sampling_logprobs: s.sampling_logprobs.clone(),
                policy_versions: s
                    .policy_versions
                    .iter()
                    .map(|&v| {
                        if v == UNKNOWN_POLICY_VERSION {
                            -1
                        } else {
                            v as i64
                        }
                    })
                    .collect(),
                finish_reasons: s
                    .call_indices
                    .iter()
                    .map(|i| call(i).and_then(|c| c.finish_reason.clone()))
                    .collect(),
                messages,
                tools,
                images,
            });
        }
    }
    (out, filtered_out)
}

/// A call's conversation as an SFT row holds it.
struct Conversation {
    messages: Value,
    tools: Option<Value>,
    images: Vec<String>,
}

/// The call's request messages followed by its answer, as Hugging Face
/// templates read them; its tools, if any; the images they show.
fn conversation(call: &CallFinished) -> Option<Conversation> {
    let view = call.chat_view()?;
    let answer = view.answer?;
    let mut images = Vec::new();
    let messages = view
        .messages
        .iter()
        .chain([&answer])
        .map(|m| with_images(m, &mut images))
        .collect();
    let tools = (!view.tools.is_empty()).then_some(Value::Array(view.tools));
    Some(Conversation {
        messages: Value::Array(messages),
        tools,
        images,
    })
}

/// `message` as Hugging Face templates read it ([`hf_message`]); one that
/// shows images keeps its content as parts, text and `{"type": "image"}` in
/// order, each image's URL appended to `images`.
fn with_images(message: &Value, images: &mut Vec<String>) -> Value {
    let mut hf = hf_message(message).into_owned();
    let Some(parts) = message.get("content").and_then(Value::as_array) else {
        return hf;
    };
    let url = |p: &Value| {
        p.pointer("/image_url/url")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    if !parts.iter().any(|p| url(p).is_some()) {
        return hf;
    }
    let content: Vec<Value> = parts
        .iter()
        .filter_map(|p| match (url(p), p.get("text").and_then(Value::as_str)) {
            (Some(url), _) => {
                images.push(url);
                Some(serde_json::json!({"type": "image"}))
            }
            (None, Some(text)) => Some(serde_json::json!({"type": "text", "text": text})),
            (None, None) => None,
        })
        .collect();
    hf["content"] = Value::Array(content);
    hf
}

#[cfg(test)]
mod tests;

/// Reads run `run` from the log (batches, trajectories, calls) and exports it
/// to `to`, a rollout at a time.
pub async fn export_run(
    reader: &impl forgelog_stream::LogReader,
    run: &str,
    to: &str,
    kind: ExportKind,
    filter: ExportFilter,
) -> Result<(Manifest, Vec<String>), Box<dyn std::error::Error + Send + Sync>> {
    let mut manifest = Manifest {
        run_id: run.into(),
        kind,
        filter: filter.clone(),
        forgelog_version: env!("CARGO_PKG_VERSION").into(),
        schema_version: forgelog_schemas::SCHEMA_VERSION,
        ..Default::default()
    };
    let mut offsets = source::SourceOffsets::new();
    let batches = source::batches(reader, run, &mut offsets)?;
    let mut files = Files::create(to)?;
    if kind == ExportKind::Atif {
        let mut documents = DocumentWriter::new()?;
        source::each_rollout::<StreamedError>(reader, run, &mut offsets, |t, calls| {
            let reward = batches.scores.get(&t.rollout_id).and_then(|s| s.reward);
            if !filter.keeps(reward) {
                manifest.filtered_out += 1;
                return Ok(());
            }
            for (name, document) in atif::trajectories(&[t], &calls, &batches.scores) {
                documents.push(name, &document)?;
            }
            manifest.note_sampling(&calls, []);
            Ok(())
        })?;
        documents.finish(&mut files, &mut manifest).await?;
    } else {
        let mut writer = RowWriter::new(kind)?;
        let mut preferences =
            (kind == ExportKind::Rl).then(|| rl::GroupPreferences::new(&batches.groups));
        source::each_rollout::<StreamedError>(reader, run, &mut offsets, |t, calls| {
            let group = t.group_id.clone();
            let (rows, filtered_out) = rows(&[t], &calls, &batches.scores, &filter);
            manifest.filtered_out += filtered_out;
            if !rows.is_empty() {
                manifest.note_sampling(&calls, rows.iter().flat_map(|r| &r.policy_versions));
            }
            if let Some((pairs, kto)) = preferences.as_mut().and_then(|p| p.add(&group, &rows)) {
                writer.preferences(&pairs, &kto)?;
            }
            for row in rows {
                writer.push(row)?;
            }
            Ok(())
        })?;
        if let Some(preferences) = preferences {
            let (pairs, kto) = preferences.rest();
            writer.preferences(&pairs, &kto)?;
        }
        writer.finish(&mut files, &mut manifest).await?;
    }
    manifest.source_offsets = offsets;
    let written = files.finish(&mut manifest).await?;
    Ok((manifest, written))
}

/// What stops a streamed export: the log or the files.
#[derive(Debug, thiserror::Error)]
enum StreamedError {
    #[error(transparent)]
    Source(#[from] source::SourceError),
    #[error(transparent)]
    Export(#[from] ExportError),
}
