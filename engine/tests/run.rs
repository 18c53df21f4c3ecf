//! `run`, as `forgelog engine` calls it: loads the model, serves, and fails
//! with a clear error when the model is missing.

use forgelog_engine::{run, DeviceKind, EngineArgs};
use std::time::{Duration, Instant};

fn args(model: String) -> EngineArgs {
    EngineArgs {
        model,
        listen: forgelog_stream::testing::free_local_addr(),
        device: DeviceKind::Cpu,
        brokers: None,
        run: None,
        admin_token: Some("admin".into()),
        checkpoint_root: None,
        max_checkpoint_mib: 1024,
        prefix_cache_mib: 64,
    }
}

#[tokio::test]
async fn run_serves_a_model_directory() {
    let dir = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_llama(dir.path(), 9).unwrap();
    let args = args(dir.path().display().to_string());
    let base = format!("http://{}", args.listen);
    tokio::spawn(run(args));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = reqwest::get(format!("{base}/healthz")).await {
            assert_eq!(response.status(), 200);
            break;
        }
        assert!(Instant::now() < deadline, "the engine did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = serde_json::json!({"messages": [{"role": "user", "content": "Hello"}],
                                  "max_tokens": 3, "return_token_ids": true});
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let prompt = response.json::<serde_json::Value>().await.unwrap()["prompt_token_ids"]
        .as_array()
        .unwrap()
        .len();
    // vLLM's /tokenize counts the same prompt without generating.
    let counted: serde_json::Value = reqwest::Client::new()
        .post(format!("{base}/tokenize"))
        .json(&serde_json::json!({"messages": body["messages"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(counted["count"].as_u64(), Some(prompt as u64), "{counted}");
    // Reload over HTTP wants the token, and is off without a checkpoint root.
    let reload = |token: &'static str| {
        reqwest::Client::new()
            .post(format!("{base}/admin/reload"))
            .bearer_auth(token)
            .json(&serde_json::json!({"checkpoint_uri": "file:///etc/shadow", "version": 1}))
            .send()
    };
    assert_eq!(reload("wrong").await.unwrap().status(), 401);
    assert_eq!(reload("admin").await.unwrap().status(), 403);
}

#[tokio::test]
async fn a_missing_model_is_a_clear_error() {
    let err = run(args("/nonexistent/model".into())).await.unwrap_err();
    assert!(err.to_string().contains("neither `smollm2`"), "{err}");
    fn send_sync<E: std::error::Error + Send + Sync + 'static>(_: &E) {}
    send_sync(&err);
}
