//! A Hugging Face model directory: `config.json`, `*.safetensors`,
//! `tokenizer.json` and the chat template.

use super::{
    io_err, read_json, stop_tokens, unknown_architecture, weights_from_safetensors, LoadError,
    Policy,
};
use crate::{Architecture, ChatCodec, ChatTemplate, ModelConfig};
use candle_core::Device;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

/// A token given in `tokenizer_config.json` as a string or `{"content": …}`.
fn token_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        _ => String::new(),
    }
}

/// What `config.json` in `dir` says of the architecture. An architecture
/// forgelog does not run, or a field it cannot read, is an error naming it.
pub fn hf_config(dir: &Path) -> Result<ModelConfig, LoadError> {
    let path = dir.join("config.json");
    let raw = read_json(&path)?;
    let model_type = raw
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("llama");
    let architecture = Architecture::from_model_type(model_type).ok_or_else(|| {
        LoadError::Invalid(format!(
            "{}: {}",
            path.display(),
            unknown_architecture("model_type", model_type)
        ))
    })?;
    // A llama with `attention_bias` has a bias on o_proj too, which this
    // decoder has no place for: refused rather than run without it.
    if architecture == Architecture::Llama && raw.get("attention_bias") == Some(&Value::Bool(true))
    {
        return Err(LoadError::Invalid(format!(
            "{}: attention_bias = true on a llama is not supported",
            path.display()
        )));
    }
    let mut config: ModelConfig = serde_json::from_value(raw.clone())
        .map_err(|e| LoadError::Invalid(format!("{}: {e}", path.display())))?;
    // transformers 5 writes `rope_theta` inside `rope_parameters`.
    if let Some(theta) = raw
        .pointer("/rope_parameters/rope_theta")
        .and_then(Value::as_f64)
    {
        config.rope_theta = theta;
    }
    Ok(config.canonical())
}
/// A Hugging Face directory: `config.json`, `*.safetensors`, `tokenizer.json`,
/// and `tokenizer_config.json` (or `chat_template.jinja`) for the template.
pub fn load_hf_dir(dir: &Path, device: &Device) -> Result<Policy, LoadError> {
    let config = hf_config(dir)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(LoadError::Invalid(format!(
            "no *.safetensors in {}",
            dir.display()
        )));
    }
    let mut weights = HashMap::new();
    for file in &files {
        let bytes = std::fs::read(file).map_err(io_err(file))?;
        weights.extend(weights_from_safetensors(&bytes, device)?);
    }
    let name = dir
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let codec = hf_chat(dir, &read_json(&dir.join("config.json"))?)?;
    Policy::assemble(name, weights, &config, codec, device)
}

/// A Hugging Face directory's tokenizer (`tokenizer.json`), template
/// (`tokenizer_config.json` or `chat_template.jinja`) and stop tokens.
pub(super) fn hf_chat(dir: &Path, raw_config: &Value) -> Result<ChatCodec, LoadError> {
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
        .map_err(|e| LoadError::Tokenizer(e.to_string()))?;
    let tokenizer_config = match dir.join("tokenizer_config.json") {
        p if p.is_file() => read_json(&p)?,
        _ => Value::Null,
    };
    let source = match tokenizer_config.get("chat_template") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .unwrap_or(crate::chat::CHATML)
            .to_string(),
        _ => std::fs::read_to_string(dir.join("chat_template.jinja"))
            .unwrap_or_else(|_| crate::chat::CHATML.into()),
    };
    let bos = token_text(tokenizer_config.get("bos_token"));
    let eos = token_text(tokenizer_config.get("eos_token"));
    let mut stop_token_ids = stop_tokens(&tokenizer, &[eos.as_str()]);
    for key in ["eos_token_id"] {
        match raw_config.get(key) {
            Some(Value::Number(n)) => stop_token_ids.extend(n.as_u64().map(|n| n as u32)),
            Some(Value::Array(ids)) => {
                stop_token_ids.extend(ids.iter().filter_map(Value::as_u64).map(|n| n as u32))
            }
            _ => {}
        }
    }
    stop_token_ids.sort();
    stop_token_ids.dedup();
    Ok(ChatCodec::new(
        tokenizer,
        ChatTemplate::new(source, &bos, &eos),
        stop_token_ids,
    ))
}
