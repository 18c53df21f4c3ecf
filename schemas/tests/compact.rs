//! Calls stored as splices of earlier calls come back whole, byte for byte.

use forgelog_schemas::compact::{expand_finished, expand_started, SessionMemory, Splice};
use forgelog_schemas::{testing, CallFinished, CallStarted, Codec, Event};
use proptest::prelude::*;

/// Records a session as the proxy does: each event compacted against the
/// calls remembered so far, encoded, then remembered.
fn record(session: &[(CallStarted, CallFinished)]) -> Vec<Vec<u8>> {
    let mut memory = SessionMemory::default();
    let mut log = Vec::new();
    for (started, finished) in session {
        let mut s = started.clone();
        let whole = memory.compact_started(&mut s);
        log.push(Codec::global().encode(&s.into()).unwrap());
        memory.remember(whole);
        let mut f = finished.clone();
        let whole = memory.compact_finished(&mut f);
        log.push(Codec::global().encode(&f.into()).unwrap());
        memory.remember(whole);
    }
    log
}

fn read(log: &[Vec<u8>]) -> (Vec<CallStarted>, Vec<CallFinished>) {
    let (mut started, mut finished) = (Vec::new(), Vec::new());
    for bytes in log {
        match Codec::global().decode(bytes).unwrap() {
            Event::CallStarted(s) => started.push(s),
            Event::CallFinished(f) => finished.push(f),
            e => panic!("{e:?}"),
        }
    }
    (started, finished)
}

#[test]
fn a_growing_session_comes_back_whole_from_a_log_a_fraction_of_its_size() {
    let session = testing::growing_session("r", "s", 55, 4_000);
    let log = record(&session);
    let (mut started, mut finished) = read(&log);
    assert!(finished[1..].iter().all(|f| f.prompt_splice.is_some()));
    assert!(finished[1..]
        .iter()
        .all(|f| f.chat_request_splice.is_some()));
    assert!(started[1..].iter().all(|s| s.raw_request_splice.is_some()));
    assert!(expand_started(&mut started).is_empty());
    assert!(expand_finished(&mut finished).is_empty());
    for ((s, f), (want_s, want_f)) in started.iter().zip(&finished).zip(&session) {
        assert_eq!(s, want_s);
        assert_eq!(f, want_f);
    }
    // Every event is about the size of a turn, where the last call stored
    // whole would be past Kafka's default 1 MiB message limit.
    let largest = log.iter().map(Vec::len).max().unwrap();
    let last_whole = Codec::global()
        .encode(&session[54].1.clone().into())
        .unwrap()
        .len();
    assert!(
        largest < 64 << 10 && last_whole > 1 << 20,
        "{largest} {last_whole}"
    );
    let compact: usize = log.iter().map(Vec::len).sum();
    let whole: usize = session
        .iter()
        .map(|(s, f)| {
            let e = |e: Event| Codec::global().encode(&e).unwrap().len();
            e(s.clone().into()) + e(f.clone().into())
        })
        .sum();
    assert!(
        whole > 20 * compact,
        "whole {whole} bytes, compact {compact}"
    );
}

#[test]
fn expansion_does_not_depend_on_the_order_events_are_read_in() {
    let session = testing::growing_session("r", "s", 23, 50);
    let (started, mut finished) = read(&record(&session));
    finished.reverse();
    let mut started: Vec<_> = started.into_iter().rev().collect();
    assert!(expand_finished(&mut finished).is_empty());
    assert!(expand_started(&mut started).is_empty());
    finished.reverse();
    started.reverse();
    let want: (Vec<_>, Vec<_>) = session.into_iter().unzip();
    assert_eq!((started, finished), want);
}

#[test]
fn a_missing_base_is_named_and_its_call_left_untrainable_not_wrong() {
    let session = testing::growing_session("r", "s", 4, 50);
    let (_, mut finished) = read(&record(&session));
    finished.remove(1);
    let errors = expand_finished(&mut finished);
    // Call 2's prompt and chat form were stored against call 1; call 3's maybe too.
    let call2: Vec<_> = errors.iter().filter(|e| e.call_index == 2).collect();
    assert_eq!(call2.len(), 2, "{errors:?}");
    assert!(
        call2[0]
            .to_string()
            .contains("call 1, which is not in the log"),
        "{}",
        call2[0]
    );
    let c2 = &finished[1];
    assert!(c2.prompt_token_ids.is_empty() && !c2.trainable);
    assert!(c2
        .error
        .as_deref()
        .unwrap()
        .contains("prompt ids not recoverable"));
    assert!(c2.chat_request.is_empty());
    // Call 0 needs nothing.
    assert_eq!(finished[0], session[0].1);
}

