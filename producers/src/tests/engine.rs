//! The proxy and the engine behind it: probes, sampling it cannot honour,
//! token counts and the version a call is stamped with.

use super::*;

/// A proxy whose start-up probe failed (its engine was down) used to fail
/// every call until restarted: no model name, no context to clamp
/// `max_tokens` to. It probes again while the probe fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_up_probe_is_retried_when_calls_come() {
    let options = fake_upstream::FakeOptions {
        context: Some(4000),
        ..Default::default()
    };
    let failed = upstream::Probe {
        untrainable: Some("probe failed: connection refused".into()),
        ..Default::default()
    };
    let (proxy, _, _) = fast_proxy(options, Some(failed), |c| ProxyConfig {
        run_id: Some("reprobe".into()),
        ..c
    })
    .await;
    let s = session(&proxy, NewSession::new("r1", "t", "sdk", "g")).await;
    // Claude Code asks for more tokens than the model's whole context.
    let r = chat(
        &proxy,
        &s.api_key,
        serde_json::json!({"model": "claude-x", "max_tokens": 128000,
                                  "messages": [{"role": "user", "content": "hi"}]}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let probe = proxy.state.probe();
    assert_eq!(
        (probe.context, probe.untrainable.as_deref()),
        (Some(4000), None)
    );
    assert!(!probe.model.is_empty());
    proxy.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// Negative `max_tokens` or temperature used to be forwarded and recorded as
/// trainable; they are the harness's error, in its dialect, recorded as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_no_engine_can_honour_is_a_client_error() {
    let keep = fake_upstream::FakeOptions {
        keep_answers: true,
        ..Default::default()
    };
    let (proxy, log, fake) = fast_proxy(keep, Some(probed()), |c| ProxyConfig {
        run_id: Some("sampling".into()),
        ..c
    })
    .await;
    let s = session(&proxy, NewSession::new("r1", "t", "sdk", "g")).await;
    let http = reqwest::Client::new();
    let chat = chat(
        &proxy,
        &s.api_key,
        serde_json::json!({"model": "m", "max_tokens": -5,
                                  "messages": [{"role": "user", "content": "hi"}]}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(chat.status().as_u16(), 400);
    let body: serde_json::Value = chat.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let anthropic = http
        .post(format!("{}/v1/messages", proxy.url()))
        .header("x-api-key", &s.api_key)
        .json(
            &serde_json::json!({"model": "m", "max_tokens": 10, "temperature": -1,
                                  "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(anthropic.status().as_u16(), 400);
    let body: serde_json::Value = anthropic.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert!(
        fake.answers.lock().unwrap().is_empty(),
        "nothing went upstream"
    );
    proxy.shutdown(Duration::from_secs(5)).await.unwrap();
    let statuses: Vec<(CallStatus, bool)> = finished(&log, |c| (c.status, c.trainable));
    assert_eq!(
        statuses,
        [
            (CallStatus::ClientError, false),
            (CallStatus::ClientError, false)
        ]
    );
}

/// Anthropic's token counter used to ask the upstream for a completion with
/// no regard for the session's budget: now it tokenizes (no generation, no
/// budget taken), and where the upstream cannot, the completion it asks for
/// takes a model call and is refused once they are spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counts_tokenize_or_take_a_model_call_from_the_budget() {
    for without_tokenize in [false, true] {
        let options = fake_upstream::FakeOptions {
            without_tokenize,
            ..Default::default()
        };
        let (proxy, _, _) = fast_proxy(options, Some(probed()), |c| ProxyConfig {
            run_id: Some(format!("count-{without_tokenize}")),
            ..c
        })
        .await;
        let s = session(
            &proxy,
            NewSession::new("r1", "t", "sdk", "g").max_model_calls(1),
        )
        .await;
        let count = || {
            reqwest::Client::new()
                .post(format!("{}/v1/messages/count_tokens", proxy.url()))
                .header("x-api-key", &s.api_key)
                .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}))
                .send()
        };
        let first = count().await.unwrap();
        assert_eq!(first.status().as_u16(), 200);
        let n = first.json::<serde_json::Value>().await.unwrap()["input_tokens"]
            .as_u64()
            .unwrap();
        assert!(n >= 5, "{n}");
        let second = count().await.unwrap().status().as_u16();
        assert_eq!(
            second,
            if without_tokenize { 429 } else { 200 },
            "without /tokenize: {without_tokenize}"
        );
        proxy.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

#[test]
fn a_call_is_stamped_with_the_engines_version_only_when_no_reload_crossed_it() {
    use upstream::version_across;
    assert_eq!(version_across(Some(3), Some(3)), Some(3));
    // A reload finished while the call was out: asked before it, or queued
    // behind it; either could have served the call.
    assert_eq!(version_across(Some(3), Some(4)), None);
    assert_eq!(version_across(None, Some(1)), None);
    assert_eq!(version_across(None, None), None);
}
