use super::*;

fn paths(plan: &Plan) -> Vec<&str> {
    plan.steps.iter().map(|s| s.path.as_str()).collect()
}

#[test]
fn vllm_reloads_full_weights_paused_and_reads_the_version_back() {
    let p = plan(EngineKind::Vllm, SyncMode::Weights, 7, "/ckpt/v000007");
    assert_eq!(
        paths(&p),
        [
            "/pause?mode=wait",
            "/collective_rpc",
            "/reset_prefix_cache",
            "/update_weight_version"
        ]
    );
    assert!(p.steps[0].pauses && !p.steps[1..].iter().any(|s| s.pauses));
    assert_eq!(
        p.steps[1].body,
        Some(json!({"method": "reload_weights",
                    "kwargs": {"weights_path": "/ckpt/v000007", "is_checkpoint_format": true}}))
    );
    assert_eq!(p.steps[3].body, Some(json!({"new_version": "7"})));
    assert_eq!(
        (p.read_back.method, p.read_back.path.as_str()),
        (Method::Get, "/weight_info")
    );
    assert_eq!(p.resume.unwrap().path, "/resume");
}

#[test]
fn vllm_loads_an_adapter_per_version_under_its_own_name() {
    let p = plan(EngineKind::Vllm, SyncMode::Adapter, 3, "/ckpt/v000003");
    assert_eq!(paths(&p), ["/v1/load_lora_adapter", "/reset_prefix_cache"]);
    assert_eq!(
        p.steps[0].body,
        Some(json!({"lora_name": "policy@3", "lora_path": "/ckpt/v000003"}))
    );
    assert!(p.resume.is_none());
    assert_eq!(
        unload_adapter(EngineKind::Vllm, 1).path,
        "/v1/unload_lora_adapter"
    );
    assert_eq!(
        unload_adapter(EngineKind::Vllm, 1).body,
        Some(json!({"lora_name": "policy@1"}))
    );
}

#[test]
fn sglang_updates_from_disk_with_its_version_and_flushes() {
    // The documented request: POST /update_weights_from_disk
    // {model_path, weight_version, flush_cache} -> {success, message}.
    let p = plan(EngineKind::Sglang, SyncMode::Weights, 12, "/ckpt/v000012");
    assert_eq!(paths(&p), ["/update_weights_from_disk"]);
    assert_eq!(
        p.steps[0].body,
        Some(json!({"model_path": "/ckpt/v000012", "weight_version": "12", "flush_cache": true}))
    );
    assert_eq!(p.read_back.path, "/get_model_info");
    let a = plan(EngineKind::Sglang, SyncMode::Adapter, 12, "/ckpt/v000012");
    assert_eq!(paths(&a), ["/load_lora_adapter", "/flush_cache"]);
    assert_eq!(
        unload_adapter(EngineKind::Sglang, 9).path,
        "/unload_lora_adapter"
    );
    // SGLang refuses with 200 and success false.
    assert!(!accepted(
        200,
        &json!({"success": false, "message": "no such file"})
    ));
    assert!(accepted(200, &json!({"success": true, "message": "ok"})));
    assert!(accepted(200, &Value::Null), "vLLM answers plain text");
    assert!(!accepted(400, &Value::Null));
    assert_eq!(
        served_version(
            EngineKind::Sglang,
            SyncMode::Weights,
            &json!({"model_path": "/m", "weight_version": "12"})
        ),
        Some(12)
    );
}

#[test]
fn the_served_version_is_what_the_engine_answers() {
    let w = |b: Value| served_version(EngineKind::Vllm, SyncMode::Weights, &b);
    assert_eq!(w(json!({"weight_version": "4"})), Some(4));
    assert_eq!(w(json!({"weight_version": 4})), Some(4));
    // Not yet synced, or set to something that is not ours.
    assert_eq!(w(json!({"weight_version": null})), None);
    assert_eq!(w(json!({"weight_version": "base"})), None);
    let models = json!({"data": [{"id": "smollm2"}, {"id": "policy@2"}, {"id": "policy@10"}, {"id": "policy@x"}]});
    assert_eq!(
        served_version(EngineKind::Vllm, SyncMode::Adapter, &models),
        Some(10)
    );
    // No adapter yet: the base model, version 0.
    let base = json!({"data": [{"id": "smollm2"}]});
    assert_eq!(
        served_version(EngineKind::Vllm, SyncMode::Adapter, &base),
        Some(0)
    );
    assert_eq!(ModelList::of(&base).unwrap().newest_adapter(), None);
    assert_eq!(ModelList::of(&models).unwrap().newest_adapter(), Some(10));
    // Not a model list: no version, not the base model's.
    assert_eq!(
        served_version(EngineKind::Vllm, SyncMode::Adapter, &json!({"data": 3})),
        None
    );
}

