use super::*;
use crate::TrajectoryBuilder;
use forgelog_schemas::testing::recorded_run;

/// The trajectories the builder makes of `events`.
fn trajectories_of(events: &[Event]) -> Vec<Event> {
    let mut trajectories = Vec::new();
    let mut builder = TrajectoryBuilder::default();
    for e in events.iter().cloned() {
        builder.process(e, &mut trajectories);
    }
    trajectories
}

/// The recorded run's events through both cores, rewards in the given position.
fn batches(config: RewardConfig, events: Vec<Event>) -> Vec<TrainingBatch> {
    let trajectories = trajectories_of(&events);
    let mut join = RewardJoin::new(config);
    let mut out = Vec::new();
    let inputs = events
        .into_iter()
        .filter(|e| !matches!(e, Event::CallFinished(_)));
    for e in inputs.chain(trajectories) {
        join.process(e, &mut out);
    }
    out.into_iter()
        .map(|e| match e {
            Event::TrainingBatch(b) => b,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn verdicts_first(events: Vec<Event>) -> Vec<Event> {
    let (v, rest): (Vec<Event>, Vec<Event>) = events
        .into_iter()
        .partition(|e| matches!(e, Event::VerifierResult(_)));
    v.into_iter().chain(rest).collect()
}

#[test]
fn groups_are_emitted_once_complete_in_either_arrival_order() {
    let events = recorded_run("run", 3, 4, 3, 12);
    let after = batches(RewardConfig::default(), events.clone());
    let before = batches(RewardConfig::default(), verdicts_first(events));
    assert_eq!(after.len(), 3);
    assert_eq!(after, before);
    for b in &after {
        assert_eq!(b.members.len(), 4);
        assert!(b
            .members
            .windows(2)
            .all(|w| w[0].rollout_id < w[1].rollout_id));
        assert!(b
            .members
            .iter()
            .flat_map(|m| &m.sequences)
            .all(|s| !s.discarded));
    }
}

#[test]
fn a_group_waits_for_its_last_member() {
    let events = recorded_run("run", 1, 3, 2, 8);
    let last_verdict = events
        .iter()
        .rposition(|e| matches!(e, Event::VerifierResult(_)))
        .unwrap();
    let mut missing = events.clone();
    missing.remove(last_verdict);
    assert!(batches(RewardConfig::default(), missing).is_empty());
    assert_eq!(batches(RewardConfig::default(), events).len(), 1);
}

#[test]
fn a_verifier_that_did_not_run_is_left_out_never_scored_zero() {
    let rewards = [Some(1.0), None, Some(0.0), Some(0.5)];
    let (adv, flat) = advantages(&rewards, 1e-6);
    assert!(!flat);
    assert_eq!(adv[1], None);
    // Baseline over the three scored: mean 0.5.
    assert!(adv[3].unwrap().abs() < 1e-9);
    let std = (((0.5f64).powi(2) * 2.0) / 3.0).sqrt();
    assert!((adv[0].unwrap() - 0.5 / (std + 1e-6)).abs() < 1e-9);
    // In a real group: the recorded run's ninth-rollout verifier did not run.
    let all = batches(RewardConfig::default(), recorded_run("run", 2, 4, 2, 8));
    let unscored: Vec<&GroupMember> = all
        .iter()
        .flat_map(|b| &b.members)
        .filter(|m| m.reward.is_none())
        .collect();
    assert!(!unscored.is_empty());
    assert!(unscored.iter().all(|m| m.advantage.is_none()));
}

#[test]
fn equal_rewards_are_flagged_with_zero_advantages() {
    let (adv, flat) = advantages(&[Some(1.0), Some(1.0), None], 1e-6);
    assert!(flat);
    assert_eq!(adv, vec![Some(0.0), Some(0.0), None]);
    assert!(advantages(&[None, None], 1e-6).1);
    assert!(advantages(&[Some(0.3)], 1e-6).1);
}

#[test]
fn efficiency_bonus_rewards_fewer_tool_calls_among_correct_answers() {
    let bonus = RewardTransform::EfficiencyBonus { correct_at: 1.0 };
    assert_eq!(bonus.apply(1.0, 0), 1.1);
    assert!((bonus.apply(1.0, 15) - 1.05).abs() < 1e-12);
    assert_eq!(bonus.apply(0.5, 0), 0.5, "wrong answers are not boosted");
    assert_eq!(
        RewardTransform::Clip { min: 0.0, max: 1.0 }.apply(1.7, 0),
        1.0
    );

    let config = RewardConfig {
        transforms: vec![bonus],
        ..Default::default()
    };
    let out = batches(config, recorded_run("run", 3, 4, 3, 8));
    let boosted: Vec<f64> = out
        .iter()
        .flat_map(|b| &b.members)
        .filter_map(|m| m.reward)
        .filter(|&r| r > 1.0)
        .collect();
    assert!(!boosted.is_empty());
    // Two tool calls per 3-turn session: 1 + 1.5 / 17.
    assert!(
        boosted
            .iter()
            .all(|&r| (r - (1.0 + 1.5 / 17.0)).abs() < 1e-12),
        "{boosted:?}"
    );
}

/// An attempt given up before its first model call and run again under a new
/// id, for the first group of `events`: its start, finish and verdict.
fn abandoned_attempt(events: &[Event]) -> [Event; 3] {
    use forgelog_schemas::{RolloutFinished, RolloutStarted, VerifierResult};
    let Some(Event::RolloutStarted(first)) = events.first().cloned() else {
        panic!("a run starts with a rollout");
    };
    let id = format!("{}-attempt-given-up", first.group_id);
    let started = Event::from(RolloutStarted {
        event_id: format!("{}-a", first.event_id),
        rollout_id: id.clone(),
        session_id: format!("session-{id}"),
        ..first.clone()
    });
    let finished = Event::from(RolloutFinished {
        run_id: first.run_id.clone(),
        event_id: "abandoned-finished".into(),
        rollout_id: id.clone(),
        session_id: format!("session-{id}"),
        exit_status: None,
        model_calls: 0,
        started_at_ms: 0,
        finished_at_ms: 1,
    });
    let verdict = Event::from(VerifierResult {
        run_id: first.run_id,
        event_id: "abandoned-verdict".into(),
        rollout_id: id,
        ok: false,
        reward: None,
        details: "infra:sandbox".into(),
        abandoned: true,
    });
    [started, finished, verdict]
}

/// In whichever order its events arrive, a group's members are the rollouts
/// that ran, never the abandoned attempt.
#[test]
fn an_abandoned_attempt_is_no_member_of_its_group() {
    let events = recorded_run("run", 1, 3, 2, 8);
    let [started, finished, verdict] = abandoned_attempt(&events);
    let expected = batches(RewardConfig::default(), events.clone());
    assert_eq!(expected.len(), 1);
    assert_eq!(expected[0].members.len(), 3);
    let orders = [
        // Given up first, as an orchestrator records it.
        [started.clone(), finished.clone(), verdict.clone()]
            .into_iter()
            .chain(events.clone())
            .collect::<Vec<_>>(),
        // Its verdict last: the group must wait for it, then leave it out.
        [started.clone(), finished.clone()]
            .into_iter()
            .chain(events.clone())
            .chain([verdict.clone()])
            .collect(),
        // Its verdict before anything else of it.
        [verdict.clone()]
            .into_iter()
            .chain(events.clone())
            .chain([started, finished])
            .collect(),
    ];
    for (i, order) in orders.into_iter().enumerate() {
        let got = batches(RewardConfig::default(), order);
        assert_eq!(got, expected, "order {i}");
    }
}

/// A member's trajectory and verdict can reach the join before any of its
/// group's starts (a live run: the trajectory consumer and the verifier were
/// quicker than the join's read of the rollouts). The group's size is not
/// known yet, so it is not complete with that one member.
#[test]
fn a_group_is_never_complete_before_its_size_is_known() {
    let events = recorded_run("run", 1, 3, 2, 8);
    let trajectories = trajectories_of(&events);
    let mut join = RewardJoin::new(RewardConfig::default());
    let mut out = Vec::new();
    let first = trajectories[0].clone();
    let Event::TrajectoryBuilt(t) = &first else {
        panic!("{first:?}")
    };
    let verdict = events
        .iter()
        .find(|e| matches!(e, Event::VerifierResult(v) if v.rollout_id == t.rollout_id))
        .cloned()
        .unwrap();
    join.process(first, &mut out);
    join.process(verdict, &mut out);
    assert!(out.is_empty(), "a group of one was emitted: {out:?}");
}

/// The join's inputs are three topics that grow independently in a live run,
/// so it sees them interleaved in any order that keeps each topic's own.
/// Whatever the interleaving, the batches are the same events (byte for byte
/// by event id); only the order they complete in may differ.
mod interleavings {
    use super::*;
    use proptest::prelude::*;

    fn by_topic() -> [Vec<Event>; 3] {
        let mut events = recorded_run("run", 3, 3, 2, 6);
        events.splice(0..0, abandoned_attempt(&events));
        let trajectories = trajectories_of(&events);
        let (rewards, rollouts): (Vec<Event>, Vec<Event>) = events
            .into_iter()
            .filter(|e| !matches!(e, Event::CallFinished(_)))
            .partition(|e| matches!(e, Event::VerifierResult(_)));
        [rollouts, trajectories, rewards]
    }

    fn sorted(mut batches: Vec<TrainingBatch>) -> Vec<TrainingBatch> {
        batches.sort_by(|a, b| a.event_id.cmp(&b.event_id));
        batches
    }

    proptest! {
        #[test]
        fn batches_do_not_depend_on_how_the_topics_interleave(
            picks in proptest::collection::vec(0usize..3, 0..200),
        ) {
            let topics = by_topic();
            let swept: Vec<Event> = topics.iter().flatten().cloned().collect();
            let mut join = RewardJoin::new(RewardConfig::default());
            let mut expected = Vec::new();
            for e in swept {
                join.process(e, &mut expected);
            }
            let expected = sorted(expected.into_iter().map(batch).collect());
            prop_assert_eq!(expected.len(), 3);

            let mut queues = topics.map(|t| t.into_iter().peekable());
            let mut picks = picks.into_iter();
            let mut join = RewardJoin::new(RewardConfig::default());
            let mut got = Vec::new();
            loop {
                let open: Vec<usize> = (0..3).filter(|&i| queues[i].peek().is_some()).collect();
                if open.is_empty() {
                    break;
                }
                let i = open[picks.next().unwrap_or(0) % open.len()];
                join.process(queues[i].next().expect("open"), &mut got);
            }
            prop_assert_eq!(sorted(got.into_iter().map(batch).collect()), expected);
        }
    }

    fn batch(e: Event) -> TrainingBatch {
        match e {
            Event::TrainingBatch(b) => b,
            other => panic!("{other:?}"),
        }
    }
}
