//! The fake model: its chat template, its tokenizer (a byte a token, [`END`]
//! one of its own), the Hugging Face folder that carries both, and the
//! logprobs it samples with.

use super::MODEL;
use serde_json::{json, Value};

/// The end of a turn: the one token that is not a byte.
pub const END: &str = "<|end|>";
pub const END_ID: u32 = 256;

/// The fake model's chat template, as its `tokenizer_config.json` carries it:
/// the tools as JSON, then each message's role and text (tool calls as Hermes
/// text, as a template that shows none is given them), each closed by [`END`].
pub const CHAT_TEMPLATE: &str = "{% if tools %}<|tools|>{{ tools | tojson }}<|end|>\n{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// [`CHAT_TEMPLATE`] rendered here, with a generation prompt (the tools as
/// Hugging Face's `tojson` writes them).
pub fn render_prompt(messages: &[Value], tools: Option<&Value>) -> String {
    let mut s = String::new();
    if let Some(tools) = tools.filter(|t| t.as_array().is_some_and(|a| !a.is_empty())) {
        let tools = forgelog_dialects::hf::tojson(tools, None);
        s.push_str(&format!("<|tools|>{tools}{END}\n"));
    }
    for m in messages {
        let m = forgelog_dialects::hf::hf_message_with_hermes_calls(m);
        let role = m["role"].as_str().unwrap_or("?");
        let content = m["content"].as_str().unwrap_or_default();
        s.push_str(&format!("<|{role}|>{content}{END}\n"));
    }
    s.push_str("<|assistant|>");
    s
}

/// The fake tokenizer: a byte a token, [`END`] one of its own.
pub fn encode(text: &str) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len());
    for (i, piece) in text.split(END).enumerate() {
        if i > 0 {
            ids.push(END_ID);
        }
        ids.extend(piece.bytes().map(u32::from));
    }
    ids
}

pub fn decode(ids: &[u32]) -> String {
    let mut bytes = Vec::with_capacity(ids.len());
    for &id in ids {
        match u8::try_from(id) {
            Ok(b) => bytes.push(b),
            Err(_) => bytes.extend_from_slice(END.as_bytes()),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The conversation and tools a prompt of [`CHAT_TEMPLATE`] holds.
pub(super) fn parse_prompt(text: &str) -> (Vec<Value>, Option<Value>) {
    let mut tools = None;
    let mut messages = Vec::new();
    let closed = format!("{END}\n");
    for turn in text.split(&closed).filter(|t| *t != "<|assistant|>") {
        let Some((role, content)) = turn.strip_prefix("<|").and_then(|t| t.split_once("|>")) else {
            continue;
        };
        match role {
            "tools" => tools = serde_json::from_str(content).ok(),
            _ => messages.push(json!({"role": role, "content": content})),
        }
    }
    (messages, tools)
}

/// The fake model as a Hugging Face folder (`config.json`, `tokenizer.json`,
/// `tokenizer_config.json`): what `forgelog proxy --tokenizer DIR` loads to
/// render this upstream's prompts. The tokenizer is a byte-level BPE with no
/// merges, so its ids are the bytes (GPT-2's byte-to-character map) and
/// [`END`] is [`END_ID`].
pub fn write_model_dir(dir: &std::path::Path) -> std::io::Result<()> {
    // GPT-2's map: printable Latin-1 bytes are their own character, the rest
    // are 256, 257, ... in byte order.
    let printable = |b: u32| matches!(b, 33..=126 | 161..=172 | 174..=255);
    let mut vocab = serde_json::Map::new();
    let mut shifted = 256;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            shifted += 1;
            shifted - 1
        };
        let c = char::from_u32(c).expect("a Latin-1 or shifted code point");
        vocab.insert(c.to_string(), json!(b));
    }
    vocab.insert(END.into(), json!(END_ID));
    // GPT-2's word split first (as real byte-level tokenizers do): with no
    // merges the ids are the bytes either way, and words are what BPE caches.
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": END_ID, "content": END, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []},
    });
    let config = json!({"model_type": MODEL, "eos_token_id": END_ID});
    let tokenizer_config =
        json!({"chat_template": CHAT_TEMPLATE, "eos_token": END, "bos_token": null});
    std::fs::create_dir_all(dir)?;
    for (name, value) in [
        ("config.json", config),
        ("tokenizer.json", tokenizer),
        ("tokenizer_config.json", tokenizer_config),
    ] {
        std::fs::write(dir.join(name), serde_json::to_vec_pretty(&value)?)?;
    }
    Ok(())
}

/// The sampled logprob of the `i`-th completion token: exact in f32.
pub fn logprob(i: usize) -> f32 {
    -((i % 8) as f32 + 1.0) / 16.0
}
