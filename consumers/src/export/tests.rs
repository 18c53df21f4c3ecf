use super::*;
use crate::{Processor, TrajectoryBuilder};
use forgelog_schemas::{testing::recorded_run, Event};

fn run() -> (Vec<TrajectoryBuilt>, Vec<CallFinished>) {
    let mut events = recorded_run("r", 2, 2, 2, 8);
    for e in &mut events {
        if let Event::CallFinished(c) = e {
            c.chat_request = format!(
                r#"{{"messages":[{{"role":"user","content":"call {}"}}],"tools":[]}}"#,
                c.call_index
            );
            c.chat_response = r#"{"role":"assistant","content":"ok"}"#.into();
        }
    }
    let mut b = TrajectoryBuilder::default();
    let mut out = Vec::new();
    for e in events.clone() {
        b.process(e, &mut out);
    }
    let trajectories = out
        .into_iter()
        .map(|e| match e {
            Event::TrajectoryBuilt(t) => t,
            _ => unreachable!(),
        })
        .collect();
    let calls = events
        .into_iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) => Some(c),
            _ => None,
        })
        .collect();
    (trajectories, calls)
}

#[test]
fn rows_carry_tokens_labels_and_the_conversation_and_filters_apply() {
    let (trajectories, calls) = run();
    let rewards: BTreeMap<String, RolloutScore> = trajectories
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let reward = [Some(1.0), Some(0.0), None, Some(0.5)][i];
            let advantage = reward.map(|r| r - 0.5);
            (t.rollout_id.clone(), RolloutScore { reward, advantage })
        })
        .collect();
    let (all, filtered) = rows(&trajectories, &calls, &rewards, &ExportFilter::default());
    assert_eq!(filtered, 0);
    assert_eq!(
        all.len(),
        4,
        "one live path per rollout (retries are discarded)"
    );
    let r = &all[0];
    assert_eq!(
        r.labels().iter().filter(|&&l| l != -100).count(),
        r.loss_mask.iter().filter(|&&m| m == 1).count()
    );
    let messages = r.messages.as_ref().unwrap().as_array().unwrap();
    assert_eq!(messages.last().unwrap()["role"], "assistant");
    assert!(r.tools.is_none(), "empty tool lists are left out");
    // Where each row comes from, and what it needs for RL as well as SFT.
    let t = &trajectories[0];
    assert_eq!(r.row_id, format!("{}/{}", t.rollout_id, r.path_index));
    assert_eq!(
        (&r.run_id, &r.task_id, &r.group_id),
        (&t.run_id, &t.task_id, &t.group_id)
    );
    assert_eq!((r.reward, r.advantage), (Some(1.0), Some(0.5)));
    assert_eq!(all[2].advantage, None, "not scored: no advantage either");
    for r in &all {
        assert_eq!(r.sampling_logprobs.len(), r.input_ids.len());
        assert_eq!(r.policy_versions.len(), r.input_ids.len());
        let sampled = r.loss_mask.iter().filter(|&&m| m == 1).count();
        assert_eq!(
            r.policy_versions.iter().filter(|&&v| v >= 0).count(),
            sampled
        );
        let seq = trajectories
            .iter()
            .find(|t| t.rollout_id == r.rollout_id)
            .map(|t| &t.sequences[r.path_index])
            .unwrap();
        assert_eq!(r.finish_reasons.len(), seq.call_indices.len());
    }
    let ids: std::collections::BTreeSet<&str> = all.iter().map(|r| r.row_id.as_str()).collect();
    assert_eq!(ids.len(), all.len(), "row ids are unique");

    let (ok, filtered) = rows(
        &trajectories,
        &calls,
        &rewards,
        &ExportFilter {
            only_successful: true,
            min_reward: None,
        },
    );
    assert_eq!((ok.len(), filtered), (2, 2));
    let (high, _) = rows(
        &trajectories,
        &calls,
        &rewards,
        &ExportFilter {
            only_successful: false,
            min_reward: Some(0.75),
        },
    );
    assert_eq!(
        high.iter().map(|r| r.reward).collect::<Vec<_>>(),
        vec![Some(1.0)]
    );
}

