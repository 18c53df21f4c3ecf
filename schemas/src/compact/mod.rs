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

mod expand;
mod memory;
mod volume;

pub use expand::{expand_events, expand_finished, expand_started, ExpandError};
pub use memory::{SessionMemory, Whole, RECENT_CALLS};
pub use volume::SessionVolume;

use serde::{Deserialize, Serialize};

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
