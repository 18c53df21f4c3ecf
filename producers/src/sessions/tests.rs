use super::*;
use forgelog_schemas::{CallStatus, Event};

fn new(rollout: &str) -> NewSession {
    NewSession::new(rollout, "t", "h", "g")
}

#[test]
fn the_call_budget_runs_out_and_stays_out() {
    let s = Sessions::default();
    let (capped, _) = s
        .create(
            NewSession {
                max_model_calls: Some(2),
                ..new("capped")
            },
            Some("run"),
            4,
            0,
        )
        .unwrap();
    let taken: Vec<bool> = (0..4).map(|_| capped.take_model_call()).collect();
    assert_eq!(taken, [true, true, false, false]);
    let (open, _) = s.create(new("open"), Some("run"), 4, 0).unwrap();
    assert!((0..100).all(|_| open.take_model_call()));
}

#[test]
fn keys_are_unguessable_and_die_with_the_session() {
    let s = Sessions::default();
    let (a, ka) = s.create(new("r1"), Some("run"), 4, 0).unwrap();
    let (_, kb) = s.create(new("r2"), Some("run"), 4, 0).unwrap();
    assert_ne!(ka, kb);
    assert_eq!(ka.len(), 3 + 64);
    assert_eq!(s.by_key(&ka).unwrap().id, a.id);
    assert_eq!(
        s.create(new("r1"), Some("run"), 4, 0).unwrap_err(),
        SessionError::Exists("r1".into())
    );
    s.end(&a.id).unwrap();
    assert!(s.by_key(&ka).is_none());
    assert!(s.by_key(&kb).is_some());
    assert_eq!(
        s.create(new("r3"), None, 4, 0).unwrap_err(),
        SessionError::NoRunId
    );
}

#[test]
fn the_log_projects_to_the_open_sessions_with_their_calls() {
    use forgelog_schemas::testing::call_finished;
    use forgelog_schemas::{Dialect, RolloutFinished};
    let live = Sessions::default();
    let (open, key) = live
        .create(
            NewSession {
                max_model_calls: Some(3),
                ..new("open")
            },
            Some("run"),
            4,
            7,
        )
        .unwrap();
    let (done, _) = live.create(new("done"), Some("run"), 4, 7).unwrap();
    let started = |s: &Session| Event::from(crate::server::record::rollout_started(s, 1, None, 7));
    let call_started = |s: &Session, i: i64| {
        Event::from(crate::server::record::CallIds::of(s, i).started(
            Dialect::OpenaiChat,
            "h",
            "/".into(),
            vec![],
            8,
        ))
    };
    let mut finished = call_finished("run", &open.id, 0, 5, 4);
    finished.status = CallStatus::Ok;
    let events = vec![
        started(&open),
        started(&done),
        call_started(&open, 0),
        finished.into(),
        call_started(&open, 1),
        RolloutFinished {
            run_id: "run".into(),
            event_id: "f".into(),
            rollout_id: "done".into(),
            session_id: done.id.clone(),
            exit_status: None,
            model_calls: 0,
            started_at_ms: 7,
            finished_at_ms: 9,
        }
        .into(),
    ];
    let mut log = SessionLog::default();
    for e in &events {
        log.apply(e);
    }
    assert_eq!(log.open_sessions(), 1);
    assert_eq!(log.unfinished_calls(), [(open.id.clone(), 1)]);
    assert_eq!(log.oldest_open_ms(), Some(7));

    let restarted = Sessions::default();
    let restored = restarted.restore(&log, 4);
    assert_eq!(restored.len(), 1);
    let s = restarted.by_key(&key).expect("the key finds its session");
    assert_eq!((s.id.as_str(), s.restored), (open.id.as_str(), true));
    assert_eq!(s.next_call_index(), 2);
    assert_eq!((s.finished_calls(), s.sampled_tokens()), (1, 4));
    // Budget 3: call 0 and the unfinished call 1 took two.
    assert!(s.take_model_call());
    assert!(!s.take_model_call());
    for rollout in ["done", "open"] {
        assert!(matches!(
            restarted.create(new(rollout), Some("run"), 4, 0),
            Err(SessionError::Exists(_))
        ));
    }
    restarted.end(&s.id).unwrap();
    assert!(matches!(
        restarted.create(new("open"), Some("run"), 4, 0),
        Err(SessionError::Exists(_))
    ));
}

/// Restore finds a session by the hash its log recorded: the hash must not
/// change (this one is Python's `hashlib.sha256`).
#[test]
fn a_key_hashes_as_it_always_has() {
    assert_eq!(
        key_sha256("sk-test"),
        "f3abf2a6cc4f00987743db5f544ba345b4899ae31f326d8ee9c4816de153c9e0"
    );
}
