//! Against the real engine (`forgelog engine` on SmolLM2, 8192-token context):
//! a prompt over the context comes back through the proxy as a clean
//! context-length error in each harness dialect, and a harness's 128000
//! `max_tokens` (Claude Code's) is served, clamped by the session's `max_tokens`.

use forgelog_api::{NewSession, SessionClient};
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::RunningProxy;
use forgelog_stream::testing::{free_local_addr, shared_broker, unique_run_id};
use serde_json::{json, Value};
use std::process::{Child, Command};
use std::time::Duration;

struct Engine(Child);

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn post(http: &reqwest::Client, url: String, key: &str, body: Value) -> (u16, String) {
    let r = http
        .post(url)
        .header("x-api-key", key)
        .json(&body)
        .send()
        .await
        .expect("proxy answers");
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_prompts_to_the_real_engine_are_context_length_errors_in_each_dialect() {
    let stream = shared_broker().await;
    let engine_addr = free_local_addr();
    let _engine = Engine(
        Command::new(env!("CARGO_BIN_EXE_forgelog"))
            .args(["engine", "--model", "smollm2", "--listen"])
            .arg(engine_addr.to_string())
            .spawn()
            .unwrap(),
    );
    let http = reqwest::Client::new();
    let upstream = format!("http://{engine_addr}");
    let mut up = false;
    for _ in 0..1200 {
        if let Ok(r) = http.get(format!("{upstream}/healthz")).send().await {
            up = r.status().is_success();
            if up {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        up,
        "forgelog engine did not come up (is the model fetched? scripts/fetch-model.sh)"
    );
    let run = unique_run_id("context");
    let spool = tempfile::tempdir().unwrap();
    let proxy = RunningProxy::start(
        ProxyConfig {
            run_id: Some(run),
            max_calls_in_flight: 4,
            upstream_timeout: Duration::from_secs(300),
            max_upstream_requests: 4,
            ..ProxyConfig::new(upstream)
        },
        &stream,
        spool.path().to_path_buf(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(proxy.state.probe().context, Some(8192));
    assert_eq!(
        proxy.state.probe().untrainable,
        None,
        "the engine is trainable"
    );
    let url = proxy.url();
    let session = SessionClient::new(&url, None)
        .create(&NewSession::new("r", "t", "h", "g").max_tokens(4))
        .await
        .unwrap();
    let key = session.api_key.as_str();
    // Well over 8192 tokens whatever the tokenizer does with it.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(1500);

    let (status, body) = post(
        &http,
        format!("{url}/v1/messages?beta=true"),
        key,
        json!({"model": "claude-x", "max_tokens": 128000, "messages": [{"role": "user", "content": long}]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message
            .starts_with("prompt is too long: This model's maximum context length is 8192 tokens"),
        "{message}"
    );

    let (status, body) = post(
        &http,
        format!("{url}/v1/chat/completions"),
        key,
        json!({"messages": [{"role": "user", "content": long}], "stream": true}),
    )
    .await;
    assert_eq!(status, 200, "a stream had started: the error is in it");
    assert!(
        body.contains("\"code\":\"context_length_exceeded\""),
        "{body}"
    );

    let (status, body) = post(
        &http,
        format!("{url}/v1/responses"),
        key,
        json!({"input": long}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");

    // A short prompt with Claude Code's 128000: served, 4 tokens at most.
    let (status, body) = post(
        &http,
        format!("{url}/v1/messages"),
        key,
        json!({"model": "claude-x", "max_tokens": 128000, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() <= 4, "{v}");
    proxy.shutdown(Duration::from_secs(30)).await.unwrap();
}
