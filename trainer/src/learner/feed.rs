//! What a micro-batch feeds the model, in two phases: each shared prefix
//! with a fresh cache, then each member's tokens after a fork of its
//! prefix's cache. A prefix is fed once for all its members, and a member's
//! gradient flows back through the keys and values it attended to. The
//! whole forward and one layer of it ([`super::layerwise`]) feed alike.

use super::MicroBatch;
use candle_core::{Result, Tensor};
use forgelog_model::{KvCache, Logits, Transformer};

pub(super) struct Feed<'a> {
    /// The runs' shared prefixes (of the runs that share one).
    prefixes: Vec<&'a [u32]>,
    /// Each member's tokens after its prefix, and which prefix it goes on from.
    members: Vec<(Option<usize>, &'a [u32])>,
    /// Per member, the rows of its logits that predict its sampled tokens.
    pub(super) rows: Vec<Vec<u32>>,
    /// Those tokens, in the micro-batch's order.
    pub(super) targets: Vec<u32>,
}

impl<'a> Feed<'a> {
    pub(super) fn of(micro: &MicroBatch<'a>) -> Feed<'a> {
        let mut feed = Feed {
            prefixes: Vec::new(),
            members: Vec::new(),
            rows: Vec::new(),
            targets: Vec::new(),
        };
        for run in &micro.runs {
            let prefix = (run.prefix > 0).then(|| {
                feed.prefixes.push(&run.members[0].tokens[..run.prefix]);
                feed.prefixes.len() - 1
            });
            for s in &run.members {
                // Logits at row i predict token i + 1: feed up to the last
                // sampled token's predecessor, after the prefix.
                let fed = &s.tokens[run.prefix..s.tokens.len() - 1];
                feed.members.push((prefix, fed));
                let rows = s.positions.iter().map(|&j| (j - 1 - run.prefix) as u32);
                feed.rows.push(rows.collect());
                feed.targets
                    .extend(s.positions.iter().map(|&j| s.tokens[j]));
            }
        }
        feed
    }

    /// Rows fed by each member.
    pub(super) fn member_lens(&self) -> Vec<usize> {
        self.members.iter().map(|(_, t)| t.len()).collect()
    }

    /// The whole forward: each member's logits at its [`Feed::rows`].
    pub(super) fn forward(&self, model: &Transformer) -> Result<Vec<Tensor>> {
        let mut prefix_caches = self.fresh_caches();
        if !self.prefixes.is_empty() {
            let mut batch = self.prefix_batch(&mut prefix_caches);
            model.forward_batch(&mut batch, Logits::Rows(&[]))?;
        }
        let mut caches = self.member_caches(&prefix_caches)?;
        let mut batch = self.member_batch(&mut caches);
        model.forward_batch(&mut batch, Logits::Rows(&self.rows))
    }

    /// Layer `layer` alone on the prefixes' rows `xp`, then on the members'
    /// rows `xm`: `(yp, ym)`.
    pub(super) fn layer(
        &self,
        model: &Transformer,
        layer: usize,
        xp: Option<&Tensor>,
        xm: &Tensor,
    ) -> Result<(Option<Tensor>, Tensor)> {
        let mut prefix_caches = self.fresh_caches();
        let yp = match xp {
            Some(xp) => {
                let mut batch = self.prefix_batch(&mut prefix_caches);
                let yp = model.layer(layer, xp, &mut batch)?;
                for (tokens, cache) in batch {
                    cache.advance(tokens.len());
                }
                Some(yp)
            }
            None => None,
        };
        let mut caches = self.member_caches(&prefix_caches)?;
        let ym = model.layer(layer, xm, &mut self.member_batch(&mut caches))?;
        Ok((yp, ym))
    }

    /// The first layer's input: the prefixes' rows (if any run shares one),
    /// then the members'.
    pub(super) fn embedded(&self, model: &Transformer) -> Result<(Option<Tensor>, Tensor)> {
        let xp = match self.prefixes.is_empty() {
            true => None,
            false => Some(model.embed(&self.prefixes.concat())?),
        };
        let members: Vec<u32> = self
            .members
            .iter()
            .flat_map(|(_, t)| t.iter().copied())
            .collect();
        Ok((xp, model.embed(&members)?))
    }

    fn fresh_caches(&self) -> Vec<KvCache> {
        self.prefixes.iter().map(|_| KvCache::new()).collect()
    }

    fn prefix_batch<'c>(&self, caches: &'c mut [KvCache]) -> Vec<(&'a [u32], &'c mut KvCache)> {
        self.prefixes
            .iter()
            .copied()
            .zip(caches.iter_mut())
            .collect()
    }

    /// Each member's cache: a fork of its prefix's, or a fresh one.
    fn member_caches(&self, prefix_caches: &[KvCache]) -> Result<Vec<KvCache>> {
        self.members
            .iter()
            .map(|(prefix, _)| match prefix {
                Some(p) => prefix_caches[*p].fork(),
                None => Ok(KvCache::new()),
            })
            .collect()
    }

    fn member_batch<'c>(&self, caches: &'c mut [KvCache]) -> Vec<(&'a [u32], &'c mut KvCache)> {
        let tokens = self.members.iter().map(|(_, tokens)| *tokens);
        tokens.zip(caches.iter_mut()).collect()
    }
}
