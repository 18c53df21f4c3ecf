//! LoRA: a low-rank update beside chosen projections. A projection
//! `y = W x` becomes `y = W x + (α / r) · B (A x)` with `A: [r, in]` and
//! `B: [out, r]`; `W` stays frozen and only `A` and `B` train.
//!
//! Tensors are named and laid out as PEFT saves them, so a folder of
//! `adapter_config.json` + `adapter_model.safetensors` loads with
//! `PeftModel.from_pretrained` and vLLM's `/v1/load_lora_adapter`:
//! `base_model.model.{module}.lora_A.weight` (`[r, in]`) and
//! `base_model.model.{module}.lora_B.weight` (`[out, r]`), where `{module}`
//! is the projection's path (`model.layers.0.self_attn.q_proj`).

use crate::{LoadError, ModelConfig};
use candle_core::{Device, Module, Result, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::HashMap;

/// The projections LoRA can adapt (PEFT's `target_modules` names).
pub const PROJECTIONS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// The adapter folder's files.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// Where every PEFT tensor name begins.
const PEFT_PREFIX: &str = "base_model.model.";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f64,
    /// Projection names from [`PROJECTIONS`], adapted in every layer.
    pub targets: Vec<String>,
}

impl LoraConfig {
    /// Checks the rank and the targets.
    pub fn new(
        rank: usize,
        alpha: f64,
        targets: Vec<String>,
    ) -> std::result::Result<LoraConfig, String> {
        if rank == 0 {
            return Err("LoRA rank must be at least 1".into());
        }
        if targets.is_empty() {
            return Err("LoRA needs at least one target module".into());
        }
        if let Some(bad) = targets.iter().find(|t| !PROJECTIONS.contains(&t.as_str())) {
            return Err(format!(
                "LoRA target {bad:?} is not a projection (one of {})",
                PROJECTIONS.join(", ")
            ));
        }
        Ok(LoraConfig {
            rank,
            alpha,
            targets,
        })
    }

    /// `α / r`, what `B A x` is scaled by.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether the projection at `module` (`model.layers.0.self_attn.q_proj`) is adapted.
    pub fn adapts(&self, module: &str) -> bool {
        let name = module.rsplit('.').next().unwrap_or(module);
        self.targets.iter().any(|t| t == name)
    }

    /// PEFT's `adapter_config.json` for an adapter of `base` (a model name or path).
    pub fn peft_config(&self, base: &str) -> Value {
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "target_modules": self.targets,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "modules_to_save": null,
        })
    }

    /// The LoRA an `adapter_config.json` describes; one forgelog cannot
    /// apply as written (another PEFT type, rsLoRA, DoRA, biases) is an
    /// error naming the field.
    pub fn from_peft_config(config: &Value) -> std::result::Result<LoraConfig, String> {
        let field = |key: &str| config.get(key).unwrap_or(&Value::Null);
        if field("peft_type").as_str() != Some("LORA") {
            return Err(format!("peft_type {} is not LORA", field("peft_type")));
        }
        for flag in ["use_rslora", "use_dora", "fan_in_fan_out"] {
            if field(flag).as_bool() == Some(true) {
                return Err(format!("{flag} = true is not supported"));
            }
        }
        if !matches!(field("bias").as_str(), None | Some("none")) {
            return Err(format!(
                "bias {} is not supported (only \"none\")",
                field("bias")
            ));
        }
        let rank = field("r")
            .as_u64()
            .ok_or("adapter_config.json has no r (the rank)")? as usize;
        let alpha = field("lora_alpha")
            .as_f64()
            .ok_or("adapter_config.json has no lora_alpha")?;
        let targets = match field("target_modules") {
            Value::Array(names) => names
                .iter()
                .map(|n| {
                    n.as_str()
                        .map(String::from)
                        .ok_or("target_modules holds a non-string")
                })
                .collect::<std::result::Result<Vec<_>, _>>()?,
            Value::String(one) => vec![one.clone()],
            other => return Err(format!("target_modules {other} is not a list of names")),
        };
        LoraConfig::new(rank, alpha, targets)
    }
}

