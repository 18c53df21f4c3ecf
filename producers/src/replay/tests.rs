use super::*;
use crate::upstream::read_response;
use serde_json::json;

fn rollout(run: &str, session: &str, rollout: &str) -> Event {
    RolloutStarted {
        run_id: run.into(),
        event_id: format!("rs-{rollout}"),
        rollout_id: rollout.into(),
        session_id: session.into(),
        task_id: "t".into(),
        harness: "h".into(),
        group_id: "g".into(),
        group_size: 2,
        policy_version: None,
        started_at_ms: 1,
        max_model_calls: None,
        max_tokens: None,
        api_key_sha256: None,
    }
    .into()
}

fn body(messages: Value) -> Value {
    json!({"model": "m", "messages": messages, "logprobs": true, "stream": false})
}

fn finished(run: &str, session: &str, index: i64, messages: Value) -> CallFinished {
    let mut c = forgelog_schemas::testing::call_finished(run, session, index, 3, 2);
    c.model = "smol".into();
    c.completion_logprobs = vec![-0.25, -1.5];
    c.finish_reason = Some("tool_calls".into());
    c.policy_version = Some(3);
    c.response_body = br#"{"id":"chatcmpl-x","created":1700000000}"#.to_vec();
    c.chat_request = chat_form_text(&body(messages));
    c.chat_response = json!({"role": "assistant", "content": "hi", "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}).to_string();
    c
}

fn recording() -> Recording {
    let m0 = json!([{"role": "user", "content": "Hi"}]);
    let m1 = json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "More"}]);
    let mut failed = finished("run", "s1", 2, json!([]));
    failed.status = CallStatus::UpstreamError;
    failed.error = Some("upstream answered HTTP 500".into());
    failed.chat_request = String::new();
    let events: Vec<Event> = vec![
        rollout("run", "s1", "r1"),
        finished("run", "s1", 1, m1).into(),
        finished("run", "s1", 0, m0).into(),
        failed.into(),
        finished("other-run", "s1", 3, json!([])).into(),
        rollout("run", "s2", "r2"),
    ];
    Recording::from_events("run", &events)
}

#[test]
fn a_recorded_answer_reads_back_as_the_recorded_response() {
    let c = finished("run", "s1", 0, json!([]));
    let (resp, sampled) = read_response(&mut recorded_answer(&c).into(), "p_").unwrap();
    assert_eq!(resp.created, 1_700_000_000);
    assert_eq!(resp.text(), "hi");
    assert_eq!(resp.tool_calls().next().unwrap().arguments, "{\"a\":1}");
    assert_eq!((resp.usage.input, resp.usage.output), (3, 2));
    assert_eq!(sampled.prompt_token_ids, c.prompt_token_ids);
    assert_eq!(sampled.completion_token_ids, c.completion_token_ids);
    assert_eq!(sampled.completion_logprobs, c.completion_logprobs);
    assert_eq!(sampled.policy_version, Some(3));
    assert_eq!(sampled.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(sampled.untrainable_reason, None);
}

#[test]
fn calls_are_answered_by_index_when_the_conversation_matches() {
    let rec = recording();
    assert_eq!(rec.model, "smol");
    assert_eq!(rec.sessions.len(), 2);
    assert_eq!(
        rec.sessions["s1"].calls.len(),
        3,
        "the other run's call is not ours"
    );
    let a = rec
        .answer("s1", 0, &body(json!([{"role": "user", "content": "Hi"}])))
        .unwrap();
    assert_eq!(a["choices"][0]["token_ids"], json!([5, 18]));
    // The same conversation with other sampling and model is the same call.
    let mut other = body(json!([{"role": "user", "content": "Hi"}]));
    other["temperature"] = json!(0.1);
    other["model"] = json!("another");
    assert!(rec.answer("s1", 0, &other).is_ok());
}

#[test]
fn a_changed_message_names_session_call_message_and_field() {
    let rec = recording();
    let changed = body(
        json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "Less"}]),
    );
    let ReplayError::Diverged(d) = rec.answer("s1", 1, &changed).unwrap_err() else {
        panic!()
    };
    assert_eq!(
        (d.session_id.as_str(), d.call_index, d.message),
        ("s1", 1, Some(2))
    );
    assert_eq!(d.field, "messages[2].content");
    let text = d.to_string();
    assert!(
        text.contains("session s1, call 1: message 2 differs")
            && text.contains("recording \"More\", request \"Less\""),
        "{text}"
    );
    let other_role = body(json!([{"role": "system", "content": "Hi"}]));
    let ReplayError::Diverged(d) = rec.answer("s1", 0, &other_role).unwrap_err() else {
        panic!()
    };
    assert_eq!((d.message, d.field.as_str()), (Some(0), "messages[0].role"));
    assert!(
        d.detail.contains("recording \"user\", request \"system\""),
        "{d}"
    );
    // Call 0's request again as call 1, once call 0 has answered.
    let shorter = body(json!([{"role": "user", "content": "Hi"}]));
    let answered = BTreeSet::from([0]);
    let ReplayError::Diverged(d) = rec
        .answer_with("s1", 1, &shorter, &Matching::Strict, &answered)
        .unwrap_err()
    else {
        panic!()
    };
    assert_eq!(d.message, Some(1));
    assert!(
        d.detail
            .contains("the request has 1 messages, the recording 3"),
        "{d}"
    );
    let mut tools = body(json!([{"role": "user", "content": "Hi"}]));
    tools["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
    let ReplayError::Diverged(d) = rec.answer("s1", 0, &tools).unwrap_err() else {
        panic!()
    };
    assert_eq!((d.message, d.field.as_str()), (None, "tools"));
}

