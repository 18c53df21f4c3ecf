//! Checkpoints through object_store: `{base}/{run}/v{version:06}/` holds
//! `model.safetensors` (exactly what the engine reloads: checkpoint tensor
//! names), `optimizer.safetensors` (AdamW moments, `m.NAME` / `v.NAME`) and
//! `trainer.json` (step, optimizer steps, the batch offsets it reflects),
//! and the policy's Hugging Face folder files (`config.json`, tokenizer,
//! generation config: [`forgelog_model::hf`]) so that a version's folder is
//! a model `transformers` and vLLM load as it is.

use candle_core::{Device, Tensor};
use forgelog_model::lora::{ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use forgelog_stream::store;
use object_store::{path::Path as StorePath, ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A version's weights: what the engine reloads.
const WEIGHTS: &str = "model.safetensors";
/// Its AdamW moments.
const MOMENTS: &str = "optimizer.safetensors";
/// Its [`TrainerState`].
const STATE: &str = "trainer.json";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint location {url}: {why}")]
    Location { url: String, why: String },
    #[error("object store {path}: {source}")]
    Store {
        path: String,
        source: object_store::Error,
    },
    #[error("safetensors: {0}")]
    Tensors(#[from] candle_core::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("trainer.json: {0}")]
    State(#[from] serde_json::Error),
}

/// What a learner needs besides its weights to continue exactly.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub version: u64,
    pub step: u64,
    pub optimizer_steps: u64,
    /// `forgelog.batches` partition → next offset to read.
    pub offsets: BTreeMap<i32, i64>,
    pub dropped_stale: u64,
}

pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    /// The URL of the run's folder, without a trailing `/`.
    url: String,
    prefix: String,
    /// Written into every version beside the weights.
    folder_files: Vec<(&'static str, Vec<u8>)>,
}

impl CheckpointStore {
    /// `base` is any object_store URL (`file:///abs/dir`, `s3://bucket/p`, …).
    pub fn new(base: &str, run: &str) -> Result<CheckpointStore, CheckpointError> {
        let base = store::location_url(base).map_err(|e| CheckpointError::Location {
            url: e.location,
            why: e.why,
        })?;
        let url = format!("{}/{run}", base.as_str().trim_end_matches('/'));
        let location = store::create(&url).map_err(|e| CheckpointError::Location {
            url: e.location,
            why: e.why,
        })?;
        Ok(CheckpointStore {
            store: location.store,
            prefix: location.prefix,
            url,
            folder_files: Vec::new(),
        })
    }

    /// Every version also gets these files (see [`forgelog_model::hf::folder_files`]).
    pub fn with_folder_files(mut self, files: Vec<(&'static str, Vec<u8>)>) -> CheckpointStore {
        self.folder_files = files;
        self
    }

    fn path(&self, version: u64, file: &str) -> StorePath {
        StorePath::from(format!("{}/v{version:06}/{file}", self.prefix).trim_start_matches('/'))
    }

    /// The URI of a version's weights, as `PolicyPublished.checkpoint_uri`.
    pub fn model_uri(&self, version: u64) -> String {
        format!("{}/v{version:06}/{WEIGHTS}", self.url)
    }

    /// The URI of a LoRA version's adapter weights: the `checkpoint_uri` of
    /// a version published as its adapter alone.
    pub fn adapter_uri(&self, version: u64) -> String {
        format!("{}/v{version:06}/{ADAPTER_WEIGHTS}", self.url)
    }

    async fn put(&self, version: u64, file: &str, bytes: Vec<u8>) -> Result<(), CheckpointError> {
        let path = self.path(version, file);
        self.store
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|source| CheckpointError::Store {
                path: path.to_string(),
                source,
            })?;
        Ok(())
    }

    async fn get(&self, version: u64, file: &str) -> Result<Vec<u8>, CheckpointError> {
        let path = self.path(version, file);
        read_object(&self.store, &path)
            .await
            .map_err(|source| CheckpointError::Store {
                path: path.to_string(),
                source,
            })
    }

    /// Writes optimizer state, `trainer.json`, the folder files and `extra`
    /// (a LoRA adapter's files) first, the weights last: a version whose
    /// weights exist is complete. Without `weights` (a LoRA adapter published
    /// alone), the adapter's weights are the last file. Returns the URI of
    /// what was written last.
    pub async fn save(
        &self,
        weights: Option<&HashMap<String, Tensor>>,
        moments: &HashMap<String, (Tensor, Tensor)>,
        state: &TrainerState,
        extra: &[(&'static str, Vec<u8>)],
    ) -> Result<String, CheckpointError> {
        let optimizer: HashMap<String, Tensor> = moments
            .iter()
            .flat_map(|(n, (m, v))| [(format!("m.{n}"), m.clone()), (format!("v.{n}"), v.clone())])
            .collect();
        self.put(state.version, MOMENTS, safetensors_bytes(&optimizer)?)
            .await?;
        self.put(state.version, STATE, serde_json::to_vec_pretty(state)?)
            .await?;
        // The adapter's weights after its config, when they are the last file.
        let mut files: Vec<_> = self.folder_files.iter().chain(extra).collect();
        files.sort_by_key(|(name, _)| *name == ADAPTER_WEIGHTS);
        for (name, bytes) in files {
            self.put(state.version, name, bytes.clone()).await?;
        }
        let Some(weights) = weights else {
            return Ok(self.adapter_uri(state.version));
        };
        self.put(state.version, WEIGHTS, safetensors_bytes(weights)?)
            .await?;
        Ok(self.model_uri(state.version))
    }

    /// What `version`'s publication makes unneeded: the moments of the
    /// version before (a restart resumes from the newest published version
    /// only; they are as large as two copies of the weights), and with
    /// `keep = Some(k)` the whole of version `version − k`, weights first so
    /// that no version is left with weights but not the rest. Files already
    /// gone are no error.
    pub async fn prune(&self, version: u64, keep: Option<u64>) -> Result<(), CheckpointError> {
        if version > 1 {
            self.delete(version - 1, MOMENTS).await?;
        }
        if let Some(old) = keep
            .and_then(|k| version.checked_sub(k.max(1)))
            .filter(|&v| v >= 1)
        {
            let files = [WEIGHTS, STATE, MOMENTS]
                .into_iter()
                .chain(forgelog_model::hf::FOLDER_FILES)
                .chain([ADAPTER_CONFIG, ADAPTER_WEIGHTS]);
            for file in files {
                self.delete(old, file).await?;
            }
            // A local store keeps the emptied folder (object stores have
            // files, not folders); one that is not empty stays.
            if let Ok(Ok(dir)) = url::Url::parse(&self.url).map(|u| u.to_file_path()) {
                let _ = std::fs::remove_dir(dir.join(format!("v{old:06}")));
            }
        }
        Ok(())
    }

    async fn delete(&self, version: u64, file: &str) -> Result<(), CheckpointError> {
        let path = self.path(version, file);
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(CheckpointError::Store {
                path: path.to_string(),
                source,
            }),
        }
    }

    /// The LoRA adapter's tensors (PEFT names) of `version`.
    pub async fn load_adapter(
        &self,
        version: u64,
        device: &Device,
    ) -> Result<HashMap<String, Tensor>, CheckpointError> {
        let bytes = self.get(version, ADAPTER_WEIGHTS).await?;
        Ok(candle_core::safetensors::load_buffer(&bytes, device)?)
    }

    /// Weights, optimizer moments and state of `version`.
    #[allow(clippy::type_complexity)]
    pub async fn load(
        &self,
        version: u64,
        device: &Device,
    ) -> Result<
        (
            HashMap<String, Tensor>,
            HashMap<String, (Tensor, Tensor)>,
            TrainerState,
        ),
        CheckpointError,
    > {
        let weights =
            candle_core::safetensors::load_buffer(&self.get(version, WEIGHTS).await?, device)?;
        let (moments, state) = self.load_state(version, device).await?;
        Ok((weights, moments, state))
    }

    /// Optimizer moments and state of `version` (a LoRA version's weights
    /// are its adapter: [`CheckpointStore::load_adapter`]).
    pub async fn load_state(
        &self,
        version: u64,
        device: &Device,
    ) -> Result<(HashMap<String, (Tensor, Tensor)>, TrainerState), CheckpointError> {
        let mut flat =
            candle_core::safetensors::load_buffer(&self.get(version, MOMENTS).await?, device)?;
        let mut moments = HashMap::new();
        let names: Vec<String> = flat
            .keys()
            .filter_map(|k| k.strip_prefix("m.").map(String::from))
            .collect();
        for name in names {
            if let (Some(m), Some(v)) = (
                flat.remove(&format!("m.{name}")),
                flat.remove(&format!("v.{name}")),
            ) {
                moments.insert(name, (m, v));
            }
        }
        let state = serde_json::from_slice(&self.get(version, STATE).await?)?;
        Ok((moments, state))
    }
}

/// Copies the Hugging Face model folder of the version whose weights are at
/// `model_uri` (a `PolicyPublished.checkpoint_uri`) into the local directory
/// `to`: the weights and the folder files (and a LoRA version's adapter
/// files), not the trainer's own state. A LoRA version published as its
/// adapter alone (`model_uri` names `adapter_model.safetensors`) is a PEFT
/// adapter folder: the adapter's two files and the tokenizer's.
/// Returns the paths written.
pub async fn export_model_folder(
    model_uri: &str,
    to: &std::path::Path,
) -> Result<Vec<std::path::PathBuf>, CheckpointError> {
    // The adapter's file name ends with the model's: asked first.
    let (folder, adapter_only) = match (
        model_uri.strip_suffix(ADAPTER_WEIGHTS),
        model_uri.strip_suffix(WEIGHTS),
    ) {
        (Some(folder), _) => (folder, true),
        (None, Some(folder)) => (folder, false),
        (None, None) => ("", false),
    };
    let folder = folder
        .strip_suffix('/')
        .ok_or_else(|| CheckpointError::Location {
            url: model_uri.to_string(),
            why: format!("not a checkpoint's {WEIGHTS} or {ADAPTER_WEIGHTS}"),
        })?;
    let location = store::open(folder).map_err(|e| CheckpointError::Location {
        url: e.location,
        why: e.why,
    })?;
    std::fs::create_dir_all(to)?;
    let mut written = Vec::new();
    let model_files: Vec<&str> = match adapter_only {
        // A config.json beside an adapter would read as a model without weights.
        true => vec!["tokenizer.json", "tokenizer_config.json"],
        false => forgelog_model::hf::FOLDER_FILES
            .into_iter()
            .chain([WEIGHTS])
            .collect(),
    };
    for name in model_files {
        let path = location.path(name);
        let bytes = read_object(&location.store, &path).await;
        let bytes = bytes.map_err(|source| match source {
            object_store::Error::NotFound { .. } if name != WEIGHTS => {
                CheckpointError::Location {
                    url: folder.to_string(),
                    why: format!(
                        "has no {name}: written by a forgelog from before checkpoints were model folders"
                    ),
                }
            }
            source => CheckpointError::Store {
                path: path.to_string(),
                source,
            },
        })?;
        let file = to.join(name);
        std::fs::write(&file, &bytes)?;
        written.push(file);
    }
    // A LoRA version's adapter, as PEFT's folder files, where it has one.
    for name in [ADAPTER_CONFIG, ADAPTER_WEIGHTS] {
        let path = location.path(name);
        match read_object(&location.store, &path).await {
            Ok(bytes) => {
                let file = to.join(name);
                std::fs::write(&file, &bytes)?;
                written.push(file);
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => {
                return Err(CheckpointError::Store {
                    path: path.to_string(),
                    source,
                })
            }
        }
    }
    Ok(written)
}

/// The whole of the object at `path`.
async fn read_object(
    store: &Arc<dyn ObjectStore>,
    path: &StorePath,
) -> Result<Vec<u8>, object_store::Error> {
    Ok(store.get(path).await?.bytes().await?.to_vec())
}

/// The safetensors file of `tensors`, made in memory (the weights and moments
/// of every version pass through here: no temporary file written and read back).
fn safetensors_bytes(tensors: &HashMap<String, Tensor>) -> Result<Vec<u8>, CheckpointError> {
    // Sorted by name: the same tensors make the same bytes.
    let sorted: std::collections::BTreeMap<&String, &Tensor> = tensors.iter().collect();
    Ok(safetensors::tensor::serialize(sorted, None).map_err(candle_core::Error::from)?)
}
