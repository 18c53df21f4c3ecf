//! Weight reload on a tiny random llama: over HTTP (`/admin/reload`) while a
//! request is in flight, and from `PolicyPublished` on the log.

mod common;

use common::{get, post, post_as, reload, serve, tiny_long_context_llama, Server};
use forgelog_model::testing::{tiny_config, tiny_weights};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// A tiny llama with a long context, so that one request can outlast a reload.
fn tiny_server(dir: &Path) -> Server {
    serve(tiny_long_context_llama(dir, 5))
}
/// The same weights with the output matrix scaled: a checkpoint as the trainer writes it.
fn write_checkpoint(dir: &Path, vocab: usize, scale: f64) -> String {
    let mut weights = tiny_weights(&tiny_config(vocab), 5);
    let lm_head = weights["lm_head.weight"].affine(scale, 0.0).unwrap();
    weights.insert("lm_head.weight".into(), lm_head);
    std::fs::create_dir_all(dir).unwrap();
    candle_core::safetensors::save(&weights, dir.join("model.safetensors")).unwrap();
    format!("file://{}/model.safetensors", dir.display())
}

fn greedy(max_tokens: usize) -> Value {
    json!({"prompt": "The capital of France is", "max_tokens": max_tokens, "temperature": 0,
           "logprobs": 1, "return_token_ids": true, "ignore_eos": true})
}