#[test]
fn failures_unknown_calls_and_sessions_are_errors() {
    let rec = recording();
    // Recorded without its request (it failed before the upstream): the
    // harness gets the recorded failure whatever it sends now.
    let e = rec
        .answer(
            "s1",
            2,
            &body(json!([{"role": "user", "content": "anything"}])),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            ReplayError::RecordedFailure {
                status: CallStatus::UpstreamError,
                ..
            }
        ),
        "{e}"
    );
    let e = rec.answer("s1", 9, &body(json!([]))).unwrap_err();
    assert_eq!(
        e.to_string(),
        "session s1, call 9: not in the recording (it holds calls 0, 1, 2)"
    );
    assert!(matches!(
        rec.answer("s9", 0, &body(json!([]))),
        Err(ReplayError::UnknownSession { .. })
    ));
}

#[test]
fn replay_sessions_are_asked_for_by_id_or_by_the_original_request() {
    let rec = recording();
    let request = |v: Value| -> ReplaySession { serde_json::from_value(v).unwrap() };
    let by_id = rec
        .new_session(&request(json!({"replay_of": "s2"})))
        .unwrap();
    assert_eq!(by_id.rollout_id, "r2");
    let by_rollout = rec
        .new_session(&request(json!({"replay_of": "r1"})))
        .unwrap();
    assert_eq!(
        (by_rollout.run_id.as_deref(), by_rollout.group_size),
        (Some("run"), Some(2))
    );
    let original = json!({"rollout_id": "r1", "task_id": "t", "harness": "h", "group_id": "g"});
    assert_eq!(
        rec.new_session(&request(original)).unwrap().rollout_id,
        "r1"
    );
    assert!(matches!(
        rec.new_session(&request(json!({"replay_of": "nope"}))),
        Err(ReplayError::UnknownSession { .. })
    ));
    let other_run =
        json!({"run_id": "x", "rollout_id": "r1", "task_id": "t", "harness": "h", "group_id": "g"});
    assert!(rec.new_session(&request(other_run)).is_err());
}

/// mini-swe-agent's replay used to end at its recorded budget stops
/// (refused: recorded with no request) and retry until its timeout: the
/// replay session has the recorded budget, so the proxy stops it there again.
#[test]
fn a_replay_session_keeps_the_recorded_budget() {
    let mut stop = finished("run", "s1", 3, json!([]));
    stop.status = CallStatus::BudgetStop;
    stop.chat_request = String::new();
    let mut events: Vec<Event> = vec![rollout("run", "s1", "r1")];
    for i in 0..3 {
        events.push(finished("run", "s1", i, json!([])).into());
    }
    events.push(stop.into());
    let rec = Recording::from_events("run", &events);
    let request: ReplaySession = serde_json::from_value(json!({"replay_of": "r1"})).unwrap();
    assert_eq!(rec.new_session(&request).unwrap().max_model_calls, Some(3));
    // Recorded since v4: the budget as the session had it.
    let Event::RolloutStarted(mut r) = rollout("run", "s2", "r2") else {
        unreachable!()
    };
    r.max_model_calls = Some(6);
    let rec = Recording::from_events("run", &[r.into()]);
    let request: ReplaySession = serde_json::from_value(json!({"replay_of": "r2"})).unwrap();
    assert_eq!(rec.new_session(&request).unwrap().max_model_calls, Some(6));
}

