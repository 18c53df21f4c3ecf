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

/// A LoRA adapter forgelog wrote (PEFT's two files, PEFT's tensor names) on a
/// tiny llama and a tiny qwen3 folder: `PeftModel.from_pretrained` gives
/// forgelog's logits at every position, unmerged and merged by PEFT.
#[test]
fn a_lora_adapter_forgelog_wrote_is_the_same_adapter_to_peft() {
    use forgelog_model::lora::{self, LoraConfig};
    type Writer = fn(&std::path::Path, u64) -> std::io::Result<forgelog_model::ModelConfig>;
    let writers: [Writer; 2] = [
        forgelog_model::testing::write_tiny_llama,
        forgelog_model::testing::write_tiny_qwen3,
    ];
    for write in writers {
        let source = tempfile::tempdir().unwrap();
        let config = write(source.path(), 7).unwrap();
        let policy = forgelog_model::load_hf_dir(source.path(), &candle_core::Device::Cpu).unwrap();
        let base_dir = tempfile::tempdir().unwrap();
        support::write_hf_model_folder(&policy, base_dir.path());
        let targets = [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "up_proj",
            "down_proj",
        ];
        let lora = LoraConfig::new(4, 8.0, targets.map(String::from).to_vec()).unwrap();
        let adapter = forgelog_model::testing::tiny_adapter(&config, &lora, 3);
        let adapter_dir = tempfile::tempdir().unwrap();
        for (name, bytes) in lora::adapter_files(&adapter, &lora, "tiny").unwrap() {
            std::fs::write(adapter_dir.path().join(name), bytes).unwrap();
        }
        let ids: Vec<u32> = (3..40).collect();
        let model = lora::unmerged_model(
            &policy.weights,
            &adapter,
            &config,
            &lora,
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let logits: Vec<Vec<f32>> = model
            .forward(&ids, &mut forgelog_model::KvCache::new())
            .unwrap()
            .to_vec2()
            .unwrap();
        let expected = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            expected.path(),
            serde_json::json!({"ids": ids, "logits": logits}).to_string(),
        )
        .unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/python/peft_adapter_check.py");
        let args = [
            base_dir.path().to_str().unwrap(),
            adapter_dir.path().to_str().unwrap(),
            expected.path().to_str().unwrap(),
        ];
        let checked = tokio::runtime::Runtime::new().unwrap().block_on(
            forgelog_stream::testing::python_json_with(
                &forgelog_stream::testing::torch_venv_python(),
                &script,
                &args,
            ),
        );
        eprintln!("{:?} adapter under PEFT: {checked}", config.architecture);
        // 6 projections in each of 2 layers.
        assert_eq!(checked["adapted_modules"], 12);
        // The adapter is not a no-op: the base model alone is far off.
        assert!(checked["base_diff"].as_f64().unwrap() > 1e-3, "{checked}");
    }
}

/// The official Qwen3 chat template (TRL ships Qwen3's own, byte for byte,
/// in `trl/chat_templates/qwen3.jinja`; no registry ships Qwen3's weights)
/// renders in forgelog exactly as `transformers` renders it: tools in the
/// system turn, tool calls and tool responses, and the reasoning of answers
/// before the last question dropped from the history (what token in forks
/// on), the last turn's kept.
#[test]
fn the_official_qwen3_template_renders_as_transformers_does() {
    let source = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_qwen3(source.path(), 7).unwrap();
    let tools = serde_json::json!([{"type": "function", "function": {
        "name": "bash", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]);
    let call = serde_json::json!({"id": "c1", "type": "function",
        "function": {"name": "bash", "arguments": {"cmd": "ls -la"}}});
    let session = vec![
        serde_json::json!({"role": "system", "content": "You are an agent."}),
        serde_json::json!({"role": "user", "content": "List the files."}),
        serde_json::json!({"role": "assistant", "content": "<think>\nI should look.\n</think>\n\nLooking.", "tool_calls": [call]}),
        serde_json::json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"}),
        serde_json::json!({"role": "assistant", "content": "", "reasoning_content": "Two files.", "tool_calls": [call]}),
        serde_json::json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"}),
        serde_json::json!({"role": "assistant", "content": "<think>\nDone.\n</think>\n\nTwo files: a.txt and b.txt."}),
        serde_json::json!({"role": "user", "content": "And now?"}),
    ];
    let cases = serde_json::json!([
        {"messages": session, "tools": tools, "add_generation_prompt": true},
        {"messages": session[..7], "tools": tools, "add_generation_prompt": false},
        {"messages": session[1..], "tools": null, "add_generation_prompt": true},
    ]);
    let cases_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cases_file.path(), cases.to_string()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python/qwen3_template_check.py");
    let args = [
        source.path().to_str().unwrap(),
        cases_file.path().to_str().unwrap(),
    ];
    let theirs = tokio::runtime::Runtime::new().unwrap().block_on(
        forgelog_stream::testing::python_json_with(
            &forgelog_stream::testing::torch_venv_python(),
            &script,
            &args,
        ),
    );
    let official = theirs["template"].as_str().unwrap();
    assert!(official.contains("reasoning_content") && official.contains("<tool_response>"));
    let ours = forgelog_model::ChatTemplate::new(official, "", "<|im_end|>");
    for (case, expected) in cases
        .as_array()
        .unwrap()
        .iter()
        .zip(theirs["rendered"].as_array().unwrap())
    {
        let messages = case["messages"].as_array().unwrap();
        let tools = Some(&case["tools"]).filter(|t| !t.is_null());
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let rendered = ours.render(messages, tools, add).unwrap();
        assert_eq!(rendered, expected.as_str().unwrap(), "{case}");
    }
    // Before the last question, answers lose their reasoning; after it,
    // the tool-calling turns keep theirs.
    let first = theirs["rendered"][0].as_str().unwrap();
    assert!(
        !first.contains("I should look.")
            && !first.contains("Two files.")
            && !first.contains("Done.")
    );
    let second = theirs["rendered"][1].as_str().unwrap();
    assert!(
        second.contains("<think>\nI should look.\n</think>")
            && second.contains("<think>\nTwo files.\n</think>")
    );
}
