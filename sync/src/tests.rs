use super::*;

/// A LoRA version published as its adapter alone cannot be loaded as
/// whole weights: refused before the engine is asked anything (it would
/// be paused and left without a model), naming what to do.
#[tokio::test]
async fn an_adapter_alone_is_not_synced_as_weights() {
    let dir = tempfile::tempdir().unwrap();
    let version = dir.path().join("v000001");
    std::fs::create_dir_all(&version).unwrap();
    std::fs::write(version.join("adapter_model.safetensors"), b"x").unwrap();
    let sync = EngineSync::new(SyncArgs {
        stage_dir: Some(dir.path().join("staged")),
        // Nothing listens here: a request would fail otherwise.
        ..SyncArgs::new("http://127.0.0.1:9", EngineKind::Vllm, SyncMode::Weights)
    });
    let published = PolicyPublished {
        event_id: "e".into(),
        run_id: "r".into(),
        version: 1,
        step: 1,
        checkpoint_uri: format!("file://{}/adapter_model.safetensors", version.display()),
        metrics: Default::default(),
    };
    let err = sync.serve(&published).await.unwrap_err().to_string();
    assert!(
        err.contains("LoRA adapter alone") && err.contains("--sync-mode adapter"),
        "{err}"
    );
}
