//! Staging: the folder of a published version that the engine loads,
//! linked or copied out of the learner's checkpoint.

use crate::{EngineSync, SyncError};
use forgelog_schemas::PolicyPublished;
use forgelog_sync_core::SyncMode;
use std::path::PathBuf;

impl EngineSync {
    /// The local folder the engine loads `published` from: the version's
    /// model folder alone (the weights and the Hugging Face files), never the
    /// checkpoint's own folder, which also holds the optimizer's moments as
    /// safetensors that vLLM would load as weights (found by running
    /// `up --train --engine vllm`). A local checkpoint's files are linked, a
    /// remote one's (s3://) copied: vLLM's reload reads no object store.
    pub(crate) async fn stage(&self, published: &PolicyPublished) -> Result<PathBuf, SyncError> {
        let version = published.version.max(0) as u64;
        let uri = &published.checkpoint_uri;
        let err = |why: String| SyncError::Stage {
            version,
            uri: uri.clone(),
            why,
        };
        let stage_dir = match &self.args.stage_dir {
            Some(dir) => dir.clone(),
            None => forgelog_stream::forgelog_home().join("staged-checkpoints"),
        };
        let dir = std::path::absolute(stage_dir.join(format!("v{version:06}")))
            .map_err(|e| err(e.to_string()))?;
        let adapter_alone = uri.ends_with(forgelog_model::lora::ADAPTER_WEIGHTS);
        if adapter_alone && self.args.sync_mode == SyncMode::Weights {
            return Err(err(
                "this version is a LoRA adapter alone: sync it with --sync-mode adapter, or \
                 have the learner publish merged weights too (--lora-publish merged)"
                    .into(),
            ));
        }
        let _ = std::fs::remove_dir_all(&dir);
        let url = forgelog_stream::store::location_url(uri).map_err(|e| err(e.to_string()))?;
        if url.scheme() != "file" {
            forgelog_trainer::checkpoint::export_model_folder(uri, &dir)
                .await
                .map_err(|e| err(e.to_string()))?;
            return Ok(dir);
        }
        let weights = url
            .to_file_path()
            .map_err(|()| err("not a local path".into()))?;
        if !weights.is_file() {
            return Err(err(format!("{} is not there", weights.display())));
        }
        let folder = weights.parent().ok_or_else(|| err("no folder".into()))?;
        std::fs::create_dir_all(&dir).map_err(|e| err(e.to_string()))?;
        // An adapter is loaded from its two PEFT files alone.
        let names: Vec<&std::ffi::OsStr> = match self.args.sync_mode {
            SyncMode::Weights => forgelog_model::hf::FOLDER_FILES
                .into_iter()
                .map(std::ffi::OsStr::new)
                .chain(weights.file_name())
                .collect(),
            SyncMode::Adapter => {
                let adapter = folder.join(forgelog_model::lora::ADAPTER_WEIGHTS);
                if !adapter.is_file() {
                    return Err(err(format!(
                        "{} is not there: a LoRA adapter is synced only from a learner \
                         that trains one (--lora-rank)",
                        adapter.display()
                    )));
                }
                [
                    forgelog_model::lora::ADAPTER_CONFIG,
                    forgelog_model::lora::ADAPTER_WEIGHTS,
                ]
                .into_iter()
                .map(std::ffi::OsStr::new)
                .collect()
            }
        };
        for name in names {
            let file = folder.join(name);
            if file.is_file() {
                std::os::unix::fs::symlink(&file, dir.join(name))
                    .map_err(|e| err(e.to_string()))?;
            }
        }
        Ok(dir)
    }
}
