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
pub mod prefix_cache;
pub mod sampling;
pub mod scheduler;
pub mod server;
#[cfg(feature = "testing")]
pub mod testing;

use candle_core::{DType, Device};
use forgelog_model::{ChatTemplate, ModelConfig, Policy, Transformer};
use object_store::ObjectStoreExt;
use scheduler::{Generation, GenerationRequest, Scheduler, SchedulerError};
use serde_json::Value;
use std::net::SocketAddr;
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

/// `forgelog engine`: serve a policy over the OpenAI/vLLM API.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// `smollm2` (the default GGUF from scripts/fetch-model.sh), a .gguf file,
    /// or a Hugging Face llama/qwen2/qwen3 directory.
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Where the engine serves its OpenAI-compatible API
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Where the model runs: cpu, or cuda (a build with `--features cuda`)
    #[arg(long, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// Follow `PolicyPublished` on `forgelog.policy` at these brokers and load each new policy.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Only follow policies of this run.
    #[arg(long)]
    pub run: Option<String>,
    /// Bearer token for `POST /admin/reload`; none given: a random one, printed
    #[arg(long, env = "FORGELOG_ENGINE_ADMIN_TOKEN", value_parser = forgelog_http::admin_token_arg)]
    pub admin_token: Option<String>,
    /// `/admin/reload` loads checkpoints from under this URL only
    /// (`file:///…/checkpoints/`, `s3://bucket/prefix/`); none: reload over HTTP is off
    #[arg(long, env = "FORGELOG_CHECKPOINT_ROOT")]
    pub checkpoint_root: Option<String>,
    /// Larger checkpoints are refused before they are read
    #[arg(long, default_value_t = DEFAULT_MAX_CHECKPOINT_BYTES >> 20)]
    pub max_checkpoint_mib: u64,
    /// Memory for the keys and values of recent sequences, reused by
    /// requests that begin the same way (0: off)
    #[arg(long, default_value_t = DEFAULT_PREFIX_CACHE_MIB)]
    pub prefix_cache_mib: u64,
}

/// The prefix cache's memory by default.
pub const DEFAULT_PREFIX_CACHE_MIB: u64 = 512;

