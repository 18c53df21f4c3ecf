//! Loading a policy (model, tokenizer, chat template) from the default GGUF
//! (SmolLM2-135M-Instruct, dequantized to f32), any llama/qwen2/qwen3 GGUF, or a
//! Hugging Face directory; and weights from a safetensors checkpoint.

use crate::{Architecture, ChatCodec, ChatTemplate, ModelConfig, Transformer};
use candle_core::quantized::gguf_file;
use candle_core::quantized::tokenizer::TokenizerFromGguf;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

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

fn file_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A GGUF file, every tensor dequantized to f32.
pub fn load_gguf(path: &Path, device: &Device) -> Result<Policy, LoadError> {
    let mut file = std::fs::File::open(path).map_err(io_err(path))?;
    let content = gguf_file::Content::read(&mut file)?;
    let meta = |key: &str| {
        content
            .metadata
            .get(key)
            .ok_or_else(|| LoadError::Invalid(format!("GGUF has no `{key}`")))
    };
    let arch = meta("general.architecture")?.to_string()?.clone();
    let architecture = Architecture::from_model_type(&arch).ok_or_else(|| {
        LoadError::Invalid(unknown_architecture("GGUF general.architecture", &arch))
    })?;
    let num = |key: &str| -> Result<usize, LoadError> {
        Ok(meta(&format!("{arch}.{key}"))?.to_u32()? as usize)
    };
    let float = |key: &str, default: f64| -> f64 {
        meta(&format!("{arch}.{key}"))
            .and_then(|v| Ok(v.to_f32()? as f64))
            .unwrap_or(default)
    };
    let tokens = meta("tokenizer.ggml.tokens")?.to_vec()?.len();
    let config = ModelConfig {
        architecture,
        vocab_size: num("vocab_size").unwrap_or(tokens),
        hidden_size: num("embedding_length")?,
        intermediate_size: num("feed_forward_length")?,
        num_hidden_layers: num("block_count")?,
        num_attention_heads: num("attention.head_count")?,
        num_key_value_heads: num("attention.head_count_kv")?,
        head_dim: num("attention.key_length").ok(),
        rope_theta: float("rope.freq_base", 10_000.0),
        rms_norm_eps: float("attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings: num("context_length")?,
        tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
    }
    .canonical();

    let mut weights = HashMap::new();
    for name in content.tensor_infos.keys() {
        let tensor = content
            .tensor(&mut file, name, &Device::Cpu)?
            .dequantize(&Device::Cpu)?;
        let Some(hf_name) = hf_name_of_gguf(name) else {
            continue;
        };
        // llama.cpp interleaves the two RoPE halves of each q/k head for llama
        // (not for qwen2); undo it so the weights match the Hugging Face layout.
        let tensor = match name.rsplit('.').nth(1) {
            Some("attn_q") if arch == "llama" && name.ends_with("weight") => {
                unpermute(&tensor, config.num_attention_heads)?
            }
            Some("attn_k") if arch == "llama" && name.ends_with("weight") => {
                unpermute(&tensor, config.num_key_value_heads)?
            }
            _ => tensor,
        };
        weights.insert(hf_name, tensor.to_device(device)?);
    }
    let model = Transformer::load(
        VarBuilder::from_tensors(weights.clone(), DType::F32, device),
        &config,
    )?;

    let ChatCodec {
        tokenizer,
        template: chat_template,
        stop_token_ids,
        ..
    } = gguf_chat(&content)?;
    Ok(Policy {
        name: file_name(path),
        model,
        chat_template,
        tokenizer,
        stop_token_ids,
        weights,
    })
}

/// The tokenizer a GGUF's metadata describes (no tensor is read).
fn gguf_tokenizer(content: &gguf_file::Content) -> Result<Tokenizer, LoadError> {
    let mut tokenizer =
        Tokenizer::from_gguf(content).map_err(|e| LoadError::Tokenizer(e.to_string()))?;
    let pre = content
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.to_string().ok());
    fix_gpt2_pre_tokenizer(&mut tokenizer, pre.map(String::as_str));
    Ok(tokenizer)
}

/// The tokenizer, template and stop tokens a GGUF's metadata describes.
fn gguf_chat(content: &gguf_file::Content) -> Result<ChatCodec, LoadError> {
    let tokenizer = gguf_tokenizer(content)?;
    let meta = |key: &str| content.metadata.get(key);
    let token = |key: &str| -> String {
        meta(key)
            .and_then(|v| v.to_u32().ok())
            .and_then(|id| tokenizer.id_to_token(id))
            .unwrap_or_default()
    };
    let (bos, eos) = (
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
    );
    let source = meta("tokenizer.chat_template")
        .and_then(|v| v.to_string().ok().cloned())
        .unwrap_or_else(|| crate::chat::CHATML.to_string());
    let stop_token_ids = stop_tokens(&tokenizer, &[eos.as_str()]);
    Ok(ChatCodec::new(
        tokenizer,
        ChatTemplate::new(source, &bos, &eos),
        stop_token_ids,
    ))
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

/// GGUF tensor names to the Hugging Face names the model uses.
fn hf_name_of_gguf(name: &str) -> Option<String> {
    let top = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(top) = top {
        return Some(top.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (part, kind) = rest.split_once('.')?;
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// Rows of each head go from llama.cpp's `[d/2][2]` order back to `[2][d/2]`.
fn unpermute(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    w.reshape((heads, rows / heads / 2, 2, cols))?
        .transpose(1, 2)?
        .reshape((rows, cols))
}

/// candle's GGUF tokenizer gives GPT-2-style models a `ByteLevel` that adds a
/// prefix space; SmolLM2 (`pre = smollm`) splits digits one by one and adds none.
fn fix_gpt2_pre_tokenizer(tokenizer: &mut Tokenizer, pre: Option<&str>) {
    use tokenizers::pre_tokenizers::{byte_level::ByteLevel, digits::Digits, sequence::Sequence};
    let byte_level = ByteLevel::new(false, true, true);
    match pre {
        Some("smollm") => {
            tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
                Digits::new(true).into(),
                byte_level.into(),
            ])));
        }
        Some("qwen2" | "smaug-bpe" | "lfm2" | "llama3") => {}
        _ => {
            tokenizer.with_pre_tokenizer(Some(byte_level));
        }
    }
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

fn unknown_architecture(field: &str, value: &str) -> String {
    let known: Vec<&str> = Architecture::ALL.iter().map(|a| a.model_type()).collect();
    format!(
        "{field} {value:?} is not an architecture forgelog runs (it runs {})",
        known.join(", ")
    )
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
    let model = Transformer::load(
        VarBuilder::from_tensors(weights.clone(), DType::F32, device),
        &config,
    )?;

    let ChatCodec {
        tokenizer,
        template: chat_template,
        stop_token_ids,
        ..
    } = hf_chat(dir, &read_json(&dir.join("config.json"))?)?;
    Ok(Policy {
        name: dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        model,
        tokenizer,
        chat_template,
        stop_token_ids,
        weights,
    })
}

/// A Hugging Face directory's tokenizer (`tokenizer.json`), template
/// (`tokenizer_config.json` or `chat_template.jinja`) and stop tokens.
fn hf_chat(dir: &Path, raw_config: &Value) -> Result<ChatCodec, LoadError> {
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
