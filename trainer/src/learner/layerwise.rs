//! Activation checkpointing: a micro-batch's forward one layer at a time,
//! keeping only each layer's input, then its backward one layer at a time
//! from the top, each layer recomputed with its graph and differentiated
//! against the gradient that reached its output. The activations held at
//! once are one layer's, not every layer's (which grow with every row fed:
//! about 10 MB a row for SmolLM2 on the CPU), for one more forward's work.
//!
//! A layer runs its micro-batch in two phases, as the whole forward does:
//! the shared prefixes' rows with fresh caches, then the members' rows after
//! forks of them, so a member's attention reaches its prefix's keys and
//! values and the gradient flows back into the prefix's rows.

use super::MicroBatch;
use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};
use forgelog_model::{KvCache, Logits, Transformer};

/// What a micro-batch feeds, phase by phase.
struct Feed<'a> {
    /// The runs' shared prefixes (runs that share one).
    prefixes: Vec<&'a [u32]>,
    /// Each member's tokens after its prefix, and which prefix it goes on from.
    members: Vec<(Option<usize>, &'a [u32])>,
}

impl<'a> Feed<'a> {
    fn of(micro: &MicroBatch<'a>) -> Feed<'a> {
        let mut feed = Feed {
            prefixes: Vec::new(),
            members: Vec::new(),
        };
        for run in &micro.runs {
            let prefix = (run.prefix > 0).then(|| {
                feed.prefixes.push(&run.members[0].tokens[..run.prefix]);
                feed.prefixes.len() - 1
            });
            for s in &run.members {
                // Logits at row i predict token i + 1.
                let fed = &s.tokens[run.prefix..s.tokens.len() - 1];
                feed.members.push((prefix, fed));
            }
        }
        feed
    }

    /// Rows fed by each member.
    fn member_lens(&self) -> Vec<usize> {
        self.members.iter().map(|(_, t)| t.len()).collect()
    }

    /// Layer `layer` on the prefixes' rows `xp`, then on the members' rows
    /// `xm`: `(yp, ym)`.
    fn layer(
        &self,
        model: &Transformer,
        layer: usize,
        xp: Option<&Tensor>,
        xm: &Tensor,
    ) -> Result<(Option<Tensor>, Tensor)> {
        let mut prefix_caches: Vec<KvCache> =
            self.prefixes.iter().map(|_| KvCache::new()).collect();
        let yp = match xp {
            Some(xp) => {
                let mut batch: Vec<(&[u32], &mut KvCache)> = self
                    .prefixes
                    .iter()
                    .copied()
                    .zip(prefix_caches.iter_mut())
                    .collect();
                let yp = model.layer(layer, xp, &mut batch)?;
                for (tokens, cache) in batch {
                    cache.advance(tokens.len());
                }
                Some(yp)
            }
            None => None,
        };
        let mut caches = self
            .members
            .iter()
            .map(|(prefix, _)| match prefix {
                Some(p) => prefix_caches[*p].fork(),
                None => Ok(KvCache::new()),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut batch: Vec<(&[u32], &mut KvCache)> = self
            .members
            .iter()
            .map(|(_, tokens)| *tokens)
            .zip(caches.iter_mut())
            .collect();
        let ym = model.layer(layer, xm, &mut batch)?;
        Ok((yp, ym))
    }
}

/// A micro-batch's forward with only each layer's input kept.
pub(super) struct LayerInputs<'a> {
    feed: Feed<'a>,
    /// Per layer: the prefixes' rows (none when no run shares one) and the members'.
    inputs: Vec<(Option<Tensor>, Tensor)>,
    /// The last layer's output of the members' rows: where the loss's
    /// gradient is read and the layers' backward starts.
    top: Var,
}

impl<'a> LayerInputs<'a> {
    /// The forward of `micro`, layer by layer, each layer's graph dropped
    /// once its output is taken.
    pub(super) fn forward(model: &Transformer, micro: &MicroBatch<'a>) -> Result<LayerInputs<'a>> {
        let feed = Feed::of(micro);
        let (xp, xm) = embedded(model, &feed)?;
        let (mut xp, mut xm) = (xp.map(|t| t.detach()), xm.detach());
        let mut inputs = Vec::with_capacity(model.num_layers());
        for layer in 0..model.num_layers() {
            let (yp, ym) = feed.layer(model, layer, xp.as_ref(), &xm)?;
            inputs.push((xp, xm));
            (xp, xm) = (yp.map(|t| t.detach()), ym.detach());
        }
        Ok(LayerInputs {
            feed,
            inputs,
            top: Var::from_tensor(&xm)?,
        })
    }

    /// The logits at `rows` of each member, from the kept top: what the
    /// loss is taken on.
    pub(super) fn top_logits(&self, model: &Transformer, rows: &[Vec<u32>]) -> Result<Vec<Tensor>> {
        let lens = self.feed.member_lens();
        model.logits(self.top.as_tensor(), &lens, Logits::Rows(rows))
    }

    /// The gradients of the loss whose own backward is `top_grads`, layer
    /// by layer down to the embeddings, each given to `add`.
    pub(super) fn backward(
        self,
        model: &Transformer,
        top_grads: GradStore,
        mut add: impl FnMut(&GradStore) -> Result<()>,
    ) -> Result<()> {
        add(&top_grads)?;
        // No sampled row reached the loss: nothing flows further down.
        let Some(mut gm) = top_grads.get(self.top.as_tensor()).cloned() else {
            return Ok(());
        };
        let (feed, mut gp) = (&self.feed, None::<Tensor>);
        for (layer, (xp, xm)) in self.inputs.into_iter().enumerate().rev() {
            let xp = xp.as_ref().map(Var::from_tensor).transpose()?;
            let xm = Var::from_tensor(&xm)?;
            let (yp, ym) = feed.layer(model, layer, xp.as_ref().map(Var::as_tensor), &xm)?;
            let grads = along(&[(yp.as_ref(), gp.as_ref()), (Some(&ym), Some(&gm))])?;
            add(&grads)?;
            gm = grads.get(xm.as_tensor()).cloned().ok_or_else(|| {
                candle_core::Error::Msg(format!("layer {layer}: no gradient reached its input"))
            })?;
            gp = xp.and_then(|xp| grads.get(xp.as_tensor()).cloned());
        }
        // The embeddings' rows get what reached the first layer's input.
        let (ep, em) = embedded(model, feed)?;
        if em.track_op() {
            add(&along(&[
                (ep.as_ref(), gp.as_ref()),
                (Some(&em), Some(&gm)),
            ])?)?;
        }
        Ok(())
    }
}

/// The first layer's input: the prefixes' rows (if any run shares one),
/// then the members'.
fn embedded(model: &Transformer, feed: &Feed) -> Result<(Option<Tensor>, Tensor)> {
    let xp = match feed.prefixes.is_empty() {
        true => None,
        false => Some(model.embed(&feed.prefixes.concat())?),
    };
    let members: Vec<u32> = feed
        .members
        .iter()
        .flat_map(|(_, t)| t.iter().copied())
        .collect();
    Ok((xp, model.embed(&members)?))
}

/// The backward of `Σ y · g` over the pairs that have both: each output's
/// gradient carried back through the graph that made it.
fn along(pairs: &[(Option<&Tensor>, Option<&Tensor>)]) -> Result<GradStore> {
    let mut sum: Option<Tensor> = None;
    for (y, g) in pairs {
        if let (Some(y), Some(g)) = (y, g) {
            let term = (*y * *g)?.sum_all()?;
            sum = Some(match sum {
                Some(s) => (s + term)?,
                None => term,
            });
        }
    }
    match sum {
        Some(sum) => sum.backward(),
        None => candle_core::bail!("a layer's backward with no gradient to carry"),
    }
}