#[test]
fn files_are_deterministic_and_parquet_reads_back() {
    let (trajectories, calls) = run();
    let (all, _) = rows(
        &trajectories,
        &calls,
        &BTreeMap::new(),
        &ExportFilter::default(),
    );
    let refs: Vec<&SftRow> = all.iter().collect();
    assert_eq!(jsonl(&refs), jsonl(&refs));
    let bytes = parquet(&refs).unwrap();
    assert_eq!(bytes, parquet(&refs).unwrap());
    let reader = ::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        bytes::Bytes::from(bytes),
    )
    .unwrap()
    .build()
    .unwrap();
    let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
    assert_eq!(
        batches.iter().map(|b| b.num_rows()).sum::<usize>(),
        all.len()
    );
    let names: Vec<String> = batches[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        [
            "row_id",
            "run_id",
            "task_id",
            "group_id",
            "harness",
            "rollout_id",
            "path_index",
            "call_indices",
            "reward",
            "advantage",
            "input_ids",
            "loss_mask",
            "assistant_masks",
            "labels",
            "sampling_logprobs",
            "policy_versions",
            "finish_reasons",
            "messages_json",
            "tools_json",
            "images"
        ]
    );
    let schema = batches[0].schema();
    assert!(schema.field_with_name("reward").unwrap().is_nullable());
    assert!(!schema.field_with_name("input_ids").unwrap().is_nullable());
    for (line, row) in String::from_utf8(jsonl(&refs)).unwrap().lines().zip(&all) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["messages"].is_array());
        assert_eq!(v["row_id"], row.row_id.as_str());
        assert_eq!(v["input_ids"], serde_json::json!(row.input_ids));
        assert_eq!(v["labels"], serde_json::json!(row.labels()));
    }
}

type ParquetFile = ::parquet::file::serialized_reader::SerializedFileReader<bytes::Bytes>;

/// `rows` written as the export writes them, read back.
fn parquet_file(rows: &[&SftRow]) -> ParquetFile {
    let bytes = bytes::Bytes::from(parquet(rows).unwrap());
    ParquetFile::new(bytes).unwrap()
}

/// Rows per row group.
fn row_group_rows(file: &ParquetFile) -> Vec<i64> {
    use ::parquet::file::reader::FileReader;
    let meta = file.metadata();
    meta.row_groups().iter().map(|g| g.num_rows()).collect()
}

#[test]
fn parquet_row_groups_are_bounded() {
    let (trajectories, calls) = run();
    let (one, _) = rows(
        &trajectories,
        &calls,
        &BTreeMap::new(),
        &ExportFilter::default(),
    );
    let many: Vec<&SftRow> = one.iter().cycle().take(ROW_GROUP_ROWS * 2 + 3).collect();
    let meta = parquet_file(&many);
    assert_eq!(row_group_rows(&meta), [256, 256, 3]);
    // Long sequences: a group ends at the row that reaches the token bound.
    let mut long = one[0].clone();
    long.input_ids = vec![7; ROW_GROUP_TOKENS / 3 + 1];
    long.loss_mask = vec![1; long.input_ids.len()];
    long.sampling_logprobs = vec![-0.5; long.input_ids.len()];
    long.policy_versions = vec![0; long.input_ids.len()];
    let longs: Vec<&SftRow> = std::iter::repeat_n(&long, 7).collect();
    assert_eq!(row_group_rows(&parquet_file(&longs)), [3, 3, 1]);
    let compression = {
        use ::parquet::file::reader::FileReader;
        meta.metadata().row_group(0).column(0).compression()
    };
    assert!(matches!(
        compression,
        ::parquet::basic::Compression::ZSTD(_)
    ));
}

#[test]
fn the_dataset_card_makes_each_harness_a_config() {
    let manifest = Manifest {
        run_id: "r".into(),
        rows: BTreeMap::from([("codex".into(), 3), ("opencode".into(), 2)]),
        jsonl_rows: BTreeMap::from([("codex".into(), 3), ("opencode".into(), 0)]),
        ..Default::default()
    };
    let card = dataset_card(&manifest);
    let yaml = card.split("---").nth(1).unwrap();
    for expected in [
        "- config_name: all\n  default: true\n  data_files:\n  - split: train\n    path: \"*/sft.parquet\"",
        "- config_name: codex\n  data_files:\n  - split: train\n    path: \"codex/sft.parquet\"",
        "- config_name: opencode\n",
    ] {
        assert!(yaml.contains(expected), "{expected:?} in\n{yaml}");
    }
    assert!(
        !yaml.contains("opencode-messages"),
        "no JSONL rows, no config"
    );
    assert!(!card.contains("Sampled by"), "no models, no line");
    let sampled = Manifest {
        models: ["smollm2".to_string()].into(),
        policy_versions: [3, 0].into(),
        ..manifest
    };
    let card = dataset_card(&sampled);
    assert!(
        card.contains("Sampled by `smollm2`: policy versions 0, 3; `forgelog export model --run r --version V`"),
        "{card}"
    );
}

