//! A GGUF file: its metadata as a config, tokenizer and chat template, its
//! tensors dequantized and renamed to the Hugging Face layout.

use super::{io_err, stop_tokens, unknown_architecture, LoadError, Policy};
use crate::{Architecture, ChatCodec, ChatTemplate, ModelConfig};
use candle_core::quantized::gguf_file;
use candle_core::quantized::tokenizer::TokenizerFromGguf;
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use tokenizers::Tokenizer;

/// A GGUF file, every tensor dequantized to f32.
pub fn load_gguf(path: &Path, device: &Device) -> Result<Policy, LoadError> {
    let mut file = std::fs::File::open(path).map_err(io_err(path))?;
    // Candle's words for a cut file ("failed to fill whole buffer") name no file.
    let bad = |e: candle_core::Error| LoadError::BadGguf {
        path: path.to_path_buf(),
        why: e.to_string(),
    };
    let content = gguf_file::Content::read(&mut file).map_err(bad)?;
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
            .tensor(&mut file, name, &Device::Cpu)
            .map_err(bad)?
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
    Policy::assemble(
        file_name(path),
        weights,
        &config,
        gguf_chat(&content)?,
        device,
    )
}

fn file_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The tokenizer a GGUF's metadata describes (no tensor is read).
pub(super) fn gguf_tokenizer(content: &gguf_file::Content) -> Result<Tokenizer, LoadError> {
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
pub(super) fn gguf_chat(content: &gguf_file::Content) -> Result<ChatCodec, LoadError> {
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