#[test]
fn adapters_past_the_staleness_window_leave_as_the_engine_lists_them() {
    let models = json!({"data": [{"id": "smollm2"}, {"id": "policy@5"}, {"id": "policy@1"},
                                 {"id": "policy@7"}, {"id": "policy@8"}]});
    let models = ModelList::of(&models).unwrap();
    // Serving 8 with a window of 1: 7 and 8 may still be asked for.
    assert_eq!(models.stale_adapters(8, 1), [1, 5]);
    assert_eq!(models.stale_adapters(8, 0), [1, 5, 7]);
    assert!(models.stale_adapters(8, 100).is_empty());
}

#[test]
fn a_vllm_that_names_no_version_is_declared_version_0() {
    let step = declare_base(EngineKind::Vllm, SyncMode::Weights).unwrap();
    assert_eq!(step.path, "/update_weight_version");
    assert_eq!(step.body, Some(json!({"new_version": "0"})));
    assert!(declare_base(EngineKind::Sglang, SyncMode::Weights).is_none());
    assert!(declare_base(EngineKind::Vllm, SyncMode::Adapter).is_none());
}

#[test]
fn a_tied_output_head_reloaded_by_vllm_is_named() {
    let tied = json!({"model_type": "llama", "tie_word_embeddings": true});
    let untied = json!({"model_type": "llama", "tie_word_embeddings": false});
    let caveat = reload_caveat(EngineKind::Vllm, SyncMode::Weights, &tied).unwrap();
    assert!(caveat.contains("untied") && caveat.contains("--sync-mode adapter"));
    assert!(reload_caveat(EngineKind::Vllm, SyncMode::Weights, &untied).is_none());
    assert!(reload_caveat(EngineKind::Vllm, SyncMode::Adapter, &tied).is_none());
    assert!(reload_caveat(EngineKind::Sglang, SyncMode::Weights, &tied).is_none());
}

#[test]
fn a_paused_vllm_says_so() {
    assert_eq!(paused_query(EngineKind::Vllm).unwrap().path, "/is_paused");
    assert!(paused_query(EngineKind::Sglang).is_none());
    assert!(is_paused(&json!({"is_paused": true})));
    assert!(!is_paused(&json!({"is_paused": false})));
    assert!(!is_paused(&Value::Null));
}

#[test]
fn a_model_list_says_the_served_model_its_context_and_its_policy_version() {
    let vllm = json!({"object": "list", "data": [
        {"id": "qwen3", "object": "model", "max_model_len": 4096, "root": "/m"}]});
    let vllm = ModelList::of(&vllm).unwrap();
    let served = vllm.served().unwrap();
    assert_eq!(
        (served.id.as_str(), served.max_model_len),
        ("qwen3", Some(4096))
    );
    assert_eq!(vllm.policy_version(), None);
    // forgelog's engine names the version at the top, or on the model.
    let top = json!({"data": [{"id": "m"}], "policy_version": 3});
    assert_eq!(ModelList::of(&top).unwrap().policy_version(), Some(3));
    let card = json!({"data": [{"id": "m", "policy_version": 4}]});
    assert_eq!(ModelList::of(&card).unwrap().policy_version(), Some(4));
    // Not a list, or a model without its name: not a model list.
    assert_eq!(ModelList::of(&json!("models")), None);
    assert_eq!(ModelList::of(&json!({"data": [{"object": "model"}]})), None);
    assert_eq!(ModelList::of(&json!({})), Some(ModelList::default()));
}
