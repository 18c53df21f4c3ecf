//! What answers a run's model calls: an engine (the embedded one, or one
//! already serving, kept on each published version when training) behind a
//! capture proxy of this process.

use crate::{LocalEngine, StackError, SyncTask};
use forgelog_engine::DeviceKind;
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::upstream::TokenIn;
use forgelog_producers::RunningProxy;
use forgelog_stream::StreamConfig;
use forgelog_sync::{Kind, Mode};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How a run's calls are served.
#[derive(Debug, Clone)]
pub struct ServingConfig {
    pub run: String,
    /// An engine already serving (`--upstream`); none: the embedded one.
    pub upstream: Option<String>,
    /// The embedded engine's model, the learner's, and by default the
    /// proxy's tokenizer.
    pub model: String,
    pub device: DeviceKind,
    pub engine_listen: SocketAddr,
    /// Training: the engine must serve each version the learner publishes.
    pub train: bool,
    /// With training and `upstream`: the sync that makes it (vLLM, SGLang);
    /// none: it follows the log itself (forgelog's engine), only checked.
    pub synced: Option<(Kind, Mode)>,
    /// The model whose tokenizer and chat template the proxy renders prompts
    /// with (token in); none: `model` where the embedded engine serves it or
    /// the learner trains it, else the engine renders; `none`: the engine
    /// renders.
    pub tokenizer: Option<String>,
    /// The proxy names the newest adapter on each call (a LoRA sync).
    pub policy_adapters: bool,
    /// Fields the proxy adds to every request to the engine (`--extra-body`).
    pub extra_body: forgelog_producers::upstream::ExtraBody,
    pub proxy_listen: SocketAddr,
    /// The proxy's spool.
    pub spool: PathBuf,
    /// Where a sync stages checkpoints.
    pub home: PathBuf,
}

/// A run's engine and proxy, serving until [`Serving::stop`].
pub struct Serving {
    pub engine: Option<LocalEngine>,
    /// The engine the proxy asks.
    pub upstream: String,
    /// The sync keeping an external engine on the learner's versions.
    pub sync: Option<SyncTask>,
    pub proxy: RunningProxy,
    /// The proxy's session API token: its clients hold it, sandboxes do not.
    pub admin_token: String,
}

impl Serving {
    pub async fn start(config: &StreamConfig, s: ServingConfig) -> Result<Serving, StackError> {
        let (engine, upstream) = match &s.upstream {
            Some(url) => (None, url.clone()),
            None => {
                let engine =
                    LocalEngine::start(&s.model, s.engine_listen, s.device, config, &s.run).await?;
                let url = engine.url.clone();
                (Some(engine), url)
            }
        };
        let sync = match (s.train, &s.upstream) {
            (true, Some(_)) => {
                crate::follow(&upstream, s.synced, &config.brokers, &s.run, &s.home).await?
            }
            _ => None,
        };
        // The session API is not left open: anyone who reaches the proxy
        // (a sandbox) could create sessions and post rewards.
        let admin_token = forgelog_http::random_token();
        // A learner trains `model`, so an external engine must serve it:
        // its tokenizer renders (token in: a multi-turn rollout trains as
        // one sequence, not a fragment per call), and the proxy's start-up
        // check against the engine's `/tokenize` refuses an engine serving
        // another model (trained on, its ids would have been nonsense).
        // SGLang's `/tokenize` is not known here to take a chat: it renders
        // itself unless `--tokenizer` says otherwise.
        let checkable = s.synced.is_none_or(|(kind, _)| kind != Kind::Sglang);
        let tokenizer = s
            .tokenizer
            .clone()
            .or((engine.is_some() || (s.train && checkable)).then(|| s.model.clone()));
        let proxy_config = ProxyConfig {
            run_id: Some(s.run.clone()),
            admin_token: Some(admin_token.clone()),
            token_in: token_in(tokenizer.as_deref())?,
            policy_adapters: s.policy_adapters,
            extra_body: s.extra_body,
            ..ProxyConfig::new(&upstream)
        };
        let proxy = RunningProxy::start(proxy_config, config, s.spool, s.proxy_listen)
            .await
            .map_err(|e| StackError::Proxy(e.to_string()))?;
        Ok(Serving {
            engine,
            upstream,
            sync,
            proxy,
            admin_token,
        })
    }

    /// The proxy's events flushed (for up to `flush`) and the proxy stopped,
    /// then the learning (the consumers checkpoint), then the engine.
    pub async fn stop(
        self,
        learning: Option<crate::Learning>,
        flush: Duration,
    ) -> Result<(), StackError> {
        let stopped = self.proxy.shutdown(flush).await;
        if let Some(learning) = learning {
            learning.stop().await;
        }
        if let Some(engine) = self.engine {
            engine.stop().await;
        }
        stopped.map_err(|e| StackError::Proxy(e.to_string()))
    }
}

/// The tokenizer and template of `spec` (`smollm2`, a .gguf file, a Hugging
/// Face folder; never a hub); `none` (or no spec): the engine renders chats.
pub fn token_in(spec: Option<&str>) -> Result<Option<TokenIn>, StackError> {
    let Some(spec) = spec.filter(|s| *s != "none") else {
        return Ok(None);
    };
    let codec =
        forgelog_model::load_chat_codec(spec, &forgelog_stream::models_dir()).map_err(|e| {
            StackError::TokenIn {
                spec: spec.to_string(),
                why: e.to_string(),
            }
        })?;
    let (tokenizer_sha256, chat_template_sha256) = codec.sha256s();
    Ok(Some(TokenIn {
        renderer: Arc::new(codec),
        tokenizer_sha256,
        chat_template_sha256,
    }))
}
