//! Shared by the integration tests: a fake upstream (or the real engine behind
//! a recording relay), a proxy in this process, sessions, and reading what
//! reached the log.
#![allow(dead_code)]

use forgelog_api::{Finish, Finished, NewSession, SessionClient, Verdict};
use forgelog_producers::fake_upstream::{self, FakeOptions, FakeUpstream};
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::RunningProxy;
use forgelog_schemas::{CallFinished, Event, Topic};
use forgelog_stream::{ReplayReader, StreamConfig};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Rig {
    pub proxy: RunningProxy,
    pub upstream: Upstream,
    pub run_id: String,
    pub stream: StreamConfig,
    pub http: reqwest::Client,
    /// Each topic partition's end when the rig started: the run's events are past it.
    pub marks: Vec<(Topic, i32, i64)>,
    upstream_url: String,
    pub spool: tempfile::TempDir,
}

pub const ADMIN: &str = "test-admin-token";

pub fn config(upstream: String, run_id: &str) -> ProxyConfig {
    ProxyConfig {
        upstream,
        run_id: Some(run_id.to_string()),
        admin_token: Some(ADMIN.to_string()),
        body_limit: 1 << 20,
        max_calls_in_flight: 4,
        upstream_timeout: Duration::from_secs(20),
        keep_alive: Duration::from_millis(500),
        max_upstream_requests: 64,
        shutdown_grace: Duration::from_secs(5),
        replicas: None,
        token_in: None,
        policy_adapters: false,
        extra_body: Default::default(),
    }
}

pub type Answers = Arc<Mutex<Vec<Value>>>;

/// What the proxy talks to; each keeps every answer it gave.
pub enum Upstream {
    Fake(Arc<FakeUpstream>),
    /// The real engine behind [`recording_relay`].
    Engine(Answers),
}

impl Upstream {
    pub fn answers(&self) -> Vec<Value> {
        match self {
            Upstream::Fake(f) => f.answers.lock().unwrap().clone(),
            Upstream::Engine(a) => a.lock().unwrap().clone(),
        }
    }

    /// The policy version its answers report.
    pub fn policy_version(&self) -> i64 {
        match self {
            Upstream::Fake(_) => fake_upstream::POLICY_VERSION,
            Upstream::Engine(_) => 0,
        }
    }
}

impl Rig {
    /// A proxy in front of the fake upstream.
    pub async fn start(stream: StreamConfig, options: FakeOptions, run_prefix: &str) -> Rig {
        let (up_addr, upstream) = fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            FakeOptions {
                keep_answers: true,
                ..options
            },
        )
        .await
        .expect("fake upstream");
        let url = format!("http://{up_addr}");
        Rig::with_upstream(stream, url, Upstream::Fake(upstream), run_prefix).await
    }

    /// A proxy in front of the real engine on SmolLM2 (through a recording relay).
    pub async fn start_on_engine(stream: StreamConfig, run_prefix: &str) -> Rig {
        let (url, answers) =
            recording_relay(forgelog_engine::testing::smollm2().0.base.clone()).await;
        Rig::with_upstream(stream, url, Upstream::Engine(answers), run_prefix).await
    }

    async fn with_upstream(
        stream: StreamConfig,
        upstream_url: String,
        upstream: Upstream,
        run_prefix: &str,
    ) -> Rig {
        let run_id = forgelog_stream::testing::unique_run_id(run_prefix);
        let spool = tempfile::tempdir().unwrap();
        let stream_for_marks = stream.clone();
        let proxy = RunningProxy::start(
            config(upstream_url.clone(), &run_id),
            &stream,
            spool.path().to_path_buf(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .await
        .expect("proxy starts");
        Rig {
            proxy,
            upstream,
            run_id,
            stream,
            http: reqwest::Client::new(),
            marks: topic_ends(&stream_for_marks).await,
            upstream_url,
            spool,
        }
    }

    /// Stops the proxy and starts a new one for the same run on the same spool.
    pub async fn restart(self) -> Rig {
        self.proxy
            .shutdown(Duration::from_secs(60))
            .await
            .expect("proxy stops");
        let proxy = RunningProxy::start(
            config(self.upstream_url.clone(), &self.run_id),
            &self.stream,
            self.spool.path().to_path_buf(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .await
        .expect("proxy starts again");
        Rig { proxy, ..self }
    }

    pub async fn post(&self, path: &str, auth: Option<&str>, body: &Value) -> (u16, Value) {
        let mut r = self
            .http
            .post(format!("{}{path}", self.proxy.url()))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(a) = auth {
            r = r.header("authorization", format!("Bearer {a}"));
        }
        let resp = r.send().await.expect("proxy answers");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())),
        )
    }

    /// The proxy's session API, as the orchestrator holds it.
    pub fn sessions(&self) -> SessionClient {
        SessionClient::with_http(self.proxy.url(), Some(ADMIN.into()), self.http.clone())
    }

    /// Creates a session; returns (session_id, api_key).
    pub async fn session(&self, rollout: &str) -> (String, String) {
        self.session_with(rollout, |s| s).await
    }

    /// A session with more settings (`max_model_calls`, `max_tokens`...).
    pub async fn session_with(
        &self,
        rollout: &str,
        settings: impl FnOnce(NewSession) -> NewSession,
    ) -> (String, String) {
        let new = settings(NewSession::new(rollout, "task-1", "sdk-test", "g1").group_size(2));
        let created = self.sessions().create(&new).await.expect("session created");
        (created.session_id, created.api_key)
    }

    /// Finishes a session with exit status 0 and this verdict (`None`: the verifier did not run).
    pub async fn finish(&self, session: &str, verifier: Option<Verdict>) -> Finished {
        let finish = Finish {
            exit_status: Some(0),
            verifier,
            ..Default::default()
        };
        self.sessions()
            .finish(session, &finish)
            .await
            .expect("session finished")
    }

    /// Waits until the broker has every event sent so far.
    pub async fn flush(&self) {
        self.proxy
            .state
            .events
            .as_ref()
            .expect("the capture proxy records")
            .flush(Duration::from_secs(60))
            .await
            .expect("events reach the broker");
    }

    pub async fn events(&self, topic: Topic) -> Vec<Event> {
        read_events(&self.stream, topic, &self.run_id, &self.marks).await
    }

    /// Every ok CallFinished in `calls` carries what some upstream answer had.
    pub fn assert_calls_match_upstream(&self, calls: &[CallFinished]) {
        let answers = self.upstream.answers();
        forgelog_producers::fake_upstream::assert_calls_match(
            calls,
            &answers,
            self.upstream.policy_version(),
        );
    }
}

