//! Continuous batching: one thread owns the model and runs steps for every
//! active sequence together. A step prefills the sequences admitted since the
//! last step (whole prompts) and decodes one token for the others, as one
//! ragged batch where each sequence keeps its own KV cache. A new sequence
//! starts from the longest prefix of its prompt in the [`PrefixCache`]; one
//! that shares a prefix with a prompt being prefilled waits that step, then
//! starts from it. New requests and weight swaps are taken between steps, so
//! a swap is atomic with respect to steps and in-flight sequences simply
//! continue on the new weights.

use crate::prefix_cache::{common_prefix, PrefixCache, MIN_REUSED_TOKENS};
use crate::sampling::{sample, Rng, Sampled, SamplerConfig};
use candle_core::{Device, Tensor};
/// Why a generation ended: the engine uses `Stop` and `Length` of the shared one.
pub use forgelog_dialects::canonical::FinishReason;
use forgelog_model::{KvCache, Logits, Transformer};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokenizers::Tokenizer;
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplerConfig,
    /// Strings that end the completion; the text is cut before them.
    pub stop: Vec<String>,
    /// Keep sampling past stop tokens (vLLM's `ignore_eos`), e.g. for benchmarks.
    pub ignore_eos: bool,
}

#[derive(Debug, Clone)]
pub struct Generation {
    /// Every sampled token, the final stop token included.
    pub tokens: Vec<u32>,
    /// The processed logprob of each sampled token.
    pub logprobs: Vec<f32>,
    /// The decoded completion, special tokens and stop strings removed.
    pub text: String,
    pub finish_reason: FinishReason,
    /// The weights that prefilled this request.
    pub policy_version: u64,
    pub time_to_first_token: Duration,
}

enum Command {
    Generate(
        GenerationRequest,
        Instant,
        oneshot::Sender<Result<Generation, String>>,
    ),
    Swap(Box<Transformer>, u64, oneshot::Sender<()>),
}

/// A handle on the scheduler thread; cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    commands: mpsc::UnboundedSender<Command>,
    version: Arc<AtomicU64>,
    admitted: Arc<AtomicU64>,
    reused: Arc<AtomicU64>,
}

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("the scheduler has stopped")]
    Stopped,
    #[error("model step failed: {0}")]
    Step(String),
}

impl Scheduler {
    /// Starts the scheduler thread serving `model` as policy version
    /// `version`, keeping up to `prefix_cache_tokens` tokens' keys and values
    /// of recent sequences for the requests that go on from them.
    pub fn start(
        model: Transformer,
        tokenizer: Arc<Tokenizer>,
        stop_token_ids: Vec<u32>,
        version: u64,
        prefix_cache_tokens: usize,
    ) -> Scheduler {
        let (commands, receiver) = mpsc::unbounded_channel();
        let version = Arc::new(AtomicU64::new(version));
        let admitted = Arc::new(AtomicU64::new(0));
        let reused = Arc::new(AtomicU64::new(0));
        let state = Loop {
            model,
            tokenizer,
            stop_token_ids,
            version: version.clone(),
            admitted: admitted.clone(),
            reused: reused.clone(),
            active: Vec::new(),
            seeds: 0,
            prefix_cache: PrefixCache::new(prefix_cache_tokens),
        };
        std::thread::Builder::new()
            .name("forgelog-scheduler".into())
            .spawn(move || state.run(receiver))
            .expect("spawn the scheduler thread");
        Scheduler {
            commands,
            version,
            admitted,
            reused,
        }
    }

    /// Requests admitted so far (each stamped with the version serving then).
    pub fn admitted(&self) -> u64 {
        self.admitted.load(Ordering::SeqCst)
    }

    /// Prompt tokens taken from the prefix cache so far, not prefilled.
    pub fn reused(&self) -> u64 {
        self.reused.load(Ordering::SeqCst)
    }

    /// The policy version now serving.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    pub async fn generate(&self, request: GenerationRequest) -> Result<Generation, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Generate(request, Instant::now(), reply))
            .map_err(|_| SchedulerError::Stopped)?;
        answer
            .await
            .map_err(|_| SchedulerError::Stopped)?
            .map_err(SchedulerError::Step)
    }

    /// Replaces the weights between two steps; returns once they serve.
    pub async fn swap(&self, model: Transformer, version: u64) -> Result<(), SchedulerError> {
        let (done, swapped) = oneshot::channel();
        self.commands
            .send(Command::Swap(Box::new(model), version, done))
            .map_err(|_| SchedulerError::Stopped)?;
        swapped.await.map_err(|_| SchedulerError::Stopped)
    }
}