#[test]
fn the_normaliser_masks_what_cannot_be_the_same_and_nothing_else() {
    let n = Normaliser::known();
    let masked = n.normalise(&json!({
        "a": "Today's date is 2026-11-30. Now 05:29:49.",
        "b": ["session 0f8fad5b-d9cb-469f-a165-70867728950e in /tmp/tmp.Xy12ab/work"],
        "c": "x-anthropic-billing-header: cc_version=2.0.14.3a1; commit 3f2a9c1d0e4b5a6c",
        "d": "Tuesday, December 1, 2026",
        "e": "grep -n main src/lib.rs and 42 files",
        "f": 7,
        "g": "Chunk ID: 1e7e31\nWall time: 0.0012 seconds\nOutput:\nok",
        "h": "Output: step 1\nProcess Group PGID: 35",
    }));
    assert_eq!(masked["a"], "Today's date is <date>. Now <time>.");
    assert_eq!(masked["b"][0], "session <uuid> in <tmp>");
    assert_eq!(
        masked["c"],
        "x-anthropic-billing-header: cc_version=<version>; commit <hash>"
    );
    assert_eq!(masked["d"], "<date>");
    assert_eq!(masked["e"], "grep -n main src/lib.rs and 42 files");
    assert_eq!(masked["f"], 7);
    assert_eq!(
        masked["g"],
        "Chunk ID: <id>\nWall time: <duration>\nOutput:\nok"
    );
    assert_eq!(masked["h"], "Output: step 1\nProcess Group PGID: <pid>");
    let mine = Normaliser::with_volatile(&["seed=\\d+".into()]).unwrap();
    assert_eq!(mine.normalise(&json!("seed=42 ok")), "<volatile> ok");
    assert!(Normaliser::with_volatile(&["(".into()]).is_err());
}

/// Claude Code's system prompt changes between runs (dates, paths, version
/// stamps): a lenient replay answers it from the recording and reports it as
/// explained; a changed task is answered too, and reported as a difference;
/// a strict replay refuses both.
#[test]
fn a_lenient_replay_answers_and_reports_how_each_call_differed() {
    let recorded_messages = json!([
        {"role": "system", "content": "Today is 2026-11-30. cwd: /tmp/run-a1/work. cc_version=2.0.14"},
        {"role": "user", "content": "Fix the bug"},
    ]);
    let events: Vec<Event> = vec![
        rollout("run", "s1", "r1"),
        finished("run", "s1", 0, recorded_messages).into(),
    ];
    let rec = Recording::from_events("run", &events);
    let lenient = Matching::Lenient(Normaliser::known());
    let again = body(json!([
        {"role": "system", "content": "Today is 2026-12-01. cwd: /tmp/run-b2/work. cc_version=2.0.15"},
        {"role": "user", "content": "Fix the bug"},
    ]));
    assert!(matches!(
        rec.answer("s1", 0, &again),
        Err(ReplayError::Diverged(_))
    ));
    let answered = rec
        .answer_with("s1", 0, &again, &lenient, &BTreeSet::new())
        .unwrap();
    assert_eq!(answered.answer["choices"][0]["message"]["content"], "hi");
    let entry = answered.report.expect("reported");
    assert!(entry.explained, "{entry:?}");
    assert_eq!(entry.divergence.message, Some(0));
    assert_eq!(entry.divergence.field, "messages[0].content");

    let changed = body(json!([
        {"role": "system", "content": "Today is 2026-12-01. cwd: /tmp/run-b2/work. cc_version=2.0.15"},
        {"role": "user", "content": "Fix the other bug"},
    ]));
    let answered = rec
        .answer_with("s1", 0, &changed, &lenient, &BTreeSet::new())
        .unwrap();
    let entry = answered.report.expect("reported");
    assert!(
        !entry.explained,
        "a changed task is not volatile: {entry:?}"
    );
    // The first difference is still named where it is (the system prompt).
    assert_eq!(entry.divergence.message, Some(0));
    assert!(answered.answer["choices"][0]["message"].is_object());

    // The same request as recorded: nothing to report.
    let same = rec
        .answer_with("s1", 0, &body(json!([
            {"role": "system", "content": "Today is 2026-11-30. cwd: /tmp/run-a1/work. cc_version=2.0.14"},
            {"role": "user", "content": "Fix the bug"},
        ])), &lenient, &BTreeSet::new())
        .unwrap();
    assert_eq!(same.report, None);
    // Calls that are not in the recording are still refused, once the
    // recorded one they resemble has answered.
    assert!(matches!(
        rec.answer_with("s1", 5, &again, &lenient, &BTreeSet::from([0])),
        Err(ReplayError::NotRecorded { .. })
    ));
}

