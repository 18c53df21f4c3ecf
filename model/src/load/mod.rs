//! Loading a policy (model, tokenizer, chat template) from the default GGUF
//! (SmolLM2-135M-Instruct, dequantized to f32), any llama/qwen2/qwen3 GGUF, or a
//! Hugging Face directory; and weights from a safetensors checkpoint.

use crate::{Architecture, ChatCodec, ChatTemplate, Transformer};
use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

mod gguf;
mod hf_dir;

use gguf::{gguf_chat, gguf_tokenizer};
use hf_dir::hf_chat;

pub use gguf::load_gguf;
pub use hf_dir::{hf_config, load_hf_dir};

/// The default model's file, as `scripts/fetch-model.sh` installs it.
pub const DEFAULT_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model file {0} not found: run scripts/fetch-model.sh (or set FORGELOG_MODEL_GGUF)")]
    DefaultModelMissing(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a whole GGUF file ({why}): a partial copy or download? (scripts/fetch-model.sh fetches the default model again)")]
    BadGguf { path: PathBuf, why: String },
    #[error("{0}")]
    Candle(#[from] candle_core::Error),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{0}")]
    Invalid(String),
}

/// Everything needed to serve or train one model. Cheap to clone.
#[derive(Clone)]
pub struct Policy {
    /// What `/v1/models` reports.
    pub name: String,
    pub model: Transformer,
    pub tokenizer: Tokenizer,
    pub chat_template: ChatTemplate,
    /// Tokens that end a completion (`<|im_end|>`, `<|endoftext|>`, …).
    pub stop_token_ids: Vec<u32>,
    /// The f32 weights by checkpoint name (shared with `model`): what a
    /// trainer copies into a `VarMap` and writes back under the same names.
    pub weights: HashMap<String, Tensor>,
}

impl Policy {
    /// The policy named `name` of `weights` (f32, by checkpoint name) as the
    /// decoder `config` describes, with its chat codec.
    fn assemble(
        name: String,
        weights: HashMap<String, Tensor>,
        config: &crate::ModelConfig,
        codec: ChatCodec,
        device: &Device,
    ) -> Result<Policy, LoadError> {
        let vb = candle_nn::VarBuilder::from_tensors(weights.clone(), DType::F32, device);
        let ChatCodec {
            tokenizer,
            template: chat_template,
            stop_token_ids,
            ..
        } = codec;
        Ok(Policy {
            name,
            model: Transformer::load(vb, config)?,
            tokenizer,
            chat_template,
            stop_token_ids,
            weights,
        })
    }
}

/// Where the default model lives: `FORGELOG_MODEL_GGUF`, else
/// [`DEFAULT_GGUF`] in `models` (the caller's per-machine model directory,
/// `forgelog_stream::models_dir()` in forgelog's processes).
pub fn default_gguf_path(models: &Path) -> PathBuf {
    match std::env::var_os("FORGELOG_MODEL_GGUF") {
        Some(path) => PathBuf::from(path),
        None => models.join(DEFAULT_GGUF),
    }
}

/// `smollm2` (the default GGUF, looked for in `models`), a `.gguf` file, or a
/// Hugging Face directory.
pub fn load_policy(spec: &str, models: &Path, device: &Device) -> Result<Policy, LoadError> {
    if spec == "smollm2" {
        let path = default_gguf_path(models);
        if !path.is_file() {
            return Err(LoadError::DefaultModelMissing(path));
        }
        let mut policy = load_gguf(&path, device)?;
        policy.name = "SmolLM2-135M-Instruct".into();
        return Ok(policy);
    }
    let path = Path::new(spec);
    if path.is_dir() {
        load_hf_dir(path, device)
    } else if path.is_file() {
        load_gguf(path, device)
    } else {
        Err(LoadError::Invalid(format!(
            "model {spec:?} is neither `smollm2`, a .gguf file nor a model directory"
        )))
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LoadError + '_ {
    move |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The tokenizer and chat template of what [`load_policy`] would load,
/// without its weights: what the proxy renders prompts with.
pub fn load_chat_codec(spec: &str, models: &Path) -> Result<ChatCodec, LoadError> {
    let path = match spec {
        "smollm2" => default_gguf_path(models),
        _ => PathBuf::from(spec),
    };
    if path.is_dir() {
        let raw_config = read_json(&path.join("config.json"))?;
        return hf_chat(&path, &raw_config);
    }
    if !path.is_file() {
        return Err(match spec {
            "smollm2" => LoadError::DefaultModelMissing(path),
            _ => LoadError::Invalid(format!(
                "model {spec:?} is neither `smollm2`, a .gguf file nor a model directory"
            )),
        });
    }
    let mut file = std::fs::File::open(&path).map_err(io_err(&path))?;
    gguf_chat(&gguf_file::Content::read(&mut file)?)
}

/// Only the tokenizer of what [`load_policy`] would load (`smollm2`, a
/// `.gguf`, a Hugging Face directory): a GGUF's metadata, not its weights.
pub fn load_tokenizer(spec: &str, models: &Path) -> Result<Tokenizer, LoadError> {
    let path = match spec {
        "smollm2" => default_gguf_path(models),
        _ => PathBuf::from(spec),
    };
    if path.is_dir() {
        let file = path.join("tokenizer.json");
        return Tokenizer::from_file(&file)
            .map_err(|e| LoadError::Tokenizer(format!("{}: {e}", file.display())));
    }
    if spec == "smollm2" && !path.is_file() {
        return Err(LoadError::DefaultModelMissing(path));
    }
    let mut file = std::fs::File::open(&path).map_err(io_err(&path))?;
    gguf_tokenizer(&gguf_file::Content::read(&mut file)?)
}

/// Ids of the tokens that end a completion: the model's eos and the usual
/// end-of-turn tokens when the vocabulary has them.
fn stop_tokens(tokenizer: &Tokenizer, eos: &[&str]) -> Vec<u32> {
    let mut ids: Vec<u32> = eos
        .iter()
        .chain(&[
            "<|im_end|>",
            "<|endoftext|>",
            "<|eot_id|>",
            "<|end_of_text|>",
        ])
        .filter_map(|t| tokenizer.token_to_id(t))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Reads safetensors bytes into f32 tensors on `device` (a checkpoint for reload).
pub fn weights_from_safetensors(
    bytes: &[u8],
    device: &Device,
) -> Result<HashMap<String, Tensor>, LoadError> {
    candle_core::safetensors::load_buffer(bytes, device)?
        .into_iter()
        .map(|(name, t)| Ok((name, t.to_dtype(DType::F32)?)))
        .collect()
}

fn read_json(path: &Path) -> Result<Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text).map_err(|e| LoadError::Invalid(format!("{}: {e}", path.display())))
}

fn unknown_architecture(field: &str, value: &str) -> String {
    let known: Vec<&str> = Architecture::ALL.iter().map(|a| a.model_type()).collect();
    format!(
        "{field} {value:?} is not an architecture forgelog runs (it runs {})",
        known.join(", ")
    )
}