#[test]
fn corrupt_splices_are_errors_not_panics() {
    let session = testing::growing_session("r", "s", 3, 20);
    let (_, mut finished) = read(&record(&session));
    finished[1].prompt_splice = Some(Splice {
        base_call: 0,
        prefix: 1 << 40,
        suffix: 0,
    });
    finished[2].chat_request_splice = Some(Splice {
        base_call: 2,
        prefix: 0,
        suffix: 0,
    });
    let errors = expand_finished(&mut finished);
    assert!(errors
        .iter()
        .any(|e| e.call_index == 1 && e.field == "prompt_token_ids"));
    assert!(errors
        .iter()
        .any(|e| e.call_index == 2 && e.reason.contains("cycle")));
    assert!(finished
        .iter()
        .all(|f| f.prompt_splice.is_none() && f.chat_request_splice.is_none()));
}

#[test]
fn calls_that_extend_nothing_are_stored_whole() {
    let a = testing::growing_session("r", "a", 2, 100);
    let b = testing::growing_session("r", "b", 2, 100);
    let mut memory = SessionMemory::default();
    let mut first = a[0].1.clone();
    memory.remember(memory.compact_finished(&mut first));
    // A different conversation (another agent's system prompt and task).
    let mut other = b[1].1.clone();
    other.prompt_token_ids = (0..500).map(|t| 40_000 + t).collect();
    other.chat_request = "{\"messages\":[]}".into();
    let kept = other.clone();
    memory.compact_finished(&mut other);
    assert_eq!(other, kept);
}

#[test]
fn text_splices_never_cut_a_character() {
    let base = "{\"content\":\"héllo wörld ü\"}";
    let new = "{\"content\":\"héllo wörld ü plus ä\"}";
    let mut memory = SessionMemory::default();
    let mut a = testing::call_finished("r", "s", 0, 20, 2);
    a.chat_request = base.repeat(3);
    memory.remember(memory.compact_finished(&mut a));
    let mut b = testing::call_finished("r", "s", 1, 20, 2);
    b.chat_request = format!("{}{}", base.repeat(2), new).replace("ü\"", "ü ü\"");
    let want = b.chat_request.clone();
    memory.compact_finished(&mut b);
    assert!(b.chat_request_splice.is_some());
    let mut calls = vec![a, b];
    assert!(expand_finished(&mut calls).is_empty());
    assert_eq!(calls[1].chat_request, want);
}

proptest! {
    /// Any session of sub-agents, retries and compactions, recorded with any
    /// calls dropped from memory (a restarted proxy), comes back whole.
    #[test]
    fn any_session_comes_back_whole(
        steps in prop::collection::vec((0usize..4, 1usize..40, any::<bool>()), 1..30),
    ) {
        // Up to 4 threads of conversation (a main agent, sub-agents); each step
        // continues one, or compacts it (a new, shorter history), or forgets.
        let mut threads: Vec<Vec<u32>> = vec![Vec::new(); 4];
        let mut texts: Vec<String> = vec![String::new(); 4];
        let mut memory = SessionMemory::default();
        let (mut want, mut log) = (Vec::new(), Vec::new());
        for (i, &(thread, grow, compacts)) in steps.iter().enumerate() {
            if compacts {
                let keep = threads[thread].len() / 3;
                threads[thread].truncate(keep);
                texts[thread] = format!("summary {i}: ");
            }
            threads[thread].extend((0..grow as u32).map(|t| (t * 11 + i as u32) % 50));
            texts[thread].push_str(&format!("step {i} grows by {grow}; "));
            let mut c = testing::call_finished("r", "s", i as i64, 0, grow % 7);
            c.prompt_token_ids = threads[thread].clone();
            c.chat_request = texts[thread].clone();
            want.push(c.clone());
            let whole = memory.compact_finished(&mut c);
            log.push(c);
            if i % 5 != 4 {
                memory.remember(whole);
            }
            threads[thread].extend_from_slice(&want[i].completion_token_ids);
        }
        prop_assert!(expand_finished(&mut log).is_empty());
        prop_assert_eq!(log, want);
    }
}
