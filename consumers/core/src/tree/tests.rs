use super::*;
use forgelog_schemas::testing::call_finished;
use proptest::prelude::*;

fn call(index: i64, prompt: &[u32], completion: &[u32]) -> CallFinished {
    let mut c = call_finished("run", "s", index, 0, 0);
    c.prompt_token_ids = prompt.to_vec();
    c.completion_token_ids = completion.to_vec();
    c.completion_logprobs = completion.iter().map(|&t| -(t as f32) / 100.0).collect();
    c.policy_version = Some(index);
    c
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

const SYS: &[u32] = &[1, 10, 11, 12, 2];
const USER: &[u32] = &[1, 20, 21, 2];

#[test]
fn a_multi_turn_session_is_one_sequence_with_sampled_spans_masked() {
    let c0 = call(0, &cat(&[SYS, USER]), &[30, 31]);
    let c1 = call(1, &cat(&[SYS, USER, &[30, 31], &[40, 41, 42]]), &[50]);
    let tree = TrajectoryTree::build([&c0, &c1]);
    let seqs = tree.sequences();
    assert_eq!(seqs.len(), 1);
    let s = &seqs[0];
    assert_eq!(s.call_indices, vec![0, 1]);
    assert_eq!(s.token_ids, cat(&[SYS, USER, &[30, 31, 40, 41, 42, 50]]));
    let mask: Vec<u8> = s.loss_mask.clone();
    assert_eq!(
        mask,
        [vec![0; 9], vec![1, 1], vec![0, 0, 0], vec![1]].concat()
    );
    assert_eq!(s.sampling_logprobs[9], -0.30);
    assert_eq!(s.sampling_logprobs[14], -0.50);
    assert_eq!(s.policy_versions[9], 0);
    assert_eq!(s.policy_versions[14], 1);
    assert_eq!(s.policy_versions[0], UNKNOWN_POLICY_VERSION);
    assert!(!s.discarded);
}

#[test]
fn a_retry_forks_and_discards_the_abandoned_branch() {
    let p = cat(&[SYS, USER]);
    let c0 = call(0, &p, &[30, 31]);
    let c1 = call(1, &p, &[32]); // same prompt again: the harness retried
    let c2 = call(2, &cat(&[&p, &[32], &[40]]), &[33]);
    let seqs = TrajectoryTree::build([&c0, &c1, &c2]).sequences();
    assert_eq!(seqs.len(), 2);
    assert_eq!(
        (seqs[0].call_indices.clone(), seqs[0].discarded),
        (vec![0], true)
    );
    assert_eq!(
        (seqs[1].call_indices.clone(), seqs[1].discarded),
        (vec![1, 2], false)
    );
}

#[test]
fn sub_agents_and_compactions_start_new_roots() {
    let c0 = call(0, &cat(&[SYS, USER]), &[30]);
    let sub = call(1, &cat(&[&[1, 99, 98, 2], USER]), &[31]); // another system prompt
    let compacted = call(2, &cat(&[SYS, &[1, 77, 2]]), &[32]); // same system, summary instead of history
    let tree = TrajectoryTree::build([&c0, &sub, &compacted]);
    let seqs = tree.sequences();
    assert_eq!(
        seqs.iter().map(|s| s.root).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(seqs.iter().all(|s| !s.discarded));
}

#[test]
fn drift_is_reported_not_repaired() {
    let c0 = call(0, &cat(&[SYS, USER]), &[30, 31, 32]);
    // The harness sent the answer back re-tokenized: 30, 35 instead of 30, 31, 32.
    let c1 = call(1, &cat(&[SYS, USER, &[30, 35], &[40]]), &[50]);
    let tree = TrajectoryTree::build([&c0, &c1]);
    assert_eq!(tree.findings().len(), 1);
    assert_eq!(tree.findings()[0].kind, FindingKind::Drift);
    let seqs = tree.sequences();
    assert_eq!(
        seqs.len(),
        2,
        "the original sampled tokens keep their own path"
    );
    assert_eq!(seqs[0].loss_mask.iter().filter(|&&m| m == 1).count(), 3);
    let second = &seqs[1];
    assert_eq!(&second.token_ids[9..11], &[30, 35]);
    assert_eq!(
        &second.loss_mask[9..11],
        &[0, 0],
        "re-sent tokens are context"
    );
    assert!(seqs.iter().all(|s| !s.discarded));
}

#[test]
fn untrainable_failed_and_inconsistent_calls_are_context_only() {
    let mut c0 = call(0, &cat(&[SYS, USER]), &[30]);
    c0.trainable = false;
    c0.untrainable_reason = Some("no logprobs".into());
    let mut c1 = call(1, &cat(&[SYS, USER, &[30], &[40]]), &[31, 32]);
    c1.completion_logprobs.pop();
    let mut failed = call(2, &[], &[]);
    failed.status = CallStatus::UpstreamError;
    let c3 = call(3, &cat(&[SYS, USER, &[30], &[40], &[31, 32], &[41]]), &[33]);
    let tree = TrajectoryTree::build([&c0, &c1, &failed, &c3]);
    let kinds: Vec<_> = tree.findings().iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        vec![
            FindingKind::NotTrainable,
            FindingKind::InconsistentTokens,
            FindingKind::FailedCall
        ]
    );
    let seqs = tree.sequences();
    assert_eq!(seqs.len(), 1);
    assert_eq!(seqs[0].call_indices, vec![0, 1, 3]);
    let masked: Vec<usize> = (0..seqs[0].loss_mask.len())
        .filter(|&i| seqs[0].loss_mask[i] == 1)
        .collect();
    assert_eq!(
        masked,
        vec![seqs[0].token_ids.len() - 1],
        "only call 3's token"
    );
}

#[test]
fn common_prefix_agrees_with_the_naive_count() {
    let a: Vec<u32> = (0..300).collect();
    let mut b = a.clone();
    for cut in [0, 1, 63, 64, 65, 128, 299] {
        b[cut] = 9999;
        assert_eq!(common_prefix(&a, &b), cut);
        b[cut] = a[cut];
    }
    assert_eq!(common_prefix(&a, &b), 300);
    assert_eq!(common_prefix(&a[..10], &b), 10);
}

/// What a simulated harness did at each step, to check the tree against.
#[derive(Debug, Clone)]
enum Step {
    Continue,
    Retry,
    SubAgent,
    Compact,
    Untrainable,
    Drift,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => Just(Step::Continue),
        2 => Just(Step::Retry),
        1 => Just(Step::SubAgent),
        1 => Just(Step::Compact),
        1 => Just(Step::Untrainable),
        1 => Just(Step::Drift),
    ]
}