/// PEFT's names of the `A` and `B` tensors of the projection at `module`.
pub fn peft_names(module: &str) -> (String, String) {
    (
        format!("{PEFT_PREFIX}{module}.lora_A.weight"),
        format!("{PEFT_PREFIX}{module}.lora_B.weight"),
    )
}

/// Whether `name` is a PEFT adapter tensor's.
pub fn is_adapter_tensor(name: &str) -> bool {
    name.starts_with(PEFT_PREFIX)
}

/// The projections of `config` that `lora` adapts: `(module, in, out)`, in
/// layer order.
pub fn adapted_projections(config: &ModelConfig, lora: &LoraConfig) -> Vec<(String, usize, usize)> {
    let (hidden, ffn, d) = (
        config.hidden_size,
        config.intermediate_size,
        config.head_dim(),
    );
    let (q, kv) = (
        config.num_attention_heads * d,
        config.num_key_value_heads * d,
    );
    let mut out = Vec::new();
    for layer in 0..config.num_hidden_layers {
        for (name, d_in, d_out) in [
            ("self_attn.q_proj", hidden, q),
            ("self_attn.k_proj", hidden, kv),
            ("self_attn.v_proj", hidden, kv),
            ("self_attn.o_proj", q, hidden),
            ("mlp.gate_proj", hidden, ffn),
            ("mlp.up_proj", hidden, ffn),
            ("mlp.down_proj", ffn, hidden),
        ] {
            let module = format!("model.layers.{layer}.{name}");
            if lora.adapts(&module) {
                out.push((module, d_in, d_out));
            }
        }
    }
    out
}

/// A fresh adapter as PEFT starts one: `A` uniform in `±1/sqrt(in)` (its
/// Kaiming-uniform with a = √5), `B` zero, so the adapted model starts as
/// the base. Deterministic in `seed`.
pub fn init_adapter(
    config: &ModelConfig,
    lora: &LoraConfig,
    seed: u64,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut adapter = HashMap::new();
    for (module, d_in, d_out) in adapted_projections(config, lora) {
        let bound = 1.0 / (d_in as f32).sqrt();
        let a: Vec<f32> = (0..lora.rank * d_in).map(|_| bound * uniform()).collect();
        let (a_name, b_name) = peft_names(&module);
        adapter.insert(a_name, Tensor::from_vec(a, (lora.rank, d_in), device)?);
        adapter.insert(
            b_name,
            Tensor::zeros((d_out, lora.rank), candle_core::DType::F32, device)?,
        );
    }
    Ok(adapter)
}

/// `weights` with the adapter folded in: `W ← W + (α/r) · B A` for each
/// adapted projection. An adapter made for another base (a tensor missing,
/// or of another shape) is an error naming the tensor.
pub fn merge(
    weights: &HashMap<String, Tensor>,
    adapter: &HashMap<String, Tensor>,
    config: &ModelConfig,
    lora: &LoraConfig,
) -> std::result::Result<HashMap<String, Tensor>, LoadError> {
    let mut merged = weights.clone();
    for (module, d_in, d_out) in adapted_projections(config, lora) {
        let (a_name, b_name) = peft_names(&module);
        let get = |name: &str, shape: (usize, usize)| -> std::result::Result<&Tensor, LoadError> {
            let t = adapter
                .get(name)
                .ok_or_else(|| LoadError::Invalid(format!("adapter has no {name}")))?;
            if t.dims() != [shape.0, shape.1] {
                return Err(LoadError::Invalid(format!(
                    "adapter tensor {name} is {:?}, the base model needs {shape:?}: an adapter for another base?",
                    t.dims()
                )));
            }
            Ok(t)
        };
        let (a, b) = (
            get(&a_name, (lora.rank, d_in))?,
            get(&b_name, (d_out, lora.rank))?,
        );
        let w_name = format!("{module}.weight");
        let w = weights
            .get(&w_name)
            .ok_or_else(|| LoadError::Invalid(format!("base model has no {w_name}")))?;
        let delta = (b.to_dtype(w.dtype())?.matmul(&a.to_dtype(w.dtype())?)? * lora.scale())?;
        merged.insert(w_name, (w + delta)?);
    }
    Ok(merged)
}

