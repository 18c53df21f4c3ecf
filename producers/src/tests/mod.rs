//! The fast tier: the whole proxy (routes, sessions, the upstream call,
//! recording) in front of the fake upstream, recording into a memory log.
use super::*;
use forgelog_api::{Finish, NewSession, SessionClient, Verdict};
use forgelog_schemas::{CallStatus, Event, Topic};
use forgelog_stream::MemoryLog;
use server::ProxyConfig;

/// A proxy in front of a fake upstream started with `options`, recording into
/// the memory log it returns; `config` adjusts its configuration (the
/// upstream set). The probe as given (`None`: the fake is probed for real).
async fn fast_proxy(
    options: fake_upstream::FakeOptions,
    probe: Option<upstream::Probe>,
    config: impl FnOnce(ProxyConfig) -> ProxyConfig,
) -> (
    RunningProxy,
    Arc<MemoryLog>,
    Arc<fake_upstream::FakeUpstream>,
) {
    let (up, fake) = fake_upstream::spawn("127.0.0.1:0".parse().unwrap(), options)
        .await
        .unwrap();
    let config = config(ProxyConfig::new(format!("http://{up}")));
    let probe = match probe {
        Some(p) => p,
        None => upstream::UpstreamClient::new(&config.upstream, Duration::from_secs(5), 1)
            .probe()
            .await
            .unwrap(),
    };
    let log = Arc::new(MemoryLog::default());
    let state = Arc::new(ProxyState::new(config, log.clone(), probe));
    let proxy = RunningProxy::serve(state, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    (proxy, log, fake)
}

/// A proxy of run `run` whose session API wants the admin token "secret".
async fn guarded_proxy(run: &str) -> (RunningProxy, Arc<MemoryLog>) {
    let (proxy, log, _) = fast_proxy(Default::default(), Some(Default::default()), |c| {
        ProxyConfig {
            run_id: Some(run.into()),
            admin_token: Some("secret".into()),
            ..c
        }
    })
    .await;
    (proxy, log)
}

/// A session on `proxy`, created without an admin token.
async fn session(proxy: &RunningProxy, new: NewSession) -> forgelog_api::SessionCreated {
    SessionClient::new(proxy.url(), None)
        .create(&new)
        .await
        .unwrap()
}

/// A harness's OpenAI Chat call in session `key`.
fn chat(proxy: &RunningProxy, key: &str, body: serde_json::Value) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .bearer_auth(key)
        .json(&body)
}

/// A fake upstream that answers after `delay`.
fn slow(delay: Duration) -> fake_upstream::FakeOptions {
    fake_upstream::FakeOptions {
        delay,
        ..Default::default()
    }
}

/// The calls `log` recorded as finished, each as `view` sees it.
fn finished<T>(log: &MemoryLog, view: impl Fn(forgelog_schemas::CallFinished) -> T) -> Vec<T> {
    log.events(Topic::Calls.name())
        .into_iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) => Some(view(c)),
            _ => None,
        })
        .collect()
}

/// The fake upstream as a successful probe finds it (without asking it).
fn probed() -> upstream::Probe {
    upstream::Probe {
        model: fake_upstream::MODEL.into(),
        ..Default::default()
    }
}

mod engine;
mod recording;
mod session_api;
