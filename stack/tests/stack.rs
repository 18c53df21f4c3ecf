//! The stack's parts in this process, on the real (test) broker, with no
//! binary started: the embedded engine, an engine checked for training, the
//! clock that reads what a run published, and a run's processes together.

use forgelog_deploy::orchestrator::PolicyClock;
use forgelog_engine::DeviceKind;
use forgelog_schemas::{Event, PolicyPublished};
use forgelog_stack::{
    learner_settings, serves_policy_versions, LearningConfig, LocalEngine, LogClock, RunStack,
    Serving, ServingConfig, StackError,
};
use forgelog_stream::testing::{produce, shared_broker, unique_run_id};
use std::path::Path;
use std::time::{Duration, Instant};

#[tokio::test]
async fn the_embedded_engine_serves_says_it_follows_versions_and_stops() {
    let config = shared_broker().await;
    let model = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_llama(model.path(), 3).unwrap();
    let run = unique_run_id("stack-engine");
    let any = "127.0.0.1:0".parse().unwrap();
    let model = model.path().to_str().unwrap();
    let engine = LocalEngine::start(model, any, DeviceKind::Cpu, &config, &run)
        .await
        .unwrap();
    assert!(!engine.url.ends_with(":0"), "{}", engine.url);
    // What a training loop asks of an engine it does not sync itself.
    serves_policy_versions(&engine.url).await.unwrap();
    let url = engine.url.clone();
    engine.stop().await;
    assert!(
        reqwest::get(format!("{url}/healthz")).await.is_err(),
        "still serving"
    );
}

