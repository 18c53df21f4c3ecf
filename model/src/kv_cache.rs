//! A sequence's keys and values, per layer, grown in place.

use candle_core::{Result, Tensor};

/// Keys and values seen so far by one sequence, per layer, in buffers of
/// shape `(kv_heads, capacity, head_dim)` whose first `len` positions are
/// filled. Appending writes in place and doubles a full buffer, so a step
/// costs the new tokens, not the whole history. (Not `Clone`: clones would
/// share, and overwrite, the same buffers.)
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// Tokens already in the cache (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A cache for a sequence that goes on from this one's tokens: it starts
    /// with the same keys and values, shared (a training graph then flows back
    /// through them once for every fork), and its appends never write into
    /// this cache's buffers: each fork's first append copies or concatenates.
    pub fn fork(&self) -> Result<KvCache> {
        self.fork_prefix(self.len)
    }

    /// A [`KvCache::fork`] of this cache's first `len` tokens only.
    pub fn fork_prefix(&self, len: usize) -> Result<KvCache> {
        if len > self.len {
            candle_core::bail!("a fork of {len} tokens from a cache of {}", self.len);
        }
        let layers = self
            .layers
            .iter()
            .map(|layer| match layer {
                // Buffers exactly `len` long: no room to write in place.
                Some((k, v)) => Ok(Some((k.narrow(1, 0, len)?, v.narrow(1, 0, len)?))),
                None => Ok(None),
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, len })
    }

    /// Moves the next position on by `t` tokens, once every layer has them.
    pub fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// Adds `k`, `v` (`(kv_heads, t, head_dim)`) after the cached positions of
    /// `layer` and returns all of them.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: Tensor,
        v: Tensor,
    ) -> Result<(Tensor, Tensor)> {
        if self.layers.len() <= layer {
            self.layers.resize(layer + 1, None);
        }
        let (len, t) = (self.len, k.dim(1)?);
        let (k, v) = match self.layers[layer].take() {
            // The first tokens are kept as given, so a training forward keeps its graph.
            None => (k, v),
            // Gradients cannot flow through in-place writes: concatenate instead.
            Some((k0, v0)) if k.track_op() || k0.track_op() => {
                let k = Tensor::cat(&[&k0.narrow(1, 0, len)?, &k], 1)?;
                let v = Tensor::cat(&[&v0.narrow(1, 0, len)?, &v], 1)?;
                (k, v)
            }
            Some((k0, v0)) => {
                let (k_buffer, v_buffer) = if len + t > k0.dim(1)? {
                    let capacity = (len + t).max(2 * k0.dim(1)?);
                    (grow(&k0, len, capacity)?, grow(&v0, len, capacity)?)
                } else {
                    (k0, v0)
                };
                k_buffer.slice_set(&k.contiguous()?, 1, len)?;
                v_buffer.slice_set(&v.contiguous()?, 1, len)?;
                (k_buffer, v_buffer)
            }
        };
        let filled = (k.narrow(1, 0, len + t)?, v.narrow(1, 0, len + t)?);
        self.layers[layer] = Some((k, v));
        Ok(filled)
    }
}

/// A buffer of `capacity` positions holding the first `len` of `buffer`.
fn grow(buffer: &Tensor, len: usize, capacity: usize) -> Result<Tensor> {
    let (heads, _, head_dim) = buffer.dims3()?;
    let grown = Tensor::zeros((heads, capacity, head_dim), buffer.dtype(), buffer.device())?;
    grown.slice_set(&buffer.narrow(1, 0, len)?.contiguous()?, 1, 0)?;
    Ok(grown)
}
