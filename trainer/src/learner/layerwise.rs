//! Activation checkpointing: a micro-batch's forward one layer at a time,
//! keeping only each layer's input, then its backward one layer at a time
//! from the top, each layer recomputed with its graph and differentiated
//! against the gradient that reached its output. The activations held at
//! once are one layer's, not every layer's (which grow with every row fed:
//! about 10 MB a row for SmolLM2 on the CPU), for one more forward's work.
//!
//! A layer runs its micro-batch in the two phases of [`Feed`], as the whole
//! forward does, so a member's gradient still reaches its prefix's rows.

use super::feed::Feed;
use super::MicroBatch;
use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};
use forgelog_model::{Logits, Transformer};

/// A micro-batch's forward with only each layer's input kept.
pub(super) struct LayerInputs<'a> {
    pub(super) feed: Feed<'a>,
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
        let (xp, xm) = feed.embedded(model)?;
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

    /// Each member's logits at its [`Feed::rows`], from the kept top: what
    /// the loss is taken on.
    pub(super) fn top_logits(&self, model: &Transformer) -> Result<Vec<Tensor>> {
        let lens = self.feed.member_lens();
        model.logits(self.top.as_tensor(), &lens, Logits::Rows(&self.feed.rows))
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
        let (ep, em) = feed.embedded(model)?;
        if em.track_op() {
            add(&along(&[
                (ep.as_ref(), gp.as_ref()),
                (Some(&em), Some(&gm)),
            ])?)?;
        }
        Ok(())
    }
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
