//! How a step's sequences are fed to the model. Consecutive sequences that
//! begin with the same tokens (a GRPO group's members share their prompt)
//! form a [`SharedRun`]: the shared prefix is forwarded once and each member
//! goes on from it, so the prefix costs one forward and one backward however
//! many members share it. Runs are packed into micro-batches of a bounded
//! number of fed tokens, the activation memory of one forward and backward.

use super::SampledSequence;

/// Fewer shared tokens than this are fed with each member: splitting a
/// sequence in two costs a little for nothing then.
pub const MIN_SHARED_TOKENS: usize = 16;

/// Sequences fed from one forward of their common first `prefix` tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedRun<'a> {
    /// 0: each member is fed whole.
    pub prefix: usize,
    pub members: Vec<&'a SampledSequence>,
}

impl SharedRun<'_> {
    /// Tokens one forward of this run feeds.
    pub fn fed(&self) -> usize {
        self.prefix
            + self
                .members
                .iter()
                .map(|s| fed(s) - self.prefix)
                .sum::<usize>()
    }
}

/// The runs of one forward and backward.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MicroBatch<'a> {
    pub runs: Vec<SharedRun<'a>>,
}

impl<'a> MicroBatch<'a> {
    /// Its sequences, in the order the step gave them.
    pub fn sequences(&self) -> impl Iterator<Item = &'a SampledSequence> + '_ {
        self.runs.iter().flat_map(|r| r.members.iter().copied())
    }

    pub fn fed(&self) -> usize {
        self.runs.iter().map(SharedRun::fed).sum()
    }
}

/// The tokens a sequence feeds: all but its last (logits at row `i` predict
/// token `i + 1`).
fn fed(s: &SampledSequence) -> usize {
    s.tokens.len() - 1
}

/// The longest prefix `s` can be fed from: the tokens before the row that
/// predicts its first sampled token, which must be fed with the member.
fn shareable(s: &SampledSequence) -> usize {
    s.positions[0] - 1
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// `seqs` (each with at least one sampled position) in micro-batches of at
/// most `max_tokens` fed tokens, or of one sequence where that alone is more.
/// With `share` false, no prefix is shared. Sequences keep their order; a run
/// too big for one micro-batch is split, each part feeding the prefix again.
pub fn micro_batches(
    seqs: &[SampledSequence],
    max_tokens: usize,
    share: bool,
) -> Vec<MicroBatch<'_>> {
    let runs = if share {
        shared_runs(seqs)
    } else {
        seqs.iter().map(SharedRun::alone).collect()
    };
    let mut out: Vec<MicroBatch> = Vec::new();
    // The run the current micro-batch's last part belongs to.
    let mut last_run = None;
    for (r, run) in runs.iter().enumerate() {
        for &s in &run.members {
            let continues = last_run == Some(r);
            let cost = if continues {
                fed(s) - run.prefix
            } else {
                fed(s)
            };
            match out.last_mut() {
                Some(m) if m.fed() + cost <= max_tokens => match m.runs.last_mut() {
                    Some(part) if continues => part.members.push(s),
                    _ => m.runs.push(run.part(s)),
                },
                _ => out.push(MicroBatch {
                    runs: vec![run.part(s)],
                }),
            }
            last_run = Some(r);
        }
    }
    // A part of one member shares nothing: fed whole, in the batch's one forward.
    for part in out.iter_mut().flat_map(|m| &mut m.runs) {
        if part.members.len() == 1 {
            part.prefix = 0;
        }
    }
    out
}

