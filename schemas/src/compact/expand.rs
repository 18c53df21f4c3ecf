//! The reader's side: every call made whole again from the events of its
//! session, each splice applied after its base.

use super::Splice;
use crate::{CallFinished, CallStarted};
use std::collections::BTreeMap;

/// A field that could not be made whole: its base is not among the events given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandError {
    pub session_id: String,
    pub call_index: i64,
    pub field: &'static str,
    pub reason: String,
}

impl std::fmt::Display for ExpandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "call {} of session {}: {} cannot be made whole: {}",
            self.call_index, self.session_id, self.field, self.reason
        )
    }
}

/// A call of a session: what a splice's `base_call` is looked up by.
trait SessionCall {
    fn call_key(&self) -> (&str, &str, i64);
}

impl SessionCall for CallStarted {
    fn call_key(&self) -> (&str, &str, i64) {
        (&self.run_id, &self.session_id, self.call_index)
    }
}

impl SessionCall for CallFinished {
    fn call_key(&self) -> (&str, &str, i64) {
        (&self.run_id, &self.session_id, self.call_index)
    }
}

/// One field that may be stored as a splice.
trait SplicedField {
    type Event: SessionCall;
    type Item: Clone;
    const NAME: &'static str;
    fn splice(e: &Self::Event) -> Option<Splice>;
    fn stored(e: &Self::Event) -> &[Self::Item];
    /// The whole value later calls' splices of this field refer to.
    fn base(e: &Self::Event) -> Vec<Self::Item>;
    /// Puts the whole value back and clears the splice; on failure, leaves the
    /// field empty (what an event without it has always meant: not known).
    fn set_whole(e: &mut Self::Event, whole: Result<Vec<Self::Item>, String>);
}

struct RawRequest;
struct PromptIds;
struct ChatRequest;

impl SplicedField for RawRequest {
    type Event = CallStarted;
    type Item = u8;
    const NAME: &'static str = "raw_request";
    fn splice(e: &CallStarted) -> Option<Splice> {
        e.raw_request_splice
    }
    fn stored(e: &CallStarted) -> &[u8] {
        &e.raw_request
    }
    fn base(e: &CallStarted) -> Vec<u8> {
        e.raw_request.clone()
    }
    fn set_whole(e: &mut CallStarted, whole: Result<Vec<u8>, String>) {
        e.raw_request_splice = None;
        e.raw_request = whole.unwrap_or_default();
    }
}

impl SplicedField for PromptIds {
    type Event = CallFinished;
    type Item = u32;
    const NAME: &'static str = "prompt_token_ids";
    fn splice(e: &CallFinished) -> Option<Splice> {
        e.prompt_splice
    }
    fn stored(e: &CallFinished) -> &[u32] {
        &e.prompt_token_ids
    }
    fn base(e: &CallFinished) -> Vec<u32> {
        [&e.prompt_token_ids[..], &e.completion_token_ids[..]].concat()
    }
    fn set_whole(e: &mut CallFinished, whole: Result<Vec<u32>, String>) {
        e.prompt_splice = None;
        match whole {
            Ok(ids) => e.prompt_token_ids = ids,
            Err(why) => {
                // Without its prompt a call is not trainable; say why where readers look.
                e.prompt_token_ids = Vec::new();
                e.trainable = false;
                let why = format!("prompt ids not recoverable: {why}");
                e.untrainable_reason = Some(why.clone());
                e.error = Some(match e.error.take() {
                    Some(old) => format!("{old}; {why}"),
                    None => why,
                });
            }
        }
    }
}

impl SplicedField for ChatRequest {
    type Event = CallFinished;
    type Item = u8;
    const NAME: &'static str = "chat_request";
    fn splice(e: &CallFinished) -> Option<Splice> {
        e.chat_request_splice
    }
    fn stored(e: &CallFinished) -> &[u8] {
        e.chat_request.as_bytes()
    }
    fn base(e: &CallFinished) -> Vec<u8> {
        e.chat_request.as_bytes().to_vec()
    }
    fn set_whole(e: &mut CallFinished, whole: Result<Vec<u8>, String>) {
        e.chat_request_splice = None;
        e.chat_request = whole
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
    }
}

