//! Rows as bytes: JSONL lines and zstd Parquet in bounded row groups.

use super::super::SftRow;
use super::ExportError;
use arrow_array::builder::{
    Float32Builder, Float64Builder, Int64Builder, ListBuilder, StringBuilder, UInt32Builder,
    UInt8Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use std::io::Write;
use std::sync::Arc;

/// Rows per Parquet row group (and per Arrow batch built at a time) at most:
/// a reader never needs more than this many sequences in memory.
pub const ROW_GROUP_ROWS: usize = 256;

/// Tokens per row group at most (it ends at the row that reaches this): long
/// agent sequences (100k tokens and more) bound a group by size, not count.
/// About 30 MB of columns.
pub const ROW_GROUP_TOKENS: usize = 1 << 20;

/// Whether a row group of `rows` rows and `tokens` tokens is complete.
pub(super) fn row_group_full(rows: usize, tokens: usize) -> bool {
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
pub(super) fn jsonl_line(r: &SftRow) -> Option<Vec<u8>> {
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
    if !r.images.is_empty() {
        line["images"] = serde_json::json!(r.images);
    }
    let mut out = serde_json::to_vec(&line).expect("json values serialize");
    out.push(b'\n');
    Some(out)
}

/// One Arrow batch of pre-tokenized rows with their provenance; `messages`
/// and `tools` as JSON text (their shapes vary row to row).
pub(super) fn record_batch(rows: &[&SftRow]) -> Result<RecordBatch, ExportError> {
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
    let mut images = ListBuilder::new(StringBuilder::new());
    for r in rows {
        for image in &r.images {
            images.values().append_value(image);
        }
        images.append(true);
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
        ("images", Arc::new(images.finish()), false),
    ];
    Ok(RecordBatch::try_from_iter_with_nullable(columns)?)
}

fn parquet_properties() -> Result<WriterProperties, ExportError> {
    Ok(WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_max_row_group_size(ROW_GROUP_ROWS)
        .build())
}

pub(super) fn parquet_writer<W: Write + Send>(out: W) -> Result<ArrowWriter<W>, ExportError> {
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

/// JSON lines of `items`.
pub(super) fn json_lines<T: serde::Serialize>(items: &[T]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        serde_json::to_writer(&mut out, item).expect("json values serialize");
        out.push(b'\n');
    }
    out
}
