//! forgelog-engine: a candle inference server that returns sampled token ids
//! and logprobs the way vLLM does (`--return-tokens-as-token-ids`,
//! processed logprobs), batches concurrent requests, and swaps in new weights
//! when the trainer publishes a policy.
//!
//! The pure core is [`sampling`] and [`api`] (tool calls are parsed by
//! `forgelog_dialects::hermes`); [`scheduler`]
//! owns the model on its own thread; [`server`] and [`follow_policy`] are the
//! thin HTTP and Kafka shells.

pub mod access;
pub mod api;
mod args;
mod follow;
pub mod grammar;
pub mod prefix_cache;
mod process;
mod reload;
pub mod sampling;
pub mod scheduler;
pub mod server;
#[cfg(feature = "testing")]
pub mod testing;

pub use args::{EngineArgs, DEFAULT_PREFIX_CACHE_MIB};
pub use follow::follow_policy;
pub use process::{run, serve, serve_on};
pub use reload::DEFAULT_MAX_CHECKPOINT_BYTES;

use candle_core::Device;
use forgelog_model::{ChatTemplate, ModelConfig, Policy};
use scheduler::{Generation, GenerationRequest, Scheduler, SchedulerError};
use serde_json::Value;
use std::sync::Arc;
use tokenizers::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Load(#[from] forgelog_model::LoadError),
    #[error(transparent)]
    Template(#[from] forgelog_model::TemplateError),
    #[error("tokenizer: {0}")]
    Tokenize(String),
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("device: {0}")]
    Device(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("policy consumer: {0}")]
    Consume(#[from] forgelog_stream::ConsumeError),
    #[error("version {version} is not newer than the serving policy {serving}")]
    StaleVersion { version: u64, serving: u64 },
}

pub use forgelog_model::DeviceKind;

/// A model's tensors by checkpoint name.
type Weights = std::collections::HashMap<String, candle_core::Tensor>;

struct Shared {
    name: String,
    config: ModelConfig,
    device: Device,
    tokenizer: Arc<Tokenizer>,
    chat_template: ChatTemplate,
    scheduler: Scheduler,
    /// Serializes reloads so versions are applied in the order asked.
    reloading: tokio::sync::Mutex<()>,
    /// Checkpoints loaded since the start.
    loaded: std::sync::atomic::AtomicU64,
    /// The weights it started with, by checkpoint name: what a LoRA version
    /// published as its adapter alone is merged onto. Shared with the model
    /// until the first reload, then a second copy of the model's memory
    /// while adapters arrive; let go once whole weights are loaded (a
    /// full-weight run would otherwise hold the model twice for ever).
    base: std::sync::Mutex<Option<Arc<Weights>>>,
    /// Each token's bytes, made at the first request with `structured_outputs`.
    vocabulary: std::sync::OnceLock<Arc<grammar::Vocabulary>>,
}

/// A running engine: the scheduler and what the HTTP layer needs. Cheap to clone.
#[derive(Clone)]
pub struct Engine(Arc<Shared>);

impl Engine {
    /// Starts serving `policy` as policy version 0, with a prefix cache of
    /// [`DEFAULT_PREFIX_CACHE_MIB`].
    pub fn start(policy: Policy) -> Engine {
        Engine::start_with(policy, DEFAULT_PREFIX_CACHE_MIB)
    }

    /// [`Engine::start`] with `prefix_cache_mib` of prefix cache (0: none).
    pub fn start_with(policy: Policy, prefix_cache_mib: u64) -> Engine {
        let Policy {
            name,
            model,
            tokenizer,
            chat_template,
            stop_token_ids,
            weights: base,
        } = policy;
        let (config, device) = (model.config().clone(), model.device().clone());
        let tokenizer = Arc::new(tokenizer);
        // Keys and values per token: two f32 vectors per layer and KV head.
        let token_bytes =
            2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim() * 4;
        let prefix_cache_tokens = (prefix_cache_mib << 20) as usize / token_bytes.max(1);
        let scheduler = Scheduler::start(
            model,
            tokenizer.clone(),
            stop_token_ids,
            0,
            prefix_cache_tokens,
        );
        Engine(Arc::new(Shared {
            name,
            config,
            device,
            tokenizer,
            chat_template,
            scheduler,
            reloading: tokio::sync::Mutex::new(()),
            loaded: Default::default(),
            base: std::sync::Mutex::new(Some(Arc::new(base))),
            vocabulary: Default::default(),
        }))
    }

    pub fn model_name(&self) -> &str {
        &self.0.name
    }

    pub fn context_length(&self) -> usize {
        self.0.config.max_position_embeddings
    }

    /// Each token's bytes, for structured outputs.
    pub fn vocabulary(&self) -> Arc<grammar::Vocabulary> {
        self.0
            .vocabulary
            .get_or_init(|| Arc::new(grammar::Vocabulary::of(&self.0.tokenizer)))
            .clone()
    }

    pub fn vocab_size(&self) -> usize {
        self.0.config.vocab_size
    }

    pub fn policy_version(&self) -> u64 {
        self.0.scheduler.version()
    }

    /// Checkpoints this engine has loaded since it started (each costs a
    /// read of the whole model).
    pub fn checkpoints_loaded(&self) -> u64 {
        self.0.loaded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Requests the scheduler has admitted so far (a request is stamped with
    /// the policy version serving when it is admitted).
    pub fn requests_admitted(&self) -> u64 {
        self.0.scheduler.admitted()
    }

    /// Prompt tokens served from the prefix cache so far instead of prefilled.
    pub fn prefix_tokens_reused(&self) -> u64 {
        self.0.scheduler.reused()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.0.tokenizer
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let encoding = self
            .0
            .tokenizer
            .encode_fast(text, false)
            .map_err(|e| EngineError::Tokenize(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The prompt tokens of a chat: the template rendered with the generation prompt.
    pub fn chat_prompt(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
    ) -> Result<Vec<u32>, EngineError> {
        let text = self.0.chat_template.render(messages, tools, true)?;
        self.encode(&text)
    }

    /// The weights the engine started with, while it keeps them (until it
    /// loads whole weights): what an adapter alone is merged onto.
    fn base(&self) -> Option<Arc<Weights>> {
        self.0
            .base
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the engine still holds the weights it started with (an
    /// adapter alone can be merged onto them).
    pub fn holds_start_weights(&self) -> bool {
        self.base().is_some()
    }

    pub async fn generate(&self, request: GenerationRequest) -> Result<Generation, EngineError> {
        Ok(self.0.scheduler.generate(request).await?)
    }
}
