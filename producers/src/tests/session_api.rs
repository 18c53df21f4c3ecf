//! The session API: sessions opened, refused, finished and abandoned, and
//! what each records.

use super::*;

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
