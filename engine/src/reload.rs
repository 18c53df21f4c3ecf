//! Swapping in a published checkpoint: whole weights, or a LoRA adapter
//! merged onto the weights the engine started with.

use crate::{Engine, EngineError};
use candle_core::DType;
use forgelog_model::Transformer;
use object_store::ObjectStoreExt;
use serde_json::Value;

impl Engine {
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
