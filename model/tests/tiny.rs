//! The llama forward on a tiny random model: a ragged batch with KV caches
//! computes what one full (teacher-forced) forward of each sequence computes.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use forgelog_model::testing::{
    max_abs_diff, tiny_config, tiny_qwen3_config, tiny_weights, write_tiny_llama, write_tiny_qwen2,
    write_tiny_qwen3, QWEN3_STYLE_TEMPLATE,
};
use forgelog_model::{load_hf_dir, KvCache, Logits, Transformer};

fn tiny_model() -> Transformer {
    tiny_model_of(tiny_config(300))
}

fn tiny_model_of(config: forgelog_model::ModelConfig) -> Transformer {
    let vb = VarBuilder::from_tensors(tiny_weights(&config, 1), DType::F32, &Device::Cpu);
    Transformer::load(vb, &config).unwrap()
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
    for model in [tiny_model(), tiny_model_of(tiny_qwen3_config(300))] {
        assert_cached_steps_match_full_forwards(&model);
    }
}

fn assert_cached_steps_match_full_forwards(model: &Transformer) {
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
    assert!(config.qkv_bias());
    let policy = load_hf_dir(dir.path(), &Device::Cpu).unwrap();
    assert!(policy.model.config().qkv_bias());
    let logits = policy
        .model
        .forward(&[5, 6, 7], &mut KvCache::new())
        .unwrap();
    assert_eq!(logits.dims(), &[3, config.vocab_size]);
    // The biases are used: the same weights without them give other logits.
    let mut no_bias = config.clone();
    no_bias.architecture = forgelog_model::Architecture::Llama;
    let weights = tiny_weights(&no_bias, 4);
    let plain = Transformer::load(
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
    let model = Transformer::load(
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

/// Qwen3's head size is read, not derived, and its per-head q/k norms are
/// applied: the same weights with other norm weights give other logits.
#[test]
fn qwen3_directory_loads_its_head_size_and_qk_norms() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_tiny_qwen3(dir.path(), 4).unwrap();
    assert_eq!(config.head_dim(), 16);
    assert_ne!(config.hidden_size / config.num_attention_heads, 16);
    let policy = load_hf_dir(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(policy.model.config(), &config);
    let tokens = [5, 6, 7, 8];
    let logits = policy.model.forward(&tokens, &mut KvCache::new()).unwrap();
    assert_eq!(logits.dims(), &[4, config.vocab_size]);
    let mut weights = policy.weights.clone();
    let k_norm = "model.layers.1.self_attn.k_norm.weight";
    weights.insert(k_norm.into(), (&weights[k_norm] * 2.0).unwrap());
    let other = Transformer::load(
        VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu),
        &config,
    )
    .unwrap();
    let other_logits = other.forward(&tokens, &mut KvCache::new()).unwrap();
    assert!(max_abs_diff(&logits, &other_logits) > 1e-3);
}

/// The Qwen3-style template drops an answer's reasoning once a later user
/// turn follows it, and keeps it in the turn being answered.
#[test]
fn the_qwen3_template_drops_reasoning_from_earlier_turns() {
    let template = forgelog_model::ChatTemplate::new(QWEN3_STYLE_TEMPLATE, "", "<|im_end|>");
    let thought =
        serde_json::json!({"role": "assistant", "content": "<think>\nhmm\n</think>\n\nParis."});
    let user = |text: &str| serde_json::json!({"role": "user", "content": text});
    let earlier = template
        .render(
            &[user("Capital?"), thought.clone(), user("And Italy?")],
            None,
            true,
        )
        .unwrap();
    assert!(!earlier.contains("hmm"), "{earlier}");
    assert!(
        earlier.contains("<|im_start|>assistant\nParis.<|im_end|>"),
        "{earlier}"
    );
    let last = template
        .render(&[user("Capital?"), thought], None, false)
        .unwrap();
    assert!(last.contains("<think>\nhmm\n</think>"), "{last}");
}

/// A config or checkpoint forgelog cannot run is an error naming the field or
/// the tensor, never a panic or a model that runs wrong.
#[test]
fn bad_model_folders_are_errors_naming_the_field_or_tensor() {
    let error_of = |edit: &dyn Fn(&std::path::Path)| {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_qwen3(dir.path(), 2).unwrap();
        edit(dir.path());
        match load_hf_dir(dir.path(), &Device::Cpu) {
            Ok(_) => panic!("loaded"),
            Err(e) => e.to_string(),
        }
    };
    let set_config = |dir: &std::path::Path, key: &str, value: serde_json::Value| {
        let path = dir.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        config[key] = value;
        std::fs::write(path, config.to_string()).unwrap();
    };
    let unknown = error_of(&|d| set_config(d, "model_type", "mistral".into()));
    assert!(
        unknown.contains("model_type \"mistral\"") && unknown.contains("qwen3"),
        "{unknown}"
    );
    let no_field = error_of(&|d| {
        let path = d.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        config.as_object_mut().unwrap().remove("hidden_size");
        std::fs::write(path, config.to_string()).unwrap();
    });
    assert!(no_field.contains("hidden_size"), "{no_field}");
    // Weights of another shape than the config says (a llama's head size).
    let shape = error_of(&|d| set_config(d, "head_dim", 8.into()));
    assert!(
        shape.contains("q_norm.weight") || shape.contains("q_proj.weight"),
        "{shape}"
    );
    // A tensor the architecture needs and the checkpoint lacks.
    let missing = error_of(&|d| {
        let path = d.join("model.safetensors");
        let mut weights = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
        weights.remove("model.layers.1.self_attn.k_norm.weight");
        candle_core::safetensors::save(&weights, &path).unwrap();
    });
    assert!(
        missing.contains("model.layers.1.self_attn.k_norm.weight"),
        "{missing}"
    );
}

/// Token in through a Qwen3 template: a follow-up to an answer that thought
/// aloud is rendered afresh and says why (the template re-renders that turn
/// without its reasoning); one to a plain answer is spliced onto it.
#[test]
fn token_in_forks_where_the_qwen3_template_drops_reasoning() {
    use forgelog_dialects::splice::{prompt, AnsweredCall, ChatRenderer, Made};
    let dir = tempfile::tempdir().unwrap();
    write_tiny_qwen3(dir.path(), 1).unwrap();
    let codec = forgelog_model::load_chat_codec(dir.path().to_str().unwrap(), dir.path()).unwrap();
    let user = |text: &str| serde_json::json!({"role": "user", "content": text});
    let follow_up = |answer: &str| {
        let first = [user("Capital of France?")];
        let text = codec.render(&first, None, true).unwrap();
        let answer_ids = [codec.encode(answer).unwrap(), vec![2]].concat(); // + <|im_end|>
        let answer = serde_json::json!({"role": "assistant", "content": answer});
        let history = [AnsweredCall {
            call: 0,
            messages: first.to_vec(),
            tools: None,
            answer: answer.clone(),
            prompt_ids: codec.encode(&text).unwrap(),
            sampled_ids: answer_ids,
            prompt_text: Some(text),
        }];
        let messages = [first[0].clone(), answer, user("And of Italy?")];
        prompt(&history, &messages, None, &codec).unwrap().made
    };
    match follow_up("<think>\nA capital.\n</think>\n\nParis.") {
        Made::Rendered { why } => assert!(why.contains("re-renders earlier turns"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(follow_up("Paris."), Made::Spliced { base_call: 0 });
}
