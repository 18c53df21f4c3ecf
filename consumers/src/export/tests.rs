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
    let rewards: BTreeMap<String, Option<f64>> = trajectories
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (
                t.rollout_id.clone(),
                [Some(1.0), Some(0.0), None, Some(0.5)][i],
            )
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
        ["rollout_id", "reward", "input_ids", "loss_mask", "labels"]
    );
    for line in String::from_utf8(jsonl(&refs)).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["messages"].is_array());
    }
}
