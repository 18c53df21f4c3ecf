//! The prefix cache on the tiny random llama: the next turn of a conversation
//! and the members of a group arriving together reuse what was computed, with
//! the logprobs a whole teacher-forced forward gives; new weights reuse
//! nothing of the old ones.

mod common;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use common::{ids, post, reload, serve, tiny_long_context_llama};
use forgelog_model::testing::{tiny_config, tiny_weights};
use forgelog_model::{log_softmax, KvCache, Transformer};
use serde_json::{json, Value};

fn body(prompt: &[u32], max_tokens: usize, temperature: f32, seed: u64) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
           "logprobs": 1, "return_token_ids": true, "ignore_eos": true})
}

/// The completion's tokens, and its logprobs as the engine reported them.
fn completion(response: &Value) -> (Vec<u32>, Vec<f32>) {
    let choice = &response["choices"][0];
    let logprobs = choice["logprobs"]["token_logprobs"].as_array().unwrap();
    (
        ids(&choice["token_ids"]),
        logprobs
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect(),
    )
}

/// Each completion token's logprob from one forward of prompt and completion.
fn assert_teacher_forced(model: &Transformer, prompt: &[u32], response: &Value) {
    let (tokens, got) = completion(response);
    assert!(!tokens.is_empty(), "{response}");
    let input: Vec<u32> = prompt.iter().chain(&tokens).copied().collect();
    let logits = model.forward(&input, &mut KvCache::new()).unwrap();
    for (i, (&token, got)) in tokens.iter().zip(got).enumerate() {
        let row: Vec<f32> = logits.get(prompt.len() + i - 1).unwrap().to_vec1().unwrap();
        let want = log_softmax(&row)[token as usize];
        assert!((got - want).abs() < 1e-4, "token {i}: {got} vs {want}");
    }
}

fn tokens(from: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| 3 + (from + i * 37) % 290).collect()
}

#[tokio::test]
async fn a_next_turn_and_a_group_reuse_the_cache_and_new_weights_reuse_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let policy = tiny_long_context_llama(&dir.path().join("model"), 5);
    let model = policy.model.clone();
    let config = model.config().clone();
    let server = serve(policy);
    let engine = &server.engine;

    // A first turn, then the next: its prompt is the first's, the completion
    // and new tokens. All but the first turn's last sampled token (never
    // fed) comes from the cache.
    let first: Vec<u32> = tokens(1, 100);
    let (status, one) = post(&server.base, "/v1/completions", &body(&first, 20, 0.0, 1)).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(engine.prefix_tokens_reused(), 0);
    let (sampled, _) = completion(&one);
    let next: Vec<u32> = first
        .iter()
        .chain(&sampled)
        .chain(&tokens(7, 30))
        .copied()
        .collect();
    let (_, two) = post(&server.base, "/v1/completions", &body(&next, 12, 0.0, 1)).await;
    assert_eq!(engine.prefix_tokens_reused(), 100 + 19);
    assert_teacher_forced(&model, &next, &two);

    // A group of four with one prompt, sent together: one prefills it, the
    // other three start from it.
    let shared = tokens(11, 80);
    let group = (0..4u64).map(|seed| {
        let (base, body) = (server.base.clone(), body(&shared, 10, 1.0, seed));
        tokio::spawn(async move { post(&base, "/v1/completions", &body).await })
    });
    let before = engine.prefix_tokens_reused();
    let mut answers = Vec::new();
    for member in group {
        let (status, answer) = member.await.unwrap();
        assert_eq!(status, 200, "{answer}");
        answers.push(answer);
    }
    assert_eq!(engine.prefix_tokens_reused() - before, 3 * 79);
    for answer in &answers {
        assert_teacher_forced(&model, &shared, answer);
    }
    let distinct: std::collections::BTreeSet<Vec<u32>> =
        answers.iter().map(|a| completion(a).0).collect();
    assert!(distinct.len() > 1, "four seeds, one completion");

    // New weights, attention included: the old keys and values are of no use.
    let mut weights = tiny_weights(&tiny_config(config.vocab_size), 5);
    for name in [
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "lm_head.weight",
    ] {
        let scaled = weights[name].affine(1.5, 0.0).unwrap();
        weights.insert(name.into(), scaled);
    }
    let checkpoint = dir.path().join("v1");
    std::fs::create_dir_all(&checkpoint).unwrap();
    candle_core::safetensors::save(&weights, checkpoint.join("model.safetensors")).unwrap();
    let uri = format!("file://{}/model.safetensors", checkpoint.display());
    let (status, reloaded) =
        reload(&server.base, &json!({"checkpoint_uri": uri, "version": 1})).await;
    assert_eq!(status, 200, "{reloaded}");
    let reused = engine.prefix_tokens_reused();
    let (_, three) = post(&server.base, "/v1/completions", &body(&next, 12, 0.0, 1)).await;
    assert_eq!(
        engine.prefix_tokens_reused(),
        reused,
        "nothing of the old weights is reused"
    );
    let new_model = Transformer::load(
        VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu),
        &config,
    )
    .unwrap();
    assert_teacher_forced(&new_model, &next, &three);
}
