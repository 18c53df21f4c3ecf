//! Whether a learner step went where the rewards said: a run's groups read
//! back from the log, the tool-call grammar that gives a small model's
//! rollouts different rewards, and how a step moved each kind of token's
//! logprob (teacher-forced by the engine that serves the versions, or by
//! forgelog's model code on the published weights).

use forgelog_model::{KvCache, Policy};
use forgelog_schemas::Event;
use serde_json::json;

/// The commands a training run's grammar offers on hello-file: its answer
/// and three that solve nothing. SmolLM2 picked the answer in 16 of 32
/// rollouts measured through vLLM, so a group of eight scores alike about
/// once in a hundred.
pub const HELLO_FILE_COMMANDS: &[&str] = &[
    "echo 'Hello, forgelog!' > /app/hello.txt",
    "ls /app",
    "head -3 /app/data.txt",
    "wc -l /app/data.txt",
];

/// `structured_outputs` (vLLM's, which forgelog's engine also takes) holding each answer to one Hermes
/// `<tool_call>` of a harness's shell tool `tool` (its command in the
/// argument `arg`: `bash(command)`, Claude Code's `Bash(command)`, Codex's
/// `exec_command(cmd)`) running one of `commands`: SmolLM2-135M writes no
/// tool call of its own. For `--extra-body`.
pub fn tool_call_grammar(tool: &str, arg: &str, commands: &[&str]) -> String {
    let escape = |c: &str| {
        c.chars()
            .flat_map(|ch| {
                let special = r".|()[]{}*+?^$\".contains(ch);
                special.then_some('\\').into_iter().chain([ch])
            })
            .collect::<String>()
    };
    let choices: Vec<String> = commands.iter().map(|c| escape(c)).collect();
    let regex = format!(
        "<tool_call>\n\\{{\"name\": \"{}\", \"arguments\": \\{{\"{}\": \"({})\"\\}}\\}}\n</tool_call>",
        escape(tool),
        escape(arg),
        choices.join("|")
    );
    json!({"structured_outputs": {"regex": regex}}).to_string()
}

/// `run`'s events on `topic`, each decodable.
pub fn events_of(
    config: &forgelog_stream::StreamConfig,
    topic: forgelog_schemas::Topic,
    run: &str,
) -> Vec<Event> {
    forgelog_stream::ReplayReader::new(config)
        .unwrap()
        .read(topic.name(), forgelog_stream::StartAt::Beginning, Some(run))
        .unwrap()
        .into_iter()
        .map(|r| r.event.expect("decodable"))
        .collect()
}

/// `run`'s calls, whole (as every reader of the log sees them).
pub fn calls_of(config: &forgelog_stream::StreamConfig, run: &str) -> Vec<Event> {
    let mut calls = events_of(config, forgelog_schemas::Topic::Calls, run);
    forgelog_schemas::compact::expand_events(&mut calls);
    calls
}

/// The versions `run` published, in order.
pub fn published(
    config: &forgelog_stream::StreamConfig,
    run: &str,
) -> Vec<forgelog_schemas::PolicyPublished> {
    events_of(config, forgelog_schemas::Topic::Policy, run)
        .into_iter()
        .filter_map(|e| match e {
            Event::PolicyPublished(p) => Some(p),
            _ => None,
        })
        .collect()
}