impl EngineArgs {
    /// Who may reload over HTTP: the token given (or a new one), the root.
    pub fn reload_access(&self) -> Result<access::ReloadAccess, EngineError> {
        let checkpoint_root = self
            .checkpoint_root
            .as_deref()
            .map(access::ReloadAccess::root)
            .transpose()
            .map_err(|e| EngineError::Checkpoint(format!("--checkpoint-root: {e}")))?;
        Ok(access::ReloadAccess {
            admin_token: self
                .admin_token
                .clone()
                .unwrap_or_else(forgelog_http::random_token),
            checkpoint_root,
            max_checkpoint_bytes: self.max_checkpoint_mib.saturating_mul(1 << 20),
        })
    }
}

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
        }))
    }

    pub fn model_name(&self) -> &str {
        &self.0.name
    }

    pub fn context_length(&self) -> usize {
        self.0.config.max_position_embeddings
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

    /// Loads `model.safetensors` at `checkpoint_uri` (any object_store URL:
    /// `file:///…`, `s3://…`, …; a directory URL gets `model.safetensors`
    /// appended) and swaps it in as policy `version` between two steps. A
    /// LoRA version published as its adapter alone (`checkpoint_uri` names
    /// `adapter_model.safetensors`, its `adapter_config.json` beside) is
    /// merged onto the weights the engine started with.
    /// Versions only move forward: an older or equal one is refused, so a
    /// stray reload can never hide the policies that follow.
    /// Checkpoints over `max_bytes` are refused before they are read.
    pub async fn reload(
        &self,
        checkpoint_uri: &str,
        version: u64,
        max_bytes: u64,
    ) -> Result<(), EngineError> {
        let _in_order = self.0.reloading.lock().await;
        let serving = self.policy_version();
        if version <= serving {
            return Err(EngineError::StaleVersion { version, serving });
        }
        let bytes = fetch_checkpoint(checkpoint_uri, max_bytes).await?;
        use forgelog_model::lora::{self, ADAPTER_CONFIG, ADAPTER_WEIGHTS};
        let adapter = checkpoint_uri.ends_with(ADAPTER_WEIGHTS);
        let adapter_config = match checkpoint_uri.strip_suffix(ADAPTER_WEIGHTS) {
            Some(folder) => {
                let config =
                    fetch_checkpoint(&format!("{folder}{ADAPTER_CONFIG}"), max_bytes).await?;
                let config: Value = serde_json::from_slice(&config).map_err(|e| {
                    EngineError::Checkpoint(format!("{folder}{ADAPTER_CONFIG}: {e}"))
                })?;
                Some(lora::LoraConfig::from_peft_config(&config).map_err(|e| {
                    EngineError::Checkpoint(format!("{folder}{ADAPTER_CONFIG}: {e}"))
                })?)
            }
            None => None,
        };
        let base = match adapter_config {
            Some(_) => Some(self.base().ok_or_else(|| {
                EngineError::Checkpoint(format!(
                    "{checkpoint_uri} is a LoRA adapter alone, and this engine let go of the \
                     weights it started with when it loaded whole weights: publish merged \
                     weights (--lora-publish merged) or restart the engine"
                ))
            })?),
            None => None,
        };
        let (config, device) = (self.0.config.clone(), self.0.device.clone());
        let model = tokio::task::spawn_blocking(move || -> Result<Transformer, EngineError> {
            let mut weights = forgelog_model::weights_from_safetensors(&bytes, &device)?;
            if let (Some(lora), Some(base)) = (adapter_config, base) {
                weights = lora::merge(&base, &weights, &config, &lora)?;
            }
            let vb = candle_nn::VarBuilder::from_tensors(weights, DType::F32, &device);
            Transformer::load(vb, &config).map_err(|e| EngineError::Checkpoint(e.to_string()))
        })
        .await
        .map_err(|e| EngineError::Checkpoint(e.to_string()))??;
        self.0.scheduler.swap(model, version).await?;
        if !adapter {
            // Whole weights serve from here on: the start's copy goes.
            *self.0.base.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        self.0
            .loaded
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(version, checkpoint_uri, "policy loaded");
        Ok(())
    }
}

/// The largest checkpoint loaded unless `--max-checkpoint-mib` says otherwise:
/// an 8B-parameter model in f32 is 32 GB.
pub const DEFAULT_MAX_CHECKPOINT_BYTES: u64 = 64 << 30;

async fn fetch_checkpoint(uri: &str, max_bytes: u64) -> Result<bytes::Bytes, EngineError> {
    let err = |e: &dyn std::fmt::Display| EngineError::Checkpoint(format!("{uri}: {e}"));
    let mut url = url::Url::parse(uri).map_err(|e| err(&e))?;
    if url.path().ends_with('/') {
        url = url.join("model.safetensors").map_err(|e| err(&e))?;
    }
    // The file's folder is the location (opened as the trainer wrote it: with
    // the environment's credentials and endpoint), the file its one object.
    let file = url
        .path_segments()
        .and_then(|mut s| s.next_back())
        .unwrap_or_default()
        .to_string();
    let folder = url.join(".").map_err(|e| err(&e))?;
    let location = forgelog_stream::store::open(folder.as_str()).map_err(|e| err(&e))?;
    let path = location.path(&file);
    let size = location.store.head(&path).await.map_err(|e| err(&e))?.size;
    if size > max_bytes {
        return Err(err(&format!(
            "{size} bytes is over the {max_bytes}-byte checkpoint limit"
        )));
    }
    let object = location.store.get(&path).await.map_err(|e| err(&e))?;
    object.bytes().await.map_err(|e| err(&e))
}

/// Follows `forgelog.policy` and loads each `PolicyPublished` newer than what
/// serves (of `run`, when given). Every engine reads every policy, so the
/// consumer group is this process's own; it starts from the beginning of the
/// topic and so ends on the newest policy. A (re)started engine first loads
/// the newest one the topic holds, so that it does not load every version
/// of a long run on its way there.
pub async fn follow_policy(
    engine: Engine,
    brokers: &str,
    run: Option<&str>,
) -> Result<(), EngineError> {
    use forgelog_schemas::{Event, Topic};
    let config = forgelog_stream::StreamConfig::new(brokers);
    let group = format!(
        "forgelog-engine-{}-{}",
        std::process::id(),
        engine.model_name()
    );
    let newest = {
        let config = config.clone();
        let run = run.map(str::to_string);
        tokio::task::spawn_blocking(move || {
            let reader = forgelog_stream::ReplayReader::new(&config)?;
            forgelog_stream::newest_policy(&reader, run.as_deref())
        })
        .await
    };
    match newest {
        Ok(Ok(Some(p))) => load_published(&engine, &p).await,
        Ok(Ok(None)) => {}
        // Not fatal: following the topic from its beginning gets there too.
        Ok(Err(e)) => tracing::warn!(error = %e, "reading the newest policy"),
        Err(e) => tracing::warn!(error = %e, "reading the newest policy"),
    }
    let consumer = forgelog_stream::EventConsumer::new(&config, &group, &[Topic::Policy])?;
    loop {
        let received = consumer.recv().await?;
        let published = match received.event {
            Ok(Event::PolicyPublished(p)) if run.is_none_or(|r| r == p.run_id) => p,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(
                    offset = received.offset,
                    "undecodable message on forgelog.policy: {e}"
                );
                continue;
            }
        };
        load_published(&engine, &published).await;
    }
}

