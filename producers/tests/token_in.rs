//! Token in, token out, against the real engine on SmolLM2: the proxy renders
//! prompts with the model's own tokenizer and template, splices each
//! follow-up call onto the ids the model sampled, asks the engine with ids,
//! and records how each prompt was made.

mod common;

use common::{calls_of, config, read_events, topic_ends, ADMIN};
use forgelog_api::{NewSession, SessionClient};
use forgelog_model::{ChatCodec, ChatTemplate};
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::upstream::TokenIn;
use forgelog_producers::{ProxyError, RunningProxy};
use forgelog_schemas::Topic;
use serde_json::{json, Value};
use std::sync::Arc;

fn token_in(codec: ChatCodec) -> TokenIn {
    let (tokenizer_sha256, chat_template_sha256) = codec.sha256s();
    TokenIn {
        renderer: Arc::new(codec),
        tokenizer_sha256,
        chat_template_sha256,
    }
}

fn smollm2_codec() -> ChatCodec {
    let policy = &forgelog_engine::testing::smollm2().1;
    ChatCodec::new(
        policy.tokenizer.clone(),
        policy.chat_template.clone(),
        policy.stop_token_ids.clone(),
    )
}

/// The message as a harness sends it back: its own tool-call ids, the
/// arguments re-serialized with other spacing, content as a list of parts.
fn resent(message: &Value) -> Value {
    let mut m = json!({"role": "assistant", "content": [{"type": "text", "text": message["content"].as_str().unwrap_or("")}]});
    if let Some(calls) = message["tool_calls"].as_array() {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let args: Value =
                    serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                json!({"id": format!("toolu_{i}"), "type": "function", "function": {
                    "name": c["function"]["name"],
                    "arguments": serde_json::to_string_pretty(&args).unwrap()}})
            })
            .collect();
        m["tool_calls"] = json!(calls);
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_up_calls_are_spliced_onto_the_sampled_ids() {
    let stream = forgelog_stream::testing::shared_broker().await;
    let engine = &forgelog_engine::testing::smollm2().0;
    let run_id = forgelog_stream::testing::unique_run_id("token-in");
    let marks = topic_ends(&stream).await;
    let spool = tempfile::tempdir().unwrap();
    let t = token_in(smollm2_codec());
    let hashes = (t.tokenizer_sha256.clone(), t.chat_template_sha256.clone());
    let proxy = RunningProxy::start(
        ProxyConfig {
            token_in: Some(t),
            ..config(engine.base.clone(), &run_id)
        },
        &stream,
        spool.path().to_path_buf(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .expect("the proxy renders as the engine does, and starts");
    let sessions = SessionClient::new(proxy.url(), Some(ADMIN.into()));
    let created = sessions
        .create(&NewSession::new("r1", "task-1", "token-in-test", "g1"))
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let tools = json!([{"type": "function", "function": {"name": "calculator",
        "description": "Evaluates an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]);
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant. Use the calculator tool."}),
        json!({"role": "user", "content": "What is 24 * 17?"}),
    ];
    let ask = |messages: &Vec<Value>, seed: u64| {
        let body = json!({"model": "smollm2", "messages": messages, "tools": tools,
            "max_tokens": 24, "temperature": 0.8, "seed": seed});
        let request = http
            .post(format!("{}/v1/chat/completions", proxy.url()))
            .bearer_auth(&created.api_key)
            .json(&body);
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };
    for turn in 0..3 {
        let answer = ask(&messages, turn).await;
        let message = &answer["choices"][0]["message"];
        messages.push(resent(message));
        match message["tool_calls"].as_array() {
            Some(calls) => {
                for i in 0..calls.len() {
                    messages.push(json!({"role": "tool", "tool_call_id": format!("toolu_{i}"), "content": "408"}));
                }
            }
            None => messages.push(json!({"role": "user", "content": "Please go on."})),
        }
    }
    // The harness edits its history: a fresh render, saying where.
    messages[1] = json!({"role": "user", "content": "What is 25 * 17?"});
    ask(&messages, 9).await;
    sessions
        .finish(&created.session_id, &Default::default())
        .await
        .unwrap();
    proxy
        .shutdown(std::time::Duration::from_secs(30))
        .await
        .unwrap();

    let events = read_events(&stream, Topic::Calls, &run_id, &marks).await;
    let (_, calls) = calls_of(&events, &created.session_id);
    assert_eq!(calls.len(), 4);
    let made: Vec<_> = calls
        .iter()
        .map(|c| c.prompt_made.clone().expect("token in records how"))
        .collect();
    assert_eq!(
        made[0].why_rendered.as_deref(),
        Some("no earlier call to splice onto (the session's first, or its first since the proxy started)")
    );
    assert_eq!(made[1].spliced_from, Some(0));
    assert_eq!(made[2].spliced_from, Some(1));
    for (c, m) in calls.iter().zip(&made) {
        assert!(c.trainable, "{:?}", c.untrainable_reason);
        assert_eq!(
            (&m.tokenizer_sha256, &m.chat_template_sha256),
            (&hashes.0, &hashes.1)
        );
    }
    // Each follow-up starts with exactly what the engine saw and sampled before.
    for k in 1..3 {
        let before = [
            &calls[k - 1].prompt_token_ids[..],
            &calls[k - 1].completion_token_ids[..],
        ]
        .concat();
        assert!(
            calls[k].prompt_token_ids.starts_with(&before),
            "call {k} does not extend call {}",
            k - 1
        );
        assert!(calls[k].prompt_token_ids.len() > before.len());
    }
    // The first prompt is the engine's own rendering of the chat.
    let first_chat: Value = serde_json::from_str(&calls[0].chat_request).unwrap();
    let engine_ids = engine
        .engine
        .chat_prompt(
            first_chat["messages"].as_array().unwrap(),
            Some(&first_chat["tools"]),
        )
        .unwrap();
    assert_eq!(calls[0].prompt_token_ids, engine_ids);
    assert_eq!(made[3].spliced_from, None);
    let why = made[3].why_rendered.as_deref().unwrap();
    assert!(why.starts_with("message 1 differs from call 2's"), "{why}");
}

/// A tokenizer or template other than the engine's is refused at start,
/// naming the first token that differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rendering_other_than_the_engines_refuses_to_start() {
    let stream = forgelog_stream::testing::shared_broker().await;
    let engine = &forgelog_engine::testing::smollm2().0;
    let codec = smollm2_codec();
    let plain = ChatCodec::new(
        codec.tokenizer.clone(),
        // ChatML with a space where the engine's template has a newline.
        ChatTemplate::new(
            "{% for m in messages %}{{ '<|im_start|>' + m['role'] + ' ' + m['content'] + '<|im_end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant ' }}{% endif %}",
            "",
            "<|im_end|>",
        ),
        codec.stop_token_ids.clone(),
    );
    let spool = tempfile::tempdir().unwrap();
    let started = RunningProxy::start(
        ProxyConfig {
            token_in: Some(token_in(plain)),
            ..config(engine.base.clone(), "refused")
        },
        &stream,
        spool.path().to_path_buf(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    match started {
        Err(ProxyError::Rendering(why)) => {
            assert!(why.contains("first difference at token"), "{why}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("started with a template other than the engine's"),
    }
}

/// A restarted proxy takes over its predecessor's open sessions with the
/// calls they had answered: the next call of a session is still spliced onto
/// the ids the model sampled before the restart, not rendered afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_proxy_goes_on_splicing_its_open_sessions() {
    let stream = forgelog_stream::testing::shared_broker().await;
    let engine = &forgelog_engine::testing::smollm2().0;
    let run_id = forgelog_stream::testing::unique_run_id("token-in-restart");
    let marks = topic_ends(&stream).await;
    let spool = tempfile::tempdir().unwrap();
    let start = || async {
        RunningProxy::start(
            ProxyConfig {
                token_in: Some(token_in(smollm2_codec())),
                ..config(engine.base.clone(), &run_id)
            },
            &stream,
            spool.path().to_path_buf(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .await
        .unwrap()
    };
    let http = reqwest::Client::new();
    let ask = |url: String, key: String, messages: Vec<Value>| {
        let body = json!({"model": "smollm2", "messages": messages, "max_tokens": 12, "seed": 1});
        let request = http
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body);
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };
    let mut messages = vec![json!({"role": "user", "content": "Name a colour."})];
    let first = start().await;
    let created = SessionClient::new(first.url(), Some(ADMIN.into()))
        .create(&NewSession::new("r1", "task-1", "token-in-test", "g1"))
        .await
        .unwrap();
    for _ in 0..2 {
        let answer = ask(first.url(), created.api_key.clone(), messages.clone()).await;
        messages.push(resent(&answer["choices"][0]["message"]));
        messages.push(json!({"role": "user", "content": "Another one?"}));
    }
    first
        .shutdown(std::time::Duration::from_secs(30))
        .await
        .unwrap();

    let second = start().await;
    ask(second.url(), created.api_key.clone(), messages.clone()).await;
    SessionClient::new(second.url(), Some(ADMIN.into()))
        .finish(&created.session_id, &Default::default())
        .await
        .unwrap();
    second
        .shutdown(std::time::Duration::from_secs(30))
        .await
        .unwrap();

    let events = read_events(&stream, Topic::Calls, &run_id, &marks).await;
    let (_, calls) = calls_of(&events, &created.session_id);
    let spliced: Vec<Option<i64>> = calls
        .iter()
        .map(|c| c.prompt_made.as_ref().unwrap().spliced_from)
        .collect();
    assert_eq!(
        spliced,
        [None, Some(0), Some(1)],
        "call 2 came after the restart"
    );
    let before = [
        &calls[1].prompt_token_ids[..],
        &calls[1].completion_token_ids[..],
    ]
    .concat();
    assert!(calls[2].prompt_token_ids.starts_with(&before));
}
