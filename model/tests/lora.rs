//! LoRA on tiny random models: the unmerged update the learner trains and the
//! merged weights the engine serves compute the same logits; a fresh adapter
//! is the base model; PEFT's files round-trip; an adapter for another base is
//! an error naming the tensor.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use forgelog_model::lora::{self, LoraConfig, PROJECTIONS};
use forgelog_model::testing::{
    max_abs_diff, tiny_adapter, tiny_config, tiny_qwen3_config, tiny_weights,
};
use forgelog_model::{Adapter, KvCache, ModelConfig, Transformer};
use std::collections::HashMap;

const TOKENS: [u32; 7] = [5, 17, 42, 8, 99, 3, 7];

fn all_targets() -> LoraConfig {
    LoraConfig::new(4, 8.0, PROJECTIONS.iter().map(|s| s.to_string()).collect()).unwrap()
}

fn logits(model: &Transformer) -> Tensor {
    model.forward(&TOKENS, &mut KvCache::new()).unwrap()
}

fn base(weights: &HashMap<String, Tensor>, config: &ModelConfig) -> Transformer {
    Transformer::load(
        VarBuilder::from_tensors(weights.clone(), DType::F32, &Device::Cpu),
        config,
    )
    .unwrap()
}

fn unmerged(
    weights: &HashMap<String, Tensor>,
    config: &ModelConfig,
    lora: &LoraConfig,
    adapter: &HashMap<String, Tensor>,
) -> Transformer {
    let adapter = Adapter {
        lora,
        tensors: VarBuilder::from_tensors(adapter.clone(), DType::F32, &Device::Cpu),
    };
    Transformer::load_adapted(
        VarBuilder::from_tensors(weights.clone(), DType::F32, &Device::Cpu),
        config,
        Some(&adapter),
    )
    .unwrap()
}

#[test]
fn merged_and_unmerged_adapters_give_the_same_logits() {
    for config in [tiny_config(300), tiny_qwen3_config(300)] {
        for lora in [
            all_targets(),
            LoraConfig::new(2, 16.0, vec!["q_proj".into(), "v_proj".into()]).unwrap(),
        ] {
            let weights = tiny_weights(&config, 3);
            let adapter = tiny_adapter(&config, &lora, 5);
            let with = logits(&unmerged(&weights, &config, &lora, &adapter));
            let merged = lora::merge(&weights, &adapter, &config, &lora).unwrap();
            let diff = max_abs_diff(&with, &logits(&base(&merged, &config)));
            assert!(diff < 1e-4, "{:?} {lora:?}: {diff}", config.architecture);
            let moved = max_abs_diff(&with, &logits(&base(&weights, &config)));
            assert!(moved > 1e-3, "the adapter changes the model: {moved}");
        }
    }
}

#[test]
fn a_fresh_adapter_is_the_base_model() {
    let config = tiny_qwen3_config(300);
    let lora = all_targets();
    let weights = tiny_weights(&config, 3);
    let fresh = lora::init_adapter(&config, &lora, 1, &Device::Cpu).unwrap();
    // 7 projections x 2 layers x (A, B).
    assert_eq!(fresh.len(), 28);
    let a = &fresh["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"];
    assert_eq!(a.dims(), &[4, 32]);
    assert!(
        a.abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            > 0.0
    );
    let diff = max_abs_diff(
        &logits(&unmerged(&weights, &config, &lora, &fresh)),
        &logits(&base(&weights, &config)),
    );
    assert_eq!(diff, 0.0);
}

#[test]
fn adapter_files_round_trip_as_peft_writes_them() {
    let config = tiny_qwen3_config(300);
    let lora = all_targets();
    let adapter = tiny_adapter(&config, &lora, 2);
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in lora::adapter_files(&adapter, &lora, "tiny-qwen3").unwrap() {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(lora::ADAPTER_CONFIG)).unwrap())
            .unwrap();
    assert_eq!(written["peft_type"], "LORA");
    assert_eq!(written["r"], 4);
    assert_eq!(written["lora_alpha"], 8.0);
    let (back, tensors) = lora::load_adapter_dir(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(back, lora);
    assert_eq!(tensors.len(), adapter.len());
    for (name, t) in &adapter {
        assert_eq!(max_abs_diff(t, &tensors[name]), 0.0, "{name}");
    }
}

#[test]
fn bad_adapters_are_errors_naming_what_is_wrong() {
    // An adapter made for a Qwen3 (heads of 16) merged into a llama (heads of 8).
    let lora = all_targets();
    let qwen3 = tiny_adapter(&tiny_qwen3_config(300), &lora, 1);
    let llama = tiny_config(300);
    let err = lora::merge(&tiny_weights(&llama, 1), &qwen3, &llama, &lora)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_")
            && err.contains("another base"),
        "{err}"
    );
    // A tensor missing.
    let mut partial = tiny_adapter(&llama, &lora, 1);
    partial.remove("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
    let err = lora::merge(&tiny_weights(&llama, 1), &partial, &llama, &lora)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("layers.1.mlp.down_proj.lora_B.weight"),
        "{err}"
    );
    // Configs forgelog cannot apply as written.
    let peft = |edit: serde_json::Value| {
        let mut config = lora.peft_config("base");
        for (k, v) in edit.as_object().unwrap() {
            config[k] = v.clone();
        }
        LoraConfig::from_peft_config(&config)
    };
    assert_eq!(peft(serde_json::json!({})).unwrap(), lora);
    assert!(peft(serde_json::json!({"use_dora": true}))
        .unwrap_err()
        .contains("use_dora"));
    assert!(peft(serde_json::json!({"target_modules": ["lm_head"]}))
        .unwrap_err()
        .contains("lm_head"));
    assert!(peft(serde_json::json!({"r": 0}))
        .unwrap_err()
        .contains("rank"));
    assert!(peft(serde_json::json!({"peft_type": "IA3"}))
        .unwrap_err()
        .contains("IA3"));
}