#[tokio::test]
async fn an_engine_that_cannot_start_says_why_at_once() {
    let config = shared_broker().await;
    let started = Instant::now();
    let any = "127.0.0.1:0".parse().unwrap();
    let err = LocalEngine::start("/nowhere/model.gguf", any, DeviceKind::Cpu, &config, "r")
        .await
        .err()
        .expect("no such model");
    let said = err.to_string();
    assert!(matches!(err, StackError::Engine(_)), "{said}");
    assert!(
        said.contains("did not start") && said.contains("/nowhere/model.gguf"),
        "{said}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

/// Found by probing `forgelog up --engine-listen` on a port in use: the
/// error said only "Address already in use", not whose or where.
#[tokio::test]
async fn an_engine_whose_port_is_taken_says_where() {
    let config = shared_broker().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err = LocalEngine::start("smollm2", addr, DeviceKind::Cpu, &config, "r")
        .await
        .err()
        .expect("the port is taken");
    assert!(matches!(err, StackError::Engine(_)), "{err}");
    let said = err.to_string();
    assert!(
        said.starts_with(&format!("the engine cannot listen on {addr}: ")),
        "{said}"
    );
}

#[tokio::test]
async fn an_engine_that_reports_no_policy_version_is_refused_for_training() {
    // vLLM's `/v1/models`: no `policy_version`.
    let app = axum::Router::new().route(
        "/v1/models",
        axum::routing::get(|| async { axum::Json(serde_json::json!({"data": [{"id": "m"}]})) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let err = serves_policy_versions(&url).await.unwrap_err();
    assert!(matches!(err, StackError::NoPolicyVersions { .. }), "{err}");
    assert!(err.to_string().contains("--engine vllm"), "{err}");
    // Nobody there: said so, naming the URL.
    let gone = format!("http://{}", forgelog_stream::testing::free_local_addr());
    let err = serves_policy_versions(&gone).await.unwrap_err();
    assert!(matches!(err, StackError::Upstream { .. }), "{err}");
    assert!(err.to_string().contains(&gone), "{err}");
}

#[tokio::test]
async fn the_log_clock_reads_the_newest_version_its_run_published() {
    let config = shared_broker().await;
    let (ours, theirs) = (unique_run_id("stack-clock"), unique_run_id("stack-other"));
    let clock = LogClock {
        config: config.clone(),
        run: ours.clone(),
    };
    assert_eq!(clock.newest_version().await, 0, "nothing published yet");
    let published = |run: &str, version: i64| {
        Event::PolicyPublished(PolicyPublished {
            run_id: run.to_string(),
            event_id: format!("{run}-v{version}"),
            version,
            step: version,
            checkpoint_uri: format!("file:///nowhere/{run}/v{version}/"),
            metrics: Default::default(),
        })
    };
    produce(
        &config,
        &[
            published(&ours, 2),
            published(&ours, 5),
            published(&theirs, 9),
        ],
    )
    .await;
    assert_eq!(clock.newest_version().await, 5);
    assert_eq!(clock.stopped(), None);
}

/// What answers a run's calls: the embedded engine behind a proxy that
/// renders prompts with the engine's own tokenizer (token in), its session
/// API behind a token; both gone once stopped.
#[tokio::test(flavor = "multi_thread")]
async fn serving_starts_an_engine_behind_a_proxy_and_stops_both() {
    let config = shared_broker().await;
    let model = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_llama(model.path(), 5).unwrap();
    let home = tempfile::tempdir().unwrap();
    let serving = Serving::start(
        &config,
        serving_config(unique_run_id("stack-serving"), model.path(), home.path()),
    )
    .await
    .unwrap();
    let engine = serving
        .engine
        .as_ref()
        .expect("the embedded engine")
        .url
        .clone();
    assert_eq!(serving.upstream, engine);
    assert!(serving.sync.is_none(), "no training, no sync");
    let proxy = serving.proxy.url();
    // The session API wants the token it was given.
    let client = reqwest::Client::new();
    let sessions = |token: Option<&str>| {
        let mut post = client
            .post(format!("{proxy}/sessions"))
            .json(&serde_json::json!({"rollout_id": "r", "task_id": "t", "harness": "h", "group_id": "g"}));
        if let Some(token) = token {
            post = post.bearer_auth(token);
        }
        post.send()
    };
    assert_eq!(sessions(None).await.unwrap().status(), 401);
    let token = serving.admin_token.clone();
    assert!(sessions(Some(&token)).await.unwrap().status().is_success());
    serving.stop(None, Duration::from_secs(5)).await.unwrap();
    for url in [&proxy, &engine] {
        assert!(
            client.get(format!("{url}/healthz")).send().await.is_err(),
            "{url} still serves"
        );
    }
}

/// How `run` of the tiny model in `model` is served: the embedded engine,
/// both servers on free local ports, state under `home`.
fn serving_config(run: String, model: &Path, home: &Path) -> ServingConfig {
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    ServingConfig {
        run,
        upstream: None,
        model: model.display().to_string(),
        device: DeviceKind::Cpu,
        engine_listen: any,
        train: false,
        synced: None,
        tokenizer: None,
        policy_adapters: false,
        extra_body: Default::default(),
        proxy_listen: any,
        spool: home.join("spool"),
        home: home.to_path_buf(),
    }
}

/// A run's processes as `up` and `run --train` start them: without a
/// learner nothing is admitted on versions or waited for; with one that
/// fails (a model it cannot load), the loop is told why, admission stops
/// waiting for a version that will not come, and the last versions say so.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_stack_admits_on_its_learner_and_ends_when_the_learner_fails() {
    let config = shared_broker().await;
    let model = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_llama(model.path(), 7).unwrap();
    let home = tempfile::tempdir().unwrap();
    let consumers = LearningConfig {
        state: home.path().join("consumers"),
        rewards: Default::default(),
        train: None,
    };
    let run = unique_run_id("stack-run");
    let serving = serving_config(run.clone(), model.path(), home.path());
    let mut stack = RunStack::start(&config, serving, Some(consumers.clone()))
        .await
        .unwrap();
    let proxy = stack.serving.proxy.url();
    assert_eq!(format!("http://{}", stack.proxy_addr().unwrap()), proxy);
    assert!(stack.admission().is_none(), "no learner, no admission");
    let last = stack.last_versions(&config, 4, Duration::from_secs(1));
    assert_eq!(last.await.unwrap(), None);
    let ended = tokio::time::timeout(Duration::from_secs(2), stack.ended()).await;
    assert!(
        ended.is_err(),
        "nothing ends a stack with no learner or sync"
    );
    stack.stop(Duration::from_secs(5)).await.unwrap();

    let run = unique_run_id("stack-run-learner");
    let train = forgelog_trainer::TrainArgs {
        groups_per_step: Some(2),
        max_staleness: 1,
        ..learner_settings("/nowhere/model", &config, &run, home.path()).unwrap()
    };
    let learning = LearningConfig {
        train: Some(train),
        ..consumers
    };
    let serving = serving_config(run.clone(), model.path(), home.path());
    let mut stack = RunStack::start(&config, serving, Some(learning))
        .await
        .unwrap();
    let admission = stack.admission().expect("a learner stepping on groups");
    assert_eq!(admission.bound.groups_per_step, 2);
    // The engine serves version 0: the first groups start under the bound.
    admission.admitted(3).await.unwrap();
    let why = tokio::time::timeout(Duration::from_secs(120), stack.ended())
        .await
        .expect("the learner fails at once");
    assert!(matches!(why, StackError::LearnerFailed(_)), "{why}");
    assert!(why.to_string().contains("the learner failed"), "{why}");
    // Group 9 waits for version 3, which the failed learner never publishes.
    let refused = admission.admitted(9).await.unwrap_err().to_string();
    assert!(refused.contains("the learner failed"), "{refused}");
    let last = stack
        .last_versions(&config, 4, Duration::from_secs(1))
        .await;
    let said = last.unwrap_err().to_string();
    assert!(said.ends_with("0 of 2 versions published"), "{said}");
    stack.stop(Duration::from_secs(5)).await.unwrap();
}