/// The adapter folder's two files for `adapter` (tensors by PEFT name).
pub fn adapter_files(
    adapter: &HashMap<String, Tensor>,
    lora: &LoraConfig,
    base: &str,
) -> std::result::Result<Vec<(&'static str, Vec<u8>)>, LoadError> {
    let sorted: std::collections::BTreeMap<&String, &Tensor> = adapter.iter().collect();
    let tensors = safetensors::tensor::serialize(sorted, None)
        .map_err(|e| LoadError::Invalid(format!("adapter: {e}")))?;
    let config = serde_json::to_vec_pretty(&lora.peft_config(base))
        .map_err(|e| LoadError::Invalid(e.to_string()))?;
    Ok(vec![(ADAPTER_CONFIG, config), (ADAPTER_WEIGHTS, tensors)])
}

/// An adapter folder (PEFT's two files): its LoRA and its tensors in f32.
pub fn load_adapter_dir(
    dir: &std::path::Path,
    device: &Device,
) -> std::result::Result<(LoraConfig, HashMap<String, Tensor>), LoadError> {
    let config_path = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read(&config_path).map_err(|source| LoadError::Io {
        path: config_path.clone(),
        source,
    })?;
    let raw: Value = serde_json::from_slice(&text)
        .map_err(|e| LoadError::Invalid(format!("{}: {e}", config_path.display())))?;
    let lora = LoraConfig::from_peft_config(&raw)
        .map_err(|e| LoadError::Invalid(format!("{}: {e}", config_path.display())))?;
    let weights_path = dir.join(ADAPTER_WEIGHTS);
    let bytes = std::fs::read(&weights_path).map_err(|source| LoadError::Io {
        path: weights_path,
        source,
    })?;
    Ok((lora, crate::weights_from_safetensors(&bytes, device)?))
}

/// The model of `weights` with `adapter` applied unmerged (f32 tensors by
/// name; see [`crate::Transformer::load_adapted`] for trainable ones).
pub fn unmerged_model(
    weights: &HashMap<String, Tensor>,
    adapter: &HashMap<String, Tensor>,
    config: &ModelConfig,
    lora: &LoraConfig,
    device: &Device,
) -> Result<crate::Transformer> {
    use candle_nn::VarBuilder;
    let f32 = candle_core::DType::F32;
    let adapter = crate::Adapter {
        lora,
        tensors: VarBuilder::from_tensors(adapter.clone(), f32, device),
    };
    crate::Transformer::load_adapted(
        VarBuilder::from_tensors(weights.clone(), f32, device),
        config,
        Some(&adapter),
    )
}

/// One projection's low-rank update, unmerged: what the learner trains.
#[derive(Clone)]
pub(crate) struct LowRank {
    a: Tensor,
    b: Tensor,
    scale: f64,
}

impl LowRank {
    /// The update of the projection at `vb`'s prefix, from `adapter` (its
    /// tensors by PEFT name), or `None` where `lora` does not adapt it.
    pub(crate) fn load(
        adapter: &crate::transformer::Adapter,
        module: &str,
        d_in: usize,
        d_out: usize,
    ) -> Result<Option<LowRank>> {
        if !adapter.lora.adapts(module) {
            return Ok(None);
        }
        let (a_name, b_name) = peft_names(module);
        let r = adapter.lora.rank;
        Ok(Some(LowRank {
            a: adapter.tensors.get((r, d_in), &a_name)?,
            b: adapter.tensors.get((d_out, r), &b_name)?,
            scale: adapter.lora.scale(),
        }))
    }
}

impl Module for LowRank {
    /// `(α/r) · B (A x)` for rows `x`: two thin matmuls, never `B A`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.matmul(&self.a.t()?)?.matmul(&self.b.t()?)? * self.scale
    }
}