/// Makes one field of every event whole, each splice applied after its base's.
fn expand<F: SplicedField>(events: &mut [F::Event]) -> Vec<ExpandError> {
    let position: BTreeMap<(String, String, i64), usize> = events
        .iter()
        .enumerate()
        .rev() // the first of duplicates wins
        .map(|(i, e)| {
            let (run, session, call) = e.call_key();
            ((run.to_string(), session.to_string(), call), i)
        })
        .collect();
    let mut errors = Vec::new();
    let mut fail = |e: &mut F::Event, reason: String| {
        let (_, session, call) = e.call_key();
        errors.push(ExpandError {
            session_id: session.to_string(),
            call_index: call,
            field: F::NAME,
            reason: reason.clone(),
        });
        F::set_whole(e, Err(reason));
    };
    // Bases are usually earlier in the slice: one pass, rarely two.
    loop {
        let mut progress = false;
        for i in 0..events.len() {
            let Some(s) = F::splice(&events[i]) else {
                continue;
            };
            let (run, session, _) = events[i].call_key();
            let key = (run.to_string(), session.to_string(), s.base_call);
            match position.get(&key) {
                None => fail(
                    &mut events[i],
                    format!(
                        "it is stored relative to call {}, which is not in the log",
                        s.base_call
                    ),
                ),
                Some(&j) if F::splice(&events[j]).is_some() => continue,
                Some(&j) => {
                    let whole = s.apply(&F::base(&events[j]), F::stored(&events[i]));
                    match whole {
                        Ok(w) => F::set_whole(&mut events[i], Ok(w)),
                        Err(why) => fail(&mut events[i], why),
                    }
                }
            }
            progress = true;
        }
        if !progress {
            break;
        }
    }
    for e in events.iter_mut().filter(|e| F::splice(e).is_some()) {
        fail(e, "its splices refer to each other in a cycle".into());
    }
    errors
}

/// Makes every call's prompt ids and chat form whole. `calls` may hold many
/// sessions, in any order; each splice needs its base call among them. What
/// cannot be made whole is left empty (the prompt's call untrainable, saying
/// why) and returned.
pub fn expand_finished(calls: &mut [CallFinished]) -> Vec<ExpandError> {
    let mut errors = expand::<PromptIds>(calls);
    errors.extend(expand::<ChatRequest>(calls));
    errors
}

/// Makes every call's raw request whole, as [`expand_finished`] does.
pub fn expand_started(calls: &mut [CallStarted]) -> Vec<ExpandError> {
    expand::<RawRequest>(calls)
}

/// [`expand_finished`] and [`expand_started`] over a mixed list of events.
pub fn expand_events(events: &mut [crate::Event]) -> Vec<ExpandError> {
    use crate::Event;
    fn each<E: Clone>(
        events: &mut [Event],
        take: impl Fn(&Event) -> Option<&E>,
        put: impl Fn(&mut Event) -> Option<&mut E>,
        expand: impl Fn(&mut [E]) -> Vec<ExpandError>,
    ) -> Vec<ExpandError> {
        let mut calls: Vec<E> = events.iter().filter_map(&take).cloned().collect();
        let errors = expand(&mut calls);
        for (slot, whole) in events.iter_mut().filter_map(put).zip(calls) {
            *slot = whole;
        }
        errors
    }
    let mut errors = each(
        events,
        |e| match e {
            Event::CallStarted(c) => Some(c),
            _ => None,
        },
        |e| match e {
            Event::CallStarted(c) => Some(c),
            _ => None,
        },
        expand_started,
    );
    errors.extend(each(
        events,
        |e| match e {
            Event::CallFinished(c) => Some(c),
            _ => None,
        },
        |e| match e {
            Event::CallFinished(c) => Some(c),
            _ => None,
        },
        expand_finished,
    ));
    errors
}
