//! The engine over HTTP on the real default model, SmolLM2-135M-Instruct.
//! Needs `scripts/fetch-model.sh` to have run; fails (never skips) otherwise.

mod common;

use common::{chat_logprobs, get, ids, post, smollm2};
use forgelog_engine::sampling::processed_logprobs;
use forgelog_model::{KvCache, Policy};
use serde_json::{json, Value};
use std::time::Instant;

fn question(extra: Value) -> Value {
    let mut body = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "logprobs": true,
        "top_logprobs": 0,
        "return_token_ids": true,
        "stream": false,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The processed logprob of each completion token from one teacher-forced
/// forward over prompt + completion.
fn teacher_forced(
    policy: &Policy,
    prompt: &[u32],
    completion: &[u32],
    temperature: f32,
) -> Vec<f32> {
    let input: Vec<u32> = prompt.iter().chain(completion).copied().collect();
    let logits = policy.model.forward(&input, &mut KvCache::new()).unwrap();
    completion
        .iter()
        .enumerate()
        .map(|(i, &token)| {
            let row: Vec<f32> = logits.get(prompt.len() + i - 1).unwrap().to_vec1().unwrap();
            processed_logprobs(&row, temperature)[token as usize]
        })
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], tolerance: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() < tolerance, "token {i}: {g} vs {w}");
    }
}