/// A pass-through in front of `target` that keeps every chat completion answer
/// it relays: what the engine really returned, to compare the log with.
pub async fn recording_relay(target: String) -> (String, Answers) {
    use axum::body::Bytes;
    use axum::http::{Method, StatusCode, Uri};
    let answers = Answers::default();
    let (kept, client) = (answers.clone(), reqwest::Client::new());
    let forward = move |method: Method, uri: Uri, body: Bytes| {
        let (kept, client, target) = (kept.clone(), client.clone(), target.clone());
        async move {
            let url = format!("{target}{uri}");
            let r = client
                .request(method, url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("the engine answers the relay");
            let status = StatusCode::from_u16(r.status().as_u16()).unwrap();
            let bytes = r.bytes().await.unwrap();
            if uri.path() == "/v1/chat/completions" {
                if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                    kept.lock().unwrap().push(v);
                }
            }
            (status, bytes)
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(forward);
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), answers)
}

/// The end offset of every partition of the proxy's topics.
pub async fn topic_ends(stream: &StreamConfig) -> Vec<(Topic, i32, i64)> {
    let stream = stream.clone();
    tokio::task::spawn_blocking(move || {
        let reader = ReplayReader::new(&stream).unwrap();
        let mut marks = Vec::new();
        for topic in [Topic::Calls, Topic::Rollouts, Topic::Rewards] {
            for p in reader.partitions(topic.name()).unwrap() {
                marks.push((topic, p, reader.end(topic.name(), p).unwrap()));
            }
        }
        marks
    })
    .await
    .unwrap()
}

/// The run's events on `topic` written after `marks` (the shared topics hold
/// every past run), calls made whole.
pub async fn read_events(
    stream: &StreamConfig,
    topic: Topic,
    run_id: &str,
    marks: &[(Topic, i32, i64)],
) -> Vec<Event> {
    let (stream, run_id) = (stream.clone(), run_id.to_string());
    let marks: Vec<(i32, i64)> = marks
        .iter()
        .filter(|m| m.0 == topic)
        .map(|m| (m.1, m.2))
        .collect();
    tokio::task::spawn_blocking(move || {
        let reader = ReplayReader::new(&stream).unwrap();
        let mut out = Vec::new();
        for (p, from) in marks {
            let to = reader.end(topic.name(), p).unwrap();
            let _all_read = reader
                .for_each_in(topic.name(), p, from, to, |r| {
                    if r.in_run(Some(&run_id)) {
                        out.push(r.event.expect("decodable event"));
                    }
                    std::ops::ControlFlow::Continue(())
                })
                .unwrap();
        }
        // Calls whole again, as every reader of the log sees them (schema v5).
        let errors = forgelog_schemas::compact::expand_events(&mut out);
        assert!(errors.is_empty(), "{errors:?}");
        out
    })
    .await
    .unwrap()
}

pub fn calls_of(events: &[Event], session: &str) -> (usize, Vec<CallFinished>) {
    let started = events
        .iter()
        .filter(|e| matches!(e, Event::CallStarted(s) if s.session_id == session))
        .count();
    let finished = events
        .iter()
        .filter_map(|e| match e {
            Event::CallFinished(f) if f.session_id == session => Some(f.clone()),
            _ => None,
        })
        .collect();
    (started, finished)
}