/// The export streams from the log a rollout at a time: a tree that is in the
/// log twice (a second consumer group, a restart between output and commit)
/// is exported once, the last one read; a rollout whose calls are not all in
/// the log still gets its rows (without a conversation); what is written is
/// what the pure `rows` make of the whole run, and the same on a second export.
#[test]
fn the_streamed_export_writes_what_rows_make_of_the_whole_run() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (trajectories, calls) = run();
    let log = forgelog_stream::MemoryLog::new(3);
    let mut again = trajectories[0].clone();
    again.calls += 100; // its calls never all arrive
    again.task_id = "the copy read last".into(); // tell the copies apart
    for t in trajectories.iter().chain([&again]) {
        log.append(&t.clone().into()).unwrap();
    }
    // Calls after their trees, as a consumer writes them; the first rollout's
    // last call is missing.
    let missing = calls
        .iter()
        .filter(|c| c.rollout_id == again.rollout_id)
        .map(|c| c.call_index)
        .max()
        .unwrap();
    for c in &calls {
        if !(c.rollout_id == again.rollout_id && c.call_index == missing) {
            log.append(&c.clone().into()).unwrap();
        }
    }
    let export = |dir: &std::path::Path| {
        rt.block_on(export_run(
            &log,
            "r",
            dir.to_str().unwrap(),
            ExportKind::Sft,
            Default::default(),
        ))
        .unwrap()
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (manifest, written) = export(a.path());
    let (again_manifest, _) = export(b.path());
    assert_eq!(manifest.sha256, again_manifest.sha256, "two exports differ");
    assert!(
        written.iter().any(|w| w.ends_with("manifest.json")),
        "{written:?}"
    );

    // What the pure rows make of the same run, the second copy standing.
    let mut latest = trajectories.clone();
    latest[0] = again.clone();
    let present: Vec<CallFinished> = calls
        .iter()
        .filter(|c| !(c.rollout_id == again.rollout_id && c.call_index == missing))
        .cloned()
        .collect();
    let (expected, _) = rows(&latest, &present, &Default::default(), &Default::default());
    let total: usize = manifest.rows.values().sum();
    assert_eq!(total, expected.len());
    // The manifest names the models that answered and the versions that sampled.
    let models: std::collections::BTreeSet<String> = present
        .iter()
        .map(|c| c.model.clone())
        .filter(|m| !m.is_empty())
        .collect();
    assert!(!models.is_empty());
    assert_eq!(manifest.models, models);
    let versions: std::collections::BTreeSet<i64> = expected
        .iter()
        .flat_map(|r| r.policy_versions.iter().copied())
        .filter(|&v| v >= 0)
        .collect();
    assert_eq!(manifest.policy_versions, versions);
    let mut got: Vec<String> = Vec::new();
    for harness in manifest.rows.keys() {
        let bytes = std::fs::read(a.path().join(harness).join("sft.parquet")).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            bytes::Bytes::from(bytes),
        )
        .unwrap()
        .build()
        .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let column = |name: &str| {
                batch
                    .column_by_name(name)
                    .unwrap()
                    .as_any()
                    .downcast_ref::<arrow_array::StringArray>()
                    .unwrap()
                    .clone()
            };
            let (ids, tasks) = (column("row_id"), column("task_id"));
            got.extend(
                ids.iter()
                    .zip(tasks.iter())
                    .map(|(id, task)| format!("{} {}", id.unwrap(), task.unwrap())),
            );
        }
    }
    let mut want: Vec<String> = expected
        .iter()
        .map(|r| format!("{} {}", r.row_id, r.task_id))
        .collect();
    assert!(want.iter().any(|w| w.ends_with("the copy read last")));
    got.sort();
    want.sort();
    assert_eq!(got, want);
    // The first rollout's path that needed the missing call has no conversation.
    let chats: usize = manifest.jsonl_rows.values().sum();
    let with_messages = expected.iter().filter(|r| r.messages.is_some()).count();
    assert_eq!(chats, with_messages);
    assert!(
        with_messages < expected.len(),
        "the missing call cost a conversation"
    );
}