struct Sequence {
    request: GenerationRequest,
    reply: oneshot::Sender<Result<Generation, String>>,
    submitted: Instant,
    time_to_first_token: Duration,
    cache: KvCache,
    rng: Rng,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    /// Set when its prefill starts (see [`Loop::start_sequences`]).
    policy_version: u64,
}

struct Loop {
    model: Transformer,
    tokenizer: Arc<Tokenizer>,
    stop_token_ids: Vec<u32>,
    version: Arc<AtomicU64>,
    admitted: Arc<AtomicU64>,
    reused: Arc<AtomicU64>,
    active: Vec<Sequence>,
    /// Seeds for requests without one: distinct, so that unseeded requests differ.
    seeds: u64,
    /// Keys and values of the serving weights only: emptied at a swap.
    prefix_cache: PrefixCache,
}

impl Loop {
    fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.active.is_empty() {
                match commands.blocking_recv() {
                    Some(command) => self.apply(command),
                    None => return,
                }
            }
            while let Ok(command) = commands.try_recv() {
                self.apply(command);
            }
            if !self.active.is_empty() {
                self.step();
            }
        }
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Swap(model, version, done) => {
                self.model = *model;
                self.prefix_cache.clear();
                self.version.store(version, Ordering::SeqCst);
                metrics::gauge!("forgelog_engine_policy_version").set(version as f64);
                let _ = done.send(());
            }
            Command::Generate(request, submitted, reply) => {
                let seed = request.sampling.seed.unwrap_or_else(|| {
                    self.seeds += 1;
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    now.as_nanos() as u64 ^ self.seeds.rotate_left(32)
                });
                self.active.push(Sequence {
                    prefilled: 0,
                    request,
                    reply,
                    submitted,
                    time_to_first_token: Duration::ZERO,
                    cache: KvCache::new(),
                    rng: Rng::new(seed),
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    policy_version: self.version.load(Ordering::SeqCst),
                });
                self.admitted.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Which active sequences feed this step, starting new ones from the
    /// prefix cache. A new sequence that shares a prefix with a prompt being
    /// prefilled now (a GRPO group's members arrive together) waits: that
    /// prompt is in the cache after this step.
    fn start_sequences(&mut self) -> Vec<bool> {
        let mut feeds = Vec::with_capacity(self.active.len());
        let mut prefilling: Vec<usize> = Vec::new();
        for i in 0..self.active.len() {
            let new = self.active[i].prefilled == 0 && self.active[i].cache.is_empty();
            if new {
                match self.prefix_cache.lookup(&self.active[i].request.prompt) {
                    Some((reused, cache)) => {
                        let sequence = &mut self.active[i];
                        sequence.cache = cache;
                        sequence.prefilled = reused;
                        self.reused.fetch_add(reused as u64, Ordering::SeqCst);
                        metrics::counter!("forgelog_engine_prefix_cache_hit_tokens_total")
                            .increment(reused as u64);
                    }
                    None if self.prefix_cache.enabled() => {
                        let prompt = &self.active[i].request.prompt;
                        let shares = prefilling.iter().any(|&j| {
                            common_prefix(&self.active[j].request.prompt, prompt)
                                >= MIN_REUSED_TOKENS
                        });
                        if shares {
                            feeds.push(false);
                            continue;
                        }
                    }
                    None => {}
                }
            }
            if new {
                // The weights its prompt and first token are computed with:
                // a swap applied after its admission and before this step
                // serves it (swaps are taken between steps).
                self.active[i].policy_version = self.version.load(Ordering::SeqCst);
            }
            if self.active[i].prefilled < self.active[i].request.prompt.len() {
                prefilling.push(i);
            }
            feeds.push(true);
        }
        feeds
    }

    fn step(&mut self) {
        let started = Instant::now();
        // A client that went away no longer needs its tokens.
        self.active.retain(|s| !s.reply.is_closed());
        let feeds = self.start_sequences();
        let mut batch: Vec<(&[u32], &mut KvCache)> = self
            .active
            .iter_mut()
            .zip(&feeds)
            .filter(|(_, &feeds)| feeds)
            .map(|(s, _)| {
                (
                    next_input(&s.request.prompt, s.prefilled, &s.tokens),
                    &mut s.cache,
                )
            })
            .collect();
        let forward = Instant::now();
        let logits = self
            .model
            .forward_batch(&mut batch, Logits::Last)
            // A GPU runs the step asynchronously: wait for it, so the phases
            // split device time from host time (reading the logits would wait anyway).
            .and_then(|logits| self.model.device().synchronize().map(|()| logits));
        let sampling = Instant::now();
        record_step_phase("schedule", forward - started);
        record_step_phase("forward", sampling - forward);
        let logits = match logits.and_then(on_host) {
            Ok(logits) => logits,
            Err(e) => {
                for sequence in self.active.drain(..) {
                    let _ = sequence.reply.send(Err(e.to_string()));
                }
                return;
            }
        };
        // Which sequences sample now (decoding, or their prompt's last chunk
        // fed), with their logits.
        let mut logits = logits.into_iter();
        let mut rows: Vec<Option<Tensor>> = Vec::with_capacity(self.active.len());
        for (sequence, &fed) in self.active.iter_mut().zip(&feeds) {
            let prompt_len = sequence.request.prompt.len();
            let row = fed.then(|| logits.next().expect("logits for every sequence fed"));
            if fed && sequence.prefilled < prompt_len {
                sequence.prefilled = (sequence.prefilled + PREFILL_CHUNK).min(prompt_len);
                if sequence.prefilled < prompt_len {
                    rows.push(None);
                    continue;
                }
                if let Ok(prompt_cache) = sequence.cache.fork() {
                    self.prefix_cache
                        .insert(sequence.request.prompt.clone(), prompt_cache);
                }
            }
            rows.push(row);
        }
        // Each sequence samples from its own logits with its own generator:
        // independent, so spread over the cores (a vocabulary of 150k makes
        // this the host's larger share of a step).
        let sampled: Vec<Option<Result<Sampled, String>>> = self
            .active
            .par_iter_mut()
            .zip(rows)
            .map(|(sequence, row)| {
                let row = row?.flatten_all().and_then(|l| l.to_vec1::<f32>());
                Some(
                    row.map(|row| sample(&row, &sequence.request.sampling, &mut sequence.rng))
                        .map_err(|e| e.to_string()),
                )
            })
            .collect();
        let context = self.model.config().max_position_embeddings;
        let mut still_active = Vec::with_capacity(self.active.len());
        for (mut sequence, sampled) in self.active.drain(..).zip(sampled) {
            let sampled = match sampled {
                None => {
                    still_active.push(sequence);
                    continue;
                }
                Some(Err(e)) => {
                    let _ = sequence.reply.send(Err(e));
                    continue;
                }
                Some(Ok(sampled)) => sampled,
            };
            if sequence.tokens.is_empty() {
                sequence.time_to_first_token = sequence.submitted.elapsed();
            }
            sequence.tokens.push(sampled.token);
            sequence.logprobs.push(sampled.logprob);
            match finish(&sequence, &self.stop_token_ids, &self.tokenizer, context) {
                None => still_active.push(sequence),
                Some((finish_reason, text)) => {
                    record_finished(&sequence, &finish_reason);
                    // Its keys and values, for the request that goes on from
                    // it: all but the last sampled token, which was never fed.
                    let Sequence {
                        request,
                        reply,
                        cache,
                        tokens,
                        logprobs,
                        policy_version,
                        time_to_first_token,
                        ..
                    } = sequence;
                    let mut fed = request.prompt;
                    fed.extend_from_slice(&tokens[..tokens.len() - 1]);
                    self.prefix_cache.insert(fed, cache);
                    let generation = Generation {
                        tokens,
                        logprobs,
                        text,
                        finish_reason,
                        policy_version,
                        time_to_first_token,
                    };
                    let _ = reply.send(Ok(generation));
                }
            }
        }
        self.active = still_active;
        record_step_phase("sample", sampling.elapsed());
        metrics::gauge!("forgelog_engine_running").set(self.active.len() as f64);
        metrics::gauge!("forgelog_engine_prefix_cache_tokens").set(self.prefix_cache.held() as f64);
    }
}

