//! Export files: JSONL and Parquet bytes, a dataset card, written through
//! object_store.

use super::{rl, ExportKind, Manifest, SftRow};
use arrow_array::builder::{
    Float32Builder, Float64Builder, Int64Builder, ListBuilder, StringBuilder, UInt32Builder,
    UInt8Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use forgelog_stream::store::Location;
use object_store::{ObjectStoreExt, PutPayload};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Rows per Parquet row group (and per Arrow batch built at a time): a reader
/// never needs more than this many sequences in memory.
pub const ROW_GROUP_ROWS: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("export destination {url}: {why}")]
    Destination { url: String, why: String },
    #[error("writing {path}: {source}")]
    Store {
        path: String,
        source: object_store::Error,
    },
    #[error("parquet: {0}")]
    Parquet(#[from] ::parquet::errors::ParquetError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
}

/// One JSON object per line: the conversation (`messages`, `tools` when
/// present) and every column of the Parquet row (`row_id` joins them). Rows
/// without a chat view are left out.
pub fn jsonl(rows: &[&SftRow]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in rows {
        let Some(messages) = &r.messages else {
            continue;
        };
        let mut line = serde_json::json!({
            "messages": messages,
            "row_id": r.row_id,
            "run_id": r.run_id,
            "task_id": r.task_id,
            "group_id": r.group_id,
            "harness": r.harness,
            "rollout_id": r.rollout_id,
            "path_index": r.path_index,
            "call_indices": r.call_indices,
            "reward": r.reward,
            "advantage": r.advantage,
            "input_ids": r.input_ids,
            "loss_mask": r.loss_mask,
            "assistant_masks": r.loss_mask,
            "labels": r.labels(),
            "sampling_logprobs": r.sampling_logprobs,
            "policy_versions": r.policy_versions,
            "finish_reasons": r.finish_reasons,
        });
        if let Some(tools) = &r.tools {
            line["tools"] = tools.clone();
        }
        serde_json::to_writer(&mut out, &line).expect("json values serialize");
        out.push(b'\n');
    }
    out
}

/// One Arrow batch of pre-tokenized rows with their provenance; `messages`
/// and `tools` as JSON text (their shapes vary row to row).
fn record_batch(rows: &[&SftRow]) -> Result<RecordBatch, ExportError> {
    let strings = |f: &dyn Fn(&SftRow) -> Option<String>| {
        let mut b = StringBuilder::new();
        for r in rows {
            b.append_option(f(r));
        }
        Arc::new(b.finish()) as ArrayRef
    };
    let floats = |f: &dyn Fn(&SftRow) -> Option<f64>| {
        let mut b = Float64Builder::new();
        for r in rows {
            b.append_option(f(r));
        }
        Arc::new(b.finish()) as ArrayRef
    };
    let mut path = Int64Builder::new();
    let mut calls = ListBuilder::new(Int64Builder::new());
    let mut ids = ListBuilder::new(UInt32Builder::new());
    let mut mask = ListBuilder::new(UInt8Builder::new());
    let mut assistant = ListBuilder::new(UInt8Builder::new());
    let mut labels = ListBuilder::new(Int64Builder::new());
    let mut logprobs = ListBuilder::new(Float32Builder::new());
    let mut versions = ListBuilder::new(Int64Builder::new());
    let mut finish = ListBuilder::new(StringBuilder::new());
    for r in rows {
        path.append_value(r.path_index as i64);
        calls.values().append_slice(&r.call_indices);
        calls.append(true);
        ids.values().append_slice(&r.input_ids);
        ids.append(true);
        mask.values().append_slice(&r.loss_mask);
        mask.append(true);
        assistant.values().append_slice(&r.loss_mask);
        assistant.append(true);
        labels.values().append_slice(&r.labels());
        labels.append(true);
        logprobs.values().append_slice(&r.sampling_logprobs);
        logprobs.append(true);
        versions.values().append_slice(&r.policy_versions);
        versions.append(true);
        for reason in &r.finish_reasons {
            finish.values().append_option(reason.as_deref());
        }
        finish.append(true);
    }
    let json = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string());
    let columns: Vec<(&str, ArrayRef, bool)> = vec![
        ("row_id", strings(&|r| Some(r.row_id.clone())), false),
        ("run_id", strings(&|r| Some(r.run_id.clone())), false),
        ("task_id", strings(&|r| Some(r.task_id.clone())), false),
        ("group_id", strings(&|r| Some(r.group_id.clone())), false),
        ("harness", strings(&|r| Some(r.harness.clone())), false),
        (
            "rollout_id",
            strings(&|r| Some(r.rollout_id.clone())),
            false,
        ),
        ("path_index", Arc::new(path.finish()), false),
        ("call_indices", Arc::new(calls.finish()), false),
        // Always nullable, so that every export of every run has one schema.
        ("reward", floats(&|r| r.reward), true),
        ("advantage", floats(&|r| r.advantage), true),
        ("input_ids", Arc::new(ids.finish()), false),
        ("loss_mask", Arc::new(mask.finish()), false),
        ("assistant_masks", Arc::new(assistant.finish()), false),
        ("labels", Arc::new(labels.finish()), false),
        ("sampling_logprobs", Arc::new(logprobs.finish()), false),
        ("policy_versions", Arc::new(versions.finish()), false),
        ("finish_reasons", Arc::new(finish.finish()), false),
        ("messages_json", strings(&|r| json(&r.messages)), true),
        ("tools_json", strings(&|r| json(&r.tools)), true),
    ];
    Ok(RecordBatch::try_from_iter_with_nullable(columns)?)
}

