//! A run as one file: its events of every topic, in log order, in an Avro
//! object container file (readable by any Avro reader: `fastavro`, the Java
//! tools), with where each sat in the log and a SHA-256 of each record and of
//! the whole. A [`Bundle`] read back is a [`LogReader`] of that run alone, so
//! every per-run reader (rebuild, export, report) takes one in place of a
//! broker. A claim-checked event is bundled whole: the bundle needs no object
//! store either.

use crate::{ConsumeError, LogReader};
use apache_avro::types::Value;
use forgelog_schemas::{Event, Received, Topic};
use header::header_keys_are_ours;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod header;

/// The bundle format's version, in the file's metadata.
pub const BUNDLE_VERSION: &str = "1";

/// Each record: where it sat in the log, its key, its event's bytes (a claim
/// check resolved) and the SHA-256 of all of those.
const SCHEMA: &str = r#"{"type": "record", "name": "BundleRecord", "namespace": "forgelog.bundle",
 "fields": [
  {"name": "topic", "type": "string"},
  {"name": "partition", "type": "int"},
  {"name": "offset", "type": "long"},
  {"name": "key", "type": "bytes"},
  {"name": "value", "type": "bytes"},
  {"name": "sha256", "type": "bytes"}
 ]}"#;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("reading run {run} from the log: {source}")]
    Log { run: String, source: ConsumeError },
    #[error("run {0} has no events in the log")]
    Empty(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a forgelog bundle: {why}")]
    NotABundle { path: PathBuf, why: String },
    #[error("{path}: refused at byte {at}: {why}")]
    Refused { path: PathBuf, at: u64, why: String },
    #[error("writing the bundle: {0}")]
    Avro(String),
}

/// One record of a bundle.
#[derive(Debug, Clone, PartialEq)]
struct Record {
    topic: String,
    partition: i32,
    offset: i64,
    key: Vec<u8>,
    value: Vec<u8>,
}

impl Record {
    fn sha256(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.topic.as_bytes());
        h.update([0]);
        h.update(self.partition.to_be_bytes());
        h.update(self.offset.to_be_bytes());
        h.update((self.key.len() as u64).to_be_bytes());
        h.update(&self.key);
        h.update(&self.value);
        h.finalize().into()
    }

    fn to_avro(&self) -> Value {
        Value::Record(vec![
            ("topic".into(), Value::String(self.topic.clone())),
            ("partition".into(), Value::Int(self.partition)),
            ("offset".into(), Value::Long(self.offset)),
            ("key".into(), Value::Bytes(self.key.clone())),
            ("value".into(), Value::Bytes(self.value.clone())),
            ("sha256".into(), Value::Bytes(self.sha256().to_vec())),
        ])
    }

    /// The record and the digest it was written with.
    fn from_avro(value: Value) -> Result<(Record, Vec<u8>), String> {
        let Value::Record(fields) = value else {
            return Err("a record that is not a BundleRecord".into());
        };
        let mut fields: BTreeMap<String, Value> = fields.into_iter().collect();
        let mut take = |name: &str| {
            fields
                .remove(name)
                .ok_or_else(|| format!("a record without its {name}"))
        };
        let bytes = |v: Value| match v {
            Value::Bytes(b) => Ok(b),
            other => Err(format!("bytes expected, found {other:?}")),
        };
        let record = Record {
            topic: match take("topic")? {
                Value::String(s) => s,
                other => return Err(format!("topic: {other:?}")),
            },
            partition: match take("partition")? {
                Value::Int(p) => p,
                other => return Err(format!("partition: {other:?}")),
            },
            offset: match take("offset")? {
                Value::Long(o) => o,
                other => return Err(format!("offset: {other:?}")),
            },
            key: bytes(take("key")?)?,
            value: bytes(take("value")?)?,
        };
        let sha = bytes(take("sha256")?)?;
        Ok((record, sha))
    }
}