/// Plays the steps as a harness would, returning the calls and which were retried.
fn simulate(steps: &[Step], lens: &[usize]) -> (Vec<CallFinished>, Vec<i64>) {
    let mut calls: Vec<CallFinished> = Vec::new();
    let mut retried = Vec::new();
    let mut fresh = 1000u32;
    let mut next = |n: usize| -> Vec<u32> {
        let v: Vec<u32> = (0..n as u32).map(|i| fresh + i).collect();
        fresh += n as u32 + 1;
        v
    };
    let system = |tag: u32| vec![1, tag, tag + 1, 2];
    for (i, step) in steps.iter().enumerate() {
        let len = lens[i % lens.len()].max(1);
        let index = i as i64;
        let last = calls.last().cloned();
        let (prompt, mut trainable) = match (step, &last) {
            (_, None) | (Step::SubAgent, _) => ([system(10 + i as u32), next(len)].concat(), true),
            (Step::Compact, Some(_)) => ([system(10), next(len)].concat(), true),
            (Step::Retry, Some(l)) => {
                retried.push(l.call_index);
                (l.prompt_token_ids.clone(), true)
            }
            (Step::Drift, Some(l)) if !l.completion_token_ids.is_empty() => {
                let mut resent = l.completion_token_ids.clone();
                *resent.last_mut().unwrap() += 7; // re-tokenized differently
                resent.push(4242);
                (
                    [l.prompt_token_ids.clone(), resent, next(len)].concat(),
                    true,
                )
            }
            (Step::Untrainable, Some(l)) => (
                [
                    l.prompt_token_ids.clone(),
                    l.completion_token_ids.clone(),
                    next(len),
                ]
                .concat(),
                false,
            ),
            (_, Some(l)) => (
                [
                    l.prompt_token_ids.clone(),
                    l.completion_token_ids.clone(),
                    next(len),
                ]
                .concat(),
                true,
            ),
        };
        if prompt.is_empty() {
            trainable = false;
        }
        let mut c = call(index, &prompt, &next(len));
        c.trainable = trainable;
        calls.push(c);
    }
    (calls, retried)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn tree_invariants(steps in prop::collection::vec(step(), 1..25), lens in prop::collection::vec(1usize..12, 1..5), seed in any::<u64>()) {
        let (calls, retried) = simulate(&steps, &lens);
        let tree = TrajectoryTree::build(&calls);
        let seqs = tree.sequences();
        let by_index = |i: i64| calls.iter().find(|c| c.call_index == i).unwrap();
        let mut on_some_path = std::collections::BTreeSet::new();
        for s in &seqs {
            let mut expected_masked = 0;
            for &ci in &s.call_indices {
                on_some_path.insert(ci);
                let c = by_index(ci);
                let span = c.prompt_token_ids.len()..c.prompt_token_ids.len() + c.completion_token_ids.len();
                // The path holds exactly what this call saw and sampled.
                prop_assert_eq!(&s.token_ids[..c.prompt_token_ids.len()], &c.prompt_token_ids[..]);
                prop_assert_eq!(&s.token_ids[span.clone()], &c.completion_token_ids[..]);
                if c.trainable {
                    expected_masked += span.len();
                    prop_assert!(s.loss_mask[span.clone()].iter().all(|&m| m == 1));
                    prop_assert_eq!(&s.sampling_logprobs[span.clone()], &c.completion_logprobs[..]);
                } else {
                    prop_assert!(s.loss_mask[span].iter().all(|&m| m == 0));
                }
            }
            // No harness-written token is masked in.
            prop_assert_eq!(s.loss_mask.iter().filter(|&&m| m == 1).count(), expected_masked);
            prop_assert!(s.sampling_logprobs.iter().zip(&s.loss_mask).all(|(&l, &m)| m == 1 || l == 0.0));
        }
        prop_assert_eq!(on_some_path.len(), calls.len(), "every call is on a path");
        for r in &retried {
            prop_assert!(seqs.iter().filter(|s| s.call_indices.contains(r)).all(|s| s.discarded), "retried call {} not discarded", r);
        }
        let drifts = steps.iter().skip(1).filter(|s| matches!(s, Step::Drift)).count();
        prop_assert!(tree.findings().iter().filter(|f| f.kind == FindingKind::Drift).count() <= drifts);

        // Arrival order does not matter.
        let mut shuffled = calls.clone();
        let mut x = seed | 1;
        for i in (1..shuffled.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        prop_assert_eq!(TrajectoryTree::build(&shuffled).sequences(), seqs);
    }

    /// Stored compactly (each call a splice of a recent one, as the proxy
    /// records it) and read back in any order, the calls are the same calls
    /// and build the same tree.
    #[test]
    fn compact_storage_builds_the_same_tree(steps in prop::collection::vec(step(), 1..25), lens in prop::collection::vec(1usize..12, 1..5), seed in any::<u64>()) {
        use forgelog_schemas::compact::{expand_finished, SessionMemory};
        let (calls, _) = simulate(&steps, &lens);
        let mut memory = SessionMemory::default();
        let mut stored: Vec<CallFinished> = calls
            .iter()
            .map(|c| {
                let mut c = c.clone();
                let whole = memory.compact_finished(&mut c);
                memory.remember(whole);
                c
            })
            .collect();
        let mut x = seed | 1;
        for i in (1..stored.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            stored.swap(i, (x % (i as u64 + 1)) as usize);
        }
        prop_assert!(expand_finished(&mut stored).is_empty());
        stored.sort_by_key(|c| c.call_index);
        prop_assert_eq!(&stored, &calls);
        prop_assert_eq!(TrajectoryTree::build(&stored).sequences(), TrajectoryTree::build(&calls).sequences());
    }
}