/// Pre-tokenized rows with their provenance, zstd-compressed, in row groups
/// of [`ROW_GROUP_ROWS`] built one at a time.
pub fn parquet(rows: &[&SftRow]) -> Result<Vec<u8>, ExportError> {
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_max_row_group_size(ROW_GROUP_ROWS)
        .build();
    let schema = record_batch(&[])?.schema();
    let mut out = Vec::new();
    let mut writer = ::parquet::arrow::ArrowWriter::try_new(&mut out, schema, Some(properties))?;
    for chunk in rows.chunks(ROW_GROUP_ROWS) {
        writer.write(&record_batch(chunk)?)?;
        writer.flush()?;
    }
    writer.close()?;
    Ok(out)
}

/// The dataset card: a Hugging Face `README.md` whose `configs:` make each
/// harness a config of the tokenized Parquet (`load_dataset(dir, "codex")`),
/// `all` the default. (`datasets` reads one file format per folder, so the
/// conversational JSONL is loaded by its path: the card says how.)
pub fn dataset_card(manifest: &Manifest) -> String {
    let tokens = tokens_file(manifest.kind);
    let mut yaml = String::from("---\nconfigs:\n");
    let config = |yaml: &mut String, name: &str, path: &str, default: bool| {
        yaml.push_str(&format!("- config_name: {name}\n"));
        if default {
            yaml.push_str("  default: true\n");
        }
        yaml.push_str(&format!(
            "  data_files:\n  - split: train\n    path: \"{path}\"\n"
        ));
    };
    config(&mut yaml, "all", &format!("*/{tokens}"), true);
    for harness in manifest.rows.keys() {
        config(&mut yaml, harness, &format!("{harness}/{tokens}"), false);
    }
    yaml.push_str("tags:\n- forgelog\n- agent-trajectories\n---\n\n");
    let table: String = manifest
        .rows
        .iter()
        .map(|(h, n)| {
            let chat = manifest.jsonl_rows.get(h).copied().unwrap_or(0);
            format!("| `{h}` | {n} | {chat} |\n")
        })
        .collect();
    format!(
        "{yaml}# forgelog run `{run}`\n\n\
         Agent trajectories recorded by forgelog {version} (log schema v{schema}): one row per path of \
         each rollout's trajectory tree, with the exact token ids the model was given and sampled.\n\n\
         | harness (config) | rows (Parquet) | rows with messages (JSONL) |\n|---|---|---|\n{table}\n\
         `load_dataset(\"path/to/export\", \"HARNESS\")` gives a harness's tokenized rows; \
         `load_dataset(\"json\", data_files=\"path/to/export/HARNESS/sft.jsonl\")` its conversations.\n\n\
         Columns: `input_ids`, `loss_mask` (= `assistant_masks`: 1 where the model sampled), `labels` \
         (-100 off the mask), `sampling_logprobs`, `policy_versions` (-1 where unknown), \
         `finish_reasons` (one per call on the path), `reward` and `advantage` (null before the \
         rollout was scored), and where each row comes from (`run_id`, `task_id`, `group_id`, \
         `harness`, `rollout_id`, `path_index`; `row_id` joins a JSONL row to its Parquet row). \
         The JSONL's `messages` are in the shape Hugging Face chat templates read (content a \
         string, tool-call arguments a mapping); the Parquet keeps them as `messages_json`.\n\n\
         {rl}`manifest.json` lists the filter, the log offsets read and each file's SHA-256.\n",
        rl = match manifest.kind {
            ExportKind::Sft | ExportKind::Atif => "",
            ExportKind::Rl => "An RL export keeps every path, scored or not; `dpo.jsonl` holds a DPO pair \
                per group whose rewards differ (its best rollout `chosen`, its worst `rejected`, after the \
                `prompt` messages both share) and `kto.jsonl` every scored rollout of such groups \
                (`label`: reward above the group's mean), in TRL's conversational shapes.\n\n",
        },
        run = manifest.run_id,
        version = manifest.forgelog_version,
        schema = manifest.schema_version,
    )
}

