//! A bounded memory of the keys a processor is done with.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};

/// How many keys a processor remembers being done with: a duplicate of an
/// input arriving later than this many newer completions is taken as new.
pub const KEPT: usize = 100_000;

/// The newest `N` keys a processor finished, in the order it finished them.
/// What arrives again for one of them (a duplicate) is dropped; the oldest is
/// forgotten when a new one comes. State stays bounded, and what is forgotten
/// when is a function of the input alone.
///
/// Serialized as the list, oldest first (a plain set, as older checkpoints
/// hold, reads as one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<String>", into = "Vec<String>")]
pub struct RecentKeys<const N: usize = KEPT> {
    order: VecDeque<String>,
    set: BTreeSet<String>,
}

impl<const N: usize> Default for RecentKeys<N> {
    fn default() -> Self {
        RecentKeys {
            order: VecDeque::new(),
            set: BTreeSet::new(),
        }
    }
}

impl<const N: usize> RecentKeys<N> {
    pub fn contains(&self, key: &str) -> bool {
        self.set.contains(key)
    }

    /// Remembers `key` as the newest (a key already held keeps its place).
    pub fn insert(&mut self, key: String) {
        if self.set.insert(key.clone()) {
            self.order.push_back(key);
            while self.order.len() > N {
                if let Some(oldest) = self.order.pop_front() {
                    self.set.remove(&oldest);
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

impl<const N: usize> From<Vec<String>> for RecentKeys<N> {
    fn from(keys: Vec<String>) -> Self {
        let mut recent = RecentKeys::default();
        for key in keys {
            recent.insert(key);
        }
        recent
    }
}

impl<const N: usize> From<RecentKeys<N>> for Vec<String> {
    fn from(recent: RecentKeys<N>) -> Self {
        recent.order.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_oldest_is_forgotten_and_a_checkpoint_keeps_the_order() {
        let mut keys = RecentKeys::<3>::default();
        for k in ["a", "b", "a", "c", "d"] {
            keys.insert(k.into());
        }
        assert!(!keys.contains("a") && keys.contains("b") && keys.contains("d"));
        let json = serde_json::to_string(&keys).unwrap();
        assert_eq!(json, r#"["b","c","d"]"#);
        let mut back: RecentKeys<3> = serde_json::from_str(&json).unwrap();
        back.insert("e".into());
        assert!(!back.contains("b") && back.contains("c"), "{back:?}");
    }

    proptest! {
        /// Whatever is inserted, at most `N` are held: the newest `N` distinct ones.
        #[test]
        fn holds_the_newest_distinct_keys(keys in proptest::collection::vec(0u8..20, 0..60)) {
            let mut recent = RecentKeys::<5>::default();
            for k in &keys {
                recent.insert(k.to_string());
            }
            // Re-inserting a held key keeps its place, so replay the same rule.
            let mut model: VecDeque<String> = VecDeque::new();
            for k in keys.iter().map(|k| k.to_string()) {
                if !model.contains(&k) {
                    model.push_back(k);
                    if model.len() > 5 {
                        model.pop_front();
                    }
                }
            }
            prop_assert!(recent.len() <= 5);
            prop_assert_eq!(Vec::<String>::from(recent), Vec::from(model));
        }
    }
}
