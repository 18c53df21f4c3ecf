//! Deterministic event ids: a hash of what the event was derived from, so a
//! consumer that sees the same input twice emits the same id twice and any
//! reader can drop the duplicate.

use sha2::{Digest, Sha256};

/// 128 bits of SHA-256 over `kind` and `parts`, each length-prefixed so that
/// `("ab","c")` and `("a","bc")` differ. Hex, 32 characters.
pub fn event_id(kind: &str, parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in std::iter::once(kind).chain(parts.iter().copied()) {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    let digest = h.finalize();
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::event_id;

    #[test]
    fn stable_and_unambiguous() {
        assert_eq!(event_id("K", &["a", "b"]), event_id("K", &["a", "b"]));
        assert_ne!(event_id("K", &["ab", "c"]), event_id("K", &["a", "bc"]));
        assert_ne!(event_id("K", &["a"]), event_id("L", &["a"]));
        assert_eq!(event_id("K", &["a"]).len(), 32);
    }
}
