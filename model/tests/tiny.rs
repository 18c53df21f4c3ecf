//! The llama forward on a tiny random model: a ragged batch with KV caches
//! computes what one full (teacher-forced) forward of each sequence computes.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use forgelog_model::testing::{tiny_config, tiny_weights, write_tiny_llama, write_tiny_qwen2};
use forgelog_model::{load_hf_dir, KvCache, Llama, Logits};

fn tiny_model() -> Llama {
    let config = tiny_config(300);
    let vb = VarBuilder::from_tensors(tiny_weights(&config, 1), DType::F32, &Device::Cpu);
    Llama::load(vb, &config).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Forks of one cache go on from its tokens each their own way (in place,
/// no gradient tracked), never writing into it or each other; `Rows` gives
/// those rows of what `All` gives, and nothing when asked for none.
#[test]
fn forks_of_a_cache_go_on_apart_and_rows_are_rows_of_all() {
    let model = tiny_model();
    let (prefix, tails): (&[u32], [&[u32]; 2]) = (&[5, 17, 42, 8], [&[99, 3, 7], &[250, 1]]);
    let mut shared = KvCache::new();
    let none = model
        .forward_batch(&mut [(prefix, &mut shared)], Logits::Rows(&[]))
        .unwrap();
    assert_eq!(none[0].dims(), &[0, 300]);
    let mut forks = [shared.fork().unwrap(), shared.fork().unwrap()];
    let rows = [vec![2, 0], vec![1]];
    let mut batch: Vec<(&[u32], &mut KvCache)> =
        tails.iter().copied().zip(forks.iter_mut()).collect();
    let got = model
        .forward_batch(&mut batch, Logits::Rows(&rows))
        .unwrap();
    for ((tail, rows), got) in tails.iter().zip(&rows).zip(&got) {
        let whole: Vec<u32> = prefix.iter().chain(tail.iter()).copied().collect();
        let full = model.forward(&whole, &mut KvCache::new()).unwrap();
        let at: Vec<u32> = rows.iter().map(|r| r + prefix.len() as u32).collect();
        let want = full
            .index_select(&Tensor::new(at.as_slice(), &Device::Cpu).unwrap(), 0)
            .unwrap();
        assert!(max_abs_diff(got, &want) < 1e-5);
    }
    // Forks of a cache with room to spare (3 tokens in 4 places) taking
    // turns: had they shared its buffer, the second would overwrite the
    // first's fourth position, and the first's next step would read it.
    let mut roomy = KvCache::new();
    model.forward(&[5, 17], &mut roomy).unwrap();
    model.forward(&[42], &mut roomy).unwrap();
    let (mut a, mut b) = (roomy.fork().unwrap(), roomy.fork().unwrap());
    model.forward(&[8], &mut a).unwrap();
    model.forward(&[99], &mut b).unwrap();
    let next = model.forward(&[11], &mut a).unwrap();
    let full = model
        .forward(&[5, 17, 42, 8, 11], &mut KvCache::new())
        .unwrap();
    assert!(max_abs_diff(&next, &full.narrow(0, 4, 1).unwrap()) < 1e-5);
    assert_eq!((roomy.len(), a.len(), b.len()), (3, 5, 4));
    let bad = model.forward_batch(
        &mut [(&[1, 2][..], &mut KvCache::new())],
        Logits::Rows(&[vec![2]]),
    );
    assert!(bad.is_err(), "a row past the new tokens is refused");
}

#[test]
fn cached_ragged_steps_match_full_forwards() {
    let model = tiny_model();
    let sequences: [&[u32]; 3] = [
        &[5, 17, 42, 8, 99, 3],
        &[7, 7, 250],
        &[1, 2, 3, 4, 5, 6, 7, 8, 9],
    ];
    let full: Vec<Tensor> = sequences
        .iter()
        .map(|s| model.forward(s, &mut KvCache::new()).unwrap())
        .collect();
    assert_eq!(full[0].dims(), &[6, 300]);

    // Prefill the first two tokens of each together, then step one token at a time.
    let mut caches = [KvCache::new(), KvCache::new(), KvCache::new()];
    let mut batch: Vec<(&[u32], &mut KvCache)> = sequences
        .iter()
        .zip(caches.iter_mut())
        .map(|(s, c)| (&s[..2], c))
        .collect();
    let prefill = model.forward_batch(&mut batch, Logits::All).unwrap();
    for (i, logits) in prefill.iter().enumerate() {
        assert!(max_abs_diff(logits, &full[i].narrow(0, 0, 2).unwrap()) < 1e-5);
    }
    for position in 2..9 {
        let mut batch: Vec<(&[u32], &mut KvCache)> = sequences
            .iter()
            .zip(caches.iter_mut())
            .filter(|(s, _)| position < s.len())
            .map(|(s, c)| (&s[position..position + 1], c))
            .collect();
        let (live, steps) = (
            batch.len(),
            model.forward_batch(&mut batch, Logits::Last).unwrap(),
        );
        assert_eq!(steps.len(), live);
        let expected: Vec<Tensor> = sequences
            .iter()
            .zip(&full)
            .filter(|(s, _)| position < s.len())
            .map(|(_, f)| f.narrow(0, position, 1).unwrap())
            .collect();
        for (got, want) in steps.iter().zip(&expected) {
            let diff = max_abs_diff(got, want);
            assert!(diff < 1e-5, "position {position}: {diff}");
        }
    }
    assert_eq!(
        caches.iter().map(KvCache::len).collect::<Vec<_>>(),
        [6, 3, 9]
    );
}

#[test]
fn context_overflow_is_an_error_not_a_panic() {
    let model = tiny_model();
    let too_long: Vec<u32> = vec![3; 97];
    let err = model.forward(&too_long, &mut KvCache::new()).unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
}

#[test]
fn hf_directory_loads_with_tokenizer_and_template() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_tiny_llama(dir.path(), 3).unwrap();
    let policy = load_hf_dir(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(policy.model.config(), &config);
    assert_eq!(policy.tokenizer.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(policy.stop_token_ids, vec![0, 2]);
    let prompt = policy
        .chat_template
        .render(
            &[serde_json::json!({"role": "user", "content": "Hello"})],
            None,
            true,
        )
        .unwrap();
    let ids = policy
        .tokenizer
        .encode(prompt.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ids[0], 1);
    assert_eq!(policy.tokenizer.decode(&ids, false).unwrap(), prompt);
}

#[test]
fn qwen2_directory_loads_its_biases() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_tiny_qwen2(dir.path(), 4).unwrap();
    assert!(config.attention_bias);
    let policy = load_hf_dir(dir.path(), &Device::Cpu).unwrap();
    assert!(policy.model.config().attention_bias);
    let logits = policy
        .model
        .forward(&[5, 6, 7], &mut KvCache::new())
        .unwrap();
    assert_eq!(logits.dims(), &[3, config.vocab_size]);
    // The biases are used: the same weights without them give other logits.
    let mut no_bias = config.clone();
    no_bias.attention_bias = false;
    let weights = tiny_weights(&no_bias, 4);
    let plain = Llama::load(
        VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu),
        &no_bias,
    )
    .unwrap();
    let plain_logits = plain.forward(&[5, 6, 7], &mut KvCache::new()).unwrap();
    assert!(max_abs_diff(&logits, &plain_logits) > 1e-3);
}

/// The trainer's use: weights as `Var`s in a `VarMap`, a teacher-forced forward
/// over a ragged batch, and gradients reaching every layer.
#[test]
fn gradients_flow_through_a_batched_forward() {
    let config = tiny_config(300);
    let varmap = candle_nn::VarMap::new();
    for (name, tensor) in tiny_weights(&config, 2) {
        let var = candle_core::Var::from_tensor(&tensor).unwrap();
        varmap.data().lock().unwrap().insert(name, var);
    }
    let model = Llama::load(
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        &config,
    )
    .unwrap();
    let sequences: [&[u32]; 2] = [&[4, 8, 15, 16], &[23, 42]];
    let (mut a, mut b) = (KvCache::new(), KvCache::new());
    let mut batch: Vec<(&[u32], &mut KvCache)> =
        vec![(sequences[0], &mut a), (sequences[1], &mut b)];
    let logits = model.forward_batch(&mut batch, Logits::All).unwrap();
    // Mean log-likelihood of each next token.
    let mut terms = Vec::new();
    for (logits, tokens) in logits.iter().zip(sequences) {
        let logprobs = candle_nn::ops::log_softmax(logits, 1).unwrap();
        let targets = Tensor::new(&tokens[1..], &Device::Cpu)
            .unwrap()
            .unsqueeze(1)
            .unwrap();
        let picked = logprobs
            .narrow(0, 0, tokens.len() - 1)
            .unwrap()
            .gather(&targets, 1)
            .unwrap();
        terms.push(picked.sum_all().unwrap());
    }
    let loss = Tensor::stack(&terms, 0)
        .unwrap()
        .sum_all()
        .unwrap()
        .neg()
        .unwrap();
    let grads = loss.backward().unwrap();
    let data = varmap.data().lock().unwrap();
    for name in [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "lm_head.weight",
    ] {
        let grad = grads
            .get(data[name].as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let norm = grad
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(norm > 0.0, "{name}");
    }
}
