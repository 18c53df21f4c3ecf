//! Bad input, limits, upstream failures and an untrainable backend: each gets
//! the dialect's error shape (or a served call) and is recorded, nothing crashes.

mod common;
use forgelog_api::Verdict;

use common::*;
use forgelog_producers::fake_upstream::FakeOptions;
use forgelog_schemas::{CallStatus, Topic};
use serde_json::json;

fn chat(text: &str) -> serde_json::Value {
    json!({"model": "m", "messages": [{"role": "user", "content": text}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_answered_in_dialect_and_recorded() {
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        Default::default(),
        "proxy-limits",
    )
    .await;
    let (session, key) = rig.session("r-limits").await;

    // Upstream failure: 502 in Anthropic's shape, recorded as upstream_error.
    let body = json!({"model": "c", "max_tokens": 10, "messages": [{"role": "user", "content": "[fail] please"}]});
    let (status, v) = rig.post("/v1/messages", Some(&key), &body).await;
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "overloaded_error");

    // Malformed JSON: 400 in OpenAI's shape.
    let r = rig
        .http
        .post(format!("{}/v1/chat/completions", rig.proxy.url()))
        .bearer_auth(&key)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("malformed JSON"),
        "{v}"
    );

    // Too large: 413, and the connection (its body unread) is closed, so a
    // client's pool does not send the next request on it.
    let big = "x".repeat(2 << 20);
    let r = rig
        .http
        .post(format!("{}/v1/chat/completions", rig.proxy.url()))
        .bearer_auth(&key)
        .body(chat(&big).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(r.headers()["connection"], "close");

    // A slow upstream: the stream carries keep-alives, then the answer.
    let mut slow = chat("[slow]");
    slow["stream"] = json!(true);
    let r = rig
        .http
        .post(format!("{}/v1/chat/completions", rig.proxy.url()))
        .bearer_auth(&key)
        .body(slow.to_string())
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    assert!(text.starts_with(": keep-alive\n\n"), "{text}");
    assert!(
        text.contains("Echo: slow") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );

    // More calls in flight than the session allows (4): the fifth is refused
    // with 429 and recorded as a failed call.
    let slow = chat("[slow]");
    let posts: Vec<_> = (0..5)
        .map(|_| rig.post("/v1/chat/completions", Some(&key), &slow))
        .collect();
    let statuses: Vec<u16> = futures::future::join_all(posts)
        .await
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        4,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        1,
        "{statuses:?}"
    );

    let finished = rig.finish(&session, None).await;
    assert_eq!(finished.model_calls, 9);
    // An ended session's key is refused, in Gemini's shape here.
    let r = rig
        .http
        .post(format!(
            "{}/v1beta/models/g:generateContent",
            rig.proxy.url()
        ))
        .header("x-goog-api-key", &key)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    rig.flush().await;
    let (started, done) = calls_of(&rig.events(Topic::Calls).await, &session);
    assert_eq!((started, done.len()), (9, 9));
    let concurrent: Vec<_> = done.iter().filter(|c| c.call_index >= 4).collect();
    let refused: Vec<_> = concurrent
        .iter()
        .filter(|c| c.status == CallStatus::ClientError)
        .collect();
    assert_eq!((concurrent.len(), refused.len()), (5, 1));
    assert!(refused[0].error.as_deref().unwrap().contains("in flight"));
    assert!(!refused[0].trainable && refused[0].completion_token_ids.is_empty());
    let status = |i: usize| {
        done.iter()
            .find(|c| c.call_index == i as i64)
            .unwrap()
            .status
    };
    assert_eq!(status(0), CallStatus::UpstreamError);
    assert_eq!(status(1), CallStatus::ClientError);
    assert_eq!(status(2), CallStatus::ClientError);
    assert_eq!(status(3), CallStatus::Ok);
    assert!(done[0].error.as_deref().unwrap().contains("500"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_ids_serves_untrainable_calls() {
    let options = FakeOptions {
        without_ids: true,
        ..Default::default()
    };
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        options,
        "proxy-noids",
    )
    .await;
    assert!(rig
        .proxy
        .state
        .probe()
        .untrainable
        .as_deref()
        .unwrap()
        .contains("no prompt token ids"));
    let (session, key) = rig.session("r-noids").await;
    let (status, v) = rig
        .post("/v1/chat/completions", Some(&key), &chat("hello"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["choices"][0]["message"]["content"], "Echo: hello");
    rig.finish(&session, Some(Verdict::scored(0.0, ""))).await;
    rig.flush().await;
    let (_, done) = calls_of(&rig.events(Topic::Calls).await, &session);
    assert_eq!(done.len(), 1);
    assert!(!done[0].trainable);
    assert_eq!(
        done[0].untrainable_reason.as_deref(),
        Some("upstream returned no prompt token ids")
    );
    assert_eq!(done[0].status, CallStatus::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reachability_probes_get_200_and_unknown_routes_a_404_naming_them() {
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        Default::default(),
        "proxy-probes",
    )
    .await;
    let head = rig
        .http
        .head(format!("{}/api/hello", rig.proxy.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    let (status, v) = rig.post("/v1/nothing/here", None, &json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(v["error"], "no route POST /v1/nothing/here");
    // With a session's key, what it asked for in vain is kept on the
    // session, and its finish names it (what the harness expected).
    let (session, key) = rig.session("r-probes").await;
    for _ in 0..2 {
        let tags = rig
            .http
            .get(format!("{}/api/tags", rig.proxy.url()))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(tags.status(), 404);
    }
    let (status, _) = rig.post("/props", Some(&key), &json!({})).await;
    assert_eq!(status, 404);
    // Gemini's clients send the key as `?key=`.
    let version = rig
        .http
        .get(format!("{}/version?alt=json&key={key}", rig.proxy.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(version.status(), 404);
    // Another key's probe, or none, is not this session's.
    let _ = rig.post("/api/other", Some("not-a-key"), &json!({})).await;
    let done = rig.finish(&session, None).await;
    let asked: Vec<String> = done.unrouted.iter().map(ToString::to_string).collect();
    assert_eq!(
        asked,
        ["GET /api/tags (2×)", "POST /props", "GET /version"],
        "{done:?}"
    );
}

/// Codex sends large Responses bodies zstd-compressed; gzip and deflate happen too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_request_bodies_are_decoded_and_recorded_decoded() {
    use std::io::Write;
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        Default::default(),
        "proxy-encoding",
    )
    .await;
    let (session, key) = rig.session("r-encoding").await;
    let send = |path: &'static str, encoding: &'static str, body: Vec<u8>| {
        let r = rig
            .http
            .post(format!("{}{path}", rig.proxy.url()))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .header("content-encoding", encoding)
            .header("accept-encoding", "zstd,gzip")
            .body(body);
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let responses = json!({"model": "m", "input": "zipped hello"}).to_string();
    let (status, body) = send(
        "/v1/responses",
        "zstd",
        zstd::encode_all(responses.as_bytes(), 3).unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Echo: zipped hello"), "{body}");

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(chat("gzipped hello").to_string().as_bytes())
        .unwrap();
    let (status, body) = send("/v1/chat/completions", "gzip", gz.finish().unwrap()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Echo: gzipped hello"), "{body}");

    let (status, body) = send("/v1/chat/completions", "br", b"\x0b\x02\x80".to_vec()).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("Content-Encoding 'br' is not supported"),
        "{body}"
    );
    let (status, body) = send("/v1/chat/completions", "zstd", b"not zstd".to_vec()).await;
    assert_eq!(status, 400, "{body}");
    // A small body that inflates past the body limit (1 MiB here) is refused, not inflated.
    let bomb = zstd::encode_all(&vec![b' '; 4 << 20][..], 19).unwrap();
    assert!(bomb.len() < 64 << 10);
    let (status, body) = send("/v1/chat/completions", "zstd", bomb).await;
    assert_eq!(status, 413, "{body}");

    rig.finish(&session, Some(Verdict::scored(1.0, ""))).await;
    rig.flush().await;
    let events = rig.events(Topic::Calls).await;
    let recorded: Vec<&[u8]> = events
        .iter()
        .filter_map(|e| match e {
            forgelog_schemas::Event::CallStarted(s) if s.session_id == session => {
                Some(&s.raw_request[..])
            }
            _ => None,
        })
        .collect();
    assert_eq!(recorded.len(), 5);
    assert_eq!(recorded[0], responses.as_bytes(), "recorded decoded");
    let (_, done) = calls_of(&events, &session);
    let ok = done.iter().filter(|c| c.status == CallStatus::Ok).count();
    assert_eq!(ok, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparseable_tool_call_goes_back_as_text_and_is_flagged() {
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        Default::default(),
        "proxy-badtool",
    )
    .await;
    let (session, key) = rig.session("r-badtool").await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let body = json!({"model": "m", "tools": tools, "messages": [{"role": "user", "content": "[badtool] weather?"}]});
    let (status, v) = rig.post("/v1/chat/completions", Some(&key), &body).await;
    assert_eq!(status, 200, "{v}");
    let message = &v["choices"][0]["message"];
    assert!(message["tool_calls"].is_null(), "{v}");
    assert!(
        message["content"]
            .as_str()
            .unwrap()
            .contains("<tool_call>{\"name\": \"get_weather\""),
        "the text goes back as it was sampled: {v}"
    );
    rig.finish(&session, None).await;
    rig.flush().await;
    let (_, done) = calls_of(&rig.events(Topic::Calls).await, &session);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].unparsed_tool_calls, 1);
    assert!(
        done[0].trainable,
        "the sampled tokens are still the policy's"
    );
}
