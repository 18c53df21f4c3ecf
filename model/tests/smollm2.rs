//! The real default model, SmolLM2-135M-Instruct from its GGUF: tokenizer,
//! template and a teacher-forced forward that knows where Paris is.
//! Needs `scripts/fetch-model.sh` to have run; fails (never skips) otherwise.

use candle_core::Device;
use forgelog_model::{load_policy, log_softmax, KvCache};

#[test]
fn smollm2_tokenizes_renders_and_predicts() {
    let policy = load_policy("smollm2", &forgelog_stream::models_dir(), &Device::Cpu)
        .unwrap_or_else(|e| panic!("{e}"));
    let config = policy.model.config();
    assert_eq!(
        (
            config.num_hidden_layers,
            config.hidden_size,
            config.vocab_size
        ),
        (30, 576, 49152)
    );
    assert!(config.tie_word_embeddings);

    let tok = &policy.tokenizer;
    assert_eq!(
        (
            tok.token_to_id("<|im_start|>"),
            tok.token_to_id("<|im_end|>")
        ),
        (Some(1), Some(2))
    );
    assert!(policy.stop_token_ids.contains(&2));
    let digits = tok.encode("x 2024", false).unwrap();
    assert_eq!(
        digits.get_tokens()[1..],
        ["Ġ", "2", "0", "2", "4"],
        "digits split one by one"
    );
    let text = "Hello world! The capital of France is Paris.";
    let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(tok.encode(" Paris", false).unwrap().get_ids().len(), 1);

    let prompt = policy
        .chat_template
        .render(
            &[serde_json::json!({"role": "user", "content": "What is the capital of France?"})],
            None,
            true,
        )
        .unwrap();
    assert!(prompt.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
    assert!(prompt.ends_with(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ));

    let mut input = tok
        .encode(prompt.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    input.extend(
        tok.encode("The capital of France is", false)
            .unwrap()
            .get_ids(),
    );
    let logits = policy.model.forward(&input, &mut KvCache::new()).unwrap();
    let last: Vec<f32> = logits.get(input.len() - 1).unwrap().to_vec1().unwrap();
    let logprobs = log_softmax(&last);
    let paris = tok.token_to_id("ĠParis").unwrap() as usize;
    assert!(
        logprobs[paris] > -0.5,
        "logprob of ' Paris' = {}",
        logprobs[paris]
    );
}

/// A cut or foreign file where the GGUF should be is an error naming the
/// file and what fetches it again: found by probing `up --demo` on a cut
/// model, which said only "failed to fill whole buffer" (or "tensor needs
/// 69120 bytes at offset …") and named no file.
#[test]
fn a_cut_gguf_is_an_error_naming_the_file() {
    let whole = std::fs::read(forgelog_model::default_gguf_path(
        &forgelog_stream::models_dir(),
    ))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    // No bytes, a header cut short, tensors cut short, not a GGUF at all.
    let cases: [&[u8]; 4] = [&[], &whole[..64], &whole[..5_000_000], b"PK\x03\x04 a zip"];
    for bytes in cases {
        std::fs::write(&path, bytes).unwrap();
        let Err(e) = forgelog_model::load_gguf(&path, &Device::Cpu) else {
            panic!("{} bytes loaded", bytes.len());
        };
        let said = e.to_string();
        assert!(
            said.starts_with(&format!("{} is not a whole GGUF file (", path.display()))
                && said.contains("scripts/fetch-model.sh"),
            "{} bytes: {said}",
            bytes.len()
        );
    }
}
