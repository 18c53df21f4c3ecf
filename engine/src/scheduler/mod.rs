//! Continuous batching: one thread owns the model and runs steps for every
//! active sequence together. A step prefills the sequences admitted since the
//! last step (whole prompts) and decodes one token for the others, as one
//! ragged batch where each sequence keeps its own KV cache. A new sequence
//! starts from the longest prefix of its prompt in the [`PrefixCache`]; one
//! that shares a prefix with a prompt being prefilled waits that step, then
//! starts from it. New requests and weight swaps are taken between steps, so
//! a swap is atomic with respect to steps and in-flight sequences simply
//! continue on the new weights.

use crate::grammar::TokenGrammar;
use crate::prefix_cache::PrefixCache;
use crate::sampling::{Rng, SamplerConfig};
/// Why a generation ended: the engine uses `Stop` and `Length` of the shared one.
pub use forgelog_dialects::canonical::FinishReason;
use forgelog_model::{KvCache, Transformer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokenizers::Tokenizer;
use tokio::sync::{mpsc, oneshot};

mod admission;
mod finish;
mod step;

#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplerConfig,
    /// Strings that end the completion; the text is cut before them.
    pub stop: Vec<String>,
    /// Keep sampling past stop tokens (vLLM's `ignore_eos`), e.g. for benchmarks.
    pub ignore_eos: bool,
    /// The expression the completion must match (`structured_outputs`).
    pub grammar: Option<TokenGrammar>,
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
            Command::Generate(request, submitted, reply) => self.admit(request, submitted, reply),
        }
    }
}

#[cfg(test)]
mod tests;
