//! A policy as a Hugging Face model folder (`forgelog_model::hf`, what every
//! checkpoint carries and `forgelog export model` writes), read by
//! `transformers` (in torch) outside forgelog: the default model
//! (SmolLM2 from its GGUF: the tokenizer rebuilt from GGUF metadata, the q/k
//! rows un-interleaved), a qwen2 (q/k/v biases) and a qwen3, compared at
//! every position.

mod support;

#[test]
fn the_default_model_as_a_folder_is_the_same_model_to_transformers() {
    let policy = forgelog_model::load_policy(
        "smollm2",
        &forgelog_stream::models_dir(),
        &candle_core::Device::Cpu,
    )
    .expect("the default model (scripts/fetch-model.sh)");
    let dir = tempfile::tempdir().unwrap();
    support::write_hf_model_folder(&policy, dir.path());
    let checked = support::check_hf_model_folder(dir.path(), &policy);
    eprintln!("SmolLM2 folder: {checked}");
    assert_eq!(checked["model_type"], "llama");
    assert_eq!(checked["tokenizer"], "TokenizersBackend");
}

#[test]
fn a_qwen2_folder_is_the_same_model_to_transformers() {
    let source = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_qwen2(source.path(), 5).unwrap();
    let policy = forgelog_model::load_hf_dir(source.path(), &candle_core::Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    support::write_hf_model_folder(&policy, dir.path());
    let checked = support::check_hf_model_folder(dir.path(), &policy);
    eprintln!("qwen2 folder: {checked}");
    assert_eq!(checked["model_type"], "qwen2");
    assert_eq!(checked["architectures"][0], "Qwen2ForCausalLM");
}

/// Qwen3 (per-head q/k norms before RoPE, its own head size, tied
/// embeddings) against `transformers`' own Qwen3ForCausalLM, logits at every
/// position of a chat whose Qwen3-style template drops an earlier answer's
/// reasoning.
#[test]
fn a_qwen3_folder_is_the_same_model_to_transformers() {
    let source = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_qwen3(source.path(), 6).unwrap();
    let policy = forgelog_model::load_hf_dir(source.path(), &candle_core::Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    support::write_hf_model_folder(&policy, dir.path());
    let checked = support::check_hf_model_folder(dir.path(), &policy);
    eprintln!("qwen3 folder: {checked}");
    assert_eq!(checked["model_type"], "qwen3");
    assert_eq!(checked["model_class"], "Qwen3ForCausalLM");
    assert!(checked["positions"].as_u64().unwrap() > 20);
}
