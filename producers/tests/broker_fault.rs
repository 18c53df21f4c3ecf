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