impl<'a> SharedRun<'a> {
    fn alone(s: &'a SampledSequence) -> SharedRun<'a> {
        SharedRun {
            prefix: 0,
            members: vec![s],
        }
    }

    /// A part of this run that starts with `s`.
    fn part(&self, s: &'a SampledSequence) -> SharedRun<'a> {
        SharedRun {
            prefix: self.prefix,
            members: vec![s],
        }
    }
}

/// Consecutive sequences in runs: a sequence joins the run before it when
/// their common prefix is at least [`MIN_SHARED_TOKENS`] and feeding them
/// together costs fewer tokens than apart (a run's prefix may shrink to take
/// a member, never at a loss).
fn shared_runs(seqs: &[SampledSequence]) -> Vec<SharedRun<'_>> {
    let mut runs: Vec<SharedRun> = Vec::new();
    for s in seqs {
        if let Some(run) = runs.last_mut() {
            let first = run.members[0];
            let before = match run.members.len() {
                1 => shareable(first),
                _ => run.prefix,
            };
            let prefix = before
                .min(shareable(s))
                .min(common_prefix(&first.tokens, &s.tokens));
            let mut joined = SharedRun {
                prefix,
                members: run.members.clone(),
            };
            joined.members.push(s);
            if prefix >= MIN_SHARED_TOKENS && joined.fed() < run.fed() + fed(s) {
                *run = joined;
                continue;
            }
        }
        runs.push(SharedRun::alone(s));
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `prompt` then `own` tokens, sampled from `sampled_from` on.
    fn seq(prompt: &[u32], own: &[u32], sampled_from: usize) -> SampledSequence {
        let tokens: Vec<u32> = prompt.iter().chain(own).copied().collect();
        let positions: Vec<usize> = (sampled_from..tokens.len()).collect();
        SampledSequence {
            recorded: vec![0.0; positions.len()],
            tokens,
            positions,
            advantage: 1.0,
        }
    }

    #[test]
    fn a_groups_members_are_fed_from_one_copy_of_their_prompt() {
        let prompt: Vec<u32> = (0..260).collect();
        let other: Vec<u32> = (1000..1260).collect();
        let seqs = vec![
            seq(&prompt, &[1, 2, 3, 4], 262),
            seq(&prompt, &[5, 6, 7], 261),
            seq(&prompt, &[1, 2, 9], 260),
            // Another group's prompt: a run of its own.
            seq(&other, &[8, 8], 260),
            seq(&other, &[8, 9], 260),
        ];
        let micro = micro_batches(&seqs, 10_000, true);
        assert_eq!(micro.len(), 1);
        let runs = &micro[0].runs;
        // The first member shares its first 260 tokens with the others, up
        // to the row that predicts the third one's first sampled token.
        assert_eq!(
            (runs.len(), runs[0].prefix, runs[0].members.len()),
            (2, 259, 3)
        );
        assert_eq!((runs[1].prefix, runs[1].members.len()), (259, 2));
        assert_eq!(
            micro[0].fed(),
            259 + (263 - 259) + (262 - 259) + (262 - 259) + 259 + 2 + 2
        );
        // Without sharing, the same sequences, each fed whole.
        let apart = micro_batches(&seqs, 10_000, false);
        assert_eq!(apart[0].fed(), 263 + 262 + 262 + 261 + 261);
        assert!(apart[0].runs.iter().all(|r| r.prefix == 0));
    }

    #[test]
    fn a_run_too_big_for_a_micro_batch_is_split_and_feeds_its_prefix_again() {
        let prompt: Vec<u32> = (0..100).collect();
        let seqs: Vec<_> = (0..5).map(|i| seq(&prompt, &[i; 30], 100)).collect();
        let micro = micro_batches(&seqs, 200, true);
        // 99 shared + 30 a member: three fit in 200 tokens (189), then two.
        let sizes: Vec<(usize, usize)> = micro
            .iter()
            .map(|m| (m.runs[0].members.len(), m.fed()))
            .collect();
        assert_eq!(sizes, vec![(3, 99 + 3 * 30), (2, 99 + 2 * 30)]);
    }

    #[test]
    fn a_bound_that_holds_an_agents_prompt_and_its_answers_feeds_the_prompt_once() {
        // An agent's group: a 900-token prompt, eight answers of 50 tokens.
        // The bound counts the prompt (it is activation memory like any
        // row): at 1,536 (the learner's default) the group is one
        // micro-batch; at 1,024 (the old default) two members fit beside
        // the prompt, which each pair feeds again.
        let prompt: Vec<u32> = (0..900).collect();
        let seqs: Vec<_> = (0..8).map(|i| seq(&prompt, &[i; 50], 900)).collect();
        let sizes = |max| -> Vec<(usize, usize)> {
            micro_batches(&seqs, max, true)
                .iter()
                .map(|m| (m.runs[0].members.len(), m.fed()))
                .collect()
        };
        assert_eq!(sizes(1536), vec![(8, 899 + 8 * 50)]);
        assert_eq!(sizes(1024), vec![(2, 899 + 2 * 50); 4]);
    }

    proptest! {
        /// Whatever the sequences: each comes once, in order; a shared
        /// prefix is one every member has and precedes every row it is
        /// trained at; a micro-batch holds at most `max` fed tokens or one
        /// sequence; and sharing never feeds more than not sharing.
        #[test]
        fn micro_batches_keep_every_sequence_once_and_within_bounds(
            groups in prop::collection::vec((1usize..40, prop::collection::vec((0usize..20, 1usize..20), 1..5)), 1..6),
            max in 10usize..200,
        ) {
            let mut seqs = Vec::new();
            for (g, (prompt_len, members)) in groups.iter().enumerate() {
                let prompt: Vec<u32> = (0..*prompt_len as u32).map(|i| i + 100 * g as u32).collect();
                for (m, &(prompt_sampled, own)) in members.iter().enumerate() {
                    let own: Vec<u32> = (0..own as u32).map(|i| 10_000 + i * 7 + m as u32).collect();
                    let from = prompt_sampled.clamp(1, prompt_len + own.len() - 1);
                    seqs.push(seq(&prompt, &own, from));
                }
            }
            for share in [true, false] {
                let micro = micro_batches(&seqs, max, share);
                let order: Vec<*const SampledSequence> =
                    micro.iter().flat_map(|m| m.sequences()).map(|s| s as *const _).collect();
                let given: Vec<*const SampledSequence> = seqs.iter().map(|s| s as *const _).collect();
                prop_assert_eq!(order, given);
                for m in &micro {
                    prop_assert!(m.fed() <= max || m.sequences().count() == 1, "{} fed", m.fed());
                    for run in &m.runs {
                        for s in &run.members {
                            prop_assert!(run.prefix <= shareable(s));
                            prop_assert_eq!(&s.tokens[..run.prefix], &run.members[0].tokens[..run.prefix]);
                        }
                        prop_assert!(share || run.prefix == 0);
                    }
                }
            }
            let fed = |share| micro_batches(&seqs, usize::MAX, share)[0].fed();
            prop_assert!(fed(true) <= fed(false));
        }
    }
}
