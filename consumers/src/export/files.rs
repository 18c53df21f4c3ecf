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
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Rows per Parquet row group (and per Arrow batch built at a time) at most:
/// a reader never needs more than this many sequences in memory.
pub const ROW_GROUP_ROWS: usize = 256;

/// Tokens per row group at most (it ends at the row that reaches this): long
/// agent sequences (100k tokens and more) bound a group by size, not count.
/// About 30 MB of columns.
pub const ROW_GROUP_TOKENS: usize = 1 << 20;

/// Whether a row group of `rows` rows and `tokens` tokens is complete.
fn row_group_full(rows: usize, tokens: usize) -> bool {
    rows >= ROW_GROUP_ROWS || tokens >= ROW_GROUP_TOKENS
}

/// `rows` cut into row groups.
fn row_groups<'a, 'r>(rows: &'a [&'r SftRow]) -> impl Iterator<Item = &'a [&'r SftRow]> {
    let mut rest = rows;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut tokens = 0;
        let mut n = 0;
        while n < rest.len() {
            tokens += rest[n].input_ids.len();
            n += 1;
            if row_group_full(n, tokens) {
                break;
            }
        }
        let (group, tail) = rest.split_at(n);
        rest = tail;
        Some(group)
    })
}

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
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl ExportError {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ExportError {
        let what = what.into();
        move |source| ExportError::Io { what, source }
    }
}

/// One JSON object per line: the conversation (`messages`, `tools` when
/// present) and every column of the Parquet row (`row_id` joins them). Rows
/// without a chat view are left out.
pub fn jsonl(rows: &[&SftRow]) -> Vec<u8> {
    rows.iter()
        .filter_map(|r| jsonl_line(r))
        .flatten()
        .collect()
}