/// The training batch of `run`'s group on `task`.
pub fn batch_of(
    config: &forgelog_stream::StreamConfig,
    run: &str,
    task: &str,
) -> forgelog_schemas::TrainingBatch {
    events_of(config, forgelog_schemas::Topic::Batches, run)
        .into_iter()
        .find_map(|e| match e {
            Event::TrainingBatch(b) if b.task_id == task => Some(b),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{run}: no batch of {task}"))
}

/// A training run on one group whose rewards differ: `train(attempt)` (0,
/// 1, 2) runs one on `task` and names its run. A group that scored alike
/// teaches nothing, so it runs again, three times at most.
pub fn a_group_with_variance(
    config: &forgelog_stream::StreamConfig,
    task: &str,
    mut train: impl FnMut(usize) -> String,
) -> (String, forgelog_schemas::TrainingBatch) {
    for attempt in 0..3 {
        let run = train(attempt);
        let batch = batch_of(config, &run, task);
        let rewards: Vec<Option<f64>> = batch.members.iter().map(|m| m.reward).collect();
        eprintln!("{run}: {task}'s rewards {rewards:?}");
        if !batch.no_reward_variance {
            return (run, batch);
        }
    }
    panic!("three runs of {task} whose groups scored alike");
}

/// The token ids of each trajectory of `batch`, member by member: what an
/// engine teacher-forces, in the order [`LogprobMoves`] reads its results.
pub fn trajectories(batch: &forgelog_schemas::TrainingBatch) -> impl Iterator<Item = &[u32]> + '_ {
    batch
        .members
        .iter()
        .flat_map(|m| &m.sequences)
        .map(|s| s.token_ids.as_slice())
}

/// A sampled token was a decision when the model gave it less than this
/// logprob (p < 0.9) when it sampled it: which command to run, say. The
/// other choices are near-certain ones, mostly which of two tokenizations
/// spells the tool call's fixed text, the same text in every rollout of the
/// group: rewarded in some rollouts and penalized in others, their gradients
/// cancel to first order, and what the step's size does to them (Adam's
/// first step moves every weight by the learning rate) is drift, not the
/// rewards' word. With four rollouts of six rewarded, that drift once
/// lowered the rewarded rollouts' near-certain tokens by 0.19 on average
/// while the step raised their decisions.
pub const DECISION: f32 = -0.105;

/// The learning rate of the one step a gradient check takes (full weights,
/// SmolLM2). Adam's first step moves every weight by about the rate, so a
/// step's effect on a logprob is the rewards' word to first order in the rate
/// and a drift down on every peaked distribution to second order. At 1e-4
/// the drift was as large as the word: rewarded rollouts' decisions moved
/// -0.19, -0.057, -0.010 (and +0.083) while failed ones' fell by 1.3 to 1.9,
/// and the near-certain choices by up to 0.63. At 3e-5, four runs: +0.15 to
/// +0.30 and -0.41 to -0.57, near-certain -0.08 to +0.16.
pub const CHECK_LEARNING_RATE: &str = "3e-5";

/// How a step moved the logprobs of a group's tokens, by kind.
#[derive(Default)]
pub struct LogprobMoves {
    /// Decisions (see [`DECISION`]) the model sampled (mask 1, the loss's)
    /// in members with a positive advantage.
    pub positive: Mean,
    pub negative: Mean,
    /// The other sampled tokens the model had a choice over, either sign.
    pub near_certain: Mean,
    /// Sampled tokens the grammar forced (recorded logprob 0): outside the loss.
    pub forced: Mean,
    /// What the harness or tools wrote (mask 0): context, outside the loss.
    pub context: Mean,
}

#[derive(Default)]
pub struct Mean {
    n: usize,
    sum: f64,
}

impl Mean {
    fn add(&mut self, x: f64) {
        self.n += 1;
        self.sum += x;
    }

    pub fn mean(&self) -> f64 {
        self.sum / self.n as f64
    }
}

impl LogprobMoves {
    /// `after − before` of each token of `batch`'s trajectories but the first.
    pub fn of(
        batch: &forgelog_schemas::TrainingBatch,
        before: &[Vec<f64>],
        after: &[Vec<f64>],
    ) -> LogprobMoves {
        let mut moves = LogprobMoves::default();
        moves.add(batch, before, after);
        moves
    }

    /// Adds `batch`'s moves (as [`LogprobMoves::of`]).
    pub fn add(
        &mut self,
        batch: &forgelog_schemas::TrainingBatch,
        before: &[Vec<f64>],
        after: &[Vec<f64>],
    ) {
        let moves = self;
        let sequences = batch
            .members
            .iter()
            .flat_map(|m| m.sequences.iter().map(move |s| (m.advantage, s)));
        for ((advantage, s), (before, after)) in sequences.zip(before.iter().zip(after)) {
            for j in 1..s.token_ids.len() {
                let moved = after[j] - before[j];
                let sampled = s.sampling_logprobs[j];
                match (s.loss_mask[j], advantage) {
                    (0, _) => moves.context.add(moved),
                    _ if sampled == 0.0 => moves.forced.add(moved),
                    _ if sampled >= DECISION => moves.near_certain.add(moved),
                    (_, Some(a)) if a > 0.0 => moves.positive.add(moved),
                    (_, Some(a)) if a < 0.0 => moves.negative.add(moved),
                    _ => {}
                }
            }
        }
    }
}

impl std::fmt::Display for LogprobMoves {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let kinds = [
            ("decisions, positive advantage", &self.positive),
            ("decisions, negative advantage", &self.negative),
            ("near-certain choices", &self.near_certain),
            ("forced", &self.forced),
            ("mask 0", &self.context),
        ];
        for (name, m) in kinds {
            write!(f, "{name}: {} tokens, mean {:+.4}; ", m.n, m.mean())?;
        }
        Ok(())
    }
}

