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
