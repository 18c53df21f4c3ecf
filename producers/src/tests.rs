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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_and_its_calls_are_recorded_in_any_event_sink() {
    let (proxy, log, _) = fast_proxy(Default::default(), None, |c| ProxyConfig {
        run_id: Some("fast".into()),
        ..c
    })
    .await;
    let sessions = SessionClient::new(proxy.url(), None);
    let s = sessions
        .create(&NewSession::new("r1", "t", "sdk", "g").group_size(1))
        .await
        .unwrap();
    for (i, body) in [
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        serde_json::json!({"model": "m", "messages": "not a list"}),
    ]
    .into_iter()
    .enumerate()
    {
        let r = chat(&proxy, &s.api_key, body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), [200, 400][i]);
    }
    // An absurd reward is refused (it would turn its group's advantages to
    // NaN) and the session stays open for the corrected verdict.
    let absurd = sessions
        .finish(
            &s.session_id,
            &Finish {
                verifier: Some(Verdict::scored(1e300, "")),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(absurd.status(), Some(400), "{absurd}");
    let done = sessions
        .finish(
            &s.session_id,
            &Finish {
                exit_status: Some(0),
                verifier: Some(Verdict::scored(1.0, "")),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(done.model_calls, 2);
    proxy.shutdown(Duration::from_secs(5)).await.unwrap();

    let calls = log.events(Topic::Calls.name());
    let finished = finished(&log, |c| (c.call_index, c.status, c.trainable));
    assert_eq!(calls.len(), 4, "started and finished, twice");
    assert_eq!(
        finished,
        [
            (0, CallStatus::Ok, true),
            (1, CallStatus::ClientError, false)
        ]
    );
    let kinds: Vec<&str> = log
        .events(Topic::Rollouts.name())
        .iter()
        .map(|e| e.kind().name())
        .collect();
    assert_eq!(kinds, ["RolloutStarted", "RolloutFinished"]);
    let rewards = log.events(Topic::Rewards.name());
    assert!(matches!(&rewards[..], [Event::VerifierResult(v)] if v.reward == Some(1.0)));
}

/// The session API answers the admin token only, and checks it before it
/// reads a body: an unauthenticated endless upload is refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_api_wants_the_admin_token_before_any_body() {
    let (proxy, _) = guarded_proxy("auth").await;
    let new = NewSession::new("r", "t", "h", "g");
    let refused = SessionClient::new(proxy.url(), Some("wrong".into()))
        .create(&new)
        .await
        .unwrap_err();
    assert_eq!(refused.status(), Some(401), "{refused}");
    let finish = SessionClient::new(proxy.url(), None)
        .finish("any", &Finish::default())
        .await
        .unwrap_err();
    assert_eq!(finish.status(), Some(401), "{finish}");
    let created = SessionClient::new(proxy.url(), Some("secret".into()))
        .create(&new)
        .await
        .unwrap();
    assert!(created.api_key.starts_with("fl-"));

    // 1 MiB a second for a minute, no token: the answer comes first, on every
    // route that takes a body (count_tokens used to buffer it all first).
    for path in [
        "/sessions",
        "/v1/messages/count_tokens",
        "/v1/chat/completions",
    ] {
        let endless = futures::stream::unfold(0u32, |n| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            (n < 60).then(|| (Ok::<_, std::io::Error>(vec![b' '; 1 << 20]), n + 1))
        });
        let started = std::time::Instant::now();
        let answered = reqwest::Client::new()
            .post(format!("{}{path}", proxy.url()))
            .body(reqwest::Body::wrap_stream(endless))
            .send()
            .await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{path}: {:?}",
            started.elapsed()
        );
        assert_eq!(answered.unwrap().status().as_u16(), 401, "{path}");
    }
    // With the token, session requests are still limited.
    let oversize = reqwest::Client::new()
        .post(format!("{}/sessions", proxy.url()))
        .bearer_auth("secret")
        .body(vec![b' '; server::SESSION_BODY_LIMIT + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(oversize.status().as_u16(), 413);
}

/// Blank ids and sizes below 1 are refused, saying which, and nothing is
/// recorded of them: found by probing `POST /sessions`, which took them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_with_a_blank_id_or_a_size_below_1_is_refused() {
    let (proxy, log) = guarded_proxy("checked").await;
    let admin = SessionClient::new(proxy.url(), Some("secret".into()));
    let refused = [
        (
            NewSession::new(" ", "t", "sdk", "g"),
            "'rollout_id' must not be blank",
        ),
        (
            NewSession::new("r9", "t", "", "g"),
            "'harness' must not be blank",
        ),
        (
            NewSession::new("r9", "t", "sdk", "g").in_run(""),
            "'run_id' must not be blank",
        ),
        (
            NewSession::new("r9", "t", "sdk", "g").group_size(0),
            "'group_size' must be 1 or more, not 0",
        ),
        (
            NewSession::new("r9", "t", "sdk", "g").max_tokens(-5),
            "'max_tokens' must be 1 or more, not -5",
        ),
    ];
    for (new, why) in refused {
        let err = admin.create(&new).await.unwrap_err();
        assert_eq!(err.status(), Some(400), "{new:?}: {err}");
        assert!(
            err.to_string()
                .contains(&format!("bad session request: {why}")),
            "{err}"
        );
    }
    assert!(
        log.events(Topic::Rollouts.name()).is_empty(),
        "nothing recorded of them"
    );
    // The rollout they named was not taken: it opens now.
    admin
        .create(&NewSession::new("r9", "t", "sdk", "g"))
        .await
        .unwrap();
}

/// A call whose start and end do not both fit where events wait for the
/// broker is refused as unavailable (503, in the dialect's words: a later
/// try may pass), and every call answered is recorded whole. Found by probing
/// a spool on a full disk: the refusal was a 500, and a call whose start fit
/// but whose end did not was answered with its end lost. A real spool here,
/// capped, with no broker to drain it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_spool_has_no_room_for_is_refused_as_unavailable_and_answers_are_whole() {
    let (up, _fake) = fake_upstream::spawn("127.0.0.1:0".parse().unwrap(), Default::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dead = forgelog_stream::testing::free_local_addr().to_string();
    let mut stream = forgelog_stream::StreamConfig::new(dead);
    stream.claims.location = dir.path().join("claims").display().to_string();
    stream.claims.max_record_bytes = 4 << 10;
    let options = forgelog_stream::SpoolOptions {
        max_bytes: 64 << 10,
        ..Default::default()
    };
    let producer =
        forgelog_stream::EventProducer::start(&stream, dir.path().join("spool"), options);
    let producer = Arc::new(producer.unwrap());
    let config = ProxyConfig {
        run_id: Some("full".into()),
        ..ProxyConfig::new(format!("http://{up}"))
    };
    let state = Arc::new(ProxyState::new(
        config,
        producer.clone(),
        Default::default(),
    ));
    let proxy = RunningProxy::serve(state, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let key = session(&proxy, NewSession::new("r", "t", "sdk", "g"))
        .await
        .api_key;
    let http = reqwest::Client::new();
    let chat = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x ".repeat(600)}]});
    let mut answered = 0u64;
    let refused = loop {
        let r = http
            .post(format!("{}/v1/chat/completions", proxy.url()))
            .bearer_auth(&key)
            .json(&chat)
            .send()
            .await
            .unwrap();
        if r.status() != 200 {
            break r;
        }
        answered += 1;
        assert!(answered < 100, "the spool never filled");
    };
    assert_eq!(refused.status(), 503);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["type"], "api_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("spool full"),
        "{body}"
    );
    assert!(answered >= 2, "{answered} calls before the spool was full");
    // The session's start, and each answered call's start and end.
    assert_eq!(producer.spool().pending(), 1 + 2 * answered);
    // Refused while a largest record's room was left (its end must fit),
    // not once a start no longer fit.
    let left = (64 << 10) - producer.spool().bytes();
    assert!(left >= 4 << 10, "refused with {left} bytes left");
    // A new session is not opened either: its start would fit, its end and
    // verdict not.
    let admin = SessionClient::new(proxy.url(), None);
    let new = NewSession::new("r2", "t", "sdk", "g");
    let err = admin.create(&new).await.unwrap_err();
    assert_eq!(err.status(), Some(503), "{err}");
    assert!(
        err.to_string().contains("cannot record the rollout"),
        "{err}"
    );
}

/// An attempt that never reached the model is recorded as abandoned when the
/// orchestrator asks (it runs the rollout again); one that did is not, and
/// an attempt whose session this proxy never held gets an abandoned verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_are_abandoned_only_before_their_first_model_call() {
    let (proxy, log, _) = fast_proxy(Default::default(), Some(probed()), |c| ProxyConfig {
        run_id: Some("retry".into()),
        ..c
    })
    .await;
    let sessions = SessionClient::new(proxy.url(), None);
    let give_up = Finish {
        exit_status: None,
        verifier: Some(Verdict::failed("infra:sandbox")),
        abandon_if_unused: true,
    };
    let unused = sessions
        .create(&NewSession::new("r0", "t", "h", "g"))
        .await
        .unwrap();
    let done = sessions.finish(&unused.session_id, &give_up).await.unwrap();
    assert!(done.abandoned);

    let used = sessions
        .create(&NewSession::new("r1", "t", "h", "g"))
        .await
        .unwrap();
    let r = chat(
        &proxy,
        &used.api_key,
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .send()
    .await
    .unwrap();
    assert!(r.status().is_success());
    let done = sessions.finish(&used.session_id, &give_up).await.unwrap();
    assert!(
        !done.abandoned,
        "its calls are in the log: it stays a member"
    );

    let gone = forgelog_api::AbandonAttempt {
        run_id: None,
        rollout_id: "r2".into(),
        why: "orchestrator died".into(),
    };
    assert!(sessions.abandon(&gone).await.unwrap().abandoned);
    proxy.shutdown(Duration::from_secs(5)).await.unwrap();

    let mut verdicts: Vec<(String, bool, bool)> = log
        .events(Topic::Rewards.name())
        .into_iter()
        .map(|e| match e {
            Event::VerifierResult(v) => (v.rollout_id, v.ok, v.abandoned),
            other => panic!("{other:?}"),
        })
        .collect();
    verdicts.sort();
    assert_eq!(
        verdicts,
        [
            ("r0".to_string(), false, true),
            ("r1".to_string(), false, false),
            ("r2".to_string(), false, true)
        ]
    );
}

/// A call too large for one event of the log (here: a 3.6 MB prompt, as
/// 14.4 MB of token ids and 3.6 MB of chat form) is recorded without its bodies, keeping its
/// tokens, and says so; it used to jam the spool for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_too_large_for_the_log_is_recorded_without_its_bodies() {
    let (proxy, log, _) = fast_proxy(Default::default(), None, |c| ProxyConfig {
        run_id: Some("large".into()),
        ..c
    })
    .await;
    let sessions = SessionClient::new(proxy.url(), None);
    let s = sessions
        .create(&NewSession::new("r1", "t", "sdk", "g"))
        .await
        .unwrap();
    let prompt = "a".repeat(3_600_000);
    let r = chat(
        &proxy,
        &s.api_key,
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": prompt}]}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let done = sessions
        .finish(&s.session_id, &Finish::default())
        .await
        .unwrap();
    assert_eq!(done.model_calls, 1);
    proxy.shutdown(Duration::from_secs(5)).await.unwrap();
    let finished = finished(&log, |c| c);
    let [call] = &finished[..] else {
        panic!("one CallFinished expected, got {}", finished.len())
    };
    assert_eq!(call.status, CallStatus::Ok);
    assert!(call.trainable);
    assert!(call.prompt_token_ids.len() > 3_600_000);
    assert!(call.chat_request.is_empty() && call.response_body.is_empty());
    let error = call.error.as_deref().unwrap_or_default();
    assert!(error.contains("recorded without"), "{error}");
}

/// Stopping used to wait on a hanging upstream call (70 s), then leave its
/// `CallStarted` without a `CallFinished`: now it waits the grace, and the
/// call is recorded as interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_bounded_and_records_a_hanging_call_as_interrupted() {
    let (proxy, log, _) = fast_proxy(slow(Duration::from_secs(120)), Some(probed()), |c| {
        ProxyConfig {
            run_id: Some("interrupted".into()),
            shutdown_grace: Duration::from_millis(500),
            ..c
        }
    })
    .await;
    let s = session(&proxy, NewSession::new("r1", "t", "sdk", "g")).await;
    let call = chat(
        &proxy,
        &s.api_key,
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .send();
    let call = tokio::spawn(call);
    while proxy.state.calls_in_flight.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = std::time::Instant::now();
    proxy.shutdown(Duration::from_secs(5)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(call.await.unwrap().is_err(), "the connection was closed");
    let finished = finished(&log, |c| (c.status, c.error));
    assert_eq!(
        finished,
        [(
            CallStatus::UpstreamError,
            Some(server::INTERRUPTED.to_string())
        )]
    );
}

/// A harness hanging up does not cut its call short: the upstream's answer
/// still comes and is recorded, for a plain call and for a streaming one
/// (whose hang-up the proxy sees at its next keep-alive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_harness_hangs_up_is_still_recorded_in_full() {
    let (proxy, log, _) = fast_proxy(slow(Duration::from_millis(700)), Some(probed()), |c| {
        ProxyConfig {
            run_id: Some("hung-up".into()),
            keep_alive: Duration::from_millis(50),
            ..c
        }
    })
    .await;
    let s = session(&proxy, NewSession::new("r1", "t", "sdk", "g")).await;
    let started = |n: usize| {
        let log = log.clone();
        async move {
            let count = || {
                log.events(Topic::Calls.name())
                    .iter()
                    .filter(|e| matches!(e, Event::CallStarted(_)))
                    .count()
            };
            while count() < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    for (n, stream) in [(1, false), (2, true)] {
        let body = serde_json::json!({
            "model": "m", "stream": stream,
            "messages": [{"role": "user", "content": "hi"}],
        });
        let read = async { chat(&proxy, &s.api_key, body).send().await?.bytes().await };
        // The harness hangs up once the proxy has the call (not after a
        // fixed time, which a loaded machine could spend before it arrives).
        tokio::select! {
            answer = read => panic!("the answer came before the harness hung up: {answer:?}"),
            () = started(n) => {}
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !proxy.state.calls_in_flight.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let finished = finished(&log, |c| (c.status, c.completion_token_ids.is_empty()));
    assert_eq!(finished, [(CallStatus::Ok, false), (CallStatus::Ok, false)]);
}

/// The wait for an upstream turn used to be outside the upstream timeout:
/// queued calls outlived `/finish`'s wait, which then counted fewer calls
/// than the log recorded. Now every call ends within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_calls_end_within_the_upstream_timeout_and_finish_counts_them_all() {
    let (proxy, log, _) = fast_proxy(slow(Duration::from_millis(800)), Some(probed()), |c| {
        ProxyConfig {
            run_id: Some("queued".into()),
            upstream_timeout: Duration::from_millis(1200),
            max_upstream_requests: 1,
            ..c
        }
    })
    .await;
    let sessions = SessionClient::new(proxy.url(), None);
    let s = sessions
        .create(&NewSession::new("r1", "t", "sdk", "g"))
        .await
        .unwrap();
    // Ten calls queued on one upstream slot: the last would end 8 s in,
    // past /finish's wait of timeout + 5 s.
    let calls: Vec<_> = (0..10)
        .map(|_| {
            tokio::spawn(
                chat(&proxy, &s.api_key, serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
                    .send(),
            )
        })
        .collect();
    while proxy.state.calls_in_flight.len() < 10 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done = sessions
        .finish(&s.session_id, &Finish::default())
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for c in calls {
        statuses.push(c.await.unwrap().unwrap().status().as_u16());
    }
    assert_eq!(done.model_calls, 10, "answers: {statuses:?}");
    let recorded = log
        .events(Topic::Calls.name())
        .iter()
        .filter(|e| matches!(e, Event::CallFinished(_)))
        .count();
    assert_eq!(recorded, 10);
    assert!(
        statuses.contains(&200) && statuses.iter().any(|s| *s >= 500),
        "{statuses:?}"
    );
    proxy.shutdown(Duration::from_secs(5)).await.unwrap();
}

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
