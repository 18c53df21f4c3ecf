//! A session's calls stored as what is new in them (schema v5).
//!
//! An agent re-sends its whole history on every call, so storing each call's
//! prompt whole makes a session's bytes grow with the square of its length. The
//! proxy stores each call's prompt ids, its raw request and its chat form as a
//! [`Splice`] of an earlier call of the same session: that call's first `prefix`
//! elements, then what the event itself holds, then the earlier call's last
//! `suffix` elements. A call that extends nothing (the first, a sub-agent, a
//! compacted history) is stored whole. Nothing is lost: [`expand_finished`] and
//! [`expand_started`] give every call back whole, byte for byte, from the log
//! alone.
//!
//! What a splice may refer to: only a call of the same session whose event the
//! proxy had recorded before it stored this one ([`SessionMemory`] remembers a
//! call once its event is in the log). Expansion needs the session's events,
//! in any order.

use crate::{CallFinished, CallStarted};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// A field stored relative to call `base_call` of the same session: the base's
/// first `prefix` elements, the field's own content, the base's last `suffix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Splice {
    pub base_call: i64,
    pub prefix: i64,
    pub suffix: i64,
}

/// Length of the common prefix of two slices (compared in chunks: memcmp speed).
pub fn common_prefix<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    const CHUNK: usize = 64;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

fn common_suffix<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

impl Splice {
    /// `new` against `base`: their longest common prefix, then the longest
    /// common suffix of what is left of both.
    pub fn between<T: PartialEq>(base_call: i64, base: &[T], new: &[T]) -> Splice {
        let prefix = common_prefix(base, new);
        let suffix = common_suffix(&base[prefix..], &new[prefix..]);
        Splice {
            base_call,
            prefix: prefix as i64,
            suffix: suffix as i64,
        }
    }

    /// The same for text: both ends on character boundaries, so that what is
    /// stored (the middle) is text too.
    fn between_text(base_call: i64, base: &str, new: &str) -> Splice {
        let mut s = Splice::between(base_call, base.as_bytes(), new.as_bytes());
        while !new.is_char_boundary(s.prefix as usize) {
            s.prefix -= 1;
        }
        while !new.is_char_boundary(new.len() - s.suffix as usize) {
            s.suffix -= 1;
        }
        s
    }

    /// How many elements the base supplies.
    pub fn shared(&self) -> usize {
        (self.prefix + self.suffix) as usize
    }

    /// The whole field again, from its base's whole field and the stored middle.
    pub fn apply<T: Clone>(&self, base: &[T], middle: &[T]) -> Result<Vec<T>, String> {
        let (prefix, suffix) = (self.prefix, self.suffix);
        if prefix < 0 || suffix < 0 || (prefix + suffix) as usize > base.len() {
            return Err(format!(
                "the splice takes {prefix} + {suffix} elements of call {}, which has {}",
                self.base_call,
                base.len()
            ));
        }
        let (prefix, suffix) = (prefix as usize, suffix as usize);
        let mut whole = Vec::with_capacity(prefix + middle.len() + suffix);
        whole.extend_from_slice(&base[..prefix]);
        whole.extend_from_slice(middle);
        whole.extend_from_slice(&base[base.len() - suffix..]);
        Ok(whole)
    }
}

/// How many recent calls of a session a proxy keeps to splice against: a retry
/// or a sub-agent interleaved with its parent still finds its base.
pub const RECENT_CALLS: usize = 4;

/// A splice is worth storing only when it saves at least this many elements.
const WORTH_SPLICING: usize = 16;

/// The last [`RECENT_CALLS`] values of one field, by call index.
#[derive(Debug, Default)]
struct Recent<T>(VecDeque<(i64, T)>);

impl<T> Recent<T> {
    fn remember(&mut self, call: i64, value: T) {
        if self.0.len() == RECENT_CALLS {
            self.0.pop_front();
        }
        self.0.push_back((call, value));
    }

    /// The splice that leaves the least to store (latest on ties), if worth it.
    fn best(&self, splice: impl Fn(i64, &T) -> Splice) -> Option<Splice> {
        self.0
            .iter()
            .map(|(call, v)| splice(*call, v))
            .filter(|s| s.shared() >= WORTH_SPLICING)
            .max_by_key(|s| s.shared())
    }
}

/// `whole` as an event stores it: with `best`, the splice and the middle it
/// leaves; without, no splice and all of it.
fn stored<T: Clone>(best: Option<Splice>, whole: &[T]) -> (Option<Splice>, Vec<T>) {
    match best {
        Some(s) => (
            Some(s),
            whole[s.prefix as usize..whole.len() - s.suffix as usize].to_vec(),
        ),
        None => (None, whole.to_vec()),
    }
}

/// What a proxy remembers of a session to store its next calls compactly.
#[derive(Debug, Default)]
pub struct SessionMemory {
    raw_requests: Recent<Vec<u8>>,
    /// Prompt then completion: what a continuation's prompt starts with.
    tokens: Recent<Vec<u32>>,
    chat_requests: Recent<String>,
}

