//! The broker dies during a run of calls: every harness call still succeeds,
//! and once it is back every event is in the log exactly once.

mod common;
use forgelog_api::Verdict;

use common::*;
use forgelog_schemas::{Event, Topic};
use forgelog_stream::testing::PrivateBroker;
use serde_json::json;
use std::collections::HashMap;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_succeed_while_the_broker_is_down_and_land_exactly_once() {
    let mut broker = PrivateBroker::start().expect("tansu is installed (scripts/setup.sh)");
    forgelog_stream::admin::create_topics(&broker.config(), &Default::default())
        .await
        .expect("topics");
    let rig = Rig::start(broker.config(), Default::default(), "proxy-fault").await;
    let (session, key) = rig.session("r-fault").await;
    let chat = |i: usize| json!({"model": "m", "messages": [{"role": "user", "content": format!("call {i}")}]});
    let mut answered = 0;
    for i in 0..30 {
        if i == 10 {
            broker.kill();
        }
        if i == 20 {
            broker.restart().expect("broker restarts");
        }
        let (status, body) = rig.post("/v1/chat/completions", Some(&key), &chat(i)).await;
        assert_eq!(status, 200, "call {i}: {body}");
        assert_eq!(
            body["choices"][0]["message"]["content"],
            format!("Echo: call {i}")
        );
        answered += 1;
    }
    assert_eq!(answered, 30);
    rig.finish(&session, Some(Verdict::scored(0.5, json!({"tests": 3}))))
        .await;
    rig.flush().await;

    let calls = rig.events(Topic::Calls).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for e in &calls {
        *seen.entry(e.event_id().to_string()).or_default() += 1;
    }
    assert_eq!(calls.len(), 60, "30 CallStarted + 30 CallFinished");
    assert!(
        seen.values().all(|n| *n == 1),
        "duplicates: {:?}",
        seen.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    let (started, finished) = calls_of(&calls, &session);
    assert_eq!((started, finished.len()), (30, 30));
    rig.assert_calls_match_upstream(&finished);
    let rollouts = rig.events(Topic::Rollouts).await;
    assert_eq!(rollouts.len(), 2);
    assert!(rollouts
        .iter()
        .any(|e| matches!(e, Event::RolloutFinished(r) if r.model_calls == 30)));
    assert_eq!(rig.events(Topic::Rewards).await.len(), 1);
}

/// Sessions used to live only in the proxy's memory: after a restart every
/// harness got 401s, and re-creating a finished rollout reused its session id
/// with call indices from 0 (two calls, one event id). The table is now a
/// projection of the log: the restarted proxy serves the open sessions of
/// its run, indices and budgets go on, the call the dead proxy left without
/// an end is recorded as interrupted, and a finished rollout is not reopened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_proxy_serves_the_open_sessions_of_its_run() {
    let stream = forgelog_stream::testing::shared_broker().await;
    let rig = Rig::start(stream, Default::default(), "proxy-restart").await;
    let (open, key) = rig.session_with("r-open", |s| s.max_model_calls(4)).await;
    let (done, _) = rig.session("r-done").await;
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..2 {
        let (status, body) = rig.post("/v1/chat/completions", Some(&key), &chat).await;
        assert_eq!(status, 200, "{body}");
    }
    rig.finish(&done, None).await;
    // A call in flight when the proxy died: started, never finished.
    let session = rig.proxy.state.sessions.by_id(&open).unwrap();
    let orphan = forgelog_producers::server::record::CallIds::of(&session, 2).started(
        forgelog_schemas::Dialect::OpenaiChat,
        "sdk-test",
        "/v1/chat/completions".into(),
        b"{}".to_vec(),
        0,
    );
    let sink = rig.proxy.state.events.clone().unwrap();
    sink.send(&orphan.into()).unwrap();
    // A proxy killed between a rollout's verdict and its end.
    let (half, _) = rig.session("r-half").await;
    let half_session = rig.proxy.state.sessions.by_id(&half).unwrap();
    let finish = forgelog_api::Finish {
        verifier: Some(Verdict::scored(0.5, "")),
        ..Default::default()
    };
    let (_, verdict) =
        forgelog_producers::server::record::rollout_ended(&half_session, &finish, 0, 1);
    sink.send(&verdict.into()).unwrap();
    drop((session, half_session, sink));

    let rig = rig.restart().await;
    let (status, body) = rig.post("/v1/chat/completions", Some(&key), &chat).await;
    assert_eq!(status, 200, "the key works after the restart: {body}");
    // The budget of 4 went on too: 2 calls, the interrupted one, this one.
    let (status, body) = rig.post("/v1/chat/completions", Some(&key), &chat).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.to_string().contains("Budget exhausted"), "{body}");
    let finished = rig.finish(&open, None).await;
    assert_eq!(finished.model_calls, 5);
    rig.sessions().finish(&half, &finish).await.unwrap();
    for rollout in ["r-open", "r-done"] {
        let again = rig
            .sessions()
            .create(&forgelog_api::NewSession::new(rollout, "t", "h", "g"))
            .await
            .unwrap_err();
        assert_eq!(again.status(), Some(409), "{rollout}: {again}");
    }
    rig.flush().await;
    let calls = rig.events(Topic::Calls).await;
    let (started, finished) = calls_of(&calls, &open);
    assert_eq!(started, 5);
    let ends: Vec<(i64, String)> = finished
        .iter()
        .map(|c| (c.call_index, c.error.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        ends.iter().map(|e| e.0).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert!(ends[2].1.contains("restarted"), "{ends:?}");
    let ids: std::collections::BTreeSet<&str> = calls.iter().map(|e| e.event_id()).collect();
    assert_eq!(ids.len(), calls.len(), "an event id twice");
    // The half-finished rollout: its verdict once, its end once.
    let rewards = rig.events(Topic::Rewards).await;
    let verdicts_of_half = rewards
        .iter()
        .filter(|e| matches!(e, Event::VerifierResult(v) if v.rollout_id == "r-half"))
        .count();
    assert_eq!(verdicts_of_half, 1);
    let rollouts = rig.events(Topic::Rollouts).await;
    assert!(rollouts
        .iter()
        .any(|e| matches!(e, Event::RolloutFinished(f) if f.rollout_id == "r-half")));
}

/// Three proxy replicas behind one address, as a Service spreads requests:
/// every session lives on the replica that owns it, and a request reaching
/// another replica is passed on (streams too). Each of twelve sessions is
/// created, called and finished through different replicas; a replica that
/// is down makes its sessions answer 503 (clients retry) and, started again,
/// serves them on from the log, call indices continuing. The log holds each
/// call once, indices 0, 1, 2 for every session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_serve_every_session_whichever_one_a_request_reaches() {
    use forgelog_producers::fake_upstream::{self, FakeOptions};
    use forgelog_producers::server::{ProxyConfig, Replicas, HOP};
    use forgelog_producers::RunningProxy;

    let stream = forgelog_stream::testing::shared_broker().await;
    let (up, _fake) = fake_upstream::spawn("127.0.0.1:0".parse().unwrap(), FakeOptions::default())
        .await
        .unwrap();
    let upstream = format!("http://{up}");
    let run_id = forgelog_stream::testing::unique_run_id("replicas");
    let marks = topic_ends(&stream).await;
    let addrs: Vec<std::net::SocketAddr> = (0..3)
        .map(|_| forgelog_stream::testing::free_local_addr())
        .collect();
    let urls: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
    let spools: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let start = |i: usize| {
        let config = ProxyConfig {
            replicas: Some(Replicas::new(urls.clone(), i).unwrap()),
            ..config(upstream.clone(), &run_id)
        };
        RunningProxy::start(config, &stream, spools[i].path().to_path_buf(), addrs[i])
    };
    let mut proxies = Vec::new();
    for i in 0..3 {
        proxies.push(Some(start(i).await.expect("replica starts")));
    }
    let http = reqwest::Client::new();
    let api = |i: usize| {
        forgelog_api::SessionClient::with_http(urls[i].clone(), Some(ADMIN.into()), http.clone())
    };
    let chat = |key: &str, via: usize, stream: bool| {
        http.post(format!("{}/v1/chat/completions", urls[via]))
            .bearer_auth(key)
            .json(&json!({"model": "m", "stream": stream,
                          "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };

    let owner = Replicas::new(urls.clone(), 0).unwrap();
    let mut sessions = Vec::new();
    for n in 0..12 {
        let new = forgelog_api::NewSession::new(format!("r{n}"), "t", "h", "g");
        let created = api(n % 3)
            .create(&new)
            .await
            .expect("created through any replica");
        sessions.push((created.session_id, created.api_key));
    }
    let owners: std::collections::BTreeSet<usize> = sessions
        .iter()
        .map(|(id, _)| owner.owner_of_session(id))
        .collect();
    assert!(
        owners.len() >= 2,
        "all twelve sessions on one replica: {owners:?}"
    );
    for (n, (_, key)) in sessions.iter().enumerate() {
        for (call, via) in [(n + 1) % 3, (n + 2) % 3].into_iter().enumerate() {
            let answer = chat(key, via, call == 1).await.unwrap();
            assert_eq!(answer.status(), 200, "session {n} via replica {via}");
            let body = answer.text().await.unwrap();
            if call == 1 {
                assert!(
                    body.contains("data: [DONE]"),
                    "a stream passed on whole: {body}"
                );
            }
        }
    }
    // A session API request that another replica passed on lands where it
    // is meant to: one sent straight to the wrong replica is refused.
    let (victim, _) = &sessions[0];
    let holder = owner.owner_of_session(victim);
    let stray = http
        .post(format!("{}/sessions", urls[(holder + 1) % 3]))
        .bearer_auth(ADMIN)
        .header(HOP, "9")
        .json(&json!({"rollout_id": "r0", "task_id": "t", "harness": "h", "group_id": "g"}))
        .send()
        .await
        .unwrap();
    assert_eq!(stray.status(), 421, "{}", stray.text().await.unwrap());

    // The owner of session 0 goes down: its calls answer 503 through the others.
    proxies[holder]
        .take()
        .unwrap()
        .shutdown(std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let key0 = sessions[0].1.clone();
    let down = chat(&key0, (holder + 1) % 3, false).await.unwrap();
    assert_eq!(down.status(), 503);
    assert!(down.text().await.unwrap().contains("replica_unavailable"));
    proxies[holder] = Some(start(holder).await.expect("replica starts again"));

    for (n, (id, key)) in sessions.iter().enumerate() {
        let answer = chat(key, n % 3, false).await.unwrap();
        assert_eq!(answer.status(), 200, "session {n} after the restart");
        let finish = forgelog_api::Finish {
            exit_status: Some(0),
            verifier: Some(Verdict::scored(1.0, "")),
            ..Default::default()
        };
        let finished = api((n + 2) % 3).finish(id, &finish).await.unwrap();
        assert_eq!(finished.model_calls, 3, "session {n}");
    }
    for p in proxies.into_iter().flatten() {
        p.shutdown(std::time::Duration::from_secs(30))
            .await
            .unwrap();
    }
    let calls = read_events(&stream, Topic::Calls, &run_id, &marks).await;
    for (n, (id, _)) in sessions.iter().enumerate() {
        let (started, finished) = calls_of(&calls, id);
        let indices: Vec<i64> = finished.iter().map(|c| c.call_index).collect();
        assert_eq!((started, indices), (3, vec![0, 1, 2]), "session {n}");
    }
    let ids: std::collections::BTreeSet<&str> = calls.iter().map(|e| e.event_id()).collect();
    assert_eq!(ids.len(), calls.len(), "an event id twice");
    let rollouts = read_events(&stream, Topic::Rollouts, &run_id, &marks).await;
    assert_eq!(rollouts.len(), 24, "a start and an end per session");
}

/// A proxy stopped as SIGTERM stops it, with a call hung upstream, leaves
/// a spool that says what the broker has: every event delivered (the hung
/// call's among them, as interrupted), none pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_proxy_leaves_no_delivered_event_pending_in_its_spool() {
    let stream = forgelog_stream::testing::shared_broker().await;
    let rig = Rig::start(stream, Default::default(), "proxy-stop").await;
    let (_, key) = rig.session("r").await;
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "[hang]"}]});
    let url = format!("{}/v1/chat/completions", rig.proxy.url());
    let call = tokio::spawn(rig.http.post(url).bearer_auth(key).json(&chat).send());
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let Rig { proxy, spool, .. } = rig;
    proxy
        .shutdown(std::time::Duration::from_secs(30))
        .await
        .expect("proxy stops");
    let left = forgelog_stream::SpoolStatus::read(spool.path()).unwrap();
    // The session, its call started, and finished as interrupted: the
    // checkpoint says the broker has all three.
    assert_eq!((left.pending, left.acked_through), (0, 3), "{left:?}");
    call.abort();
}
