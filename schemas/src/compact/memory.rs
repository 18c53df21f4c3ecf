//! The proxy's side: what it remembers of a session to store each new call
//! as a splice of a recent one.

use super::Splice;
use crate::{CallFinished, CallStarted};
use std::collections::VecDeque;

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

    /// The splice of `new` that leaves the least to store (latest on ties),
    /// if worth it. Newest first, and a call that could share no more than
    /// the best so far (it is no longer than that) is not compared at all: a
    /// growing session's latest call is its longest, so only that one is.
    /// Each comparison reads a base of the whole conversation's size.
    fn best<E>(&self, new: &[E], splice: impl Fn(i64, &T) -> Splice) -> Option<Splice>
    where
        T: AsRef<[E]>,
    {
        let mut best: Option<Splice> = None;
        for (call, base) in self.0.iter().rev() {
            let most = base.as_ref().len().min(new.len());
            if most < WORTH_SPLICING || best.is_some_and(|b| most <= b.shared()) {
                continue;
            }
            let s = splice(*call, base);
            if s.shared() >= WORTH_SPLICING && best.is_none_or(|b| s.shared() > b.shared()) {
                best = Some(s);
            }
        }
        best
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
            .best(&whole, |call, base| Splice::between(call, base, &whole));
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
            .best(&prompt, |call, base| Splice::between(call, base, &prompt));
        (e.prompt_splice, e.prompt_token_ids) = stored(best, &prompt);
        let chat = std::mem::take(&mut e.chat_request);
        let best = self.chat_requests.best(chat.as_bytes(), |call, base| {
            Splice::between_text(call, base, &chat)
        });
        let (splice, middle) = stored(best, chat.as_bytes());
        e.chat_request_splice = splice;
        e.chat_request =
            String::from_utf8(middle).expect("a text splice ends on character boundaries");
        // The proxy's prompt ids come with room for the completion: appended
        // in place, where a new vector for both copied the prompt every call.
        let mut tokens = prompt;
        if !tokens.is_empty() {
            tokens.extend_from_slice(&e.completion_token_ids);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// In a growing session every recent call is a prefix of the next: the
    /// latest is compared, the shorter ones before it are not.
    #[test]
    fn a_growing_session_compares_only_its_latest_call() {
        let whole: Vec<u32> = (0..100).collect();
        let mut memory = Recent::default();
        for call in 0..RECENT_CALLS {
            memory.remember(call as i64, whole[..40 + 10 * call].to_vec());
        }
        let compared = std::cell::Cell::new(0);
        let best = memory.best(&whole, |call, base| {
            compared.set(compared.get() + 1);
            Splice::between(call, base, &whole)
        });
        assert_eq!(best.map(|b| (b.base_call, b.prefix)), Some((3, 70)));
        assert_eq!(compared.get(), 1);
    }

    proptest! {
        /// Skipping calls too short to do better picks what comparing every
        /// recent call picks: the most shared, the latest on ties.
        #[test]
        fn the_best_splice_is_the_one_comparing_them_all_finds(
            new in prop::collection::vec(0u8..3, 0..60),
            // Each recent call: how much of `new` it starts with, then its own.
            recent in prop::collection::vec((0usize..60, prop::collection::vec(0u8..3, 0..20)), 0..7),
        ) {
            let mut memory = Recent::default();
            for (call, (shared, own)) in recent.into_iter().enumerate() {
                let base = [&new[..shared.min(new.len())], &own[..]].concat();
                memory.remember(call as i64, base);
            }
            let all = memory
                .0
                .iter()
                .map(|(call, base)| Splice::between(*call, base, &new))
                .filter(|s| s.shared() >= WORTH_SPLICING)
                .max_by_key(|s| s.shared());
            let best = memory.best(&new, |call, base| Splice::between(call, base, &new));
            prop_assert_eq!(best, all);
        }
    }
}
