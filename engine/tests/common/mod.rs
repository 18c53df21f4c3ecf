//! Shared by the engine's integration tests: the engine serving on an
//! ephemeral port ([`forgelog_engine::testing`]) and readers of its answers.

#![allow(dead_code)]

#[allow(unused_imports)] // not every test binary uses each
pub use forgelog_engine::testing::{serve, smollm2, Server};
use forgelog_model::Policy;
use serde_json::Value;

pub async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    post_as(base, path, None, body).await
}

/// `POST /admin/reload` with the test engines' admin token.
pub async fn reload(base: &str, body: &Value) -> (u16, Value) {
    let token = forgelog_engine::testing::ADMIN_TOKEN;
    post_as(base, "/admin/reload", Some(token), body).await
}

pub async fn post_as(base: &str, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
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
    forgelog_model::testing::write_tiny_llama_with_context(dir, seed, 1024).unwrap();
    forgelog_model::load_hf_dir(dir, &candle_core::Device::Cpu).unwrap()
}
