//! A rendered prompt's ids, its long pieces between added tokens
//! remembered: the sessions of one harness share its system prompt and
//! tools, the rollouts of a GRPO group share their task, so most of a
//! session's first prompt was encoded before (a fresh encode was most of the
//! proxy's CPU per call with token in).
//!
//! Exact because the tokenizer does the same: Hugging Face's added
//! vocabulary splits the text at its non-normalized added tokens
//! (leftmost-longest) before anything else, and normalizes, pre-tokenizes and
//! encodes each piece apart. [`SegmentCache::of`] says `None` for the
//! tokenizers where a piece's ids could depend on where it stands (an added
//! token that strips the spaces beside it, Metaspace prepending to the
//! text's first piece only, truncation).

use aho_corasick::{AhoCorasick, MatchKind};
use quick_cache::sync::Cache;
use std::sync::Arc;
use tokenizers::Tokenizer;

/// Pieces shorter than this are encoded each time, together with the added
/// tokens around them: cheaper than remembering them.
const MIN_REMEMBERED: usize = 256;

/// The ids of long pieces of text between added tokens, remembered up to a
/// budget of bytes (scan-resistant: one-off tool outputs do not push out a
/// system prompt every session uses).
pub struct SegmentCache {
    added_tokens: AhoCorasick,
    remembered: Cache<String, Arc<[u32]>, PieceWeight>,
}

/// A remembered piece costs its text and its ids.
#[derive(Clone)]
struct PieceWeight;

impl quick_cache::Weighter<String, Arc<[u32]>> for PieceWeight {
    fn weight(&self, text: &String, ids: &Arc<[u32]>) -> u64 {
        (text.len() + 4 * ids.len()) as u64
    }
}

impl SegmentCache {
    /// A cache of at most `budget_bytes` for `tokenizer`, if encoding its
    /// pieces apart gives exactly the ids of encoding the whole.
    pub fn of(tokenizer: &Tokenizer, budget_bytes: u64) -> Option<SegmentCache> {
        if tokenizer.get_encode_special_tokens()
            || tokenizer.get_truncation().is_some()
            || tokenizer.get_padding().is_some()
            || prepends_to_first_piece_only(tokenizer)
        {
            return None;
        }
        let mut contents = Vec::new();
        for token in tokenizer.get_added_tokens_decoder().into_values() {
            if token.normalized {
                continue; // matched inside pieces, as the tokenizer does
            }
            if token.lstrip || token.rstrip || token.single_word {
                return None;
            }
            contents.push(token.content);
        }
        contents.sort(); // the matcher's patterns in one order, whatever the map's
        let added_tokens = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&contents)
            .ok()?;
        let estimated_pieces = (budget_bytes / 16_384).max(16) as usize;
        Some(SegmentCache {
            added_tokens,
            remembered: Cache::with_weighter(estimated_pieces, budget_bytes, PieceWeight),
        })
    }

    /// The ids of `text` as `encode` gives them for the whole of it: its long
    /// pieces from memory (encoded alone the first time), the rest encoded
    /// in runs that start and end at added tokens.
    pub fn encode(
        &self,
        text: &str,
        encode: impl Fn(&str) -> Result<Vec<u32>, String>,
    ) -> Result<Vec<u32>, String> {
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut unencoded = 0; // where the text not yet encoded starts
        let mut piece = 0; // where the piece after the last added token starts
        let ends = self
            .added_tokens
            .find_iter(text)
            .map(|m| (m.start(), m.end()));
        for (start, end) in ends.chain([(text.len(), text.len())]) {
            let long = &text[piece..start];
            if long.len() >= MIN_REMEMBERED {
                if unencoded < piece {
                    ids.extend(encode(&text[unencoded..piece])?);
                }
                // A GRPO group's rollouts send their shared task at once: one
                // of them encodes it, the others wait for its ids.
                let known = self
                    .remembered
                    .get_or_insert_with(long, || encode(long).map(Arc::from))?;
                ids.extend_from_slice(&known);
                unencoded = start;
            }
            piece = end;
        }
        if unencoded < text.len() {
            ids.extend(encode(&text[unencoded..])?);
        }
        Ok(ids)
    }

    /// The pieces remembered, and their bytes.
    pub fn remembered(&self) -> (usize, u64) {
        (self.remembered.len(), self.remembered.weight())
    }
}

/// Whether the pre-tokenizer prepends only to the text's first piece
/// (Metaspace's `prepend_scheme: first`): there a piece's ids depend on
/// whether it starts the text.
fn prepends_to_first_piece_only(tokenizer: &Tokenizer) -> bool {
    fn any_first(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(o) => {
                o.get("prepend_scheme").and_then(|s| s.as_str()) == Some("first")
                    || o.values().any(any_first)
            }
            serde_json::Value::Array(a) => a.iter().any(any_first),
            _ => false,
        }
    }
    tokenizer
        .get_pre_tokenizer()
        .is_some_and(|p| serde_json::to_value(p).map_or(true, |v| any_first(&v)))
}