/// The Parquet of tokenized rows an export of `kind` writes per harness.
fn tokens_file(kind: ExportKind) -> &'static str {
    match kind {
        ExportKind::Sft => "sft.parquet",
        ExportKind::Rl | ExportKind::Atif => "paths.parquet",
    }
}

/// JSON lines of `items`.
fn json_lines<T: serde::Serialize>(items: &[T]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        serde_json::to_writer(&mut out, item).expect("json values serialize");
        out.push(b'\n');
    }
    out
}

/// Writes per harness what an export of `manifest.kind` holds (SFT:
/// `sft.jsonl` and `sft.parquet`; RL: `paths.parquet`, and for the whole run
/// `dpo.jsonl` and `kto.jsonl`), then `README.md` (the dataset card) and `manifest.json`,
/// through object_store (`file://`, `s3://`, ...), one harness at a time.
/// Returns the paths written.
pub async fn write(
    to: &str,
    rows: &[SftRow],
    manifest: &mut Manifest,
) -> Result<Vec<String>, ExportError> {
    let mut by_harness: BTreeMap<&str, Vec<&SftRow>> = BTreeMap::new();
    for r in rows {
        by_harness.entry(&r.harness).or_default().push(r);
    }
    let mut files = Files::create(to)?;
    for (harness, rows) in &by_harness {
        let h = harness.to_string();
        manifest.rows.insert(h.clone(), rows.len());
        if manifest.kind == ExportKind::Sft {
            let chats = rows.iter().filter(|r| r.messages.is_some()).count();
            manifest.jsonl_rows.insert(h, chats);
            files
                .put(&format!("{harness}/sft.jsonl"), jsonl(rows))
                .await?;
        }
        let tokens = format!("{harness}/{}", tokens_file(manifest.kind));
        files.put(&tokens, parquet(rows)?).await?;
    }
    if manifest.kind == ExportKind::Rl {
        // A group may span harnesses (one task, several harnesses): its
        // preference data is the whole run's, not a harness's.
        let all: Vec<&SftRow> = rows.iter().collect();
        let (pairs, kto) = (rl::preference_pairs(&all), rl::kto_examples(&all));
        manifest.dpo_pairs = Some(pairs.len());
        manifest.kto_examples = Some(kto.len());
        files.put("dpo.jsonl", json_lines(&pairs)).await?;
        files.put("kto.jsonl", json_lines(&kto)).await?;
    }
    files
        .put("README.md", dataset_card(manifest).into_bytes())
        .await?;
    files.finish(manifest).await
}

/// `export atif`: one JSON document per rollout (named `harness/rollout.json`),
/// then the manifest.
pub async fn write_documents(
    to: &str,
    documents: &[(String, serde_json::Value)],
    manifest: &mut Manifest,
) -> Result<Vec<String>, ExportError> {
    let mut files = Files::create(to)?;
    for (name, document) in documents {
        let harness = name.split('/').next().unwrap_or_default();
        *manifest.rows.entry(harness.to_string()).or_default() += 1;
        let bytes = serde_json::to_vec_pretty(document).expect("a JSON value serializes");
        files.put(name, bytes).await?;
    }
    files.finish(manifest).await
}

/// An export's destination and what has been written to it.
struct Files {
    location: Location,
    /// The URLs written, in order.
    written: Vec<String>,
    /// Name → SHA-256 (hex) of each file written.
    sha256: BTreeMap<String, String>,
}

impl Files {
    fn create(to: &str) -> Result<Files, ExportError> {
        let location =
            forgelog_stream::store::create(to).map_err(|e| ExportError::Destination {
                url: to.to_string(),
                why: e.why,
            })?;
        Ok(Files {
            location,
            written: Vec::new(),
            sha256: BTreeMap::new(),
        })
    }

    /// Writes the manifest last: it lists every other file's checksum, so it
    /// cannot hold its own. Returns every URL written.
    async fn finish(mut self, manifest: &mut Manifest) -> Result<Vec<String>, ExportError> {
        manifest.sha256 = std::mem::take(&mut self.sha256);
        let bytes = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
        self.put("manifest.json", bytes).await?;
        Ok(self.written)
    }

    /// Writes `name` under the destination, noting its URL and checksum.
    async fn put(&mut self, name: &str, bytes: Vec<u8>) -> Result<(), ExportError> {
        self.sha256
            .insert(name.into(), format!("{:x}", Sha256::digest(&bytes)));
        let path = self.location.path(name);
        self.location
            .store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|source| ExportError::Store {
                path: path.to_string(),
                source,
            })?;
        let url = self.location.url.as_str().trim_end_matches('/');
        self.written.push(format!("{url}/{name}"));
        Ok(())
    }
}