/// A step's logits on the host, in one copy. Each sequence's rows are a
/// view of one device matrix, and reading a view off a GPU copies its whole
/// matrix: per sequence, that is quadratic in the batch (1.7 s a step at 64
/// sequences of a 152k vocabulary on an H200).
fn on_host(logits: Vec<Tensor>) -> candle_core::Result<Vec<Tensor>> {
    if logits.first().is_none_or(|l| l.device().is_cpu()) {
        return Ok(logits);
    }
    let all = Tensor::cat(&logits, 0)?.to_device(&Device::Cpu)?;
    let mut row = 0;
    logits
        .iter()
        .map(|l| {
            let n = l.dim(0)?;
            row += n;
            all.narrow(0, row - n, n)
        })
        .collect()
}

/// Where a step's time goes: `schedule` (admission, prefix-cache lookups),
/// `forward` (the model, on its device), `sample` (logits to the host,
/// sampling, stop checks, replies).
fn record_step_phase(phase: &'static str, took: Duration) {
    metrics::histogram!("forgelog_engine_step_seconds", "phase" => phase)
        .record(took.as_secs_f64());
}

/// A finished generation in the engine's metrics (vLLM's set: tokens,
/// time to first token, request time, by finish reason).
fn record_finished(sequence: &Sequence, reason: &FinishReason) {
    metrics::counter!("forgelog_engine_requests_total", "finish_reason" => reason.openai())
        .increment(1);
    metrics::counter!("forgelog_engine_prompt_tokens_total")
        .increment(sequence.request.prompt.len() as u64);
    metrics::counter!("forgelog_engine_generation_tokens_total")
        .increment(sequence.tokens.len() as u64);
    metrics::histogram!("forgelog_engine_time_to_first_token_seconds")
        .record(sequence.time_to_first_token.as_secs_f64());
    metrics::histogram!("forgelog_engine_request_seconds")
        .record(sequence.submitted.elapsed().as_secs_f64());
}

