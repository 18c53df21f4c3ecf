//! Starting an engine on an ephemeral port for a test binary. The server runs
//! on its own thread and runtime so that it outlives each `#[tokio::test]`.

#![allow(dead_code)]

use forgelog_engine::Engine;
use forgelog_model::Policy;
use serde_json::Value;
use std::sync::OnceLock;

pub struct Server {
    pub base: String,
    pub engine: Engine,
}

/// Serves `policy` until the test process exits.
pub fn serve(policy: Policy) -> Server {
    let engine = Engine::start(policy);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = forgelog_engine::server::router(engine.clone());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, router).await.unwrap();
        });
    });
    Server { base, engine }
}

/// The default model, loaded once per test binary; the test fails (naming
/// `scripts/fetch-model.sh`) when the model file is absent.
pub fn smollm2() -> &'static (Server, Policy) {
    static SERVER: OnceLock<(Server, Policy)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let policy = forgelog_model::load_policy("smollm2", &candle_core::Device::Cpu)
            .unwrap_or_else(|e| panic!("{e}"));
        (serve(policy.clone()), policy)
    })
}

pub async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

pub async fn get(base: &str, path: &str) -> Value {
    reqwest::get(format!("{base}{path}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// `choices[0].logprobs.content[].logprob` of a chat response, checking that
/// each `token` names the sampled id as vLLM's `token_id:N`.
pub fn chat_logprobs(response: &Value) -> Vec<f32> {
    let choice = &response["choices"][0];
    let tokens = ids(&choice["token_ids"]);
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), tokens.len());
    content
        .iter()
        .zip(&tokens)
        .map(|(c, t)| {
            assert_eq!(c["token"], format!("token_id:{t}"));
            c["logprob"].as_f64().unwrap() as f32
        })
        .collect()
}

/// The tiny random llama (seeded weights) with a context of 1024 tokens.
pub fn tiny_long_context_llama(dir: &std::path::Path, seed: u64) -> Policy {
    forgelog_model::testing::write_tiny_llama(dir, seed).unwrap();
    let config_path = dir.join("config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = serde_json::json!(1024);
    std::fs::write(&config_path, config.to_string()).unwrap();
    forgelog_model::load_hf_dir(dir, &candle_core::Device::Cpu).unwrap()
}