/// Two sub-agents ran in parallel: recorded as calls 1 and 2, re-sent in the
/// other order. Each is answered by the recorded call it asks the same as
/// (its place in the tree), not by its arrival index; a recorded call answers
/// once; a strict replay accepts it too, since nothing differs.
#[test]
fn calls_made_in_parallel_are_matched_by_what_they_ask_not_by_arrival() {
    let main = json!([{"role": "user", "content": "Split the work"}]);
    let a = json!([{"role": "user", "content": "Sub-task A"}]);
    let b = json!([{"role": "user", "content": "Sub-task B"}]);
    let mut call_a = finished("run", "s1", 1, a.clone());
    call_a.chat_response = json!({"role": "assistant", "content": "A done"}).to_string();
    let mut call_b = finished("run", "s1", 2, b.clone());
    call_b.chat_response = json!({"role": "assistant", "content": "B done"}).to_string();
    let events: Vec<Event> = vec![
        rollout("run", "s1", "r1"),
        finished("run", "s1", 0, main.clone()).into(),
        call_a.into(),
        call_b.into(),
    ];
    let rec = RecordedUpstream::new(Recording::from_events("run", &events), Matching::Strict);
    let text = |mut answer: crate::upstream::UpstreamAnswer| {
        let (resp, _) = read_response(&mut answer, "p_").unwrap();
        resp.text()
    };
    assert_eq!(text(rec.answer("s1", 0, &body(main)).unwrap()), "hi");
    // B arrives first, as call 1.
    assert_eq!(
        text(rec.answer("s1", 1, &body(b.clone())).unwrap()),
        "B done"
    );
    assert_eq!(
        text(rec.answer("s1", 2, &body(a.clone())).unwrap()),
        "A done"
    );
    // Each recorded call answers once: a third identical request has none.
    assert!(rec.answer("s1", 3, &body(b.clone())).is_err());
    assert_eq!(rec.refused().len(), 1, "{:?}", rec.refused());
    assert!(rec.report().is_empty());
    // A new replay of the session starts over.
    rec.session_opened("s1");
    assert_eq!(text(rec.answer("s1", 1, &body(b)).unwrap()), "B done");
}

/// The chat form written as text is the chat form's own text, with tools or
/// without, whatever else the body holds.
#[test]
fn the_chat_form_text_is_the_chat_form_as_text() {
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let messages = json!([{"role": "user", "content": "Hi \"there\"\n"}, {"role": "assistant", "content": null, "tool_calls": []}]);
    for (b, form) in [
        (
            body(messages.clone()),
            json!({"messages": messages, "tools": null}),
        ),
        (
            json!({"model": "m", "messages": messages, "tools": tools, "temperature": 1.0}),
            json!({"messages": messages, "tools": tools}),
        ),
        (
            json!({"model": "m"}),
            json!({"messages": null, "tools": null}),
        ),
    ] {
        assert_eq!(chat_form(&b), form);
        assert_eq!(chat_form_text(&b), form.to_string());
        assert_eq!(chat_form_text(&b), chat_form(&b).to_string());
    }
}