/// A call's whole fields, taken out of its event by compaction: remembered
/// once the event is recorded ([`SessionMemory::remember`]).
#[derive(Debug)]
pub enum Whole {
    Started {
        call: i64,
        raw_request: Vec<u8>,
    },
    Finished {
        call: i64,
        tokens: Vec<u32>,
        chat_request: Option<String>,
    },
}

impl Whole {
    /// The chat form was not recorded after all (the event was too large and
    /// went without its bodies): later calls must not splice against it.
    pub fn without_chat_request(mut self) -> Whole {
        if let Whole::Finished { chat_request, .. } = &mut self {
            *chat_request = None;
        }
        self
    }
}

impl SessionMemory {
    /// Stores the raw request as a splice of a recent one where that saves.
    pub fn compact_started(&self, e: &mut CallStarted) -> Whole {
        let whole = std::mem::take(&mut e.raw_request);
        let best = self
            .raw_requests
            .best(|call, base| Splice::between(call, base, &whole));
        (e.raw_request_splice, e.raw_request) = stored(best, &whole);
        Whole::Started {
            call: e.call_index,
            raw_request: whole,
        }
    }

    /// Stores the prompt ids and the chat form as splices of recent calls
    /// where that saves. Calls without prompt ids (failures) stay as they are.
    pub fn compact_finished(&self, e: &mut CallFinished) -> Whole {
        let prompt = std::mem::take(&mut e.prompt_token_ids);
        let best = self
            .tokens
            .best(|call, base| Splice::between(call, base, &prompt));
        (e.prompt_splice, e.prompt_token_ids) = stored(best, &prompt);
        let chat = std::mem::take(&mut e.chat_request);
        let best = self
            .chat_requests
            .best(|call, base| Splice::between_text(call, base, &chat));
        let (splice, middle) = stored(best, chat.as_bytes());
        e.chat_request_splice = splice;
        e.chat_request =
            String::from_utf8(middle).expect("a text splice ends on character boundaries");
        // Built at its final size: the prompt's vector comes exactly sized, so
        // appending the completion to it reallocated and copied it every call.
        let tokens = if prompt.is_empty() {
            prompt
        } else {
            [&prompt[..], &e.completion_token_ids[..]].concat()
        };
        Whole::Finished {
            call: e.call_index,
            tokens,
            chat_request: (!chat.is_empty()).then_some(chat),
        }
    }

    /// The call's event is in the log: later calls may splice against it.
    pub fn remember(&mut self, whole: Whole) {
        match whole {
            Whole::Started { call, raw_request } if !raw_request.is_empty() => {
                self.raw_requests.remember(call, raw_request)
            }
            Whole::Started { .. } => {}
            Whole::Finished {
                call,
                tokens,
                chat_request,
            } => {
                if !tokens.is_empty() {
                    self.tokens.remember(call, tokens);
                }
                if let Some(chat) = chat_request {
                    self.chat_requests.remember(call, chat);
                }
            }
        }
    }
}

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

/// What one session's calls cost in the log, as stored and as they would be
/// stored whole, against its final transcript: the last successful call's
/// events stored whole (its whole prompt, request and answer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionVolume {
    pub calls: usize,
    pub log_bytes: usize,
    pub whole_bytes: usize,
    pub transcript_bytes: usize,
}

impl SessionVolume {
    /// From one session's `CallStarted` and `CallFinished` events as the log
    /// holds them (other events are not counted).
    pub fn of<'a>(events: impl IntoIterator<Item = &'a crate::Event>) -> SessionVolume {
        use crate::{Codec, Event};
        let size = |e: &Event| Codec::global().encode(e).map_or(0, |b| b.len());
        let mut stored: Vec<Event> = events
            .into_iter()
            .filter(|e| matches!(e, Event::CallStarted(_) | Event::CallFinished(_)))
            .cloned()
            .collect();
        let log_bytes = stored.iter().map(size).sum();
        expand_events(&mut stored);
        let last_ok = stored
            .iter()
            .filter_map(|e| match e {
                Event::CallFinished(c) if c.status == crate::CallStatus::Ok => Some(c.call_index),
                _ => None,
            })
            .max();
        let transcript_bytes = stored
            .iter()
            .filter(|e| match e {
                Event::CallStarted(c) => Some(c.call_index) == last_ok,
                Event::CallFinished(c) => Some(c.call_index) == last_ok,
                _ => false,
            })
            .map(size)
            .sum();
        SessionVolume {
            calls: stored
                .iter()
                .filter(|e| matches!(e, Event::CallFinished(_)))
                .count(),
            log_bytes,
            whole_bytes: stored.iter().map(size).sum(),
            transcript_bytes,
        }
    }

    /// Bytes in the log per byte of the final transcript.
    pub fn ratio(&self) -> f64 {
        self.log_bytes as f64 / self.transcript_bytes.max(1) as f64
    }

    /// The same, had every call been stored whole.
    pub fn whole_ratio(&self) -> f64 {
        self.whole_bytes as f64 / self.transcript_bytes.max(1) as f64
    }
}

impl std::fmt::Display for SessionVolume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} calls, final transcript {} bytes: {} bytes in the log ({:.2}×), {} stored whole ({:.2}×)",
            self.calls,
            self.transcript_bytes,
            self.log_bytes,
            self.ratio(),
            self.whole_bytes,
            self.whole_ratio()
        )
    }
}