#[tokio::test]
async fn greedy_chat_answers_paris_with_teacher_forced_logprobs() {
    let (server, policy) = smollm2();
    let (status, response) = post(
        &server.base,
        "/v1/chat/completions",
        &question(json!({"temperature": 0, "max_tokens": 12})),
    )
    .await;
    assert_eq!(status, 200, "{response}");
    let choice = &response["choices"][0];
    let text = choice["message"]["content"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text}");
    assert_eq!(response["policy_version"], 0);
    let (prompt, completion) = (
        ids(&response["prompt_token_ids"]),
        ids(&choice["token_ids"]),
    );
    assert_eq!(prompt[..2], [1, 9690], "<|im_start|>system");
    assert_eq!(response["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(response["usage"]["completion_tokens"], completion.len());
    let reason = choice["finish_reason"].as_str().unwrap();
    assert!(
        reason == "length" || (reason == "stop" && completion.last() == Some(&2)),
        "{reason}"
    );
    assert_close(
        &chat_logprobs(&response),
        &teacher_forced(policy, &prompt, &completion, 0.0),
        1e-4,
    );
}

#[tokio::test]
async fn seeded_sampling_repeats_and_reports_tempered_logprobs() {
    // An engine of its own: on the shared one, other tests' requests can join a
    // batch, and batched matmuls differ in the last bits, enough to flip a draw
    // at a near-tie. Alone, each request is a batch of one: token for token.
    let (_, policy) = smollm2();
    let server = &common::serve(policy.clone());
    for temperature in [0.7f32, 1.3] {
        let body = question(json!({"temperature": temperature, "seed": 1234, "max_tokens": 10}));
        let (_, first) = post(&server.base, "/v1/chat/completions", &body).await;
        let (_, second) = post(&server.base, "/v1/chat/completions", &body).await;
        let tokens = ids(&first["choices"][0]["token_ids"]);
        assert_eq!(
            tokens,
            ids(&second["choices"][0]["token_ids"]),
            "same seed, same tokens"
        );
        assert_close(&chat_logprobs(&first), &chat_logprobs(&second), 1e-4);
        let prompt = ids(&first["prompt_token_ids"]);
        let want = teacher_forced(policy, &prompt, &tokens, temperature);
        assert_close(&chat_logprobs(&first), &want, 1e-4);
        // They are the tempered distribution's, not the raw one's.
        let raw = teacher_forced(policy, &prompt, &tokens, 0.0);
        assert!(want.iter().zip(&raw).any(|(w, r)| (w - r).abs() > 1e-2));
    }
}

/// 16 simultaneous requests get the tokens each gets alone. Batched matmuls
/// may sum in a different order than single-row ones, so logprobs are
/// compared within 1e-4 rather than bit for bit.
#[tokio::test]
async fn concurrent_requests_match_one_at_a_time() {
    // An engine of its own, so "alone" really is a batch of one.
    let (_, policy) = smollm2();
    let server = &common::serve(policy.clone());
    let body = |seed: u64| question(json!({"temperature": 0.9, "seed": seed, "max_tokens": 8}));
    let started = Instant::now();
    let mut alone = Vec::new();
    for seed in 0..16 {
        alone.push(
            post(&server.base, "/v1/chat/completions", &body(seed))
                .await
                .1,
        );
    }
    let sequential = started.elapsed();
    let started = Instant::now();
    let handles: Vec<_> = (0..16)
        .map(|seed| {
            let base = server.base.clone();
            tokio::spawn(async move { post(&base, "/v1/chat/completions", &body(seed)).await })
        })
        .collect();
    let mut together = Vec::new();
    for handle in handles {
        let (status, response) = handle.await.unwrap();
        assert_eq!(status, 200, "{response}");
        together.push(response);
    }
    let concurrent = started.elapsed();
    for (a, b) in alone.iter().zip(&together) {
        assert_eq!(
            ids(&a["choices"][0]["token_ids"]),
            ids(&b["choices"][0]["token_ids"])
        );
        assert_close(&chat_logprobs(a), &chat_logprobs(b), 1e-4);
    }
    eprintln!("16 requests: {sequential:?} one at a time, {concurrent:?} together");
    // Batched, 16 requests share each step's weight reads (about 3x faster on 2 cores).
    assert!(
        concurrent < sequential,
        "16 concurrent requests were not batched"
    );
}

#[tokio::test]
async fn completions_take_token_ids_and_bad_requests_get_openai_errors() {
    let (server, _) = smollm2();
    let prompt: Vec<u32> = server.engine.encode("The capital of France is").unwrap();
    let body = json!({"prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 0, "return_token_ids": true});
    let (status, response) = post(&server.base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    let choice = &response["choices"][0];
    assert!(
        choice["text"].as_str().unwrap().contains("Paris"),
        "{response}"
    );
    assert_eq!(ids(&response["prompt_token_ids"]), prompt);
    assert_eq!(choice["logprobs"]["tokens"].as_array().unwrap().len(), 3);
    assert_eq!(choice["finish_reason"], "length");

    let too_long = json!({"prompt": vec![28; 8193], "max_tokens": 1});
    let (status, error) = post(&server.base, "/v1/completions", &too_long).await;
    assert_eq!(status, 400);
    assert_eq!(error["error"]["code"], "context_length_exceeded");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("context length"));

    for bad in [
        question(json!({"stream": true})),
        json!({"messages": "hi"}),
        json!({"prompt": [99999999]}),
    ] {
        let path = if bad.get("prompt").is_some() {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let (status, error) = post(&server.base, path, &bad).await;
        assert_eq!(status, 400, "{bad}");
        assert!(error["error"]["message"].is_string(), "{error}");
    }
    let malformed = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);

    let models = get(&server.base, "/v1/models").await;
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct");
    assert_eq!(models["data"][0]["policy_version"], 0);
    let health = reqwest::get(format!("{}/healthz", server.base))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // vLLM's health check: 200, empty.
    let health = reqwest::get(format!("{}/health", server.base))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "");

    // Prometheus: what this test's generations cost, described, as histograms.
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for wanted in [
        "# HELP forgelog_engine_time_to_first_token_seconds ",
        "# TYPE forgelog_engine_time_to_first_token_seconds histogram",
        "forgelog_engine_request_seconds_bucket",
        "forgelog_engine_requests_total{finish_reason=\"",
        "forgelog_build_info{version=",
    ] {
        assert!(metrics.contains(wanted), "no {wanted} in\n{metrics}");
    }
    let counted = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(
        counted("forgelog_engine_generation_tokens_total") >= 1.0,
        "{metrics}"
    );
    assert!(
        counted("forgelog_engine_prompt_tokens_total") >= 1.0,
        "{metrics}"
    );
}

/// vLLM's `structured_outputs`: the completion matches the expression, ends
/// with a stop token, and each logprob is that of the distribution the
/// expression left (teacher-forced here with the same mask), so a token the
/// expression forces has logprob 0. What the engine cannot honour is a 400
/// that names it, never an unconstrained answer.
#[tokio::test]
async fn structured_outputs_hold_the_completion_to_the_expression() {
    use forgelog_engine::grammar::{StructuredOutput, TokenGrammar};
    let (server, policy) = smollm2();
    let regex = r#"<tool_call>\n\{"name": "bash", "arguments": \{"command": "(ls /app|cat /app/[a-z]{1,8}\.txt|echo [A-Za-z ]{1,20})"\}\}\n</tool_call>"#;
    let whole = regex::Regex::new(&format!("^(?:{regex})$")).unwrap();
    let body = question(json!({
        "temperature": 1.0, "seed": 7, "max_tokens": 96,
        "structured_outputs": {"regex": regex},
    }));
    let (status, response) = post(&server.base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    let choice = &response["choices"][0];
    let completion = ids(&choice["token_ids"]);
    assert_eq!(choice["finish_reason"], "stop", "{response}");
    assert_eq!(completion.last(), Some(&2), "ends with <|im_end|>");
    let text = server
        .engine
        .tokenizer()
        .decode(&completion[..completion.len() - 1], false)
        .unwrap();
    assert!(whole.is_match(&text), "{text:?}");

    // The same mask over a teacher-forced pass gives the reported logprobs.
    let prompt = ids(&response["prompt_token_ids"]);
    let input: Vec<u32> = prompt.iter().chain(&completion).copied().collect();
    let logits = policy.model.forward(&input, &mut KvCache::new()).unwrap();
    let output = StructuredOutput::Regex(regex.into());
    let mut grammar = TokenGrammar::new(&output, server.engine.vocabulary()).unwrap();
    let mut want = Vec::new();
    for (i, &token) in completion.iter().enumerate() {
        let mut row: Vec<f32> = logits.get(prompt.len() + i - 1).unwrap().to_vec1().unwrap();
        grammar.mask(&mut row, &policy.stop_token_ids);
        want.push(processed_logprobs(&row, 1.0)[token as usize]);
        grammar.advance(token);
    }
    let got = chat_logprobs(&response);
    assert_close(&got, &want, 1e-4);
    assert!(got.contains(&0.0), "forced tokens: {got:?}");
    assert!(got.iter().any(|&l| l < -1e-3), "free choices: {got:?}");

    let choice_body = question(json!({
        "temperature": 1.0, "max_tokens": 8,
        "structured_outputs": {"choice": ["Paris", "Lyon", "Marseille"]},
    }));
    let (status, response) = post(&server.base, "/v1/chat/completions", &choice_body).await;
    assert_eq!(status, 200, "{response}");
    let answer = response["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert!(
        ["Paris", "Lyon", "Marseille"].contains(&answer),
        "{answer:?}"
    );

    for (constraint, named) in [
        (
            json!({"json": {"type": "object"}}),
            "structured_outputs.json",
        ),
        (json!({"regex": "(unclosed"}), "structured_outputs.regex"),
        (json!({"regex": "a", "choice": ["a"]}), "exactly one"),
        (json!({"regex": r"\w{1000}"}), "structured_outputs.regex"),
    ] {
        let body = question(json!({"max_tokens": 4, "structured_outputs": constraint}));
        let (status, error) = post(&server.base, "/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{constraint}: {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{constraint}: {message}");
    }
}