/// `r`'s JSONL line, newline included; none without a chat view.
fn jsonl_line(r: &SftRow) -> Option<Vec<u8>> {
    let messages = r.messages.as_ref()?;
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
    let mut out = serde_json::to_vec(&line).expect("json values serialize");
    out.push(b'\n');
    Some(out)
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

fn parquet_properties() -> Result<WriterProperties, ExportError> {
    Ok(WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_max_row_group_size(ROW_GROUP_ROWS)
        .build())
}

fn parquet_writer<W: Write + Send>(out: W) -> Result<ArrowWriter<W>, ExportError> {
    let schema = record_batch(&[])?.schema();
    Ok(ArrowWriter::try_new(
        out,
        schema,
        Some(parquet_properties()?),
    )?)
}

/// Pre-tokenized rows with their provenance, zstd-compressed, in row groups
/// of at most [`ROW_GROUP_ROWS`] rows and about [`ROW_GROUP_TOKENS`] tokens,
/// built one at a time.
pub fn parquet(rows: &[&SftRow]) -> Result<Vec<u8>, ExportError> {
    let mut out = Vec::new();
    let mut writer = parquet_writer(&mut out)?;
    for chunk in row_groups(rows) {
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

/// One harness's files while rows come in.
struct HarnessFiles {
    jsonl: Option<(PathBuf, std::io::BufWriter<std::fs::File>)>,
    parquet: (PathBuf, ArrowWriter<std::fs::File>),
    /// The row group being gathered, and its tokens.
    group: Vec<SftRow>,
    group_tokens: usize,
    rows: usize,
    jsonl_rows: usize,
}

/// An SFT or RL export written as its rows come, in memory bounded by a row
/// group per harness: per harness the JSONL (SFT) and the Parquet go to
/// temporary files, the Parquet a row group at a time; the preference data
/// (RL) likewise; [`RowWriter::finish`] copies them to the destination, then
/// writes the dataset card.
pub struct RowWriter {
    kind: ExportKind,
    dir: tempfile::TempDir,
    harnesses: BTreeMap<String, HarnessFiles>,
    /// `dpo.jsonl` and `kto.jsonl`, for an RL export.
    preferences: Option<[(PathBuf, std::io::BufWriter<std::fs::File>); 2]>,
}

impl RowWriter {
    pub fn new(kind: ExportKind) -> Result<RowWriter, ExportError> {
        let dir = tempfile::tempdir().map_err(ExportError::io("a temporary folder"))?;
        let preferences = match kind {
            ExportKind::Rl => Some([
                temp_file(dir.path(), "dpo.jsonl")?,
                temp_file(dir.path(), "kto.jsonl")?,
            ]),
            _ => None,
        };
        Ok(RowWriter {
            kind,
            dir,
            harnesses: BTreeMap::new(),
            preferences,
        })
    }

    pub fn push(&mut self, row: SftRow) -> Result<(), ExportError> {
        if !self.harnesses.contains_key(&row.harness) {
            let n = self.harnesses.len();
            let jsonl = match self.kind {
                ExportKind::Sft => Some(temp_file(self.dir.path(), &format!("{n}.jsonl"))?),
                _ => None,
            };
            let path = self.dir.path().join(format!("{n}.parquet"));
            let file = std::fs::File::create(&path)
                .map_err(ExportError::io(path.display().to_string()))?;
            let files = HarnessFiles {
                jsonl,
                parquet: (path, parquet_writer(file)?),
                group: Vec::new(),
                group_tokens: 0,
                rows: 0,
                jsonl_rows: 0,
            };
            self.harnesses.insert(row.harness.clone(), files);
        }
        let files = self.harnesses.get_mut(&row.harness).expect("inserted");
        files.rows += 1;
        if let (Some((path, out)), Some(line)) = (&mut files.jsonl, jsonl_line(&row)) {
            out.write_all(&line)
                .map_err(ExportError::io(path.display().to_string()))?;
            files.jsonl_rows += 1;
        }
        files.group_tokens += row.input_ids.len();
        files.group.push(row);
        if row_group_full(files.group.len(), files.group_tokens) {
            files.write_group()?;
        }
        Ok(())
    }

    /// A group's preference data (RL).
    pub fn preferences(
        &mut self,
        pairs: &[rl::PreferencePair],
        kto: &[rl::KtoExample],
    ) -> Result<(), ExportError> {
        let Some([(dpo_path, dpo), (kto_path, kto_out)]) = &mut self.preferences else {
            return Ok(());
        };
        dpo.write_all(&json_lines(pairs))
            .map_err(ExportError::io(dpo_path.display().to_string()))?;
        kto_out
            .write_all(&json_lines(kto))
            .map_err(ExportError::io(kto_path.display().to_string()))?;
        Ok(())
    }

    /// Closes the files, copies them under `files` and notes their counts in
    /// `manifest`; then the dataset card.
    pub async fn finish(
        self,
        files: &mut Files,
        manifest: &mut Manifest,
    ) -> Result<(), ExportError> {
        for (harness, mut h) in self.harnesses {
            h.write_group()?;
            manifest.rows.insert(harness.clone(), h.rows);
            if let Some((path, out)) = h.jsonl {
                close(out, &path)?;
                manifest.jsonl_rows.insert(harness.clone(), h.jsonl_rows);
                files
                    .put_file(&format!("{harness}/sft.jsonl"), &path)
                    .await?;
            }
            let (path, writer) = h.parquet;
            writer.close()?;
            let tokens = format!("{harness}/{}", tokens_file(manifest.kind));
            files.put_file(&tokens, &path).await?;
        }
        if let Some(preferences) = self.preferences {
            let mut counts = [0usize; 2];
            for (i, (path, out)) in preferences.into_iter().enumerate() {
                close(out, &path)?;
                counts[i] = count_lines(&path)?;
                let name = path
                    .file_name()
                    .expect("named")
                    .to_string_lossy()
                    .into_owned();
                files.put_file(&name, &path).await?;
            }
            manifest.dpo_pairs = Some(counts[0]);
            manifest.kto_examples = Some(counts[1]);
        }
        files
            .put("README.md", dataset_card(manifest).into_bytes())
            .await
    }
}

impl HarnessFiles {
    fn write_group(&mut self) -> Result<(), ExportError> {
        if self.group.is_empty() {
            return Ok(());
        }
        let refs: Vec<&SftRow> = self.group.iter().collect();
        self.parquet.1.write(&record_batch(&refs)?)?;
        self.parquet.1.flush()?;
        self.group.clear();
        self.group_tokens = 0;
        Ok(())
    }
}

/// `export atif`: one JSON document per rollout (named `harness/rollout.json`),
/// each in a temporary file until [`DocumentWriter::finish`] copies them.
pub struct DocumentWriter {
    dir: tempfile::TempDir,
    /// (name under the export, its temporary file).
    written: Vec<(String, PathBuf)>,
}

impl DocumentWriter {
    pub fn new() -> Result<DocumentWriter, ExportError> {
        Ok(DocumentWriter {
            dir: tempfile::tempdir().map_err(ExportError::io("a temporary folder"))?,
            written: Vec::new(),
        })
    }

    pub fn push(&mut self, name: String, document: &serde_json::Value) -> Result<(), ExportError> {
        let path = self.dir.path().join(format!("{}.json", self.written.len()));
        let bytes = serde_json::to_vec_pretty(document).expect("a JSON value serializes");
        std::fs::write(&path, bytes).map_err(ExportError::io(path.display().to_string()))?;
        self.written.push((name, path));
        Ok(())
    }

    pub async fn finish(
        self,
        files: &mut Files,
        manifest: &mut Manifest,
    ) -> Result<(), ExportError> {
        for (name, path) in &self.written {
            let harness = name.split('/').next().unwrap_or_default();
            *manifest.rows.entry(harness.to_string()).or_default() += 1;
            files.put_file(name, path).await?;
        }
        Ok(())
    }
}

fn temp_file(
    dir: &Path,
    name: &str,
) -> Result<(PathBuf, std::io::BufWriter<std::fs::File>), ExportError> {
    let path = dir.join(name);
    let file = std::fs::File::create(&path).map_err(ExportError::io(path.display().to_string()))?;
    Ok((path, std::io::BufWriter::new(file)))
}

fn close(mut out: std::io::BufWriter<std::fs::File>, path: &Path) -> Result<(), ExportError> {
    out.flush()
        .map_err(ExportError::io(path.display().to_string()))
}

fn count_lines(path: &Path) -> Result<usize, ExportError> {
    use std::io::BufRead;
    let file = std::fs::File::open(path).map_err(ExportError::io(path.display().to_string()))?;
    Ok(std::io::BufReader::new(file).split(b'\n').count())
}

/// An export's destination and what has been written to it.
pub struct Files {
    location: Location,
    /// The URLs written, in order.
    written: Vec<String>,
    /// Name → SHA-256 (hex) of each file written.
    sha256: BTreeMap<String, String>,
}

impl Files {
    pub fn create(to: &str) -> Result<Files, ExportError> {
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
    pub async fn finish(mut self, manifest: &mut Manifest) -> Result<Vec<String>, ExportError> {
        manifest.sha256 = std::mem::take(&mut self.sha256);
        let bytes = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
        self.put("manifest.json", bytes).await?;
        Ok(self.written)
    }

    /// Copies the local file `from` to `name` under the destination, a
    /// chunk at a time (a multipart upload where the store has them), noting
    /// its URL and checksum.
    async fn put_file(&mut self, name: &str, from: &Path) -> Result<(), ExportError> {
        let path = self.location.path(name);
        let what = || format!("writing {path}");
        let mut upload =
            object_store::buffered::BufWriter::new(self.location.store.clone(), path.clone());
        let mut file = tokio::fs::File::open(from)
            .await
            .map_err(ExportError::io(from.display().to_string()))?;
        let mut hash = Sha256::new();
        let mut chunk = vec![0; 1 << 20];
        loop {
            let n = file
                .read(&mut chunk)
                .await
                .map_err(ExportError::io(from.display().to_string()))?;
            if n == 0 {
                break;
            }
            hash.update(&chunk[..n]);
            upload
                .write_all(&chunk[..n])
                .await
                .map_err(ExportError::io(what()))?;
        }
        upload.shutdown().await.map_err(ExportError::io(what()))?;
        self.sha256
            .insert(name.into(), format!("{:x}", hash.finalize()));
        let url = self.location.url.as_str().trim_end_matches('/');
        self.written.push(format!("{url}/{name}"));
        Ok(())
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