/// The SHA-256 of a bundle: its manifest, then each record's own digest in
/// order.
fn whole_digest<'a>(manifest: &str, digests: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut h = Sha256::new();
    h.update((manifest.len() as u64).to_be_bytes());
    h.update(manifest.as_bytes());
    for d in digests {
        h.update(d);
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a bundle says of itself beside its records.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BundleManifest {
    pub run: String,
    pub records: u64,
    /// topic → how many of its records the bundle holds.
    pub topics: BTreeMap<String, u64>,
    /// What the run was made with, by SHA-256 (hex): `tokenizer`,
    /// `chat_template` (as the proxy's prompts name them), and what the
    /// writer adds (`task/ID`, `harness/NAME`).
    pub hashes: BTreeMap<String, Vec<String>>,
    /// Records of the run that did not decode, left out.
    pub left_out: u64,
}

/// Writes run `run`'s events of every topic (as `reader` has them now) to
/// `to`, with `hashes` beside those the events name; what it wrote.
pub fn write_bundle(
    reader: &impl LogReader,
    run: &str,
    to: &Path,
    hashes: BTreeMap<String, Vec<String>>,
) -> Result<BundleManifest, BundleError> {
    let mut records = Vec::new();
    let mut manifest = BundleManifest {
        run: run.to_string(),
        hashes,
        ..Default::default()
    };
    let mut named = |key: &str, sha: &str| {
        let list = manifest.hashes.entry(key.to_string()).or_default();
        if !list.iter().any(|s| s == sha) {
            list.push(sha.to_string());
        }
    };
    let log = |source| BundleError::Log {
        run: run.to_string(),
        source,
    };
    for topic in Topic::ALL {
        // The run's own records (and the undecodable ones, whose run nobody
        // can say), through the one per-run reader: from where the run starts.
        reader
            .for_each_of_run(topic.name(), run, |r| {
                match &r.event {
                    Ok(event) if event.run_id() == run => {
                        if let Event::CallFinished(c) = event {
                            if let Some(p) = &c.prompt_made {
                                named("tokenizer", &p.tokenizer_sha256);
                                named("chat_template", &p.chat_template_sha256);
                            }
                        }
                        // A claim check is bundled as the bytes it names
                        // (they decoded just now, so they are there).
                        let value = match crate::claims::event_bytes(&r.value) {
                            Ok(bytes) => bytes.into_owned(),
                            Err(_) => r.value.clone(),
                        };
                        records.push(Record {
                            value,
                            topic: r.topic,
                            partition: r.partition,
                            offset: r.offset,
                            key: r.key,
                        });
                    }
                    Ok(_) => {}
                    Err(_) => manifest.left_out += 1,
                }
                ControlFlow::Continue(())
            })
            .map_err(log)?;
    }
    if records.is_empty() {
        return Err(BundleError::Empty(run.to_string()));
    }
    for r in &records {
        *manifest.topics.entry(r.topic.clone()).or_default() += 1;
    }
    manifest.records = records.len() as u64;
    let digests: Vec<[u8; 32]> = records.iter().map(Record::sha256).collect();
    let manifest_json = serde_json::to_string(&manifest).expect("a manifest serializes");
    let whole = whole_digest(&manifest_json, digests.iter().map(|d| &d[..]));

    let io = |source| BundleError::Io {
        path: to.to_path_buf(),
        source,
    };
    let avro = |e: apache_avro::Error| BundleError::Avro(e.to_string());
    // Written beside, then renamed: a bundle is whole or not there.
    let dir = to.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let file = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    let schema = apache_avro::Schema::parse_str(SCHEMA).map_err(avro)?;
    let mut writer = apache_avro::Writer::with_codec(
        &schema,
        std::io::BufWriter::new(file),
        apache_avro::Codec::Null,
    );
    let meta = [
        ("forgelog.bundle", BUNDLE_VERSION.to_string()),
        ("forgelog.manifest", manifest_json),
        ("forgelog.sha256", whole),
    ];
    for (k, v) in meta {
        writer.add_user_metadata(k.to_string(), v).map_err(avro)?;
    }
    for r in &records {
        writer.append(r.to_avro()).map_err(avro)?;
    }
    let file = writer
        .into_inner()
        .map_err(avro)?
        .into_inner()
        .map_err(|e| io(e.into_error()))?;
    file.as_file().sync_all().map_err(io)?;
    file.persist(to).map_err(|e| io(e.error))?;
    Ok(manifest)
}

/// Counts the bytes read through it: where in the file a refusal happened.
struct Counting<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A record as a bundle holds it: (offset, key, value).
type Stored = (i64, Vec<u8>, Vec<u8>);

/// A bundle read back whole and checked: run [`manifest`](Bundle::manifest)'s
/// events as the log held them, served as a [`LogReader`].
#[derive(Debug)]
pub struct Bundle {
    pub manifest: BundleManifest,
    /// topic → partition → its records, in offset order.
    topics: BTreeMap<String, BTreeMap<i32, Vec<Stored>>>,
}

impl Bundle {
    /// Reads and checks the bundle at `path`: a file cut short or altered
    /// anywhere is refused, with the byte where it was found and why.
    pub fn open(path: &Path) -> Result<Bundle, BundleError> {
        let file = std::fs::File::open(path).map_err(|source| BundleError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let len = file.metadata().map(|m| m.len()).unwrap_or_default();
        let read = Arc::new(AtomicU64::new(0));
        let counting = Counting {
            inner: std::io::BufReader::with_capacity(64 * 1024, file),
            read: read.clone(),
        };
        let not_a_bundle = |why: String| BundleError::NotABundle {
            path: path.to_path_buf(),
            why,
        };
        header_keys_are_ours(path).map_err(not_a_bundle)?;
        let reader = apache_avro::Reader::new(counting).map_err(|e| not_a_bundle(e.to_string()))?;
        let meta = reader.user_metadata();
        let text = |key: &str| {
            meta.get(key)
                .map(|v| String::from_utf8_lossy(v).to_string())
                .ok_or_else(|| not_a_bundle(format!("no {key} in its metadata")))
        };
        let version = text("forgelog.bundle")?;
        if version != BUNDLE_VERSION {
            return Err(not_a_bundle(format!(
                "bundle format {version}; this forgelog reads {BUNDLE_VERSION}"
            )));
        }
        let ours = apache_avro::Schema::parse_str(SCHEMA).expect("the bundle schema parses");
        if reader.writer_schema().canonical_form() != ours.canonical_form() {
            return Err(not_a_bundle(format!(
                "its records are not forgelog.bundle.BundleRecord: {}",
                reader.writer_schema().canonical_form()
            )));
        }
        let manifest_json = text("forgelog.manifest")?;
        let manifest: BundleManifest = serde_json::from_str(&manifest_json)
            .map_err(|e| not_a_bundle(format!("its manifest: {e}")))?;
        let whole = text("forgelog.sha256")?;
        // Buffered reads run ahead of the records: the place named is where
        // the reader stood, at most a block past the bad record.
        let refused = |why: String| BundleError::Refused {
            path: path.to_path_buf(),
            at: read.load(Ordering::Relaxed),
            why,
        };
        let mut topics: BTreeMap<String, BTreeMap<i32, Vec<_>>> = BTreeMap::new();
        let mut digests = Vec::new();
        for (i, value) in reader.enumerate() {
            let value = value.map_err(|e| refused(format!("record {i}: {e}")))?;
            let (r, sha) =
                Record::from_avro(value).map_err(|e| refused(format!("record {i}: {e}")))?;
            if sha != r.sha256() {
                return Err(refused(format!(
                    "record {i} ({}/{} offset {}) does not match its SHA-256: altered",
                    r.topic, r.partition, r.offset
                )));
            }
            digests.push(sha);
            topics
                .entry(r.topic)
                .or_default()
                .entry(r.partition)
                .or_default()
                .push((r.offset, r.key, r.value));
        }
        if (digests.len() as u64) < manifest.records {
            return Err(BundleError::Refused {
                path: path.to_path_buf(),
                at: len,
                why: format!(
                    "it ends after {} of its {} records: cut short",
                    digests.len(),
                    manifest.records
                ),
            });
        }
        if whole_digest(&manifest_json, digests.iter().map(Vec::as_slice)) != whole
            || digests.len() as u64 != manifest.records
        {
            return Err(BundleError::Refused {
                path: path.to_path_buf(),
                at: len,
                why: "its manifest or records are not the ones it was written with (their SHA-256 \
                      differs): altered"
                    .into(),
            });
        }
        for partitions in topics.values_mut() {
            for records in partitions.values_mut() {
                records.sort_by_key(|(offset, _, _)| *offset);
            }
        }
        Ok(Bundle { manifest, topics })
    }

    /// The run the bundle holds.
    pub fn run(&self) -> &str {
        &self.manifest.run
    }
}

impl LogReader for Bundle {
    fn partitions(&self, topic: &str) -> Result<Vec<i32>, ConsumeError> {
        Ok(self
            .topics
            .get(topic)
            .map(|p| p.keys().copied().collect())
            .unwrap_or_default())
    }

    fn end(&self, topic: &str, partition: i32) -> Result<i64, ConsumeError> {
        Ok(self
            .topics
            .get(topic)
            .and_then(|p| p.get(&partition))
            .and_then(|records| records.last())
            .map_or(0, |(offset, _, _)| offset + 1))
    }

    fn for_each_in(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
        mut f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, ConsumeError> {
        let records = self.topics.get(topic).and_then(|p| p.get(&partition));
        for (offset, key, value) in records.into_iter().flatten() {
            if (from..to).contains(offset)
                && f(Received::decode(topic, partition, *offset, key, value)).is_break()
            {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }
}

#[cfg(test)]
mod tests;