/// The learner trains exactly the sampled tokens (mask 1) the model had a
/// choice over (recorded logprob below 0: not forced by a grammar), with
/// their recorded logprobs: a trajectory per each of `rollouts`.
pub fn assert_learner_reads_the_choices(batch: &forgelog_schemas::TrainingBatch, rollouts: usize) {
    let sampled: Vec<(Vec<usize>, Vec<f32>)> = batch
        .members
        .iter()
        .flat_map(|m| &m.sequences)
        .map(|s| {
            let at: Vec<usize> = (1..s.token_ids.len())
                .filter(|&j| s.loss_mask[j] == 1 && s.sampling_logprobs[j] < 0.0)
                .collect();
            let recorded = at.iter().map(|&j| s.sampling_logprobs[j]).collect();
            (at, recorded)
        })
        .collect();
    let learned: Vec<(Vec<usize>, Vec<f32>)> = forgelog_trainer::learner::sampled_sequences(batch)
        .into_iter()
        .map(|s| (s.positions, s.recorded))
        .collect();
    assert_eq!(learned.len(), rollouts, "a trajectory per rollout");
    assert_eq!(learned, sampled);
}

/// The logprob of each token of `tokens` after the ones before it under
/// `policy` (temperature 1; the first token has none: `NaN`): a teacher-forced
/// forward pass of forgelog's model code. In tensor ops, which run optimised
/// in a test build (a loop over a 49k vocabulary per position does not).
pub fn teacher_forced_by(policy: &Policy, tokens: &[u32]) -> Vec<f64> {
    let logits = policy.model.forward(tokens, &mut KvCache::new()).unwrap();
    let n = tokens.len();
    let logits = logits.narrow(0, 0, n - 1).unwrap();
    let max = logits.max_keepdim(1).unwrap();
    let shifted = logits.broadcast_sub(&max).unwrap();
    let total = shifted
        .exp()
        .unwrap()
        .sum_keepdim(1)
        .unwrap()
        .log()
        .unwrap();
    let next = candle_core::Tensor::new(&tokens[1..], logits.device())
        .unwrap()
        .unsqueeze(1)
        .unwrap();
    let chosen = shifted
        .gather(&next, 1)
        .unwrap()
        .broadcast_sub(&total)
        .unwrap();
    let chosen: Vec<f32> = chosen.flatten_all().unwrap().to_vec1().unwrap();
    std::iter::once(f64::NAN)
        .chain(chosen.into_iter().map(f64::from))
        .collect()
}
