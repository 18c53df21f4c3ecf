//! Prompts longer than a prefill chunk (512 tokens) are fed over several steps,
//! beside other sequences, and still give the teacher-forced logprobs.

mod common;

use common::{ids, post, serve, tiny_long_context_llama};
use forgelog_model::{log_softmax, KvCache};
use serde_json::json;

#[tokio::test]
async fn long_prompts_prefill_in_chunks_with_teacher_forced_logprobs() {
    let dir = tempfile::tempdir().unwrap();
    let policy = tiny_long_context_llama(dir.path(), 11);
    let model = policy.model.clone();
    let server = serve(policy);
    let prompt: Vec<u32> = (0..700u32).map(|i| 3 + (i * 37) % 290).collect();
    let body = |prompt: &[u32], max_tokens: usize| {
        json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1,
               "return_token_ids": true, "ignore_eos": true})
    };
    // A short request decoding while the long one prefills.
    let (long_body, short_body) = (body(&prompt, 4), body(&prompt[..5], 40));
    let (long, short) = tokio::join!(
        post(&server.base, "/v1/completions", &long_body),
        post(&server.base, "/v1/completions", &short_body),
    );
    assert_eq!((long.0, short.0), (200, 200));
    for (prompt, response) in [(&prompt[..], &long.1), (&prompt[..5], &short.1)] {
        let completion = ids(&response["choices"][0]["token_ids"]);
        let input: Vec<u32> = prompt.iter().chain(&completion).copied().collect();
        let logits = model.forward(&input, &mut KvCache::new()).unwrap();
        let got = response["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap();
        for (i, &token) in completion.iter().enumerate() {
            let row: Vec<f32> = logits.get(prompt.len() + i - 1).unwrap().to_vec1().unwrap();
            let want = log_softmax(&row)[token as usize];
            let got = got[i].as_f64().unwrap() as f32;
            assert!((got - want).abs() < 1e-4, "token {i}: {got} vs {want}");
        }
    }
}
