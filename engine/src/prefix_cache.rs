//! Keys and values of recent sequences, found by their tokens, so that a
//! request that begins like one of them prefills only what is new: the next
//! turn of an agent's conversation re-sends its history, and the members of a
//! GRPO group share their prompt. This is vLLM's automatic prefix caching, by
//! whole sequence rather than by block. The keys and values are the serving
//! weights': the cache is emptied when the weights change.

use forgelog_model::KvCache;

/// Shorter common prefixes are prefilled again: too little to save.
pub const MIN_REUSED_TOKENS: usize = 16;

/// Recent sequences' caches, least recently used first, within a budget of
/// tokens (each token's keys and values: `2 × layers × kv_heads × head_dim`
/// numbers).
pub struct PrefixCache {
    entries: Vec<Entry>,
    budget_tokens: usize,
}

struct Entry {
    tokens: Vec<u32>,
    /// Holds exactly the keys and values of `tokens`.
    cache: KvCache,
}

impl PrefixCache {
    /// A cache of at most `budget_tokens` tokens (0: nothing is kept).
    pub fn new(budget_tokens: usize) -> PrefixCache {
        PrefixCache {
            entries: Vec::new(),
            budget_tokens,
        }
    }

    /// The longest cached prefix of `prompt` that leaves at least its last
    /// token to feed (a forward must give the logits that sample the first
    /// token), when at least [`MIN_REUSED_TOKENS`] long: its length and a
    /// cache holding it, to go on from. The entry becomes the most recent.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(usize, KvCache)> {
        let usable = prompt.len().saturating_sub(1);
        let (at, len) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt).min(usable)))
            .filter(|&(_, len)| len >= MIN_REUSED_TOKENS)
            // The longest; of equals, the most recent.
            .max_by_key(|&(i, len)| (len, i))?;
        let entry = self.entries.remove(at);
        let cache = entry.cache.fork_prefix(len).ok()?;
        self.entries.push(entry);
        Some((len, cache))
    }

    /// Keeps `cache`, which holds exactly `tokens`' keys and values. Entries
    /// that are prefixes of `tokens` go (this one serves all they served);
    /// then the least recently used, beyond the budget.
    pub fn insert(&mut self, tokens: Vec<u32>, cache: KvCache) {
        if cache.len() != tokens.len() || tokens.len() < MIN_REUSED_TOKENS {
            return;
        }
        self.entries
            .retain(|e| !(e.tokens.len() <= tokens.len() && tokens.starts_with(&e.tokens)));
        self.entries.push(Entry { tokens, cache });
        while self.held() > self.budget_tokens {
            self.entries.remove(0);
        }
    }

    /// Whether anything is ever kept.
    pub fn enabled(&self) -> bool {
        self.budget_tokens > 0
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Tokens held (an entry that shares buffers with another counts whole).
    pub fn held(&self) -> usize {
        self.entries.iter().map(|e| e.tokens.len()).sum()
    }
}

pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use forgelog_model::testing::{tiny_config, tiny_weights};
    use forgelog_model::{Logits, Transformer};

    fn tiny() -> Transformer {
        let config = tiny_config(4096);
        let vb =
            candle_nn::VarBuilder::from_tensors(tiny_weights(&config, 3), DType::F32, &Device::Cpu);
        Transformer::load(vb, &config).unwrap()
    }

    /// The cache of a forward of `tokens`.
    fn cache_of(model: &Transformer, tokens: &[u32]) -> KvCache {
        let mut cache = KvCache::new();
        model
            .forward_batch(&mut [(tokens, &mut cache)], Logits::Last)
            .unwrap();
        cache
    }

    #[test]
    fn the_longest_prefix_is_found_and_a_token_is_left_to_feed() {
        let model = tiny();
        let mut cache = PrefixCache::new(1000);
        let a: Vec<u32> = (0..40).collect();
        let b: Vec<u32> = (0..30).chain(100..120).collect();
        cache.insert(a.clone(), cache_of(&model, &a));
        cache.insert(b.clone(), cache_of(&model, &b));
        // b's first 30 and 5 more of its own.
        let prompt: Vec<u32> = (0..30).chain(100..105).collect();
        assert_eq!(
            cache.lookup(&prompt).map(|(n, c)| (n, c.len())),
            Some((35 - 1, 34))
        );
        // All of a asked again: all but the last token.
        assert_eq!(cache.lookup(&a).map(|(n, _)| n), Some(39));
        // Too short a common prefix: prefill it all.
        let other: Vec<u32> = (0..10).chain(500..540).collect();
        assert!(cache.lookup(&other).is_none());
    }

    #[test]
    fn a_sequence_replaces_its_prefixes_and_the_oldest_go_over_budget() {
        let model = tiny();
        let mut cache = PrefixCache::new(100);
        let prompt: Vec<u32> = (0..20).collect();
        let finished: Vec<u32> = (0..30).collect();
        cache.insert(prompt.clone(), cache_of(&model, &prompt));
        cache.insert(finished.clone(), cache_of(&model, &finished));
        assert_eq!(
            cache.held(),
            30,
            "the prompt's entry is covered by the finished one"
        );
        let other: Vec<u32> = (1000..1060).collect();
        cache.insert(other.clone(), cache_of(&model, &other));
        assert_eq!(cache.held(), 90);
        // Used now: `finished` is the most recent, `other` the oldest.
        assert!(cache.lookup(&finished).is_some());
        let newest: Vec<u32> = (2000..2020).collect();
        cache.insert(newest.clone(), cache_of(&model, &newest));
        assert_eq!(cache.held(), 50);
        assert!(cache.lookup(&other).is_none() && cache.lookup(&finished).is_some());
        // A cache that does not hold its tokens is not kept.
        let short: Vec<u32> = (3000..3040).collect();
        cache.insert(short.clone(), cache_of(&model, &short[..39]));
        assert_eq!(cache.held(), 50);
        cache.clear();
        assert_eq!(cache.held(), 0);
        assert!(PrefixCache::new(0).lookup(&finished).is_none());
    }
}
