//! A policy as the files of a Hugging Face model folder beside its weights:
//! `config.json`, `generation_config.json`, `tokenizer.json` and
//! `tokenizer_config.json` (with the chat template). With a
//! `model.safetensors` of the weights (already in Hugging Face names and
//! layout), the folder loads in `transformers` and vLLM as the model it was
//! trained from. Pure: the caller writes the bytes where it wants them.

use crate::{LoadError, Policy};
use serde_json::{json, Value};

/// The files' names, in the order [`folder_files`] returns them.
pub const FOLDER_FILES: [&str; 4] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// `policy`'s folder files, its weights stored as `dtype` (`float32`,
/// `bfloat16`, … as `transformers` names them).
pub fn folder_files(
    policy: &Policy,
    dtype: &str,
) -> Result<Vec<(&'static str, Vec<u8>)>, LoadError> {
    let c = policy.model.config();
    let template = &policy.chat_template;
    let id_of = |token: &str| {
        (!token.is_empty())
            .then(|| policy.tokenizer.token_to_id(token))
            .flatten()
    };
    let bos_id = id_of(template.bos_token());
    let eos_ids = &policy.stop_token_ids;
    let mut config = serde_json::to_value(c).map_err(invalid)?;
    let fields = config
        .as_object_mut()
        .expect("a struct serializes to an object");
    for (key, value) in [
        ("architectures", json!([c.architecture.causal_lm_class()])),
        ("head_dim", json!(c.head_dim())),
        // transformers 5's form; `rope_theta` stays for older readers.
        (
            "rope_parameters",
            json!({"rope_type": "default", "rope_theta": c.rope_theta}),
        ),
        ("hidden_act", json!("silu")),
        ("mlp_bias", json!(false)),
        ("bos_token_id", json!(bos_id)),
        ("eos_token_id", eos_value(eos_ids)),
        ("dtype", json!(dtype)),
        ("torch_dtype", json!(dtype)),
        ("use_cache", json!(true)),
    ] {
        fields.insert(key.into(), value);
    }
    let generation = json!({
        "bos_token_id": bos_id,
        "eos_token_id": eos_value(eos_ids),
        "do_sample": true,
        "temperature": 1.0,
        "top_p": 1.0,
    });
    let tokenizer = policy
        .tokenizer
        .to_string(true)
        .map_err(|e| LoadError::Tokenizer(e.to_string()))?;
    let token_or_null = |t: &str| if t.is_empty() { Value::Null } else { json!(t) };
    let tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template.source(),
        "bos_token": token_or_null(template.bos_token()),
        "eos_token": token_or_null(template.eos_token()),
        "model_max_length": c.max_position_embeddings,
        "clean_up_tokenization_spaces": false,
    });
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).map_err(invalid);
    Ok(vec![
        (FOLDER_FILES[0], pretty(&config)?),
        (FOLDER_FILES[1], pretty(&generation)?),
        (FOLDER_FILES[2], tokenizer.into_bytes()),
        (FOLDER_FILES[3], pretty(&tokenizer_config)?),
    ])
}

/// One id as a number, several as a list (as Hugging Face configs write it).
fn eos_value(ids: &[u32]) -> Value {
    match ids {
        [] => Value::Null,
        [one] => json!(one),
        many => json!(many),
    }
}

fn invalid(e: serde_json::Error) -> LoadError {
    LoadError::Invalid(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{write_tiny_llama, write_tiny_qwen2, write_tiny_qwen3};
    use candle_core::Device;

    type TinyWriter = fn(&std::path::Path, u64) -> std::io::Result<crate::ModelConfig>;

    /// The folder a policy writes loads back as the same policy: same
    /// config, tokenizer, template, stop tokens and logits.
    #[test]
    fn a_policy_folder_loads_back_as_the_same_policy() {
        for (write, model_type) in [
            (write_tiny_llama as TinyWriter, "llama"),
            (write_tiny_qwen2, "qwen2"),
            (write_tiny_qwen3, "qwen3"),
        ] {
            let source = tempfile::tempdir().unwrap();
            write(source.path(), 3).unwrap();
            let policy = crate::load_hf_dir(source.path(), &Device::Cpu).unwrap();
            let folder = tempfile::tempdir().unwrap();
            for (name, bytes) in folder_files(&policy, "float32").unwrap() {
                std::fs::write(folder.path().join(name), bytes).unwrap();
            }
            std::fs::copy(
                source.path().join("model.safetensors"),
                folder.path().join("model.safetensors"),
            )
            .unwrap();
            let config: Value =
                serde_json::from_slice(&std::fs::read(folder.path().join("config.json")).unwrap())
                    .unwrap();
            assert_eq!(config["model_type"], model_type);

            let back = crate::load_hf_dir(folder.path(), &Device::Cpu).unwrap();
            assert_eq!(back.model.config(), policy.model.config());
            assert_eq!(back.stop_token_ids, policy.stop_token_ids);
            assert_eq!(back.chat_template.source(), policy.chat_template.source());
            let text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n";
            let ids = |p: &Policy| p.tokenizer.encode(text, false).unwrap().get_ids().to_vec();
            assert_eq!(ids(&back), ids(&policy));
            let logits = |p: &Policy| {
                p.model
                    .forward(&ids(p), &mut crate::KvCache::new())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            };
            assert_eq!(logits(&back), logits(&policy));
        }
    }
}
