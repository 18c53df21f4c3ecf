//! Export files: JSONL and Parquet bytes, written through object_store.

use super::{Manifest, SftRow};
use arrow_array::builder::{
    Float64Builder, Int64Builder, ListBuilder, StringBuilder, UInt32Builder, UInt8Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use object_store::{ObjectStoreExt, PutPayload};
use std::collections::BTreeMap;
use std::sync::Arc;

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

/// One JSON object per line: `messages` (OpenAI Chat), `tools` when present,
/// `rollout_id`, `reward`. Rows without a chat view are left out.
pub fn jsonl(rows: &[&SftRow]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in rows {
        let Some(messages) = &r.messages else {
            continue;
        };
        let mut line = serde_json::json!({ "messages": messages, "rollout_id": r.rollout_id, "reward": r.reward });
        if let Some(tools) = &r.tools {
            line["tools"] = tools.clone();
        }
        serde_json::to_writer(&mut out, &line).expect("json values serialize");
        out.push(b'\n');
    }
    out
}

/// Pre-tokenized rows: `rollout_id`, `reward`, `input_ids`, `loss_mask`, `labels` (-100 off the mask).
pub fn parquet(rows: &[&SftRow]) -> Result<Vec<u8>, ExportError> {
    let mut rollout = StringBuilder::new();
    let mut reward = Float64Builder::new();
    let mut ids = ListBuilder::new(UInt32Builder::new());
    let mut mask = ListBuilder::new(UInt8Builder::new());
    let mut labels = ListBuilder::new(Int64Builder::new());
    for r in rows {
        rollout.append_value(&r.rollout_id);
        reward.append_option(r.reward);
        ids.values().append_slice(&r.input_ids);
        ids.append(true);
        mask.values().append_slice(&r.loss_mask);
        mask.append(true);
        labels.values().append_slice(&r.labels());
        labels.append(true);
    }
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("rollout_id", Arc::new(rollout.finish())),
        ("reward", Arc::new(reward.finish())),
        ("input_ids", Arc::new(ids.finish())),
        ("loss_mask", Arc::new(mask.finish())),
        ("labels", Arc::new(labels.finish())),
    ];
    let batch = RecordBatch::try_from_iter(columns)?;
    let mut out = Vec::new();
    let mut writer = ::parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(out)
}

/// Writes `<to>/<harness>/sft.jsonl`, `<to>/<harness>/sft.parquet` and
/// `<to>/manifest.json` through object_store (`file://`, `s3://`, ...).
/// Returns the paths written.
pub async fn write(
    to: &str,
    rows: &[SftRow],
    manifest: &mut Manifest,
) -> Result<Vec<String>, ExportError> {
    let dest = |why: String| ExportError::Destination {
        url: to.to_string(),
        why,
    };
    let location = forgelog_stream::store::create(to).map_err(|e| dest(e.why))?;
    let to = location.url.as_str();
    let mut by_harness: BTreeMap<&str, Vec<&SftRow>> = BTreeMap::new();
    for r in rows {
        by_harness.entry(&r.harness).or_default().push(r);
    }
    let mut written = Vec::new();
    let put = |name: String, bytes: Vec<u8>| {
        let store = &location.store;
        let path = location.path(&name);
        async move {
            store
                .put(&path, PutPayload::from(bytes))
                .await
                .map_err(|source| ExportError::Store {
                    path: path.to_string(),
                    source,
                })?;
            Ok::<String, ExportError>(format!("{}/{name}", to.trim_end_matches('/')))
        }
    };
    for (harness, rows) in &by_harness {
        let lines = jsonl(rows);
        manifest.rows.insert(harness.to_string(), rows.len());
        manifest.jsonl_rows.insert(
            harness.to_string(),
            rows.iter().filter(|r| r.messages.is_some()).count(),
        );
        written.push(put(format!("{harness}/sft.jsonl"), lines).await?);
        written.push(put(format!("{harness}/sft.parquet"), parquet(rows)?).await?);
    }
    let manifest_bytes = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
    written.push(put("manifest.json".into(), manifest_bytes).await?);
    Ok(written)
}
