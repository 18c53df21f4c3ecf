use super::*;
use forgelog_schemas::testing::recorded_run;
use forgelog_schemas::{PolicyPublished, RolloutStarted};

#[test]
fn rollouts_are_reported_under_the_version_that_served_them() {
    let mut events = recorded_run("run", 2, 2, 2, 8);
    // The second group's calls were served by version 1.
    for e in events.iter_mut() {
        if let Event::CallFinished(c) = e {
            c.policy_version = Some(i64::from(c.rollout_id.contains("-g1-")));
        }
    }
    events.push(
        PolicyPublished {
            run_id: "run".into(),
            event_id: "p1".into(),
            version: 1,
            step: 1,
            checkpoint_uri: "file:///c/1".into(),
            metrics: BTreeMap::from([("loss".into(), 0.25), ("is_ratio_mean".into(), 1.0)]),
        }
        .into(),
    );
    // A rollout with no call goes under the version its session started at.
    let Some(Event::RolloutStarted(s)) = events.first().cloned() else {
        panic!()
    };
    events.push(
        RolloutStarted {
            rollout_id: "silent".into(),
            policy_version: Some(5),
            ..s
        }
        .into(),
    );
    let report = Report::of(&events);
    let versions: Vec<(Option<i64>, &str, usize)> = report
        .rows
        .iter()
        .map(|r| (r.version, r.harness.as_str(), r.rollouts))
        .collect();
    assert_eq!(
        versions,
        [
            (Some(0), "claude-code", 1),
            (Some(0), "opencode", 1),
            (Some(1), "claude-code", 1),
            (Some(1), "opencode", 1)
        ],
        "the silent rollout has no verdict yet: not reported"
    );
    let total: usize = report.rows.iter().map(|r| r.scored + r.unscored).sum();
    assert_eq!(total, 4);
    assert!(report.rows.iter().all(|r| r.model_calls >= 2));
    let (first, last) = report.first_and_last(1).unwrap();
    let mean = |v: i64| {
        let rows: Vec<&VersionRow> = report
            .rows
            .iter()
            .filter(|r| r.version == Some(v))
            .collect();
        rows.iter().map(|r| r.reward_sum).sum::<f64>()
            / rows.iter().map(|r| r.scored).sum::<usize>() as f64
    };
    assert_eq!((first, last), (mean(0), mean(1)));
    let text = report.to_string();
    assert!(text.contains("0.250"), "{text}");
    // Throughput from the recorded call times: tokens over the span from
    // the first call's start to the last call's end.
    let row = &report.rows[0];
    let calls: Vec<&forgelog_schemas::CallFinished> = events
        .iter()
        .filter_map(|e| match e {
            Event::CallFinished(c)
                if c.policy_version == Some(0) && c.rollout_id.contains("-r1") =>
            {
                Some(c)
            }
            _ => None,
        })
        .collect();
    let start = calls
        .iter()
        .map(|c| c.finished_at_ms - c.latency_ms)
        .min()
        .unwrap();
    let end = calls.iter().map(|c| c.finished_at_ms).max().unwrap();
    let tokens: usize = calls.iter().map(|c| c.completion_token_ids.len()).sum();
    assert_eq!(row.harness, "claude-code");
    assert_eq!(
        row.tokens_per_second(),
        Some(tokens as f64 * 1000.0 / (end - start) as f64)
    );
    assert!(text.contains("tok/s"), "{text}");
    assert_eq!(Report::of(&events), report, "a pure function of its events");
}

#[test]
fn groups_without_reward_variance_are_counted_and_steps_show_what_they_trained() {
    use forgelog_schemas::testing::training_batch;
    let mut events = recorded_run("run", 1, 2, 1, 4);
    events.push(training_batch("run", "g0", 3, 0));
    let mut flat = training_batch("run", "g1", 3, 0);
    if let Event::TrainingBatch(b) = &mut flat {
        b.no_reward_variance = true;
    }
    // Sent twice (a retried delivery): one group.
    events.extend([flat.clone(), flat]);
    for (version, tokens) in [(1, 6.0), (2, 0.0)] {
        events.push(
            PolicyPublished {
                run_id: "run".into(),
                event_id: format!("p{version}"),
                version,
                step: version,
                checkpoint_uri: String::new(),
                metrics: BTreeMap::from([("tokens".into(), tokens)]),
            }
            .into(),
        );
    }
    let report = Report::of(&events);
    assert_eq!((report.groups, report.groups_without_variance), (2, 1));
    let text = report.to_string();
    assert!(
        text.contains("GROUPS: 2 built for training, 1 without reward variance"),
        "{text}"
    );
    let step = |v: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(v))
            .map(|l| l.split_whitespace().nth(2).unwrap_or_default().to_string())
    };
    assert_eq!(step("1").as_deref(), Some("6"), "{text}");
    assert_eq!(step("2").as_deref(), Some("0"), "{text}");
    // A run without training says nothing of groups.
    let untrained = Report::of(&recorded_run("run", 1, 2, 1, 4)).to_string();
    assert!(!untrained.contains("GROUPS"), "{untrained}");
}