/// Loads `published` if it is newer than what the engine serves.
async fn load_published(engine: &Engine, published: &forgelog_schemas::PolicyPublished) {
    let version = published.version.max(0) as u64;
    if version <= engine.policy_version() {
        return;
    }
    let reloaded = engine
        .reload(
            &published.checkpoint_uri,
            version,
            DEFAULT_MAX_CHECKPOINT_BYTES,
        )
        .await;
    if let Err(e) = reloaded {
        tracing::error!(version, uri = %published.checkpoint_uri, "policy not loaded: {e}");
    }
}

/// How long a stopping engine lets the requests in flight finish.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// `forgelog engine`: loads the model, serves until Ctrl-C, and follows the
/// policy topic when `--brokers` is given.
pub async fn run(args: EngineArgs) -> Result<(), EngineError> {
    serve(args, forgelog_stream::shutdown_signal()?).await
}

/// [`run`], stopping when `shutdown` completes (how `forgelog up` embeds it:
/// the engine lets go of the broker before the broker stops).
pub async fn serve(
    args: EngineArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), EngineError> {
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    serve_on(listener, args, shutdown).await
}

/// [`serve`] on a listener already bound (`args.listen` is not used): an
/// embedding process binds port 0 and knows the port before the model loads.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    args: EngineArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), EngineError> {
    let device = args.device.open().map_err(EngineError::Device)?;
    let model = args.model.clone();
    let policy = tokio::task::spawn_blocking(move || {
        forgelog_model::load_policy(&model, &forgelog_stream::models_dir(), &device)
    })
    .await
    .map_err(|e| EngineError::Device(e.to_string()))??;
    let engine = Engine::start_with(policy, args.prefix_cache_mib);
    let follower = args.brokers.clone().map(|brokers| {
        let (engine, run) = (engine.clone(), args.run.clone());
        tokio::spawn(async move {
            if let Err(e) = follow_policy(engine, &brokers, run.as_deref()).await {
                tracing::error!("policy consumer stopped: {e}");
            }
        })
    });
    let access = args.reload_access()?;
    if args.admin_token.is_none() && access.checkpoint_root.is_some() {
        eprintln!(
            "engine admin token (for /admin/reload): {}",
            access.admin_token
        );
    }
    tracing::info!(model = engine.model_name(), listen = %listener.local_addr()?, "engine serving");
    let server = forgelog_http::HttpServer::start(
        listener,
        server::router(engine, access),
        Default::default(),
    )?;
    shutdown.await;
    server.shutdown(SHUTDOWN_GRACE).await;
    if let Some(f) = follower {
        f.abort();
        let _ = f.await; // its Kafka client is closed once this returns
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// How the `forgelog` CLI embeds the arguments.
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Engine(EngineArgs),
    }

    #[test]
    fn arguments_parse_as_a_subcommand() {
        let Command::Engine(args) = Cli::parse_from(["forgelog", "engine"]).command;
        assert_eq!(
            (args.model.as_str(), args.listen.to_string()),
            ("smollm2", "127.0.0.1:8000".into())
        );
        assert_eq!((args.device, args.brokers), (DeviceKind::Cpu, None));
        let Command::Engine(args) = Cli::parse_from([
            "forgelog",
            "engine",
            "--model",
            "/models/qwen",
            "--listen",
            "0.0.0.0:9000",
            "--device",
            "cuda",
            "--brokers",
            "kafka:9092",
        ])
        .command;
        assert_eq!(args.device, DeviceKind::Cuda);
        assert_eq!(args.brokers.as_deref(), Some("kafka:9092"));
    }
}
