//! How an inference engine is made to serve a version the learner published,
//! as data: the HTTP steps per engine kind and sync mode, and how each engine
//! says which version it serves. No I/O; `forgelog-sync` sends the steps.
//!
//! - vLLM, full weights (its dev-mode RL routes): pause with `mode=wait` (the
//!   requests in flight finish on the weights they started on, new ones
//!   queue: every call is sampled by one version), `reload_weights` from the
//!   folder, reset the prefix cache (its blocks were computed by the old
//!   weights), set the version, read it back, resume.
//! - vLLM, adapter: load it under a name of its own per version
//!   (`policy@N`; reloading one name in place re-reads from disk per request
//!   and reuses stale prefix blocks), unload the names past the staleness
//!   window, reset the prefix cache; read back from `/v1/models`. A call is
//!   then sampled by the version it names: the proxy asks for the newest
//!   adapter listed and stamps the call with its version, no pause needed.
//! - SGLang: `/update_weights_from_disk` with its `weight_version` (it
//!   flushes its cache), read back from `/model_info`; adapters as vLLM's.
//!
//! forgelog's own engine needs none of this: it follows `forgelog.policy`
//! itself (`forgelog engine --brokers B --run R`) and says the version it
//! serves at `/weight_info` as vLLM does.

mod models;

pub use models::{ModelCard, ModelList};
use serde_json::{json, Value};

/// The engine a policy is served by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    Vllm,
    Sglang,
}

/// What a published version is to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SyncMode {
    /// The whole model's weights, reloaded in place.
    Weights,
    /// A LoRA adapter folder (PEFT), loaded beside the base model.
    Adapter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

/// One request of a sync.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub method: Method,
    /// Path and query, from the engine's root.
    pub path: String,
    pub body: Option<Value>,
    /// Whether this step pauses the engine: once it has succeeded, a
    /// failure after it leaves the engine paused (a failed reload may have
    /// loaded part of the weights; vLLM does not roll back).
    pub pauses: bool,
}

impl Step {
    fn post(path: &str, body: Value) -> Step {
        Step {
            method: Method::Post,
            path: path.into(),
            body: Some(body),
            pauses: false,
        }
    }

    fn post_empty(path: &str) -> Step {
        Step {
            method: Method::Post,
            path: path.into(),
            body: None,
            pauses: false,
        }
    }
}

/// The name a version's adapter is served under: a request for this model
/// name is sampled by that version.
pub fn adapter_name(version: u64) -> String {
    format!("policy@{version}")
}

/// A sync's requests, in order, to make `kind` serve `version` from the
/// folder `dir` (local to the engine).
pub struct Plan {
    pub steps: Vec<Step>,
    /// How to read back what the engine serves.
    pub read_back: Step,
    /// The step that undoes the pause once every step succeeded.
    pub resume: Option<Step>,
}

pub fn plan(kind: EngineKind, mode: SyncMode, version: u64, dir: &str) -> Plan {
    let name = adapter_name(version);
    match (kind, mode) {
        (EngineKind::Vllm, SyncMode::Weights) => Plan {
            steps: vec![
                Step {
                    pauses: true,
                    ..Step::post_empty("/pause?mode=wait")
                },
                Step::post(
                    "/collective_rpc",
                    json!({"method": "reload_weights",
                           "kwargs": {"weights_path": dir, "is_checkpoint_format": true}}),
                ),
                Step::post_empty("/reset_prefix_cache"),
                Step::post(
                    "/update_weight_version",
                    json!({"new_version": version.to_string()}),
                ),
            ],
            read_back: get("/weight_info"),
            resume: Some(Step::post_empty("/resume")),
        },
        (EngineKind::Vllm, SyncMode::Adapter) => Plan {
            steps: vec![
                load_adapter(kind, &name, dir),
                Step::post_empty("/reset_prefix_cache"),
            ],
            read_back: get("/v1/models"),
            resume: None,
        },
        (EngineKind::Sglang, SyncMode::Weights) => Plan {
            steps: vec![Step::post(
                "/update_weights_from_disk",
                json!({"model_path": dir, "weight_version": version.to_string(),
                       "flush_cache": true}),
            )],
            // Every SGLang release serves `/get_model_info` (with
            // `weight_version`); newer ones alias it as `/model_info`.
            read_back: get("/get_model_info"),
            resume: None,
        },
        (EngineKind::Sglang, SyncMode::Adapter) => Plan {
            steps: vec![
                load_adapter(kind, &name, dir),
                Step::post_empty("/flush_cache"),
            ],
            read_back: get("/v1/models"),
            resume: None,
        },
    }
}

