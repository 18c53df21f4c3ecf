//! `cargo bench -p forgelog-producers --bench answer-read`: what reading one
//! upstream answer costs the proxy, by prompt length and by the size of its
//! token ids. vLLM returns the prompt's ids with every answer
//! (`prompt_token_ids`), so a long context is read again on every call: ids
//! below 256 (the fake upstream's tokens are bytes) and below 152,000 (a Qwen
//! vocabulary, 5–6 digits an id), for 4,000- and 100,000-token prompts.

use forgelog_producers::upstream::UpstreamAnswer;
use serde_json::json;
use std::hint::black_box;
use std::time::Instant;

/// A vLLM chat completion with `prompt` ids drawn below `vocab` and a
/// 64-token completion with its logprobs.
fn answer(prompt: usize, vocab: u64) -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut id = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % vocab
    };
    let prompt_ids: Vec<u64> = (0..prompt).map(|_| id()).collect();
    let completion_ids: Vec<u64> = (0..64).map(|_| id()).collect();
    let content: Vec<_> = completion_ids
        .iter()
        .map(|id| json!({"token": format!("token_id:{id}"), "logprob": -0.25, "bytes": [32], "top_logprobs": []}))
        .collect();
    serde_json::to_vec(&json!({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1_700_000_000, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x".repeat(64)},
                     "logprobs": {"content": content}, "finish_reason": "stop",
                     "token_ids": completion_ids}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 64, "total_tokens": prompt + 64},
        "prompt_token_ids": prompt_ids,
    }))
    .expect("a Value serializes")
}

fn main() {
    println!("prompt ids  below   answer bytes  µs a read  ns a prompt id");
    for vocab in [256, 152_000] {
        for prompt in [4_000, 100_000] {
            let text = answer(prompt, vocab);
            let read = || UpstreamAnswer::from_json(black_box(&text)).expect("the answer reads");
            let ids = read().prompt_token_ids.map_or(0, |ids| ids.len());
            assert_eq!(ids, prompt, "every prompt id read");
            let reads = (4_000_000 / prompt).max(20) as u32;
            let mut best = f64::MAX;
            // The best of five runs: the least disturbed by the machine.
            for _ in 0..5 {
                let start = Instant::now();
                for _ in 0..reads {
                    black_box(read());
                }
                best = best.min(start.elapsed().as_secs_f64() / f64::from(reads));
            }
            println!(
                "{prompt:>10}  {vocab:>7}  {:>12}  {:>9.1}  {:>14.2}",
                text.len(),
                best * 1e6,
                best * 1e9 / prompt as f64
            );
        }
    }
}
