//! What the log gets when something goes wrong around a call: no room for
//! it, a record too large, a shutdown, a harness that hangs up, a queue.

use super::*;

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
