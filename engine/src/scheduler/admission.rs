//! Admission: a request becomes a sequence, and a new sequence starts from
//! the longest prefix of its prompt in the prefix cache.

use super::{Generation, GenerationRequest, Loop, Sequence};
use crate::prefix_cache::{common_prefix, MIN_REUSED_TOKENS};
use crate::sampling::Rng;
use forgelog_model::KvCache;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

impl Loop {
    /// A new sequence for `request`, stamped with the version serving now.
    pub(super) fn admit(
        &mut self,
        request: GenerationRequest,
        submitted: Instant,
        reply: oneshot::Sender<Result<Generation, String>>,
    ) {
        let seed = request.sampling.seed.unwrap_or_else(|| {
            self.seeds += 1;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            now.as_nanos() as u64 ^ self.seeds.rotate_left(32)
        });
        self.active.push(Sequence {
            prefilled: 0,
            request,
            reply,
            submitted,
            time_to_first_token: Duration::ZERO,
            cache: KvCache::new(),
            rng: Rng::new(seed),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            policy_version: self.version.load(Ordering::SeqCst),
        });
        self.admitted.fetch_add(1, Ordering::SeqCst);
    }

    /// Which active sequences feed this step, starting new ones from the
    /// prefix cache. A new sequence that shares a prefix with a prompt being
    /// prefilled now (a GRPO group's members arrive together) waits: that
    /// prompt is in the cache after this step.
    pub(super) fn start_sequences(&mut self) -> Vec<bool> {
        let mut feeds = Vec::with_capacity(self.active.len());
        let mut prefilling: Vec<usize> = Vec::new();
        for i in 0..self.active.len() {
            let new = self.active[i].prefilled == 0 && self.active[i].cache.is_empty();
            if new {
                match self.prefix_cache.lookup(&self.active[i].request.prompt) {
                    Some((reused, cache)) => {
                        let sequence = &mut self.active[i];
                        sequence.cache = cache;
                        sequence.prefilled = reused;
                        self.reused.fetch_add(reused as u64, Ordering::SeqCst);
                        metrics::counter!("forgelog_engine_prefix_cache_hit_tokens_total")
                            .increment(reused as u64);
                    }
                    None if self.prefix_cache.enabled() => {
                        let prompt = &self.active[i].request.prompt;
                        let shares = prefilling.iter().any(|&j| {
                            common_prefix(&self.active[j].request.prompt, prompt)
                                >= MIN_REUSED_TOKENS
                        });
                        if shares {
                            feeds.push(false);
                            continue;
                        }
                    }
                    None => {}
                }
            }
            if new {
                // The weights its prompt and first token are computed with:
                // a swap applied after its admission and before this step
                // serves it (swaps are taken between steps).
                self.active[i].policy_version = self.version.load(Ordering::SeqCst);
            }
            if self.active[i].prefilled < self.active[i].request.prompt.len() {
                prefilling.push(i);
            }
            feeds.push(true);
        }
        feeds
    }
}