fn get(path: &str) -> Step {
    Step {
        method: Method::Get,
        path: path.into(),
        body: None,
        pauses: false,
    }
}

/// SGLang serves the adapter routes at the root, vLLM under `/v1`.
fn adapter_route(kind: EngineKind, route: &str) -> String {
    match kind {
        EngineKind::Sglang => format!("/{route}"),
        EngineKind::Vllm => format!("/v1/{route}"),
    }
}

fn load_adapter(kind: EngineKind, name: &str, dir: &str) -> Step {
    Step::post(
        &adapter_route(kind, "load_lora_adapter"),
        json!({"lora_name": name, "lora_path": dir}),
    )
}

/// Unloads the adapter of `version`.
pub fn unload_adapter(kind: EngineKind, version: u64) -> Step {
    Step::post(
        &adapter_route(kind, "unload_lora_adapter"),
        json!({"lora_name": adapter_name(version)}),
    )
}

/// Why `kind` would not serve a full-weight version of the model whose
/// `config.json` is `config` exactly as published (`None`: nothing known):
/// vLLM's `reload_weights` (0.32, measured on CPU by `cargo bench --bench
/// engine-gap`) refreshes the input embeddings of a model with tied
/// embeddings but not its output head, which keeps the weights vLLM started
/// with: the importance ratios of on-policy steps drift by up to about 12%.
pub fn reload_caveat(kind: EngineKind, mode: SyncMode, config: &Value) -> Option<&'static str> {
    let tied = config["tie_word_embeddings"].as_bool() == Some(true);
    (kind == EngineKind::Vllm && mode == SyncMode::Weights && tied).then_some(
        "the model ties its output head to its input embeddings, and vLLM's reload_weights \
         keeps the output head it started with: serve an untied copy (tie_word_embeddings \
         false, lm_head.weight a copy of the embeddings) and train that, or sync a LoRA \
         adapter (--sync-mode adapter)",
    )
}

/// What names the weights an engine was started with version 0, when it
/// names none yet: the learner's first version is trained from those weights
/// (the same folder), and every call before the first sync is then stamped
/// with the version that sampled it. SGLang has no route that sets a version
/// without loading weights.
pub fn declare_base(kind: EngineKind, mode: SyncMode) -> Option<Step> {
    match (kind, mode) {
        (EngineKind::Vllm, SyncMode::Weights) => Some(Step::post(
            "/update_weight_version",
            json!({"new_version": "0"}),
        )),
        _ => None,
    }
}

/// How to ask whether the engine is paused (vLLM's `/is_paused`), where it
/// says: a sync that failed after pausing leaves it paused.
pub fn paused_query(kind: EngineKind) -> Option<Step> {
    match kind {
        EngineKind::Vllm => Some(get("/is_paused")),
        EngineKind::Sglang => None,
    }
}

/// Whether the engine's answer to [`paused_query`] says it is paused.
pub fn is_paused(body: &Value) -> bool {
    body["is_paused"].as_bool() == Some(true)
}

/// Whether an answer with this status and body says the step was done.
/// SGLang answers 200 with `success: false` when it refuses.
pub fn accepted(status: u16, body: &Value) -> bool {
    (200..300).contains(&status) && body["success"].as_bool() != Some(false)
}

/// The version the engine says it serves, from its read-back answer; `None`
/// when the answer names none (an engine not yet synced).
pub fn served_version(kind: EngineKind, mode: SyncMode, body: &Value) -> Option<u64> {
    let version = |v: &Value| match v {
        Value::String(s) => s.parse().ok(),
        v => v.as_u64(),
    };
    match (kind, mode) {
        // vLLM's `/weight_info` and SGLang's `/model_info` name it alike.
        (_, SyncMode::Weights) => version(&body["weight_version"]),
        // The newest adapter it lists; none: the base model, version 0 (the
        // learner's adapter starts as zero on the weights the engine serves).
        // An answer that is no model list names none.
        (_, SyncMode::Adapter) => ModelList::of(body).map(|m| m.newest_adapter().unwrap_or(0)),
    }
}

#[cfg(test)]
mod tests;