/// Prompt tokens fed per step: bounds the attention scores of a long prompt
/// and keeps decoding sequences moving while it prefills.
const PREFILL_CHUNK: usize = 512;

/// What a sequence feeds next: its next prompt chunk, then its last sampled token.
fn next_input<'a>(prompt: &'a [u32], prefilled: usize, sampled: &'a [u32]) -> &'a [u32] {
    if prefilled < prompt.len() {
        &prompt[prefilled..(prefilled + PREFILL_CHUNK).min(prompt.len())]
    } else {
        &sampled[sampled.len() - 1..]
    }
}

fn decode(tokenizer: &Tokenizer, tokens: &[u32]) -> String {
    tokenizer.decode(tokens, true).unwrap_or_default()
}

/// Whether `sequence` is done after its last token, and then why and its text.
fn finish(
    sequence: &Sequence,
    stop_token_ids: &[u32],
    tokenizer: &Tokenizer,
    context: usize,
) -> Option<(FinishReason, String)> {
    let tokens = &sequence.tokens;
    let last = *tokens.last()?;
    if stop_token_ids.contains(&last) && !sequence.request.ignore_eos {
        return Some((
            FinishReason::Stop,
            decode(tokenizer, &tokens[..tokens.len() - 1]),
        ));
    }
    if !sequence.request.stop.is_empty() {
        let text = decode(tokenizer, tokens);
        let first_stop = sequence
            .request
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            return Some((FinishReason::Stop, text[..at].to_string()));
        }
    }
    let at_context = sequence.request.prompt.len() + tokens.len() >= context;
    if tokens.len() >= sequence.request.max_tokens || at_context {
        return Some((FinishReason::Length, decode(tokenizer, tokens)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_model::testing::{random_policy, tiny_config};

    fn serving(version: u64) -> (Loop, Transformer) {
        let device = Device::Cpu;
        let policy = random_policy(&tiny_config(64), "tiny", &device).unwrap();
        let next = random_policy(&tiny_config(64), "tiny", &device).unwrap();
        let state = Loop {
            model: policy.model,
            tokenizer: Arc::new(policy.tokenizer),
            stop_token_ids: Vec::new(),
            version: Arc::new(AtomicU64::new(version)),
            admitted: Arc::default(),
            reused: Arc::default(),
            active: Vec::new(),
            seeds: 0,
            prefix_cache: PrefixCache::new(0),
        };
        (state, next.model)
    }

    /// A request admitted before a swap and prefilled after it was sampled
    /// by the new weights: it says so (it used to carry the version it was
    /// admitted under). One prefilled before the swap keeps its version.
    #[test]
    fn a_request_carries_the_version_that_prefilled_it() {
        let request = GenerationRequest {
            prompt: vec![1, 2, 3],
            max_tokens: 3,
            sampling: SamplerConfig::default(),
            stop: Vec::new(),
            ignore_eos: true,
        };
        let (mut state, next) = serving(4);
        let (early, mut early_answer) = oneshot::channel();
        state.apply(Command::Generate(request.clone(), Instant::now(), early));
        state.step();
        let (late, mut late_answer) = oneshot::channel();
        state.apply(Command::Generate(request, Instant::now(), late));
        let (swapped, _) = oneshot::channel();
        state.apply(Command::Swap(Box::new(next), 5, swapped));
        while !state.active.is_empty() {
            state.step();
        }
        let version = |answer: &mut oneshot::Receiver<Result<Generation, String>>| {
            answer.try_recv().unwrap().unwrap().policy_version
        };
        assert_eq!(version(&mut early_answer), 4, "prefilled before the swap");
        assert_eq!(
            version(&mut late_answer),
            5,
            "admitted before, prefilled after"
        );
    }
}