fn logprobs(response: &Value) -> Vec<f64> {
    let values = response["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    values.iter().map(|v| v.as_f64().unwrap()).collect()
}

#[tokio::test]
async fn admin_reload_swaps_weights_without_failing_requests_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let server = tiny_server(&dir.path().join("model"));
    let vocab = server.engine.vocab_size();
    let (status, before) = post(&server.base, "/v1/completions", &greedy(4)).await;
    assert_eq!(
        (status, &before["policy_version"]),
        (200, &json!(0)),
        "{before}"
    );
    let uri = write_checkpoint(&dir.path().join("step-7"), vocab, 1.5);

    // A long request, admitted before the reload and still decoding during it.
    let admitted = server.engine.requests_admitted();
    let base = server.base.clone();
    let in_flight = tokio::spawn(async move {
        let response = post(&base, "/v1/completions", &greedy(900)).await;
        (response, Instant::now())
    });
    while server.engine.requests_admitted() == admitted {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (status, reloaded) =
        reload(&server.base, &json!({"checkpoint_uri": uri, "version": 7})).await;
    let reloaded_at = Instant::now();
    assert_eq!(
        (status, &reloaded["policy_version"]),
        (200, &json!(7)),
        "{reloaded}"
    );

    let ((status, long), finished_at) = in_flight.await.unwrap();
    assert_eq!(status, 200, "{long}");
    assert_eq!(long["policy_version"], 0, "admitted before the reload");
    assert_eq!(
        long["choices"][0]["token_ids"].as_array().unwrap().len(),
        900
    );
    assert!(
        finished_at > reloaded_at,
        "the long request was still in flight during the reload"
    );

    let (_, after) = post(&server.base, "/v1/completions", &greedy(4)).await;
    assert_eq!(after["policy_version"], 7);
    let (old, new) = (logprobs(&before), logprobs(&after));
    assert!(
        old.iter().zip(&new).any(|(a, b)| (a - b).abs() > 1e-3),
        "{old:?} vs {new:?}"
    );
    assert_eq!(
        get(&server.base, "/v1/models").await["data"][0]["policy_version"],
        7
    );

    // A checkpoint that is not there is a clean 400 and changes nothing.
    let missing = json!({"checkpoint_uri": format!("file://{}/nope/model.safetensors", dir.path().display()), "version": 8});
    let (status, error) = reload(&server.base, &missing).await;
    assert_eq!(status, 400, "{error}");
    assert_eq!(server.engine.policy_version(), 7);
}

#[tokio::test]
async fn policy_published_on_the_log_is_loaded() {
    use forgelog_schemas::{event_id, Event, PolicyPublished};
    let broker = forgelog_stream::testing::shared_broker().await;
    let run = forgelog_stream::testing::unique_run_id("engine-reload");
    let dir = tempfile::tempdir().unwrap();
    let server = tiny_server(&dir.path().join("model"));
    let uri = write_checkpoint(&dir.path().join("step-3"), server.engine.vocab_size(), 0.5);

    let (engine, brokers, follow_run) =
        (server.engine.clone(), broker.brokers.clone(), run.clone());
    tokio::spawn(async move {
        forgelog_engine::follow_policy(engine, &brokers, Some(&follow_run)).await
    });
    let producer = forgelog_stream::EventProducer::start(
        &broker,
        dir.path().join("spool"),
        Default::default(),
    )
    .unwrap();
    let published = PolicyPublished {
        run_id: run.clone(),
        event_id: event_id("PolicyPublished", &[&run, "3"]),
        version: 3,
        step: 3,
        checkpoint_uri: uri,
        metrics: Default::default(),
    };
    producer.send(&Event::from(published)).unwrap();
    producer.flush(Duration::from_secs(10)).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(60);
    while server.engine.policy_version() != 3 {
        assert!(
            Instant::now() < deadline,
            "PolicyPublished was not loaded within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, response) = post(&server.base, "/v1/completions", &greedy(2)).await;
    assert_eq!(response["policy_version"], 3);
}

/// An engine started on a run that already published several versions loads
/// the newest one, once: not every version on its way there.
#[tokio::test]
async fn a_started_engine_loads_only_the_newest_published_policy() {
    use forgelog_schemas::{event_id, Event, PolicyPublished};
    let broker = forgelog_stream::testing::shared_broker().await;
    let run = forgelog_stream::testing::unique_run_id("engine-newest");
    let dir = tempfile::tempdir().unwrap();
    let server = tiny_server(&dir.path().join("model"));
    let producer = forgelog_stream::EventProducer::start(
        &broker,
        dir.path().join("spool"),
        Default::default(),
    )
    .unwrap();
    for version in 1..=4 {
        let uri = write_checkpoint(
            &dir.path().join(format!("v{version}")),
            server.engine.vocab_size(),
            0.1 * version as f64,
        );
        let published = PolicyPublished {
            run_id: run.clone(),
            event_id: event_id("PolicyPublished", &[&run, &version.to_string()]),
            version,
            step: version,
            checkpoint_uri: uri,
            metrics: Default::default(),
        };
        producer.send(&Event::from(published)).unwrap();
    }
    producer.flush(Duration::from_secs(10)).await.unwrap();

    let (engine, brokers, follow_run) =
        (server.engine.clone(), broker.brokers.clone(), run.clone());
    tokio::spawn(async move {
        forgelog_engine::follow_policy(engine, &brokers, Some(&follow_run)).await
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.engine.policy_version() != 4 {
        assert!(Instant::now() < deadline, "version 4 was not loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The follower reads versions 1 to 4 again from the topic: none is newer.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(server.engine.checkpoints_loaded(), 1);
}

/// `/admin/reload` used to take anything from anyone: `file:///etc/shadow`,
/// `..` out of any directory, a 1 GB file, version `u64::MAX` (after which
/// every real policy was ignored). Now: the token, under the root, bounded,
/// forward only.
#[tokio::test]
async fn admin_reload_wants_the_token_a_checkpoint_under_the_root_of_bounded_size_and_a_newer_version(
) {
    use forgelog_engine::access::ReloadAccess;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    let policy = tiny_long_context_llama(&dir.path().join("model"), 5);
    let vocab = policy.tokenizer.get_vocab_size(true);
    let good = write_checkpoint(&root.join("v2"), vocab, 1.5);
    let good_size = std::fs::metadata(root.join("v2/model.safetensors"))
        .unwrap()
        .len();
    let server = forgelog_engine::testing::serve_with(
        policy,
        ReloadAccess {
            admin_token: "the-token".into(),
            checkpoint_root: Some(
                ReloadAccess::root(&format!("file://{}", root.display())).unwrap(),
            ),
            max_checkpoint_bytes: good_size + 1024,
        },
    );
    // A secret beside the root, and a file too large under it.
    std::fs::write(dir.path().join("secret"), "s3cr3t").unwrap();
    std::fs::create_dir_all(root.join("big")).unwrap();
    std::fs::write(
        root.join("big/model.safetensors"),
        vec![0u8; good_size as usize * 2],
    )
    .unwrap();
    let ask = |token: &'static str, uri: String, version: u64| {
        let base = server.base.clone();
        async move {
            post_as(
                &base,
                "/admin/reload",
                Some(token),
                &json!({"checkpoint_uri": uri, "version": version}),
            )
            .await
        }
    };
    assert_eq!(ask("wrong", good.clone(), 2).await.0, 401);
    let outside = [
        "file:///etc/passwd".to_string(),
        format!("file://{}/../secret", root.display()),
        format!("file://{}/nothing-here", dir.path().display()),
    ];
    let mut answers = Vec::new();
    for uri in outside {
        let (status, body) = ask("the-token", uri, 2).await;
        assert_eq!(status, 403, "{body}");
        answers.push(body["error"]["message"].to_string());
    }
    assert!(
        answers.windows(2).all(|w| w[0] == w[1]),
        "outside the root, what exists and what does not get one answer: {answers:?}"
    );
    let big = format!("file://{}/big/model.safetensors", root.display());
    let (status, body) = ask("the-token", big, 2).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("limit"), "{body}");
    assert_eq!(ask("the-token", good.clone(), u64::MAX).await.0, 400);
    let (status, body) = ask("the-token", good.clone(), 2).await;
    assert_eq!(
        (status, &body["policy_version"]),
        (200, &json!(2)),
        "{body}"
    );
    assert_eq!(ask("the-token", good, 2).await.0, 409, "not newer");
    assert_eq!(server.engine.policy_version(), 2);
}

/// A LoRA version published as its adapter alone (PEFT's two files; the
/// `checkpoint_uri` names `adapter_model.safetensors`) serves exactly what
/// the same adapter merged into full weights does: the engine merges it onto
/// the weights it started with. A second adapter is merged onto those base
/// weights too, not onto the first adapter's. Once whole weights are loaded
/// the engine lets its start weights go (a full-weight run would hold the
/// model twice), and an adapter alone after that is refused, saying why.
#[tokio::test]
async fn an_adapter_alone_serves_as_its_merged_weights() {
    use forgelog_model::lora::{self, LoraConfig};
    let dir = tempfile::tempdir().unwrap();
    let server = tiny_server(&dir.path().join("model"));
    let vocab = server.engine.vocab_size();
    let config = tiny_config(vocab);
    let base = tiny_weights(&config, 5);
    let lora = LoraConfig::new(2, 4.0, vec!["q_proj".into(), "down_proj".into()]).unwrap();
    let device = candle_core::Device::Cpu;
    // An adapter that changes something: B is not zero.
    let adapter = |scale: f64| {
        lora::init_adapter(&config, &lora, 11, &device)
            .unwrap()
            .into_iter()
            .map(|(name, t)| {
                let t = match name.ends_with("lora_B.weight") {
                    true => t.ones_like().unwrap().affine(scale, 0.0).unwrap(),
                    false => t,
                };
                (name, t)
            })
            .collect::<std::collections::HashMap<_, _>>()
    };
    let publish = |name: &str, adapter: &std::collections::HashMap<_, _>| {
        let alone = dir.path().join(format!("{name}-adapter"));
        std::fs::create_dir_all(&alone).unwrap();
        for (file, bytes) in lora::adapter_files(adapter, &lora, "tiny").unwrap() {
            std::fs::write(alone.join(file), bytes).unwrap();
        }
        let merged = dir.path().join(format!("{name}-merged"));
        std::fs::create_dir_all(&merged).unwrap();
        let weights = lora::merge(&base, adapter, &config, &lora).unwrap();
        candle_core::safetensors::save(&weights, merged.join("model.safetensors")).unwrap();
        (
            format!("file://{}/adapter_model.safetensors", alone.display()),
            format!("file://{}/model.safetensors", merged.display()),
        )
    };
    let served = |version: u64, uri: String| {
        let base = server.base.clone();
        async move {
            let (status, r) =
                reload(&base, &json!({"checkpoint_uri": uri, "version": version})).await;
            assert_eq!(status, 200, "{r}");
            let (status, out) = post(&base, "/v1/completions", &greedy(6)).await;
            assert_eq!((status, &out["policy_version"]), (200, &json!(version)));
            (out["choices"][0]["token_ids"].clone(), logprobs(&out))
        }
    };
    let (_, before) = post(&server.base, "/v1/completions", &greedy(6)).await;
    let before = logprobs(&before);

    let (first_alone, _) = publish("v1", &adapter(0.05));
    let (second_alone, second_merged) = publish("v2", &adapter(-0.03));
    let a = served(1, first_alone.clone()).await;
    assert_ne!(a.1, before, "the adapter changed what is served");
    let b = served(2, second_alone).await;
    assert!(server.engine.holds_start_weights());
    let c = served(3, second_merged).await;
    assert_eq!(
        b, c,
        "the second adapter alone, onto the base weights, serves as merged"
    );
    assert!(
        !server.engine.holds_start_weights(),
        "whole weights loaded: the start's copy goes"
    );
    let (status, r) = reload(
        &server.base,
        &json!({"checkpoint_uri": first_alone, "version": 4}),
    )
    .await;
    assert_ne!(status, 200, "{r}");
    assert!(
        r.to_string()
            .contains("let go of the weights it started with"),
        "{r}"
    );
    let (status, out) = post(&server.base, "/v1/completions", &greedy(6)).await;
    assert_eq!((status, &out["policy_version"]), (200, &json!(3)));
}
