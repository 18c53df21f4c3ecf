//! Exports written as their rows come, through temporary files, in memory
//! bounded by a row group per harness.

use super::super::{rl, ExportKind, Manifest, SftRow};
use super::card::{dataset_card, tokens_file};
use super::encode::{json_lines, jsonl_line, parquet_writer, record_batch, row_group_full};
use super::{ExportError, Files};
use parquet::arrow::ArrowWriter;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

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
